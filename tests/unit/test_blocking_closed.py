"""The sync transport's socket stream, cut by its own ``close()``: a read or write then
fails with "connection was closed" (mapped to ``httpx.ReadError``/``WriteError``), never
with the errno of a descriptor that is gone (``[Errno 9] Bad file descriptor``) nor as a
peer's clean end of stream."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from httpx_bulkhead._blocking import SocketStream
from httpx_bulkhead._exceptions import raise_mapped


@pytest.fixture
def pair() -> Iterator[tuple[SocketStream, socket.socket]]:
    ours, theirs = socket.socketpair()
    stream = SocketStream(ours)
    yield stream, theirs
    stream.close()
    theirs.close()


def test_a_read_after_close_says_the_connection_was_closed(
    pair: tuple[SocketStream, socket.socket],
) -> None:
    stream, _ = pair
    stream.close()
    with pytest.raises(ConnectionAbortedError, match=r"^connection was closed$"):
        stream.receive(1024, 5.0)


def test_a_write_after_close_says_the_connection_was_closed(
    pair: tuple[SocketStream, socket.socket],
) -> None:
    stream, _ = pair
    stream.close()
    with pytest.raises(ConnectionAbortedError, match=r"^connection was closed$"):
        stream.send(b"GET / HTTP/1.1\r\n\r\n", 5.0)


def test_a_read_blocked_when_another_thread_closes_is_not_a_clean_end(
    pair: tuple[SocketStream, socket.socket],
) -> None:
    """The reader may be blocked in poll (woken by the shutdown: recv gives b"") or not
    yet there (recv on a closed descriptor): either way it learns the truth."""
    stream, _ = pair
    outcome: list[BaseException | bytes] = []
    started = threading.Event()

    def reader() -> None:
        started.set()
        try:
            outcome.append(stream.receive(1024, 5.0))
        except BaseException as exc:  # recorded for the assertion
            outcome.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    started.wait(5)
    stream.close()
    thread.join(5)
    assert not thread.is_alive()
    [result] = outcome
    assert isinstance(result, ConnectionAbortedError), result
    assert str(result) == "connection was closed"


def test_mapped_it_is_a_read_error_without_an_errno(
    pair: tuple[SocketStream, socket.socket],
) -> None:
    stream, _ = pair
    stream.close()
    request = httpx.Request("GET", "http://127.0.0.1/")
    with pytest.raises(httpx.ReadError, match=r"^connection was closed$"):
        try:
            stream.receive(1024, 5.0)
        except OSError as exc:
            raise_mapped(exc, "read", request)
