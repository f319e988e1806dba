"""``response.extensions["network_stream"]``, side by side with httpx's default transport:
``get_extra_info`` gives the same answers for the same server, on TCP and TLS, HTTP/1.1
and HTTP/2, under both backends.  What differs, by design: the I/O methods are refused
(the connection belongs to the pool), and ``"socket"`` is always a ``socket.socket``
(httpcore gives trio's socket wrapper under trio)."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from httpx_bulkhead import BulkheadTransport
from tests.servers import HypercornServer, RawServer, TestApp, default_server_tls, keepalive_ok

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, HypercornServer]]:
    app = TestApp()
    with (
        HypercornServer(app) as plain,
        HypercornServer(app, tls=default_server_tls(), alpn=("http/1.1",)) as tls1,
        HypercornServer(app, tls=default_server_tls()) as tls2,
    ):
        yield {"plain": plain, "tls1": tls1, "tls2": tls2}


def answers(response: httpx.Response) -> dict[str, Any]:
    """What a caller learns from the network stream, in comparable form."""
    stream = response.extensions["network_stream"]
    ssl_object = stream.get_extra_info("ssl_object")
    sock = stream.get_extra_info("socket")
    client_addr = stream.get_extra_info("client_addr")
    return {
        "tls": None
        if ssl_object is None
        else (
            type(ssl_object),
            ssl_object.version(),
            ssl_object.selected_alpn_protocol(),
            ssl_object.getpeercert()["subjectAltName"],
        ),
        "server_addr": stream.get_extra_info("server_addr"),
        "client_host": client_addr[0],
        # the server saw the request come from client_addr: x-conn is "ip:port"
        "client_addr_matches": response.headers["x-conn"] == "{}:{}".format(*client_addr),
        "socket": (sock.family, sock.type, sock.getpeername()),
        "readable_once_read": stream.get_extra_info("is_readable"),
        "unknown": stream.get_extra_info("no-such-thing"),
    }


@pytest.mark.parametrize("server", ["plain", "tls1", "tls2"])
async def test_get_extra_info_agrees_with_the_default_transport(
    servers: dict[str, HypercornServer], server: str
) -> None:
    srv = servers[server]
    results = {}
    for name, transport in {
        "default": httpx.AsyncHTTPTransport(
            verify=default_server_tls().client_ssl_context(), http2=True
        ),
        "bulkhead": BulkheadTransport(verify=default_server_tls().client_ssl_context(), http2=True),
    }.items():
        async with httpx.AsyncClient(transport=transport, timeout=5) as client:
            response = await client.get(srv.url + "/")
            again = await client.get(srv.url + "/")
            results[name] = answers(response)
            same = again.extensions["network_stream"].get_extra_info("client_addr")
            assert same == response.extensions["network_stream"].get_extra_info("client_addr")
    assert results["bulkhead"] == results["default"]
    bulkhead = results["bulkhead"]
    assert bulkhead["server_addr"] == ("127.0.0.1", srv.port)
    assert bulkhead["client_addr_matches"] is True
    assert bulkhead["readable_once_read"] is False
    expected_alpn = {"plain": None, "tls1": "http/1.1", "tls2": "h2"}[server]
    if expected_alpn is None:
        assert bulkhead["tls"] is None
    else:
        assert bulkhead["tls"][0] is ssl.SSLObject and bulkhead["tls"][2] == expected_alpn


async def test_io_methods_are_refused(servers: dict[str, HypercornServer]) -> None:
    """The connection is the pool's: reading, writing, closing or upgrading it through
    the extension would corrupt the next exchange on it."""
    transport = BulkheadTransport()
    async with httpx.AsyncClient(transport=transport, timeout=5) as client:
        response = await client.get(servers["plain"].url + "/")
        stream = response.extensions["network_stream"]
        for attempt in (stream.read(10), stream.write(b"x"), stream.aclose(), stream.start_tls()):
            with pytest.raises(RuntimeError, match="get_extra_info"):
                await attempt
        again = await client.get(servers["plain"].url + "/")
        assert again.extensions["bulkhead"].reused is True
        assert again.extensions["network_stream"] is stream  # one per connection


async def test_is_readable_reports_an_unread_body(servers: dict[str, HypercornServer]) -> None:
    async with httpx.AsyncClient(transport=BulkheadTransport(), timeout=5) as client:
        async with client.stream("GET", servers["plain"].url + "/bytes/500000") as response:
            stream = response.extensions["network_stream"]
            await response.aread()
            assert stream.get_extra_info("is_readable") is False


async def test_unix_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    with RawServer(keepalive_ok(b"ok"), uds=path) as srv:
        async with httpx.AsyncClient(transport=BulkheadTransport(uds=path), timeout=5) as client:
            response = await client.get(srv.url)
        stream = response.extensions["network_stream"]
        assert stream.get_extra_info("socket").family == socket.AF_UNIX
        assert stream.get_extra_info("server_addr") is None  # closed with the client
        async with httpx.AsyncClient(transport=BulkheadTransport(uds=path), timeout=5) as client:
            response = await client.get(srv.url)
            stream = response.extensions["network_stream"]
            assert stream.get_extra_info("server_addr") == path
            assert stream.get_extra_info("client_addr") == ""
            assert stream.get_extra_info("ssl_object") is None
