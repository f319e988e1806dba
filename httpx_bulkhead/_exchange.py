"""What the compartment needs from a connection and from one request/response exchange on
it, whatever the protocol: the seam between pool logic and HTTP/1.1 or HTTP/2 I/O."""

from __future__ import annotations

import contextlib
import enum
import itertools
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import NamedTuple, NoReturn, Protocol, TypeVar

import anyio
import httpx

from ._exceptions import Phase, RequestTimeout, raise_mapped
from ._streams import NetworkStream
from ._trace import TraceFn, Tracer

T = TypeVar("T")
A = TypeVar("A")

__all__ = [
    "ClosedEarly",
    "Connection",
    "Exchange",
    "Refused",
    "ResponseHead",
    "Timeouts",
    "Verdict",
    "body_chunks",
    "cut_verdict",
    "io_failed",
    "is_disconnect",
    "next_connection_id",
    "run_io",
    "run_waiting",
    "went_stale",
]


_ids = itertools.count(1)


def next_connection_id() -> int:
    """A process-wide number for a new connection (shown in logs and ExchangeInfo)."""
    return next(_ids)


class Verdict(enum.Enum):
    """Why a connection may not serve another request, as its protocol sees it (the
    compartment maps each to a discard reason of the pool)."""

    UNKNOWN_STATE = "unknown_state"  # an exchange was cut mid-way (timeout, cancel, early close)
    PEER_CLOSED = "peer_closed"  # the server closed it (seen idle, or on reuse)
    BROKEN = "broken"  # a network or protocol error
    NOT_REUSABLE = "not_reusable"  # the protocol says close (GOAWAY received: draining)
    PING_TIMEOUT = "ping_timeout"  # an HTTP/2 health-check PING was not answered


# unasync: use from .._exchange import ResponseHead
# unasync: skip
class ResponseHead(NamedTuple):
    status: int
    headers: list[tuple[bytes, bytes]]
    http_version: bytes  # b"HTTP/1.1", b"HTTP/2"
    reason: bytes
    stream_id: int | None = None
    # unasync: end


class Refused(Exception):
    """Internal: the server did not process the request (GOAWAY above its stream id, or
    REFUSED_STREAM), so it may be sent again on another connection (RFC 9113 §8.7).

    ``elsewhere``: the connection still takes requests (REFUSED_STREAM), but the replay
    should prefer another one."""

    def __init__(self, *, elsewhere: bool = False) -> None:
        super().__init__()
        self.elsewhere = elsewhere


@contextlib.asynccontextmanager
async def body_chunks(stream: AsyncIterable[bytes]) -> AsyncIterator[AsyncIterator[bytes]]:
    """Iterate a request body, closing its iterator even when sending stops early (an
    async generator left open is finalized at random, with a warning under trio)."""
    iterator = aiter(stream)
    try:
        yield iterator
    finally:
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            await aclose()


class ClosedEarly(Exception):
    """Internal: the response was closed before its body was read to the end."""


class Timeouts:
    """Per-operation timeouts (httpx's ``read``/``write``) and the total deadline.

    ``deadline`` is an instant of ``clock`` (the compartment's; ``None``: no deadline) set
    by ``Policy.request_timeout``; each operation waits at most until the earlier of the two.
    """

    __slots__ = ("clock", "compartment", "deadline", "read", "request_timeout", "write")

    def __init__(
        self,
        read: float | None,
        write: float | None,
        deadline: float | None,
        compartment: str = "",
        request_timeout: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        self.read = read
        self.write = write
        self.deadline = deadline
        #: For the message of ``RequestTimeout``: whose deadline, and its configured value.
        self.compartment = compartment
        self.request_timeout = request_timeout

    def expired(self, doing: str, request: httpx.Request) -> RequestTimeout:
        """The ``RequestTimeout`` to raise: the deadline passed while ``doing``."""
        limit = "" if self.request_timeout is None else f"={self.request_timeout:g} s"
        return RequestTimeout(
            f"compartment {self.compartment!r}: request_timeout{limit} passed {doing}",
            request=request,
        )

    def budget(self, op: float | None) -> tuple[float | None, bool]:
        """``(seconds, is_deadline)``: how long the next operation may take, and whether the
        total deadline (rather than the operation's own timeout) is what bounds it."""
        if self.deadline is None:
            return op, False
        left = self.deadline - self.clock()
        if op is None or left <= op:
            return max(left, 0.0), True
        return op, False


async def run_io(
    op: Callable[[A, float | None], Awaitable[T]],
    arg: A,
    phase: Phase,
    op_timeout: float | None,
    request: httpx.Request,
    timeouts: Timeouts,
) -> T:
    """``await op(arg, timeout)``, one ``NetStream`` operation, within its own timeout and
    the total deadline, mapping failures to httpx exceptions (``RequestTimeout`` when the
    deadline is what passed)."""
    limit, by_deadline = timeouts.budget(op_timeout)
    try:
        return await op(arg, limit)
    except Exception as exc:
        io_failed(exc, by_deadline, phase, request, timeouts)


async def run_waiting(
    wait: Callable[[], Awaitable[T]],
    phase: Phase,
    op_timeout: float | None,
    request: httpx.Request,
    timeouts: Timeouts,
) -> T:
    """Like ``run_io`` for any wait (``await wait()``, bounded with a cancel scope; a
    callable rather than an awaitable, so that the sync twin starts it inside the scope)."""
    limit, by_deadline = timeouts.budget(op_timeout)
    try:
        with anyio.fail_after(limit):
            return await wait()
    except Exception as exc:
        io_failed(exc, by_deadline, phase, request, timeouts)


_DOING: dict[Phase, str] = {
    "connect": "while connecting",
    "write": "while sending the request",
    "read": "while waiting for or reading the response",
}


def io_failed(
    exc: Exception, by_deadline: bool, phase: Phase, request: httpx.Request, timeouts: Timeouts
) -> NoReturn:
    """Raise the httpx exception for a failed I/O operation (``RequestTimeout`` when the
    total deadline, not the operation's own timeout, is what passed).  ``run_io``'s error
    path, also called by HTTP/1.1, which inlines ``run_io`` on its hot path."""
    if by_deadline and isinstance(exc, TimeoutError):
        raise timeouts.expired(_DOING[phase], request) from exc
    raise_mapped(exc, phase, request)


class Exchange(Protocol):
    """One request and its response on a connection."""

    #: The connection had served a request before this one.
    reused: bool
    #: A response byte (HTTP/1.1) or frame for this stream (HTTP/2) has arrived.
    received_any: bool
    #: A request byte was handed to the OS.
    wrote_any: bool
    #: Trace events of this exchange (set by ``send_request`` when the request is traced).
    tracer: Tracer | None
    #: The pool has had the exchange's end (set by ``Connections`` in the step right after
    #: the pool's answer): until then the exchange holds its connection (``reclaim``).
    settled: bool
    #: The pool's answer was asked for (set in the step right before the call): an end cut
    #: short from then until ``settled`` leaves the pool's record of the connection unknown.
    releasing: bool

    async def send_request(
        self, request: httpx.Request, timeouts: Timeouts, trace: TraceFn | None
    ) -> ResponseHead: ...

    async def receive_body(self, request: httpx.Request, timeouts: Timeouts) -> bytes | None: ...

    def finish_buffered(self) -> bool:
        """Consume what is left of the body without I/O; true if that reached its end."""
        ...

    def completed(self) -> tuple[bool, float | None]:
        """After the body was read: ``(connection reusable, Keep-Alive timeout hint)``."""
        ...

    def cut(self, exc: BaseException) -> Verdict | None:
        """The exchange was cut by ``exc``: settle its state without I/O (an HTTP/2 reset is
        queued, not sent).  Returns why the connection must be closed, or ``None`` when it
        stays usable (an HTTP/2 stream was reset: its state is known)."""
        ...

    async def abandon(self, exc: BaseException) -> Verdict | None:
        """``cut``, then send what it queued."""
        ...


class Connection(Protocol):
    """A pooled connection that can start exchanges."""

    @property
    def id(self) -> int: ...

    #: ``response.extensions["network_stream"]``: the connection, for inspection only.
    network_stream: NetworkStream
    #: The credential-free URL of the proxy the connection goes through, or ``None``.
    proxy: str | None

    def start_exchange(self, reused: bool) -> Exchange:
        """A new exchange; ``reused``: the connection has served a request before."""
        ...

    async def check_reusable(self) -> Verdict | None:
        """Before reuse after being idle: ``None`` if fine, else why to close it."""
        ...

    async def aclose(self) -> None: ...

    def abort(self) -> None:
        """Start closing without an await (see ``NetStream.abort``)."""
        ...


def cut_verdict(exc: BaseException, exchange: Exchange) -> Verdict:
    """Why a connection whose exchange ended with ``exc`` is closed (HTTP/1.1: always)."""
    if not isinstance(exc, Exception) or isinstance(
        exc, httpx.TimeoutException | RequestTimeout | ClosedEarly
    ):
        return Verdict.UNKNOWN_STATE  # cut by cancellation, a timeout or an early close
    if went_stale(exc, exchange):
        return Verdict.PEER_CLOSED
    return Verdict.BROKEN


def went_stale(exc: BaseException, exchange: Exchange) -> bool:
    """The server closed a *reused* connection while it was idle: ``exc`` is a disconnect
    before any response byte (the request may be sent again on a new connection)."""
    return exchange.reused and not exchange.received_any and is_disconnect(exc)


def is_disconnect(exc: BaseException) -> bool:
    """The peer went away (closed or reset) rather than answering badly."""
    return isinstance(exc, httpx.ReadError | httpx.WriteError | httpx.RemoteProtocolError)
