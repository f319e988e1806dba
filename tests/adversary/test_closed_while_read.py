"""An independent review's attack: a response closed while its body is still being read
(by another thread, another task, or an iteration the caller left and resumed).  The
reader must see an error (``httpx.StreamClosed``, or the read error of a read that was in
progress), never a clean end of a body it did not get whole, over HTTP/1.1 and HTTP/2, on
both transports.  Counters agree afterwards and the next request succeeds.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import httpx
import pytest

from httpx_bulkhead import BulkheadHTTPTransport, BulkheadTransport, Policy
from tests.resources import FdSnapshot, assert_no_fd_growth, settle_io
from tests.servers import RawServer
from tests.servers.h2script import H2ScriptServer
from tests.servers.raw import RawConn

SIZE = 400_000


def big_body(conn: RawConn) -> None:
    while conn.read_request() is not None:
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % SIZE)
        conn.send(b"x" * SIZE)


@pytest.fixture(params=["http/1.1", "h2"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, dict[str, bool]]]:
    gc.collect()
    before = FdSnapshot.take()
    if request.param == "h2":
        with H2ScriptServer() as h2:
            yield f"{h2.url}/bytes/{SIZE}", {"http1": False, "http2": True}
    else:
        with RawServer(big_body) as h1:
            yield f"{h1.url}/", {}
    assert_no_fd_growth(before, "after the test")


def test_sync_a_body_closed_mid_read_is_never_a_clean_end(
    server: tuple[str, dict[str, bool]],
) -> None:
    url, options = server
    transport = BulkheadHTTPTransport(default=Policy(max_concurrency=2), **options)  # type: ignore[arg-type]
    with httpx.Client(transport=transport, timeout=5) as client:
        # The caller's own iteration, left and resumed after close().
        response = client.send(client.build_request("GET", url), stream=True)
        chunks = response.iter_raw()
        got = len(next(chunks))
        response.close()
        with pytest.raises(httpx.StreamClosed):
            got += sum(len(chunk) for chunk in chunks)
        assert got < SIZE

        # Another thread reading it while this one closes it.
        response = client.send(client.build_request("GET", url), stream=True)
        first = threading.Event()
        resume = threading.Event()
        seen: list[object] = []

        def reader() -> None:
            try:
                total = 0
                for chunk in response.iter_raw():
                    total += len(chunk)
                    first.set()
                    resume.wait(5)
                seen.append(total)
            except httpx.StreamClosed as exc:
                seen.append(exc)

        thread = threading.Thread(target=reader)
        thread.start()
        assert first.wait(5)
        response.close()
        resume.set()
        thread.join(5)
        assert not thread.is_alive()
        assert len(seen) == 1 and isinstance(seen[0], httpx.StreamClosed), seen
        [stats] = transport.statistics().values()
        assert (stats.running, stats.in_use_connections, stats.open_streams) == (0, 0, 0)
        assert stats.acquired == stats.completed + stats.failed + stats.cancelled
        assert len(client.get(url).content) == SIZE


@pytest.mark.anyio
async def test_async_a_body_closed_mid_read_is_never_a_clean_end(
    anyio_backend: str, server: tuple[str, dict[str, bool]]
) -> None:
    url, options = server
    transport = BulkheadTransport(default=Policy(max_concurrency=2), **options)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, timeout=5) as client:
        response = await client.send(client.build_request("GET", url), stream=True)
        chunks = response.aiter_raw()
        got = len(await chunks.__anext__())
        await response.aclose()
        with pytest.raises(httpx.StreamClosed):
            async for chunk in chunks:
                got += len(chunk)
        assert got < SIZE
        [stats] = transport.statistics().values()
        assert (stats.running, stats.in_use_connections, stats.open_streams) == (0, 0, 0)
        assert len((await client.get(url)).content) == SIZE
    await settle_io()
