"""An independent review's attack on the async transport's SOCKS5 and https:// proxies:
a hostile SOCKS5 server (our raw-socket ``ProxyEgress``, scripted) at every stage of the
handshake, and https:// proxies that present a wrong certificate, speak plain text or
say nothing.

Every case ends in the matching httpx exception (``ProxyError`` for what the proxy says,
``ConnectError`` for TLS and transport failures, ``ConnectTimeout`` for silence) within the
connect timeout plus slack; nothing is pooled; and the next request through the same
transport and the same proxy (whose fault hits only its first connection) succeeds.  The
descriptor check runs after each test.

A seeded loop cuts the proxy's side of the exchange at a random byte (then close, reset
or silence), or trickles it a byte per segment: ``BULKHEAD_ADVERSARY_SOCKS_EXAMPLES``
(default 12 per backend) and ``BULKHEAD_ADVERSARY_SOCKS_SEED`` run more or another seed.
No name here is ever resolved by the system: long names go through ``socks5h://`` only.
"""

from __future__ import annotations

import gc
import os
import random
import socket
import struct
import time
from collections.abc import Iterator

import httpx
import pytest

from httpx_bulkhead import BulkheadTransport
from tests.resources import FdSnapshot, assert_no_fd_growth, settle_io
from tests.servers import RawServer
from tests.servers.proxy_scripted import ProxyEgress, Send, SocksScript, SocksStage
from tests.servers.raw import RawConn, keepalive_ok
from tests.servers.tls import untrusted_server_tls

pytestmark = pytest.mark.anyio

EXAMPLES = int(os.environ.get("BULKHEAD_ADVERSARY_SOCKS_EXAMPLES", "12"))
SEED = os.environ.get("BULKHEAD_ADVERSARY_SOCKS_SEED")
CONNECT_TIMEOUT = 0.3
#: Longest a failed request may take: the connect timeout and slack for a loaded machine.
DEADLINE = CONNECT_TIMEOUT + 3.0
USER, PASSWORD = "reviewer", "s3cret-pw"


def reply(kind: int, address: bytes, code: int = 0, reserved: int = 0) -> bytes:
    return bytes([5, code, reserved, kind]) + address + struct.pack("!H", 80)


IPV4 = reply(1, socket.inet_aton("127.0.0.1"))
IPV6 = reply(4, socket.inet_pton(socket.AF_INET6, "::1"))
NAME_255 = reply(3, bytes([255]) + b"n" * 255)


@pytest.fixture
def target() -> Iterator[RawServer]:
    """The target (keep-alive, 200 to everything); descriptors are counted before it
    starts and after it stops, so only the client's can remain."""
    gc.collect()
    before = FdSnapshot.take()
    with RawServer(keepalive_ok()) as server:
        yield server
    assert_no_fd_growth(before, "after the attack")


def first_connection_only(stage: SocksStage, fault: Send | int) -> SocksScript:
    """A script that spoils ``stage`` of the proxy's first connection only."""
    seen: dict[str, int] = {}

    def script(at: SocksStage, target: str) -> Send | int | None:
        if at == "greeting":
            seen["n"] = seen.get("n", 0) + 1
        return fault if at == stage and seen["n"] == 1 else None

    return script


async def attack(
    proxy: str | httpx.Proxy, url: str, expected: type[Exception] | None, says: str = ""
) -> None:
    """One request through ``proxy`` (whose first connection is hostile), then a good one."""
    transport = BulkheadTransport(proxy=proxy)
    timeout = httpx.Timeout(5, connect=CONNECT_TIMEOUT)
    async with httpx.AsyncClient(transport=transport, timeout=timeout) as client:
        started = time.monotonic()
        if expected is None:
            assert (await client.get(url)).status_code == 200
        else:
            with pytest.raises(expected) as info:
                await client.get(url)
            assert type(info.value) is expected, repr(info.value)
            assert says in str(info.value)
            assert PASSWORD not in str(info.value)
            assert time.monotonic() - started < DEADLINE
            [stats] = transport.statistics().values()
            assert (stats.connections, stats.running, stats.proxied_connections) == (0, 0, 0)
        assert (await client.get(url)).status_code == 200  # the next request works
        [stats] = transport.statistics().values()
        assert stats.running == 0 and stats.completed == 1 + (expected is None)
    await settle_io()


HOSTILE: dict[str, tuple[SocksStage, Send | int, type[Exception], str]] = {
    "greeting: version 4": ("greeting", Send(b"\x04\x00", "hang"), httpx.ProxyError, "version 4"),
    "greeting: a method we did not offer": (
        "greeting",
        Send(b"\x05\x03", "hang"),
        httpx.ProxyError,
        "authentication method 0x03, which we did not offer",
    ),
    "greeting: no acceptable method": (
        "greeting",
        Send(b"\x05\xff", "hang"),
        httpx.ProxyError,
        "accepts none of our authentication methods",
    ),
    "greeting: silent": ("greeting", Send(b"", "hang"), httpx.ConnectTimeout, "connect timed out"),
    "greeting: closed": ("greeting", Send(b"", "close"), httpx.ProxyError, "closed the connection"),
    "greeting: reset": ("greeting", Send(b"\x05", "reset"), httpx.ConnectError, "handshake with"),
    "greeting: enormous": (
        "greeting",
        Send(b"\x05\x00" + b"\x00" * 1_000_000, "hang"),
        httpx.ProxyError,
        "invalid reply",
    ),
    "greeting: extra bytes after the method": (
        "greeting",
        Send(b"\x05\x00" + b"\x05\x00\x00\x09", "proceed"),
        httpx.ProxyError,
        "address type 0x09",
    ),
    "auth: refused": ("auth", Send(b"\x01\x01", "close"), httpx.ProxyError, "refused the user"),
    "auth: wrong version": ("auth", Send(b"\x05\x00", "hang"), httpx.ProxyError, "reply version 5"),
    "connect: refused (5)": ("connect", 5, httpx.ProxyError, ": connection refused"),
    "connect: unknown reply code": (
        "connect",
        Send(reply(1, bytes(4), code=0x63), "hang"),
        httpx.ProxyError,
        "reply 0x63",
    ),
    "connect: unknown address type": (
        "connect",
        Send(bytes([5, 0, 0, 9]) + bytes(6), "hang"),
        httpx.ProxyError,
        "address type 0x09",
    ),
    "connect: reserved byte not zero": (
        "connect",
        Send(reply(1, socket.inet_aton("127.0.0.1"), reserved=7), "proceed"),
        httpx.ProxyError,
        "reserved byte 0x07",
    ),
    "connect: empty bound name": (
        "connect",
        Send(reply(3, b"\x00"), "proceed"),
        httpx.ProxyError,
        "empty bound address name",
    ),
    "connect: bytes after the reply": (
        "connect",
        Send(IPV4 + b"HTTP/1.1 200 OK\r\n\r\n", "proceed"),
        httpx.ProxyError,
        "sent bytes after opening the tunnel",
    ),
    "connect: silent mid-reply": (
        "connect",
        Send(IPV4[:5], "hang"),
        httpx.ConnectTimeout,
        "connect timed out",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE))
async def test_a_hostile_socks5_proxy_fails_the_request_cleanly(
    anyio_backend: str, target: RawServer, case: str
) -> None:
    stage, fault, expected, says = HOSTILE[case]
    auth = (USER, PASSWORD) if stage == "auth" else None
    with ProxyEgress(auth=auth, script=first_connection_only(stage, fault)) as socks:
        proxy = httpx.Proxy(socks.url, auth=auth)
        await attack(proxy, f"{target.url}/", expected, says)


@pytest.mark.parametrize("answer", [IPV4, IPV6, NAME_255], ids=["ipv4", "ipv6", "a 255-byte name"])
async def test_every_bound_address_type_opens_the_tunnel(
    anyio_backend: str, target: RawServer, answer: bytes
) -> None:
    script = first_connection_only("connect", Send(answer, "proceed"))
    with ProxyEgress(script=script) as socks:
        await attack(socks.url, f"{target.url}/", None)


async def test_a_target_name_socks5_cannot_carry_is_a_connect_error(
    anyio_backend: str, target: RawServer
) -> None:
    name = ".".join(["a" * 60] * 5)  # 304 bytes: no SOCKS5 name field holds it
    with ProxyEgress() as socks:
        transport = BulkheadTransport(proxy=socks.url.replace("socks5", "socks5h"))
        async with httpx.AsyncClient(transport=transport) as client:
            with pytest.raises(httpx.ConnectError, match="1 to 255 ASCII bytes"):
                await client.get(f"http://{name}:{target.port}/")
            assert (await client.get(f"http://localhost:{target.port}/")).status_code == 200
        assert socks.ledger.names == [f"localhost:{target.port}"]
    await settle_io()


def exchange(auth: bool) -> list[tuple[SocksStage, bytes]]:
    """What a good proxy says, stage by stage."""
    if auth:
        return [("greeting", b"\x05\x02"), ("auth", b"\x01\x00"), ("connect", IPV4)]
    return [("greeting", b"\x05\x00"), ("connect", IPV4)]


def random_fault(rng: random.Random) -> tuple[bool, SocksStage, Send, type[Exception] | None]:
    """A cut of the proxy's side at a random byte (then close, reset or silence), or the
    whole exchange a byte per segment (which must work)."""
    auth = rng.random() < 0.5
    stages = exchange(auth)
    if rng.random() < 0.25:  # (ProxyEgress skips its own steps after a greeting Send)
        stage, data = stages[-1] if auth else rng.choice(stages)
        return auth, stage, Send(data, "proceed", byte_delay=0.001), None
    stage, data = rng.choice(stages)
    then = rng.choice(["close", "reset", "hang"])
    cut = data[: rng.randrange(len(data))]
    expected = {
        "close": httpx.ProxyError,
        "reset": httpx.ConnectError,
        "hang": httpx.ConnectTimeout,
    }[then]
    return auth, stage, Send(cut, then), expected  # type: ignore[arg-type]


async def test_a_reply_cut_at_any_byte_or_trickled(anyio_backend: str, target: RawServer) -> None:
    seed = int(SEED) if SEED is not None else (0 if anyio_backend == "asyncio" else 1)
    rng = random.Random(seed)
    for example in range(EXAMPLES):
        auth, stage, fault, expected = random_fault(rng)
        credentials = (USER, PASSWORD) if auth else None
        with ProxyEgress(auth=credentials, script=first_connection_only(stage, fault)) as socks:
            try:
                await attack(httpx.Proxy(socks.url, auth=credentials), f"{target.url}/", expected)
            except BaseException as exc:
                exc.add_note(f"seed {seed}, example {example}: {stage} {fault}")
                raise


# -- https:// proxies --------------------------------------------------------------------------
def plain_http(conn: RawConn) -> None:
    conn.send(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    conn.wait("never")


def silent(conn: RawConn) -> None:
    conn.wait("never")


def wrong_certificate(conn: RawConn) -> None:
    conn.wait("never")  # the client's verification fails first


@pytest.mark.parametrize(
    ("handler", "tls", "expected", "says"),
    [
        (wrong_certificate, True, httpx.ConnectError, "CERTIFICATE_VERIFY_FAILED"),
        (plain_http, False, httpx.ConnectError, "in the TLS handshake through proxy"),
        (silent, False, httpx.ConnectTimeout, "connect timed out"),
    ],
    ids=["wrong certificate", "plain text", "silent"],
)
async def test_a_hostile_https_proxy_fails_the_request_cleanly(
    anyio_backend: str, target: RawServer, handler: object, tls: bool, expected: type, says: str
) -> None:
    server = RawServer(handler, tls=untrusted_server_tls() if tls else None)  # type: ignore[arg-type]
    with server:
        transport = BulkheadTransport(proxy=f"https://127.0.0.1:{server.port}")
        timeout = httpx.Timeout(5, connect=CONNECT_TIMEOUT)
        async with httpx.AsyncClient(transport=transport, timeout=timeout) as client:
            for url in (f"{target.url}/", f"https://127.0.0.1:{target.port}/"):
                started = time.monotonic()
                with pytest.raises(expected, match=says):
                    await client.get(url)
                assert time.monotonic() - started < DEADLINE
        assert all(s.connections == 0 for s in transport.statistics().values())
    await settle_io()
