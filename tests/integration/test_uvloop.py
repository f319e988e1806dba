"""BulkheadTransport on uvloop's event loop (anyio's asyncio backend with ``use_uvloop``).

uvloop's transports are not subclasses of ``asyncio.Transport``; every request used to fail
with a bare ``AssertionError`` from the connect path.  Skipped when uvloop is not installed
(it is in the ``test`` extra wherever it builds)."""

from __future__ import annotations

import httpx
import pytest

from httpx_bulkhead import BulkheadTransport, Policy
from tests.resources import FdSnapshot, assert_no_fd_growth, settle_io
from tests.servers import HypercornServer, RawServer, keepalive_ok

pytest.importorskip("uvloop")

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.usefixtures("http1_parser"),
    pytest.mark.parametrize(
        "anyio_backend", [pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop")]
    ),
]

TIMEOUT = 10.0


async def test_requests_reuse_a_connection_under_uvloop(server: HypercornServer) -> None:
    transport = BulkheadTransport(default=Policy(max_concurrency=4))
    async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
        first = await client.get(f"{server.url}/")
        second = await client.post(f"{server.url}/echo", content=b"body")
        async with client.stream("GET", f"{server.url}/bytes/100000") as streamed:
            size = sum([len(chunk) async for chunk in streamed.aiter_raw()])
        (stats,) = transport.statistics().values()
    assert (first.status_code, second.status_code, streamed.status_code) == (200, 200, 200)
    assert (second.content, size) == (b"body", 100_000)
    assert second.extensions["bulkhead"].reused is True
    assert (stats.completed, stats.failed, stats.connections_created) == (3, 0, 1), stats
    (closed,) = transport.statistics().values()
    assert (closed.connections, closed.running) == (0, 0), closed


async def test_no_descriptor_left_and_refused_connect_is_connect_error_under_uvloop() -> None:
    # uvloop opens descriptors of its own on first use (/dev/null): let it, then count.
    with RawServer(keepalive_ok(b"warm")) as warm:
        async with httpx.AsyncClient(transport=BulkheadTransport(), timeout=TIMEOUT) as client:
            assert (await client.get(f"{warm.url}/")).text == "warm"
    await settle_io()
    before = FdSnapshot.take()
    with RawServer(keepalive_ok(b"one")) as srv:
        url = srv.url
        transport = BulkheadTransport()
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
            responses = [await client.get(f"{url}/{n}") for n in range(3)]
        assert [r.text for r in responses] == ["one"] * 3
        assert [r.extensions["bulkhead"].reused for r in responses] == [False, True, True]
        assert srv.connections == 1
    # The server is gone (its sockets closed with it): nobody listens on its port now.
    async with httpx.AsyncClient(transport=BulkheadTransport(), timeout=TIMEOUT) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"{url}/gone")
    await settle_io()
    assert_no_fd_growth(before, "requests and a refused connect under uvloop")
