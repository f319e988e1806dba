"""Sockets: ``uds=`` against a real Unix-socket server, ``socket_options`` (applied, and
a failing one), and no descriptor left open on any of these paths."""

from __future__ import annotations

import gc
import socket
import warnings
from pathlib import Path

import httpx
import pytest

from httpx_bulkhead import BulkheadTransport
from tests.resources import FdSnapshot, assert_no_fd_growth, settle_io
from tests.servers import RawServer, keepalive_ok

pytestmark = pytest.mark.anyio

TIMEOUT = 10.0
#: An option number no kernel knows: ``setsockopt`` fails with ENOPROTOOPT.
BAD_OPTION = (socket.SOL_SOCKET, 0x7BAD, 1)


@pytest.fixture
def uds_path(tmp_path: Path) -> str:
    path = str(tmp_path / "server.sock")
    assert len(path) < 100, "AF_UNIX paths are limited to 107 bytes"
    return path


async def test_uds_round_trips_against_a_unix_socket_server(uds_path: str) -> None:
    """``uds=`` used to fail every request: TCP_NODELAY was set on the Unix socket
    (``[Errno 95] Operation not supported``)."""
    before = FdSnapshot.take()
    with RawServer(keepalive_ok(b"over-uds"), uds=uds_path) as srv:
        transport = BulkheadTransport(uds=uds_path)
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
            first = await client.get(f"{srv.url}/a")
            second = await client.post(f"{srv.url}/b", content=b"body")
        assert (first.status_code, first.text, second.text) == (200, "over-uds", "over-uds")
        assert second.extensions["bulkhead"].reused is True
        assert srv.connections == 1
        # The default transport, given the same server, agrees.
        async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=uds_path)) as client:
            assert (await client.get(f"{srv.url}/a")).text == "over-uds"
        await settle_io()
    assert_no_fd_growth(before, "uds round trips")


async def test_uds_nobody_listening_is_connect_error(uds_path: str) -> None:
    before = FdSnapshot.take()
    transport = BulkheadTransport(uds=uds_path)
    async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
        for _ in range(5):
            with pytest.raises(httpx.ConnectError):
                await client.get("http://localhost/")
    await settle_io()
    assert_no_fd_growth(before, "refused Unix-socket connects")


@pytest.mark.parametrize("where", ["tcp", "uds"])
async def test_failing_socket_option_closes_the_socket(where: str, uds_path: str) -> None:
    """A ``socket_options`` value ``setsockopt`` refuses: ``ConnectError``, and the socket
    is closed (it used to stay open, registered with the event loop under asyncio)."""
    uds = uds_path if where == "uds" else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        before = FdSnapshot.take()
        with RawServer(keepalive_ok(b"ok"), uds=uds) as srv:
            transport = BulkheadTransport(uds=uds, socket_options=[BAD_OPTION])
            async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
                for _ in range(10):
                    with pytest.raises(httpx.ConnectError) as caught_error:
                        await client.get(srv.url)
                    assert isinstance(caught_error.value.__cause__, OSError)
                (stats,) = transport.statistics().values()
                assert (stats.failed, stats.connections, stats.running) == (10, 0, 0), stats
            await settle_io()
        assert_no_fd_growth(before, f"failed setsockopt ({where})")
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], caught


async def test_uds_with_socket_options_applies_them(uds_path: str) -> None:
    option = (socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    with RawServer(keepalive_ok(b"ok"), uds=uds_path) as srv:
        transport = BulkheadTransport(uds=uds_path, socket_options=[option])
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
            response = await client.get(srv.url)
            sock = response.extensions["network_stream"].get_extra_info("socket")
            assert sock.family == socket.AF_UNIX
            # Linux doubles the value it is given (bookkeeping overhead).
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) >= 64 * 1024
