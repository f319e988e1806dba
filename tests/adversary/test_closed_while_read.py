"""An independent review's attack: a response closed while its body is still being read
(by another thread, another task, or an iteration the caller left and resumed).  The
reader must see an error (``httpx.StreamClosed``, or the read error of a read that was in
progress), never a clean end of a body it did not get whole, over HTTP/1.1 and HTTP/2, on
both transports.  Counters agree afterwards and the next request succeeds.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
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


def _waiting_in_poll(thread: threading.Thread) -> bool:
    """Whether ``thread`` is blocked in the sync transport's socket wait right now."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == "_poll" and frame.f_code.co_filename.endswith("_blocking.py"):
            return True
        frame = frame.f_back
    return False


def test_sync_a_read_blocked_on_the_socket_when_another_thread_closes_is_stream_closed() -> None:
    """The reader is inside the socket wait (the server holds the rest of the body) when
    another thread closes the response: it gets ``httpx.StreamClosed``, not the read error
    of a socket closed under it (``[Errno 9] Bad file descriptor``)."""

    def half_body(conn: RawConn) -> None:
        if conn.read_request() is not None:
            conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 10000\r\n\r\n" + b"x" * 1000)
            conn.wait("done")

    gc.collect()
    before = FdSnapshot.take()
    with RawServer(half_body) as srv:
        transport = BulkheadHTTPTransport(default=Policy(max_concurrency=1))
        with httpx.Client(transport=transport, timeout=5) as client:
            response = client.send(client.build_request("GET", f"{srv.url}/"), stream=True)
            seen: list[object] = []

            def reader() -> None:
                try:
                    seen.append(sum(len(chunk) for chunk in response.iter_raw()))
                except Exception as exc:  # what it raises is the test's verdict
                    seen.append(exc)

            thread = threading.Thread(target=reader)
            thread.start()
            deadline = time.monotonic() + 5
            while not _waiting_in_poll(thread) and time.monotonic() < deadline:
                time.sleep(0.001)  # a gate on the thread's own state, polled
            assert _waiting_in_poll(thread)
            response.close()
            thread.join(5)
            srv.set_event("done")
            assert not thread.is_alive()
            assert len(seen) == 1 and isinstance(seen[0], httpx.StreamClosed), seen
            [stats] = transport.statistics().values()
            assert (stats.running, stats.in_use_connections) == (0, 0)
            assert stats.acquired == stats.completed + stats.failed + stats.cancelled
    assert_no_fd_growth(before, "after the test")
