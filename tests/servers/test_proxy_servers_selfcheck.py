"""Self-checks for the proxies of ``proxies.py``, with httpx's default transport
(``httpx.AsyncHTTPTransport(proxy=...)``, httpcore's proxy code) as the client, never
httpx_bulkhead: the proxies are proven here before our transport is tested through them.

Targets are hypercorn servers on 127.0.0.1 (plain, and TLS with ALPN h2); the only other
address used is 127.0.0.2, which is loopback too, as a target every proxy must refuse.
"""

from __future__ import annotations

import contextlib
import gc
import socket
import struct
import warnings
from collections.abc import Callable, Iterator

import anyio
import httpx
import pytest

from .asgi import HypercornServer, TestApp
from .proxies import (
    ESTABLISHED,
    Fault,
    FaultProxy,
    PProxy,
    ProxyEgress,
    ProxyLedger,
    ProxyRequest,
    Send,
    TinyProxy,
    close_mid_connect,
    garbage,
    never_answer,
    refuse,
    trickle,
)
from .tls import default_server_tls, wrong_host_server_tls

TIMEOUT = 10.0
pytestmark = pytest.mark.anyio


def hostport(server: HypercornServer) -> str:
    return f"127.0.0.1:{server.port}"


def client(proxy: str | httpx.Proxy, *, http2: bool = False) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport(
        proxy=proxy, verify=default_server_tls().client_ssl_context(), http2=http2
    )
    return httpx.AsyncClient(transport=transport, timeout=TIMEOUT)


async def gets(c: httpx.AsyncClient, *urls: str) -> list[tuple[int, bytes]]:
    results = []
    for url in urls:
        r = await c.get(url)
        results.append((r.status_code, r.content))
    return results


# --------------------------------------------------------------------------- egress


def socks5_connect(port: int, host: bytes, target_port: int) -> bytes:
    """A raw SOCKS5 CONNECT by name; the reply's first two bytes."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        sock.sendall(b"\x05\x01\x00")
        assert sock.recv(2) == b"\x05\x00"
        sock.sendall(
            b"\x05\x01\x00\x03" + bytes([len(host)]) + host + struct.pack("!H", target_port)
        )
        return sock.recv(2)


def test_egress_only_reaches_loopback(egress: ProxyEgress, target: HypercornServer) -> None:
    assert socks5_connect(egress.port, b"127.0.0.2", target.port) == b"\x05\x02"
    assert socks5_connect(egress.port, b"example.com", 80) == b"\x05\x02"
    assert socks5_connect(egress.port, b"localhost", target.port) == b"\x05\x00"
    assert egress.ledger.refused == [f"127.0.0.2:{target.port}", "example.com:80"]
    egress.ledger.wait_for(lambda led: led.stats(f"localhost:{target.port}").open_now == 0)
    assert egress.ledger.stats(f"localhost:{target.port}").opened == 1


@contextlib.contextmanager
def httpcore_leaks_the_socket() -> Iterator[None]:
    """httpcore (1.0.9) leaves the socket of a failed SOCKS handshake unclosed, on both
    backends: its ResourceWarning is silenced here, and the socket collected before the
    block ends rather than in a later test."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        yield
        gc.collect()


def socks5_raw(port: int, auth: bytes | None = None) -> socket.socket:
    """A raw SOCKS5 client past the greeting (and authentication)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    sock.sendall(b"\x05\x01" + (b"\x00" if auth is None else b"\x02"))
    assert sock.recv(2) == (b"\x05\x00" if auth is None else b"\x05\x02")
    if auth is not None:
        sock.sendall(auth)
    return sock


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n and (chunk := sock.recv(n - len(data))):
        data += chunk
    return data


async def test_egress_as_socks5_proxy_with_auth(target: HypercornServer) -> None:
    with ProxyEgress(auth=("u", "pw")) as socks:
        async with client(f"socks5://u:pw@127.0.0.1:{socks.port}") as c:
            assert await gets(c, f"http://localhost:{target.port}/") == [(200, b"hello")]
        with httpcore_leaks_the_socket():
            async with client(f"socks5://u:nope@127.0.0.1:{socks.port}") as c:
                with pytest.raises(httpx.ProxyError, match="Invalid username/password"):
                    await c.get(f"{target.url}/")
            async with client(socks.url) as c:
                with pytest.raises(httpx.ProxyError, match="NO ACCEPTABLE METHODS"):
                    await c.get(f"{target.url}/")
        assert socks.ledger.names == [f"localhost:{target.port}"]
        assert socks.ledger.stats(hostport(target)).opened == 0  # the refused never got there


async def test_egress_reply_codes(target: HypercornServer) -> None:
    with ProxyEgress(script=lambda stage, t: 5 if stage == "connect" else None) as socks:
        with httpcore_leaks_the_socket():
            async with client(socks.url) as c:
                with pytest.raises(httpx.ProxyError, match="could not connect: Connection refused"):
                    await c.get(f"{target.url}/")
        assert socks.ledger.targets() == {}


def test_egress_faults_on_the_wire(target: HypercornServer) -> None:
    """Proven with a raw client: httpcore reads a SOCKS reply in one read and lets
    socksio's ``ProtocolError`` escape on a short or malformed one, so it cannot tell."""
    request = b"\x05\x01\x00\x01\x7f\x00\x00\x01" + struct.pack("!H", target.port)
    get = f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{target.port}\r\n\r\n".encode()

    def connect_trickled(stage: str, t: str) -> Send | None:
        reply = b"\x05\x00\x00\x01\x7f\x00\x00\x01\x00\x01"
        return Send(reply, "proceed", byte_delay=0.002) if stage == "connect" else None

    with ProxyEgress(script=connect_trickled) as socks, socks5_raw(socks.port) as sock:
        sock.sendall(request)
        pieces = [sock.recv(10) for _ in range(10)]
        assert [len(p) for p in pieces] == [1] * 10  # one byte per segment
        sock.sendall(get)
        assert recv_exactly(sock, 12) == b"HTTP/1.1 200"

    def garbage_greeting(stage: str, t: str) -> Send | None:
        return Send(b"HTTP/1.1 400 Bad\r\n\r\n") if stage == "greeting" else None

    with ProxyEgress(script=garbage_greeting) as socks:
        with socket.create_connection(("127.0.0.1", socks.port), timeout=TIMEOUT) as sock:
            sock.sendall(b"\x05\x01\x00")
            assert recv_exactly(sock, 64) == b"HTTP/1.1 400 Bad\r\n\r\n"  # then EOF

    def cut_auth(stage: str, t: str) -> Send | None:
        return Send(b"\x01") if stage == "auth" else None

    with ProxyEgress(auth=("u", "pw"), script=cut_auth) as socks:
        with socks5_raw(socks.port, auth=b"\x01\x01u\x02pw") as sock:
            assert recv_exactly(sock, 8) == b"\x01"


# --------------------------------------------------------------------------- tinyproxy


async def test_tinyproxy_forwards_and_tunnels(
    tinyproxy: TinyProxy, egress: ProxyEgress, target: HypercornServer, tls_target: HypercornServer
) -> None:
    before, connections = len(tinyproxy.requests()), tinyproxy.client_connections()
    async with client(tinyproxy.url) as c:
        assert (
            await gets(c, f"{target.url}/", f"{target.url}/", f"{tls_target.url}/")
            == [(200, b"hello")] * 3
        )
    lines = tinyproxy.wait_requests(before + 3)[before:]
    assert lines == [("GET", f"{target.url}/")] * 2 + [("CONNECT", hostport(tls_target))]
    assert tinyproxy.client_connections() - connections == 3  # it closes after a forward
    await egress.ledger.until(lambda led: led.stats(hostport(tls_target)).open_now == 0)
    assert egress.ledger.stats(hostport(target)).opened == 2
    assert egress.ledger.stats(hostport(tls_target)).opened == 1


async def test_tinyproxy_http2_inside_the_tunnel(
    tinyproxy: TinyProxy, egress: ProxyEgress, tls_target: HypercornServer
) -> None:
    async with client(tinyproxy.url, http2=True) as c:
        responses = [await c.get(f"{tls_target.url}/") for _ in range(3)]
    assert [r.http_version for r in responses] == ["HTTP/2"] * 3
    assert egress.ledger.stats(hostport(tls_target)).opened == 1  # one tunnel, reused


async def test_tinyproxy_tunnel_checks_the_target_certificate(
    tinyproxy: TinyProxy, egress: ProxyEgress
) -> None:
    with HypercornServer(TestApp(), tls=wrong_host_server_tls()) as wrong:
        async with client(tinyproxy.url) as c:
            with pytest.raises(httpx.ConnectError):  # (an empty message under trio)
                await c.get(f"{wrong.url}/")
    assert egress.ledger.stats(hostport(wrong)).opened == 1


async def test_tinyproxy_refuses_other_targets(
    tinyproxy: TinyProxy, egress: ProxyEgress, target: HypercornServer
) -> None:
    async with client(tinyproxy.url) as c:
        assert (await c.get(f"http://127.0.0.2:{target.port}/")).status_code == 403
        with pytest.raises(httpx.ProxyError, match="403"):
            await c.get(f"https://127.0.0.2:{target.port}/")
    assert egress.ledger.targets() == {}


async def test_tinyproxy_counts_concurrent_tunnels_per_target(
    tinyproxy: TinyProxy,
    egress: ProxyEgress,
    target_app: TestApp,
    tls_target: HypercornServer,
    target: HypercornServer,
    unique: Callable[[str], str],
) -> None:
    name = unique("tiny")
    gate = target_app.gate(name)
    tunnel, forward = hostport(tls_target), hostport(target)
    async with client(tinyproxy.url) as c, anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(c.get, f"{tls_target.url}/gate/{name}")
        for _ in range(2):
            tg.start_soon(c.get, f"{target.url}/gate/{name}")
        await gate.until_entered(5)
        assert egress.ledger.stats(tunnel).open_now == 3
        assert egress.ledger.stats(forward).open_now == 2
        gate.open()
    await egress.ledger.until(lambda led: led.stats(tunnel).open_now == 0)
    await egress.ledger.until(lambda led: led.stats(forward).open_now == 0)
    assert (egress.ledger.stats(tunnel).peak, egress.ledger.stats(forward).peak) == (3, 2)


async def test_tinyproxy_basic_auth(
    egress: ProxyEgress, target: HypercornServer, tls_target: HypercornServer
) -> None:
    with TinyProxy(egress, auth=("user", "s3cret")) as proxy:
        async with client(proxy.url) as c:
            assert (await c.get(f"{target.url}/")).status_code == 407
            with pytest.raises(httpx.ProxyError, match="407"):
                await c.get(f"{tls_target.url}/")
        with_url = f"http://user:s3cret@127.0.0.1:{proxy.port}"
        with_auth = httpx.Proxy(proxy.url, auth=("user", "s3cret"))
        for given in (with_url, with_auth):
            async with client(given) as c:
                assert (
                    await gets(c, f"{target.url}/", f"{tls_target.url}/") == [(200, b"hello")] * 2
                )


# --------------------------------------------------------------------------- pproxy


async def test_pproxy_https_proxy(
    egress: ProxyEgress, target: HypercornServer, tls_target: HypercornServer
) -> None:
    tls = default_server_tls()
    with PProxy("https", egress, tls=tls) as proxy:
        assert proxy.url.startswith("https://127.0.0.1:")
        given = httpx.Proxy(proxy.url, ssl_context=tls.client_ssl_context())
        async with client(given, http2=True) as c:
            plain, secure = await c.get(f"{target.url}/"), await c.get(f"{tls_target.url}/")
        assert (plain.content, secure.content, secure.http_version) == (
            b"hello",
            b"hello",
            "HTTP/2",
        )
        untrusting = httpx.Proxy(proxy.url)  # certifi's roots: our test CA is not among them
        async with client(untrusting) as c:
            with pytest.raises(httpx.ConnectError):
                await c.get(f"{target.url}/")
    assert egress.ledger.stats(hostport(target)).opened == 1
    assert egress.ledger.stats(hostport(tls_target)).opened == 1


async def test_pproxy_socks5_names_and_addresses(
    egress: ProxyEgress, target: HypercornServer, tls_target: HypercornServer
) -> None:
    with PProxy("socks5", egress) as proxy:
        assert proxy.url.startswith("socks5://127.0.0.1:")
        async with client(proxy.url) as c:
            by_name = f"http://localhost:{target.port}/"
            by_address = f"{tls_target.url}/"
            assert await gets(c, by_name, by_address) == [(200, b"hello")] * 2
        # httpcore sends a name as a name (the proxy resolves it: remote DNS) and an
        # address as an address; pproxy passes both on to the egress as names.
        assert proxy.requests() == [
            ("socks5", f"localhost:{target.port}"),
            ("socks5", hostport(tls_target)),
        ]
    assert egress.ledger.stats(f"localhost:{target.port}").opened == 1
    assert egress.ledger.stats(hostport(tls_target)).opened == 1


async def test_pproxy_refuses_other_targets(egress: ProxyEgress, target: HypercornServer) -> None:
    with PProxy("http", egress) as proxy:
        async with client(proxy.url) as c:
            with pytest.raises(httpx.TransportError):
                await c.get(f"https://127.0.0.2:{target.port}/")
            assert (await c.get(f"{target.url}/")).content == b"hello"
    assert list(egress.ledger.targets()) == [hostport(target)]


# --------------------------------------------------------------------------- FaultProxy


async def test_fault_proxy_is_a_proxy(
    egress: ProxyEgress, target: HypercornServer, tls_target: HypercornServer
) -> None:
    with FaultProxy() as proxy:
        async with client(proxy.url, http2=True) as c:
            for _ in range(2):
                assert (
                    await gets(c, f"{target.url}/?q=1", f"{tls_target.url}/")
                    == [(200, b"hello")] * 2
                )
            assert (await c.post(f"{target.url}/echo", content=b"x" * 70000)).content == (
                b"x" * 70000
            )
            streamed = await c.get(f"{target.url}/stream/3")
            assert streamed.content == b"x" * 3072
        assert proxy.connections == 2  # one forwarding connection kept alive, one tunnel
        assert [(r.method, r.target) for r in proxy.ledger.requests[:2]] == [
            ("GET", f"{target.url}/?q=1"),
            ("CONNECT", hostport(tls_target)),
        ]
        proxy.ledger.wait_for(lambda led: led.stats(hostport(target)).open_now == 0)
        assert proxy.ledger.stats(hostport(target)).opened == 1
        assert proxy.ledger.stats(hostport(tls_target)).opened == 1


async def test_fault_proxy_auth_and_loopback_only(target: HypercornServer) -> None:
    with FaultProxy(auth=("u", "pw")) as proxy:
        async with client(proxy.url) as c:
            refused = await c.get(f"{target.url}/")
            assert refused.status_code == 407
            assert refused.headers["proxy-authenticate"] == 'Basic realm="test"'
        async with client(httpx.Proxy(proxy.url, auth=("u", "pw"))) as c:
            assert (await c.get(f"{target.url}/")).status_code == 200
            assert (await c.get(f"http://127.0.0.2:{target.port}/")).status_code == 403
            with pytest.raises(httpx.ProxyError, match="403 Filtered"):
                await c.get(f"https://127.0.0.2:{target.port}/")
        assert proxy.ledger.refused == [f"127.0.0.2:{target.port}"] * 2
        assert proxy.ledger.requests[1].header("Proxy-Authorization") == "Basic dTpwdw=="


@pytest.mark.parametrize(
    ("status", "reason"),
    [(407, "Proxy Authentication Required"), (403, "Forbidden by policy"), (502, "Bad Gateway")],
)
async def test_fault_proxy_refuses_connect(
    status: int, reason: str, tls_target: HypercornServer
) -> None:
    def script(request: ProxyRequest) -> Fault | None:
        return refuse(status, reason) if request.method == "CONNECT" else None

    with FaultProxy(script) as proxy:
        async with client(proxy.url) as c:
            with pytest.raises(httpx.ProxyError, match=f"^{status} {reason}$"):
                await c.get(f"{tls_target.url}/")
        assert proxy.ledger.connects == [hostport(tls_target)]
        assert proxy.ledger.targets() == {}


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        (close_mid_connect(), httpx.RemoteProtocolError),
        (close_mid_connect(b""), httpx.RemoteProtocolError),
        (garbage(), httpx.RemoteProtocolError),
        (Send(b"HTTP/1.1 200 OK\r\n\r\n", "reset"), httpx.ConnectError),
    ],
    ids=["partial-status", "nothing", "garbage", "reset-after-200"],
)
async def test_fault_proxy_breaks_the_handshake(
    fault: Send, error: type[Exception], tls_target: HypercornServer
) -> None:
    with FaultProxy(lambda request: fault) as proxy:
        async with client(proxy.url) as c:
            with pytest.raises(error):
                await c.get(f"{tls_target.url}/")
        assert proxy.ledger.targets() == {}  # no tunnel was ever opened


async def test_fault_proxy_trickles_then_tunnels(tls_target: HypercornServer) -> None:
    with FaultProxy(lambda request: trickle(0.002)) as proxy:
        async with client(proxy.url) as c:
            assert await gets(c, f"{tls_target.url}/") == [(200, b"hello")]
        assert proxy.ledger.stats(hostport(tls_target)).opened == 1
        assert trickle().data == ESTABLISHED


async def test_fault_proxy_never_answers(tls_target: HypercornServer) -> None:
    with FaultProxy(lambda request: never_answer()) as proxy:
        transport = httpx.AsyncHTTPTransport(proxy=proxy.url)
        async with httpx.AsyncClient(transport=transport, timeout=0.2) as c:
            with pytest.raises(httpx.ReadTimeout):
                await c.get(f"{tls_target.url}/")
        assert proxy.ledger.connects == [hostport(tls_target)]


async def test_ledger_wait_times_out() -> None:
    ledger = ProxyLedger()
    with pytest.raises(TimeoutError):
        await ledger.until(lambda led: led.stats("x:1").opened > 0, timeout=0.01)
