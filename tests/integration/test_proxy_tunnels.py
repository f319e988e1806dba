"""The proxy handshakes against real proxies on 127.0.0.1 (tinyproxy, pproxy, our SOCKS5
egress) and scripted faults: a tunnel opens, carries a request to the target and back; a
refusal, garbage, a close mid-handshake are ``httpx.ProxyError``s naming the proxy; a
trickled answer works; a proxy that never answers is cut by the caller's deadline.

The connector's wiring (``BulkheadTransport(proxy=...)``) is tested elsewhere; here the
stream to the proxy is a plain anyio TCP stream."""

from __future__ import annotations

import base64
import ssl

import anyio
import httpx
import pytest

from httpx_bulkhead._proxied import run_handshake
from httpx_bulkhead._proxy import ConnectHandshake, Handshake, Socks5Handshake, tunnel_authority
from httpx_bulkhead._stacked import StackedTLSStream
from httpx_bulkhead._streams import AnyioStream
from httpx_bulkhead._tls import TLSEngine
from tests.servers import HypercornServer, TestApp, default_server_tls
from tests.servers.proxies import (
    FaultProxy,
    PProxy,
    ProxyEgress,
    TinyProxy,
    close_mid_connect,
    garbage,
    never_answer,
    refuse,
    trickle,
)
from tests.servers.tls import wrong_host_server_tls

pytestmark = pytest.mark.anyio
TIMEOUT = 10.0
SECRET = "pa55-w0rd"


async def open_stream(port: int) -> AnyioStream:
    return AnyioStream(await anyio.connect_tcp("127.0.0.1", port))


async def tunnel_get(port: int, handshake: Handshake, host: str) -> bytes:
    """Open the tunnel through the proxy on ``port``, send a GET through it, return what
    comes back up to the end of the response head."""
    stream = await open_stream(port)
    try:
        with anyio.fail_after(TIMEOUT):
            received = await run_handshake(stream, handshake, TIMEOUT)
            await stream.send(f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\n".encode(), TIMEOUT)
            while b"\r\n\r\n" not in received:
                data = await stream.receive(65536, TIMEOUT)
                assert data, "the tunnel closed"
                received += data
        return received
    finally:
        await stream.aclose()


async def test_connect_through_tinyproxy(tinyproxy: TinyProxy, target: HypercornServer) -> None:
    authority = tunnel_authority("127.0.0.1", target.port)
    handshake = ConnectHandshake(tinyproxy.url, authority)
    answer = await tunnel_get(int(tinyproxy.url.rsplit(":", 1)[1]), handshake, authority)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert 200 <= handshake.status < 300
    assert ("CONNECT", authority) in tinyproxy.requests()


async def test_tinyproxy_basic_auth(egress: ProxyEgress, target: HypercornServer) -> None:
    authority = tunnel_authority("127.0.0.1", target.port)
    with TinyProxy(egress, auth=("user", SECRET)) as proxy:
        port = int(proxy.url.rsplit(":", 1)[1])
        good = b"Basic " + base64.b64encode(f"user:{SECRET}".encode())
        answer = await tunnel_get(
            port,
            ConnectHandshake(proxy.url, authority, ((b"Proxy-Authorization", good),)),
            authority,
        )
        assert answer.startswith(b"HTTP/1.1 200 ")
        bad = b"Basic " + base64.b64encode(b"user:wrong")
        with pytest.raises(
            httpx.ProxyError, match=r"refused the tunnel to 127.0.0.1:\d+: 401 Unauthorized$"
        ) as info:
            await tunnel_get(
                port,
                ConnectHandshake(proxy.url, authority, ((b"Proxy-Authorization", bad),)),
                authority,
            )
        assert SECRET not in str(info.value) and "wrong" not in str(info.value)
        # Without credentials tinyproxy asks for them (407); with wrong ones it says 401.
        with pytest.raises(httpx.ProxyError, match=r": 407 Proxy Authentication Required$"):
            await tunnel_get(port, ConnectHandshake(proxy.url, authority), authority)


@pytest.mark.parametrize("name", [False, True], ids=["address", "name"])
async def test_socks5_through_pproxy(
    egress: ProxyEgress, target: HypercornServer, name: bool
) -> None:
    host = "localhost" if name else "127.0.0.1"
    with PProxy("socks5", egress) as proxy:
        port = int(proxy.url.rsplit(":", 1)[1])
        answer = await tunnel_get(port, Socks5Handshake(proxy.url, host, target.port, None), host)
        assert answer.startswith(b"HTTP/1.1 200 ")
        assert proxy.requests() == [("socks5", f"{host}:{target.port}")]


async def test_socks5_with_credentials_against_our_egress(target: HypercornServer) -> None:
    with ProxyEgress(auth=("user", SECRET)) as socks:
        answer = await tunnel_get(
            socks.port, Socks5Handshake(socks.url, "127.0.0.1", target.port, ("user", SECRET)), "x"
        )
        assert answer.startswith(b"HTTP/1.1 200 ")
        with pytest.raises(httpx.ProxyError, match="refused the user name and password") as info:
            await tunnel_get(
                socks.port,
                Socks5Handshake(socks.url, "127.0.0.1", target.port, ("user", "no")),
                "x",
            )
        assert SECRET not in str(info.value)
        with pytest.raises(httpx.ProxyError, match="accepts none of our authentication methods"):
            await tunnel_get(
                socks.port, Socks5Handshake(socks.url, "127.0.0.1", target.port, None), "x"
            )
        assert socks.ledger.stats(f"127.0.0.1:{target.port}").opened == 1


async def test_a_socks5_refusal_names_the_reply(target: HypercornServer) -> None:
    with ProxyEgress(script=lambda stage, t: 5 if stage == "connect" else None) as socks:
        with pytest.raises(
            httpx.ProxyError, match=r"refused the tunnel to 127.0.0.1:\d+: connection refused"
        ):
            await tunnel_get(
                socks.port, Socks5Handshake(socks.url, "127.0.0.1", target.port, None), "x"
            )


@pytest.mark.parametrize(
    ("fault", "says"),
    [
        (refuse(407, "Proxy Authentication Required"), ": 407 Proxy Authentication Required"),
        (refuse(403, "Forbidden"), ": 403 Forbidden"),
        (refuse(502, "Bad Gateway"), ": 502 Bad Gateway"),
        (garbage(), "sent an invalid answer to CONNECT"),
        (close_mid_connect(), "closed the connection before answering CONNECT"),
        (close_mid_connect(b""), "closed the connection before answering CONNECT"),
    ],
    ids=["407", "403", "502", "garbage", "mid-head", "nothing"],
)
async def test_connect_faults_are_proxy_errors(
    target: HypercornServer, fault: object, says: str
) -> None:
    authority = tunnel_authority("127.0.0.1", target.port)
    with FaultProxy(script=lambda request: fault) as proxy:  # type: ignore[arg-type,return-value]
        with pytest.raises(httpx.ProxyError) as info:
            await tunnel_get(proxy.port, ConnectHandshake(proxy.url, authority), authority)
        assert str(info.value).startswith(f"proxy {proxy.url} ")
        assert says in str(info.value)
        assert proxy.ledger.targets() == {}  # no tunnel was opened


async def test_a_trickled_connect_answer_opens_the_tunnel(target: HypercornServer) -> None:
    authority = tunnel_authority("127.0.0.1", target.port)
    with FaultProxy(script=lambda request: trickle(0.001)) as proxy:
        answer = await tunnel_get(proxy.port, ConnectHandshake(proxy.url, authority), authority)
    assert answer.startswith(b"HTTP/1.1 200 ")


async def test_a_proxy_that_never_answers_is_cut_by_the_deadline(target: HypercornServer) -> None:
    authority = tunnel_authority("127.0.0.1", target.port)
    with FaultProxy(script=lambda request: never_answer()) as proxy:
        stream = await open_stream(proxy.port)
        try:
            with pytest.raises(TimeoutError):
                await run_handshake(stream, ConnectHandshake(proxy.url, authority), 0.05)
        finally:
            await stream.aclose()


async def stacked_get(
    proxy_port: int, target_port: int, alpn: list[str]
) -> tuple[bytes, StackedTLSStream]:
    """TLS to the https proxy, CONNECT, TLS to the target inside it, GET."""
    tls = default_server_tls()
    stream = await open_stream(proxy_port)
    with anyio.fail_after(TIMEOUT):
        await stream.start_tls(TLSEngine(tls.client_ssl_context(), "127.0.0.1"))
        authority = tunnel_authority("127.0.0.1", target_port)
        await run_handshake(
            stream, ConnectHandshake(f"https://127.0.0.1:{proxy_port}", authority), TIMEOUT
        )
        inner = StackedTLSStream(stream, TLSEngine(tls.client_ssl_context(alpn=alpn), "127.0.0.1"))
        try:
            await inner.handshake(TIMEOUT)
            await inner.send(f"GET / HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode(), TIMEOUT)
            received = b""
            while b"hello" not in received:
                data = await inner.receive(65536, TIMEOUT)
                assert data, "the tunnel closed"
                received += data
        except BaseException:
            await inner.aclose()
            raise
    return received, inner


async def test_tls_inside_an_https_proxy(egress: ProxyEgress, tls_target: HypercornServer) -> None:
    before = egress.ledger.stats(f"127.0.0.1:{tls_target.port}").opened
    with PProxy("https", egress, tls=default_server_tls()) as proxy:
        port = int(proxy.url.rsplit(":", 1)[1])
        received, inner = await stacked_get(port, tls_target.port, ["http/1.1"])
        try:
            assert received.startswith(b"HTTP/1.1 200 ")
            assert inner.alpn == "http/1.1"
            assert inner.ssl_object.server_hostname == "127.0.0.1"
            assert not inner.is_readable()  # the whole response was read
        finally:
            await inner.aclose()
        assert egress.ledger.stats(f"127.0.0.1:{tls_target.port}").opened == before + 1


async def test_the_target_certificate_is_checked_inside_the_tunnel(egress: ProxyEgress) -> None:
    with (
        HypercornServer(TestApp(), tls=wrong_host_server_tls()) as wrong,
        PProxy("https", egress, tls=default_server_tls()) as proxy,
    ):
        port = int(proxy.url.rsplit(":", 1)[1])
        with pytest.raises(ssl.SSLCertVerificationError):
            await stacked_get(port, wrong.port, ["http/1.1"])
