"""One HTTP/2 connection, driven by h2 over an anyio byte stream.

Theory of operation
-------------------
On HTTP/2 a request borrows a *stream*; the connection carries up to ``cap`` of them, where
``cap = min(peer's SETTINGS_MAX_CONCURRENT_STREAMS, our max_streams_per_connection,
MAX_STREAMS)`` (RFC 9113 §5.1.2).  The cap is one stream until the peer's first SETTINGS
frame arrives, and follows the peer whenever it changes: every change is reported to the
pool (``on_cap``), which admits new streams only below it, so a lowered cap lets streams in
flight finish and a raised one wakes waiters at once.

There is no background task (a transport owns no task group).  The task that needs the next
frame becomes the *reader* if nobody is reading; the others sleep on their own wake-up event.
The reader dispatches every frame it reads to the stream it belongs to and wakes that stream;
when it stops reading (it got what it wanted, was cancelled or timed out) it wakes one sleeper
to take over.  So a stream is never stuck behind another stream's read, and one stream's
timeout or cancellation costs only that stream.  Every wait (for a response, for send
window, for a PING's verdict) is a ``wait_until(condition)``: it ends when the condition
holds, the connection breaks (every sleeper is woken) or its own deadline passes, and the
conditions include the stream's *fate* (reset, refused, answered), so no wait outlives it.
Under asyncio (a plain ``AsyncioStream``) a stream's wait for its response is
``wait_timed``, the same roles and hand-over with the read timeout kept by loop timers
(a bare future for a sleeper, ``receive``'s own timeout for the reader) instead of a
cancel scope and an ``anyio.Event``; and ``flush`` writes at once, with no lock or scope,
when nobody else is writing and the transport takes the bytes without waiting.  These are
the per-request hot path (issue 18): each cancel scope, event and lock checkpoint costs
more than h2's work on a small response.

``_streams`` holds exactly the streams h2 counts as open (not closed), so our count, h2's
and the pool's agree: a stream leaves it when both sides have ended it, when either side
resets it, or when a GOAWAY refuses it (we then reset it in h2 too, which h2 needs to stop
counting it; the server ignores frames on streams it refused, §6.8).

Uploads (§8.1): informational (1xx) responses do not stop a request body.  A final response
of 300 or more, or a complete response, does (the server does not want the rest; a 2xx that
is still being sent may be a full-duplex exchange, as Go's transport assumes), and so do a
reset, a GOAWAY that refuses the stream and a broken connection.  A stream whose upload
stopped early is reset (RST_STREAM CANCEL) as soon as its response is complete (nothing is
lost then, and the frame goes out with the reader's next write), so neither side counts it
open afterwards.

State stays known when a stream is cut: the stream is reset (RST_STREAM CANCEL) and the
connection goes on serving others.  Stream errors stay stream errors: a reset by the peer,
or a response body that contradicts its content-length (§8.1.1; see ``_H2Connection``),
fails that stream only.  Only connection-level failures (read/write error, protocol error,
unanswered PING) break the connection, failing its streams with the matching httpx error;
after that nothing more is written but h2's GOAWAY (§5.4.1).  Writes are serialized by a
lock and shielded from cancellation (a half-written frame would corrupt the connection for
every stream); they are bounded by a timeout instead.  No h2 exception leaves this module.

GOAWAY (§6.8): no new stream; streams above ``last_stream_id`` were not processed and fail
with ``Refused`` (the compartment replays them on another connection); the others finish;
the pool closes the connection when its last stream ends.  REFUSED_STREAM (§8.7) likewise.
A stream that already has its response head was processed, whatever a GOAWAY says: it is
left to finish, and a REFUSED_STREAM on it is an ordinary reset (never a replay).

PING health check: a connection silent for ``ping_after`` is checked before reuse.  While
the PING is in flight, requests given the connection wait for the verdict before sending
anything; if the PING goes unanswered they are ``Refused`` (nothing was sent) and go
elsewhere.  Only an ACK carrying our 8 bytes answers it (§6.7).

Windows: each stream's receive window is the protocol's 65,535 bytes; the connection's is
``max(RECEIVE_WINDOW, cap x 65,535)``, so streams whose bodies are not being read (held
streamed responses) can fill at most their own windows and never starve the others.  A
send window a lowered SETTINGS_INITIAL_WINDOW_SIZE took below zero holds back even the
empty DATA frame that ends a body (§6.9.2).
"""

from __future__ import annotations

# unasync: skip
import asyncio

# unasync: end
import contextlib
import os
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterable, Callable
from typing import Any, NoReturn

import anyio
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import httpx

from ._config import Origin
from ._exchange import (
    Refused,
    ResponseHead,
    Timeouts,
    Verdict,
    body_chunks,
    cut_verdict,
    next_connection_id,
    run_io,
    run_waiting,
)
from ._h2frames import FrameSizeError, FrameSplitter
from ._h2headers import request_headers, response_head
from ._streams import NetStream, NetworkStream
from ._trace import TraceFn, Tracer, emit

__all__ = ["DEFAULT_PEER_STREAMS", "MAX_STREAMS", "HTTP2Connection"]

#: Streams allowed when the peer's SETTINGS do not mention SETTINGS_MAX_CONCURRENT_STREAMS
#: (unlimited by the RFC; 100 is the floor it recommends servers to allow).
DEFAULT_PEER_STREAMS = 100
#: Each stream's receive window: the protocol's initial one, which we do not raise (some
#: servers, hypercorn among them, do not apply a larger SETTINGS_INITIAL_WINDOW_SIZE to the
#: streams they send on); h2 grants it again as the body is consumed.
STREAM_WINDOW = 65_535
#: Our connection-level receive window, at least: large, so concurrent downloads do not
#: stall on WINDOW_UPDATE round trips.  It grows to ``cap x STREAM_WINDOW`` with the cap.
RECEIVE_WINDOW = 2**24
#: Streams per connection at most: ``cap x STREAM_WINDOW`` must fit h2's largest window.
MAX_STREAMS = (2**31 - 1) // STREAM_WINDOW
READ_SIZE = 65536
#: How much longer than a PING check's owner the requests waiting on its verdict wait.
PING_GRACE = 0.05
#: Longest a shielded write may take when httpx gives no write timeout.
MAX_SHIELDED_WRITE = 60.0
#: Longest the check of an idle connection reads what arrived while it was idle: only the
#: end of a TLS record can be missing, and a peer that does not send it within this bound
#: is not waited on (the connection is discarded).
IDLE_READ_BOUND = 0.1

#: h2's configuration: bytes headers; the outbound header list goes out as
#: ``_h2headers.request_headers`` built it (which does h2's normalisation and validation,
#: at a fraction of their cost); inbound headers stay validated by h2.  Never mutated.
H2_CONFIG = h2.config.H2Configuration(
    client_side=True,
    header_encoding=None,
    validate_outbound_headers=False,
    normalize_outbound_headers=False,
)

#: Stand-ins for flushes that serve no one request (acks, resets, PINGs): errors there only
#: mark the connection broken, and each stream then raises with its own request.
_INTERNAL = httpx.Request("GET", "http://internal.invalid/")
_NO_TIMEOUTS = Timeouts(None, None, None)

_CANCEL = h2.errors.ErrorCodes.CANCEL

#: Why a connection whose write was cut part-way (``flush``) is broken.
_WRITE_CUT = (
    "a write on the connection was cut part-way (an interrupt or a cancellation the write"
    " could not hold off): how much of it was sent is unknown, so is the connection's state"
)


class _BodyLengthMismatch(h2.events.Event):
    """Ours, not h2's: a response's DATA contradicts its content-length; the stream has
    been reset."""

    def __init__(self, stream_id: int, message: str) -> None:
        self.stream_id = stream_id
        self.message = message


class _H2Connection(h2.connection.H2Connection):
    """h2's connection, where a DATA frame that contradicts its stream's content-length is
    a stream error (RFC 9113 §8.1.1) rather than a connection error.

    h2 checks the length while it takes a DATA frame (``_receive_data_frame``) and raises
    ``InvalidBodyLengthError``, which ``receive_data`` turns into the end of the whole
    connection: every stream on it would fail.  This catches it on the way out of the
    frame handler, before that happens: the stream is reset (PROTOCOL_ERROR), the frame's
    bytes go back to the connection window (the stream is gone, so h2 credits only that),
    and a ``_BodyLengthMismatch`` event reports it.  Costs nothing on the common path.
    ``_receive_data_frame`` is h2's own (private) DATA handler, the one private API this
    module overrides: h2 is pinned below 5, and tests/unit/test_h2frames.py checks the
    behaviour relied on.

    It also counts its open streams our way (``open_outbound_streams``).
    """

    def __init__(self, config: h2.config.H2Configuration, ours: dict[int, Any] | None = None):
        super().__init__(config=config)
        #: The streams we count open (``HTTP2Connection._streams``), if any.
        self._ours = ours
        self._scan_above = 16  # when h2's own scan runs again (``open_outbound_streams``)

    @property
    def open_outbound_streams(self) -> int:
        """Open streams, for ``send_headers``'s check of the peer's cap (RFC 9113 §5.1.2).

        h2 counts by scanning every stream it holds, on each ``send_headers``: at
        concurrency 64 that is a few per cent of a request's CPU.  Ours holds exactly the
        streams h2 counts open (the adversary suite checks the two agree at rest), so it
        answers instead; h2's scan, which also forgets closed streams (recording how each
        closed, for frames that arrive late), still runs once closed streams may make up
        half of what h2 holds: amortized O(1), and h2's memory stays bounded.
        """
        ours = self._ours
        if ours is None or len(self.streams) > self._scan_above:
            count: int = super().open_outbound_streams
            self._scan_above = 2 * len(self.streams) + 16
            return count
        return len(ours)

    def _receive_data_frame(self, frame: Any) -> tuple[list[Any], list[h2.events.Event]]:
        try:
            result: tuple[list[Any], list[h2.events.Event]] = super()._receive_data_frame(frame)
        except h2.exceptions.InvalidBodyLengthError as exc:
            stream_id = frame.stream_id
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.reset_stream(stream_id, h2.errors.ErrorCodes.PROTOCOL_ERROR)
            self.acknowledge_received_data(frame.flow_controlled_length, stream_id)
            message = _length_mismatch(exc.expected_length, exc.actual_length)
            return [], [_BodyLengthMismatch(stream_id, message)]
        return result


# unasync: skip
def _expire(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


# unasync: end
def _length_mismatch(expected: int, received: int) -> str:
    return (
        f"response body does not match its content-length: {expected} bytes announced, "
        f"{received} received"
    )


class _Sleeper:
    """Something that waits for the connection: a stream, or a PING check.  It sleeps on
    ``wakeup`` (``wait_until``) or, under asyncio, on a bare future (``wait_timed``)."""

    # unasync: skip
    __slots__ = ("future", "wakeup")
    # unasync: end
    # unasync: use __slots__ = ("wakeup",)

    def __init__(self) -> None:
        self.wakeup: anyio.Event | None = None
        # unasync: skip
        self.future: asyncio.Future[None] | None = None
        # unasync: end

    def wake(self) -> None:
        if self.wakeup is not None:
            self.wakeup.set()
        # unasync: skip
        future = self.future
        if future is not None and not future.done():
            future.set_result(None)
        # unasync: end


class ConnectionListener:
    """What the compartment wants to hear from a connection (set by the compartment)."""

    def on_cap(self, conn: HTTP2Connection, cap: int) -> None:
        del conn, cap

    def on_goaway(self, conn: HTTP2Connection) -> None:
        del conn

    def on_reset(self, conn: HTTP2Connection) -> None:
        """We reset one of ``conn``'s streams (cut by a cancellation or timeout, stopped
        early, or malformed)."""
        del conn

    def on_refused_below_cap(self, conn: HTTP2Connection, opened_as: int, cap: int) -> None:
        """The server refused (REFUSED_STREAM) a stream we opened as its ``opened_as``-th
        open stream, within the ``cap`` it advertised (told once per connection)."""
        del conn, opened_as, cap


class HTTP2Connection:
    """An HTTP/2 connection in a compartment's pool."""

    def __init__(
        self,
        origin: Origin,
        stream: NetStream,
        *,
        listener: ConnectionListener,
        max_streams: int | None,
        ping_after: float | None,
        ping_timeout: float,
    ) -> None:
        self.origin = origin
        self.id = next_connection_id()
        self.cap = 1  # concurrent streams, as last reported (``on_cap``)
        self.draining = False  # no new stream: GOAWAY, or the pool says so (lifetime)
        self._streams: dict[int, H2Stream] = {}
        self._h2 = _H2Connection(H2_CONFIG, self._streams)
        self._net = stream
        # unasync: skip
        from ._streams import AsyncioStream  # (the sync twin's streams have no fast path)

        #: The stream, when it can write without waiting (``flush``'s fast path) and read
        #: with a timeout of its own (``wait_timed``): plain asyncio.
        self._direct = stream if isinstance(stream, AsyncioStream) else None
        self._loop = None if self._direct is None else asyncio.get_running_loop()
        # unasync: end
        self.network_stream = NetworkStream(stream)  # the response extension
        self.proxy: str | None = None  # the proxy this connection goes through (its URL)
        self._listener = listener
        self._max_streams = max_streams
        self._ping_after = ping_after
        self._ping_timeout = ping_timeout
        self._sleepers: OrderedDict[_Sleeper, None] = OrderedDict()
        self._window_waiters: dict[H2Stream, None] = {}
        self._reading = False
        self._write_lock = anyio.Lock()
        self._broken: tuple[type[httpx.TransportError], str] | None = None
        self._got_settings = False
        #: The peer's SETTINGS_MAX_CONCURRENT_STREAMS, once it sent one.
        self._peer_cap: int | None = None
        self._refusal_told = False  # a refusal below the peer's cap was reported
        self._window = RECEIVE_WINDOW  # our connection-level receive window, granted
        self._ping_payload: bytes | None = None  # a health-check PING in flight
        self._ping_deadline = 0.0
        self._pong_waiters: dict[_Sleeper, None] = {}
        self._frames = FrameSplitter()
        self._outbox = b""  # output taken from h2 (``pending_output``), not yet written
        self.last_frame_at = time.monotonic()

    # -- setup -------------------------------------------------------------------------
    async def start(self, request: httpx.Request, timeout: float | None) -> None:
        """Send our connection preface and SETTINGS (RFC 9113 §3.4)."""
        settings = self._h2.local_settings
        settings.enable_push = 0
        settings.max_concurrent_streams = 100
        settings.max_header_list_size = 64 * 1024
        # The connection window is raised at once so concurrent streams do not starve
        # each other (stream windows stay at STREAM_WINDOW).
        self._h2.initiate_connection()
        self._h2.increment_flow_control_window(RECEIVE_WINDOW - STREAM_WINDOW)
        trace: TraceFn | None = request.extensions.get("trace")
        await emit(trace, "http2.send_connection_init.started", {"request": request})
        try:
            await self.flush(request, Timeouts(None, timeout, None))
        except httpx.TransportError as exc:
            await emit(trace, "http2.send_connection_init.failed", {"exception": exc})
            raise
        await emit(trace, "http2.send_connection_init.complete", {"return_value": None})

    # -- the Connection protocol -----------------------------------------------------------
    def start_exchange(self, reused: bool) -> H2Stream:
        return H2Stream(self, reused=reused)

    async def check_reusable(self) -> Verdict | None:
        """Process frames that arrived while idle (GOAWAY, SETTINGS, PING) and, if the
        connection has been silent for ``ping_after``, check it answers a PING."""
        if self._broken is not None:
            return Verdict.BROKEN
        if not self._reading and self._net.is_readable():
            await self._read_once(IDLE_READ_BOUND)
        if self._broken is not None:
            return Verdict.PEER_CLOSED
        if self.draining:
            return Verdict.NOT_REUSABLE
        silent = time.monotonic() - self.last_frame_at
        due = self._ping_after is not None and silent >= self._ping_after
        if (due or self._ping_payload is not None) and not await self._ping():
            return Verdict.PING_TIMEOUT
        return None

    async def aclose(self) -> None:
        self._break(httpx.ReadError, "connection closed")
        await self._net.aclose()

    def abort(self) -> None:
        self._net.abort()  # first: waking a stream may fail (its loop may be closed)
        self._break(httpx.ReadError, "connection closed")

    @property
    def broken(self) -> bool:
        return self._broken is not None

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    # -- writing -------------------------------------------------------------------------
    def pending_output(self) -> bool:
        """Whether output is queued (so a flush is needed).  h2's public API can only tell
        by handing the bytes over: they wait in ``_outbox``, ahead of anything queued later.
        Cut short (an interrupt), the bytes h2 was handing over may be lost: as ``flush``."""
        if not self._outbox:
            try:
                self._outbox = self._h2.data_to_send()
            except BaseException:
                self._break(httpx.WriteError, _WRITE_CUT)
                raise
        return bool(self._outbox)

    async def flush(
        self, request: httpx.Request, timeouts: Timeouts, *, last_words: bool = False
    ) -> None:
        """Send what h2 has queued.  Shielded: a cancelled write would leave a partial frame
        on the wire; bounded by the write timeout instead.  A failure breaks the connection.

        What the shield cannot hold off (a native asyncio cancellation, ``KeyboardInterrupt``;
        in the sync shell, an interrupt landing anywhere) breaks the connection too when it
        lands while bytes are in flight: taken from h2, or handed to the stream and not yet
        all written.  How much of a frame went out is then unknown, and so is every stream's
        state.  Landing between the two, it leaves the bytes first in line (``_outbox``).

        Once the connection is broken nothing more is sent (RFC 9113 §5.4.1: after a
        connection error's GOAWAY, close), but for ``last_words``: the flush right after
        the read that broke it, which carries h2's GOAWAY."""
        # unasync: skip
        if (
            self._direct is not None
            and not self._write_lock.locked()
            and self._write_now(last_words)
        ):
            return
        # unasync: end
        with anyio.CancelScope(shield=True):
            async with self._write_lock:
                data: bytes | None = None
                in_flight = True  # (each change of it is one step: no call in between)
                try:
                    data = self._outbox + self._h2.data_to_send()
                    self._outbox = b""
                    in_flight = False
                    if not data or (self._broken is not None and not last_words):
                        return
                    write_timeout = timeouts.write or MAX_SHIELDED_WRITE
                    in_flight = True
                    await run_io(self._net.send, data, "write", write_timeout, request, timeouts)
                    in_flight = False
                except httpx.TransportError as exc:
                    self._break(type(exc), str(exc))
                    raise
                except BaseException:
                    if in_flight:
                        self._break(httpx.WriteError, _WRITE_CUT)
                    elif data is not None:
                        self._outbox = data  # not sent: still first in line
                    raise

    # unasync: skip
    def _write_now(self, last_words: bool) -> bool:
        """``flush`` without a cancel scope, lock or await, when nobody is writing and the
        asyncio transport takes the bytes at once (the common case): nothing can be
        interleaved or cancelled then.  False: the bytes wait in ``_outbox`` for the slow
        path (back-pressure, or the stream is closing and ``send`` reports it)."""
        assert self._direct is not None
        data = self._outbox + self._h2.data_to_send()
        self._outbox = b""
        if not data or (self._broken is not None and not last_words):
            return True
        if self._direct.write_nowait(data):
            return True
        self._outbox = data  # still first in line
        return False

    # unasync: end
    async def _flush_quietly(self, *, last_words: bool = False) -> None:
        """Flush frames that serve no request in particular (resets, acks): a failure only
        breaks the connection, for its streams to report."""
        with contextlib.suppress(httpx.TransportError):
            await self.flush(_INTERNAL, _NO_TIMEOUTS, last_words=last_words)

    # -- reading -------------------------------------------------------------------------
    async def wait_until(self, sleeper: _Sleeper, ready: Callable[[], bool]) -> None:
        """Return once ``ready()`` holds, reading frames as the reader when nobody else is.

        Raises:
            httpx.TransportError: the connection broke.
        """
        while not ready():
            self.raise_if_broken()
            if self._reading:
                sleeper.wakeup = anyio.Event()
                self._sleepers[sleeper] = None
                try:
                    await sleeper.wakeup.wait()
                except BaseException:
                    # Cancelled or interrupted, perhaps just as the reader role was handed
                    # to us: hand it on, or the other sleepers would wait for nobody.
                    self._sleepers.pop(sleeper, None)
                    self._hand_on()
                    raise
                finally:
                    self._sleepers.pop(sleeper, None)
                    sleeper.wakeup = None
                continue
            try:
                await self._read_once()
            finally:
                self._hand_on()

    def _hand_on(self) -> None:
        """Wake the longest-waiting sleeper to take the reader role, if nobody reads."""
        if not self._reading and self._sleepers:
            first, _ = self._sleepers.popitem(last=False)
            first.wake()

    # unasync: skip
    async def wait_timed(self, stream: H2Stream, timeout: float | None) -> None:
        """``wait_until(stream._ready)`` within ``timeout`` seconds, for asyncio streams
        (``_direct``): the sleeper waits on a bare future and the reader's ``receive`` has
        the timeout, each armed with a loop timer, so a wait costs no cancel scope, no
        ``anyio.Event`` and no task cancellation.  Same roles and hand-over as
        ``wait_until``; a reader that times out hands the role on and breaks nothing
        (``receive`` keeps unread bytes buffered).

        Raises:
            TimeoutError: ``timeout`` passed (``run_io`` maps it).
            httpx.TransportError: the connection broke.
        """
        loop = self._loop
        assert loop is not None  # (an asyncio stream: ``_direct``)
        ready = stream._ready
        deadline = None if timeout is None else loop.time() + timeout
        while not ready():
            self.raise_if_broken()
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                raise TimeoutError
            if self._reading:
                stream.future = future = loop.create_future()
                self._sleepers[stream] = None
                timer = None if left is None else loop.call_later(left, _expire, future)
                try:
                    await future
                except BaseException:
                    # Timed out or cancelled, perhaps just as the reader role was handed
                    # to us: hand it on, or the other sleepers would wait for nobody.
                    self._sleepers.pop(stream, None)
                    self._hand_on()
                    raise
                finally:
                    self._sleepers.pop(stream, None)
                    stream.future = None
                    if timer is not None:
                        timer.cancel()
                continue
            try:
                await self._read_once(left, timed_out_breaks=False)
            finally:
                self._hand_on()

    # unasync: end
    async def _read_once(
        self, timeout: float | None = None, *, timed_out_breaks: bool = True
    ) -> None:
        """Read once and dispatch what arrived.  Without ``timeout`` the caller's cancel
        scope bounds the read (``run_waiting``, the PING's ``move_on_after``).  A read
        that times out breaks the connection (the idle check's bound), unless
        ``timed_out_breaks`` is false: then the ``TimeoutError`` is the caller's."""
        self._reading = True
        try:
            data = await self._net.receive(READ_SIZE, timeout)
        except Exception as exc:
            if isinstance(exc, TimeoutError) and not timed_out_breaks:
                raise
            self._break(httpx.ReadError, str(exc) or type(exc).__name__)
            return
        finally:
            self._reading = False
        if not data:
            self._break(httpx.RemoteProtocolError, "Server disconnected.")
            return
        self.last_frame_at = time.monotonic()
        self._receive(data)
        if self.pending_output():  # SETTINGS acks, window updates, PING answers, resets
            await self._flush_quietly(last_words=True)

    def _receive(self, data: bytes) -> None:
        """Hand ``data`` to h2 (GOAWAYs taken out first, see ``_h2frames``), dispatch."""
        try:
            data, goaways = self._frames.feed(data)
        except FrameSizeError as exc:
            self._break(httpx.RemoteProtocolError, f"HTTP/2 frame size error: {exc}")
            return
        try:
            events = self._h2.receive_data(data) if data else []
        except h2.exceptions.ProtocolError as exc:
            self._break(httpx.RemoteProtocolError, f"HTTP/2 protocol error: {exc}")
            return
        for event in events:
            self._dispatch(event)
        for goaway in goaways:
            self._goaway(goaway.last_stream_id)

    def _dispatch(self, event: h2.events.Event) -> None:
        """Hand ``event`` to its handler (``_HANDLERS``); events we do not act on (e.g.
        trailers, our own SETTINGS acknowledged) are dropped."""
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)

    def _on_stream_event(
        self, event: h2.events.ResponseReceived | h2.events.DataReceived | h2.events.StreamEnded
    ) -> None:
        """A response head, body data or the end of a response: queued for its stream."""
        stream = self._streams.get(event.stream_id)
        if stream is None:  # a stream we reset: give the connection window back
            if isinstance(event, h2.events.DataReceived) and event.flow_controlled_length:
                self.ack(event.flow_controlled_length, event.stream_id)
            return
        if isinstance(event, h2.events.ResponseReceived):
            if not self._response_received(stream, event):
                return
        elif isinstance(event, h2.events.StreamEnded):
            stream.remote_ended = True
            if stream.sent_end:  # closed on both sides
                self.forget(stream)
            else:  # the response is complete before the request: stop sending (§8.1)
                self._close_stream(stream)
                self._listener.on_reset(self)
        stream.events.append(event)
        self._wake(stream)

    def _on_window_updated(self, event: h2.events.WindowUpdated) -> None:
        if event.stream_id:
            waiter = self._streams.get(event.stream_id)
            if waiter is not None and waiter in self._window_waiters:
                self._wake(waiter)
        else:
            for waiter in list(self._window_waiters):
                self._wake(waiter)

    def _on_stream_reset(self, event: h2.events.StreamReset) -> None:
        stream = self._streams.get(event.stream_id)
        if stream is None:
            return
        self.forget(stream)
        refused = event.error_code == h2.errors.ErrorCodes.REFUSED_STREAM
        if refused and stream.head is None:
            stream.refused = True  # not processed (RFC 9113 §8.7): replayable
            peer_cap = self._peer_cap
            if 0 < stream.opened_as <= (peer_cap or 0) and not self._refusal_told:
                # Refused although within the cap the server advertised then and now
                # (§5.1.2 allows refusing only streams beyond it): its real limit is lower.
                self._refusal_told = True
                self._listener.on_refused_below_cap(self, stream.opened_as, peer_cap or 0)
        else:
            stream.received_any = True  # answered, with a reset: not a stale connection
            stream.error = f"stream reset by the server (error code {event.error_code})"
        self._wake(stream)

    def _on_length_mismatch(self, event: _BodyLengthMismatch) -> None:
        self._stream_error(event.stream_id, event.message)

    def _on_informational(self, event: h2.events.InformationalResponseReceived) -> None:
        stream = self._streams.get(event.stream_id)
        if stream is not None:
            stream.received_any = True  # 1xx: the response is still to come (§8.1)

    def _on_ping_ack(self, event: h2.events.PingAckReceived) -> None:
        if self._ping_payload is not None and event.ping_data == self._ping_payload:
            self._ping_payload = None  # only our own 8 bytes answer it (§6.7)
            for pong in list(self._pong_waiters):
                self._wake(pong)

    def _on_terminated(self, event: h2.events.ConnectionTerminated) -> None:  # pragma: no cover
        self._goaway(event.last_stream_id or 0)  # GOAWAYs are taken out before h2

    def _response_received(self, stream: H2Stream, event: h2.events.ResponseReceived) -> bool:
        """Keep the response head; False if it is malformed (the stream was failed)."""
        head, length = response_head(event.headers, stream.stream_id)
        if head is None:
            self._stream_error(stream.stream_id, "malformed response: invalid :status")
            return False
        stream.head = head
        stream.status = head.status
        no_content = stream.head_request or head.status in (204, 304)
        if event.stream_ended and length and not no_content:
            # A length announced, and no DATA at all (h2 checks DATA frames only).
            self._stream_error(stream.stream_id, _length_mismatch(length, 0))
            return False
        return True

    def _settings_changed(self, event: h2.events.RemoteSettingsChanged) -> None:
        codes = h2.settings.SettingCodes
        changed = event.changed_settings
        if codes.MAX_CONCURRENT_STREAMS in changed:
            self._peer_cap = changed[codes.MAX_CONCURRENT_STREAMS].new_value
        if codes.MAX_CONCURRENT_STREAMS in changed or not self._got_settings:
            self._got_settings = True
            peer = (
                changed[codes.MAX_CONCURRENT_STREAMS].new_value
                if (codes.MAX_CONCURRENT_STREAMS in changed)
                else DEFAULT_PEER_STREAMS
            )
            ours = MAX_STREAMS if self._max_streams is None else self._max_streams
            cap = self.cap = min(peer, ours, MAX_STREAMS)
            self._cover_streams(cap)
            self._listener.on_cap(self, cap)
        if codes.INITIAL_WINDOW_SIZE in changed:
            for waiter in list(self._window_waiters):
                self._wake(waiter)

    def _cover_streams(self, cap: int) -> None:
        """Grow our connection window to hold every stream's window (queued frame)."""
        needed = cap * STREAM_WINDOW
        if needed > self._window:
            self._h2.increment_flow_control_window(needed - self._window)
            self._window = needed

    def _goaway(self, last: int) -> None:
        """GOAWAY (RFC 9113 §6.8): streams above ``last`` were not processed; the others
        may finish.  The pool stops giving out streams on this connection (``on_goaway``)."""
        for stream_id, stream in list(self._streams.items()):
            if stream_id > last and stream.head is None:  # (one answered was processed,
                stream.refused = True  # whatever the GOAWAY says): safe to replay elsewhere
                self._close_stream(stream)
                self._wake(stream)
        self._listener.on_goaway(self)

    def _stream_error(self, stream_id: int, message: str) -> None:
        """A stream error (RFC 9113 §5.4.2): reset that stream, fail its request, keep the
        connection."""
        stream = self._streams.get(stream_id)
        if stream is None:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self._h2.reset_stream(stream_id, h2.errors.ErrorCodes.PROTOCOL_ERROR)
            return
        stream.error = message
        self._close_stream(stream, h2.errors.ErrorCodes.PROTOCOL_ERROR)
        self._listener.on_reset(self)
        self._wake(stream)

    def forget(self, stream: H2Stream) -> None:
        """h2 has closed ``stream``."""
        self._streams.pop(stream.stream_id, None)
        stream.live = False

    def _close_stream(self, stream: H2Stream, code: int = _CANCEL) -> None:
        """Reset ``stream`` (the frame is queued) and forget it."""
        self.forget(stream)
        with contextlib.suppress(h2.exceptions.ProtocolError):  # closed or connection gone
            self._h2.reset_stream(stream.stream_id, code)

    def _wake(self, sleeper: _Sleeper) -> None:
        self._sleepers.pop(sleeper, None)
        sleeper.wake()

    def _break(self, kind: type[httpx.TransportError], message: str) -> None:
        if self._broken is None:
            self._broken = (kind, message)
        for sleeper in list(self._sleepers):
            self._wake(sleeper)

    def raise_if_broken(self, request: httpx.Request = _INTERNAL) -> None:
        if self._broken is not None:
            kind, message = self._broken
            raise kind(message, request=request)

    def ack(self, size: int, stream_id: int) -> None:
        # If the stream is already gone, h2 credits the connection window only.  Not on a
        # broken connection: h2 queues a connection-level WINDOW_UPDATE even after it has
        # closed the connection with a GOAWAY, and that frame could then follow the GOAWAY
        # out with the reader's last flush (RFC 9113 §6.8 ends the connection there).
        if self._broken is not None:
            return
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self._h2.acknowledge_received_data(size, stream_id)

    # -- what a stream asks of its connection (H2Stream's API) -----------------------------
    async def ready_for_stream(self, request: httpx.Request) -> None:
        """Before a new stream: wait for the verdict of a PING in flight, and check the
        connection still takes streams.

        Raises:
            Refused: draining, or the PING went unanswered (nothing was sent: go elsewhere).
            httpx.TransportError: the connection broke.
        """
        if self._ping_payload is not None and not await self._ping_verdict(PING_GRACE):
            raise Refused()
        self.raise_if_broken(request)
        if self.draining:
            raise Refused()

    def open_stream(
        self,
        stream: H2Stream,
        headers: list[tuple[bytes, bytes]],
        end_stream: bool,
        request: httpx.Request,
    ) -> int:
        """Queue the HEADERS of a new stream for ``stream``; returns its id.

        Raises:
            Refused: no stream available now (the peer lowered its cap, or stream ids ran
                out: then the connection drains, as after a GOAWAY).
            httpx.LocalProtocolError, httpx.TransportError.
        """
        h2c = self._h2
        try:
            stream_id = h2c.get_next_available_stream_id()
            h2c.send_headers(stream_id, headers, end_stream=end_stream)
        except h2.exceptions.TooManyStreamsError:
            raise Refused() from None  # the peer lowered its cap after we were admitted
        except h2.exceptions.NoAvailableStreamIDError:
            self._listener.on_goaway(self)  # stream ids used up: drain, like a GOAWAY
            raise Refused() from None
        except h2.exceptions.ProtocolError as exc:
            self._local_error(exc, request)
        streams = self._streams
        streams[stream_id] = stream
        peer_cap = self._peer_cap  # (for a refusal of it: was it within the peer's cap?)
        if peer_cap is not None and len(streams) <= peer_cap:
            stream.opened_as = len(streams)
        return stream_id

    def send_data(self, stream_id: int, data: bytes, request: httpx.Request) -> bool:
        """Queue DATA on the stream; False if the stream is closed (the upload stops)."""
        try:
            self._h2.send_data(stream_id, data)
        except h2.exceptions.StreamClosedError:
            return False
        except h2.exceptions.ProtocolError as exc:
            self._local_error(exc, request)
        return True

    def end_stream(self, stream_id: int, request: httpx.Request) -> bool:
        """Queue END_STREAM on the stream; False if it is closed already."""
        try:
            self._h2.end_stream(stream_id)
        except h2.exceptions.StreamClosedError:
            return False
        except h2.exceptions.ProtocolError as exc:
            self._local_error(exc, request)
        return True

    def send_window(self, stream_id: int) -> int:
        """Bytes the stream may send now, at most one frame (0 if h2 knows it no more)."""
        h2c = self._h2
        try:
            window = h2c.local_flow_control_window(stream_id)
        except h2.exceptions.ProtocolError:  # closed, or unknown to h2
            return 0
        return min(window, h2c.max_outbound_frame_size)

    async def wait_for_window(self, stream: H2Stream, ready: Callable[[], bool]) -> None:
        """``wait_until(ready)``, woken also by WINDOW_UPDATEs and window SETTINGS."""
        self._window_waiters[stream] = None
        try:
            await self.wait_until(stream, ready)
        finally:
            self._window_waiters.pop(stream, None)

    def reset(self, stream: H2Stream) -> None:
        """We cut ``stream``: RST_STREAM CANCEL is queued, the compartment told."""
        self._close_stream(stream)
        self._listener.on_reset(self)

    def _local_error(self, exc: h2.exceptions.ProtocolError, request: httpx.Request) -> NoReturn:
        """h2 refused what we asked: the connection broke, or it is our own mistake."""
        self.raise_if_broken(request)
        raise httpx.LocalProtocolError(str(exc), request=request) from exc

    # -- the PING health check -----------------------------------------------------------
    async def _ping(self) -> bool:
        """Send a PING (unless one is in flight) and wait for its verdict: whether it was
        answered within ``ping_timeout``.  An unanswered PING breaks the connection."""
        if self._ping_payload is None and self._broken is None:
            payload = os.urandom(8)
            try:
                self._h2.ping(payload)
            except h2.exceptions.ProtocolError:
                return False
            self._ping_payload = payload
            self._ping_deadline = time.monotonic() + self._ping_timeout
            try:
                await self.flush(_INTERNAL, Timeouts(None, self._ping_timeout, None))
            except httpx.TransportError:
                return False
        return await self._ping_verdict(0.0)

    async def _ping_verdict(self, grace: float) -> bool:
        """Wait until the PING in flight is answered (True) or not in time (False).  The
        check's owner waits with ``grace=0``; requests that came while it was in flight
        wait a little longer, so that when the owner is there, the verdict is its own (and
        so is the connection's discard reason)."""
        waiter = _Sleeper()
        self._pong_waiters[waiter] = None
        try:
            deadline = self._ping_deadline + grace
            with anyio.move_on_after(max(0.0, deadline - time.monotonic())):
                await self.wait_until(waiter, lambda: self._ping_payload is None)
                return True
        except httpx.TransportError:
            return False
        finally:
            del self._pong_waiters[waiter]
        if self._ping_payload is not None:  # nobody answered in time
            self._break(httpx.ReadTimeout, "PING not answered in time")
        return self._ping_payload is None and self._broken is None


#: Which method of ``HTTP2Connection`` handles each h2 event (by exact type: h2's event
#: classes do not subclass one another).
_HANDLERS: dict[type[h2.events.Event], Callable[[HTTP2Connection, Any], None]] = {
    h2.events.ResponseReceived: HTTP2Connection._on_stream_event,
    h2.events.DataReceived: HTTP2Connection._on_stream_event,
    h2.events.StreamEnded: HTTP2Connection._on_stream_event,
    h2.events.WindowUpdated: HTTP2Connection._on_window_updated,
    h2.events.StreamReset: HTTP2Connection._on_stream_reset,
    _BodyLengthMismatch: HTTP2Connection._on_length_mismatch,
    h2.events.InformationalResponseReceived: HTTP2Connection._on_informational,
    h2.events.RemoteSettingsChanged: HTTP2Connection._settings_changed,
    h2.events.PingAckReceived: HTTP2Connection._on_ping_ack,
    h2.events.ConnectionTerminated: HTTP2Connection._on_terminated,
}


class H2Stream(_Sleeper):
    """One request/response exchange on an HTTP/2 connection (an ``Exchange``)."""

    __slots__ = (
        "conn",
        "ended",
        "error",
        "events",
        "head",
        "head_request",
        "live",
        "opened_as",
        "received_any",
        "refused",
        "releasing",
        "remote_ended",
        "resetting",
        "reused",
        "sent_end",
        "settled",
        "status",
        "stream_id",
        "tracer",
        "wrote_any",
    )

    def __init__(self, conn: HTTP2Connection, *, reused: bool) -> None:
        super().__init__()
        self.conn = conn
        self.reused = reused
        self.stream_id = 0
        self.events: deque[h2.events.Event] = deque()
        self.received_any = False
        self.wrote_any = False
        self.tracer: Tracer | None = None  # when the request is traced
        self.settled = False  # the pool has had its end (``Exchange``)
        self.releasing = False  # the pool's answer was asked for (``Exchange``)
        self.live = False  # h2 has it open (it is in ``conn._streams``)
        self.sent_end = False  # we sent END_STREAM
        self.remote_ended = False  # the server sent END_STREAM
        self.ended = False  # the response was read to its end
        self.resetting = False  # ``cut`` is under way (see there)
        self.refused = False  # not processed by the server: may be replayed
        self.opened_as = 0  # its rank among open streams when opened, if within the peer's cap
        self.error: str | None = None  # a reset or a malformed response: the request fails
        self.status = 0  # of the final response, once it arrived
        self.head: ResponseHead | None = None
        self.head_request = False

    # -- sending -------------------------------------------------------------------------
    async def send_request(
        self, request: httpx.Request, timeouts: Timeouts, trace: TraceFn | None
    ) -> ResponseHead:
        conn = self.conn
        await conn.ready_for_stream(request)
        headers = request_headers(request)
        has_body = "content-length" in request.headers or "transfer-encoding" in request.headers
        self.tracer = tracer = None if trace is None else Tracer(trace, "http2")
        self.head_request = request.method == "HEAD"
        self.stream_id = conn.open_stream(self, headers, not has_body, request)
        self.live = True
        self.sent_end = not has_body
        if tracer is not None:  # (another task may flush our HEADERS during the callback)
            self.wrote_any = True
            tracer.stream_id = self.stream_id
            info = {"request": request, "stream_id": self.stream_id}
            await tracer.started("send_request_headers", info)
        await conn.flush(request, timeouts)
        self.wrote_any = True
        if tracer is not None:
            await tracer.complete("send_request_headers")
            await tracer.started("send_request_body", info)
        if has_body:
            await self._send_body(request, timeouts)
        if tracer is not None:
            await tracer.complete("send_request_body")
            await tracer.started("receive_response_headers", info)
        while True:
            event = await self._next_event(request, timeouts)
            if isinstance(event, h2.events.ResponseReceived):
                head = self.head
                assert head is not None
                if tracer is not None:
                    await tracer.complete("receive_response_headers", (head.status, head.headers))
                return head
            # h2 delivers nothing else before the final response.

    async def _send_body(self, request: httpx.Request, timeouts: Timeouts) -> None:
        stream = request.stream
        if not isinstance(stream, AsyncIterable):
            raise RuntimeError("BulkheadTransport needs an async request stream")
        conn = self.conn
        async with body_chunks(stream) as chunks:
            async for chunk in chunks:
                if not await self._send_chunk(memoryview(chunk), request, timeouts):
                    return  # stopped early: the stream is reset once the response is read
        if not self.live:
            return
        if self._window() < 0:
            # A lowered SETTINGS_INITIAL_WINDOW_SIZE took the window below zero: not even
            # an empty DATA frame (END_STREAM) may go before it is back (RFC 9113 §6.9.2).
            await self._wait_for_window(request, timeouts, self._can_end)
            if not self.live:
                return
        # The whole body went: close our side cleanly, even if answered already.
        if not conn.end_stream(self.stream_id, request):
            return
        self.sent_end = True
        if self.remote_ended:
            conn.forget(self)
        await conn.flush(request, timeouts)

    async def _send_chunk(
        self, data: memoryview, request: httpx.Request, timeouts: Timeouts
    ) -> bool:
        """Send ``data`` as flow control allows; False if the upload must stop."""
        conn = self.conn
        while data:
            if self._stop_upload():
                return False
            window = self._window()
            if window <= 0:
                await self._wait_for_window(request, timeouts, self._can_send)
                continue
            piece, data = data[:window], data[window:]
            if not conn.send_data(self.stream_id, bytes(piece), request):
                return False
            await conn.flush(request, timeouts)
        return True

    def _stop_upload(self) -> bool:
        """The request body must not go on (see the module docstring, "Uploads")."""
        return not self.live or self.status >= 300 or self.remote_ended

    async def _wait_for_window(
        self, request: httpx.Request, timeouts: Timeouts, ready: Callable[[], bool]
    ) -> None:
        conn = self.conn
        await run_waiting(
            lambda: conn.wait_for_window(self, ready), "write", timeouts.write, request, timeouts
        )

    def _can_send(self) -> bool:
        return self._window() > 0 or self._stop_upload()

    def _can_end(self) -> bool:
        return self._window() >= 0 or self._stop_upload()

    def _window(self) -> int:
        return self.conn.send_window(self.stream_id)

    # -- receiving -----------------------------------------------------------------------
    async def receive_body(self, request: httpx.Request, timeouts: Timeouts) -> bytes | None:
        tracer = self.tracer
        if tracer is not None and tracer.current != "receive_response_body":
            info = {"request": request, "stream_id": self.stream_id}
            await tracer.started("receive_response_body", info)
        while not self.ended:
            event = await self._next_event(request, timeouts)
            if isinstance(event, h2.events.DataReceived):
                if event.flow_controlled_length:
                    self.conn.ack(event.flow_controlled_length, self.stream_id)
                    if self.conn.pending_output():
                        await self.conn.flush(request, timeouts)
                if event.data:
                    return bytes(event.data)
            elif isinstance(event, h2.events.StreamEnded):
                self.ended = True
        if tracer is not None:
            await tracer.complete("receive_response_body")
        return None

    async def _next_event(self, request: httpx.Request, timeouts: Timeouts) -> h2.events.Event:
        conn = self.conn
        ready = self._ready
        try:
            if not ready():  # often the reader already queued it: no timeout scope needed
                await self._wait(request, timeouts)
        except httpx.TransportError as exc:
            if ready():
                pass  # our outcome arrived with the failure: report that instead
            elif conn.broken:
                conn.raise_if_broken(request)
            else:
                raise exc
        if self.refused:
            raise Refused(elsewhere=not conn.draining)  # REFUSED_STREAM: try another
        if self.events:
            self.received_any = True
            return self.events.popleft()
        if self.error is not None:
            raise httpx.RemoteProtocolError(self.error, request=request)
        conn.raise_if_broken(request)
        raise AssertionError("woken with nothing to report")  # pragma: no cover

    def _ready(self) -> bool:
        return bool(self.events) or self.refused or self.error is not None

    async def _wait(self, request: httpx.Request, timeouts: Timeouts) -> None:
        """Wait until ``_ready``, within the read timeout and the deadline."""
        conn = self.conn
        # unasync: skip
        if conn._direct is not None:
            await run_io(conn.wait_timed, self, "read", timeouts.read, request, timeouts)
            return
        # unasync: end
        ready = self._ready
        await run_waiting(
            lambda: conn.wait_until(self, ready), "read", timeouts.read, request, timeouts
        )

    # -- ending ----------------------------------------------------------------------------
    def finish_buffered(self) -> bool:
        while self.events and not self.ended:
            event = self.events.popleft()
            if isinstance(event, h2.events.DataReceived) and event.flow_controlled_length:
                self.conn.ack(event.flow_controlled_length, self.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                self.ended = True
        return self.ended

    def completed(self) -> tuple[bool, float | None]:
        return not self.conn.broken, None

    def cut(self, exc: BaseException) -> Verdict | None:
        """Reset the stream (RFC 9113 §5.4.2; the frame is queued); the connection stays,
        unless it is broken.

        ``resetting`` is set in the same step as ``ended`` and cleared in the step after
        the reset was queued (no call in between).  A cut an interrupt stopped part-way
        leaves it set: the RST_STREAM may not be queued and h2's stream state may be
        half-moved, so the next cut (``reclaim``'s) answers ``UNKNOWN_STATE`` and the
        connection is discarded, never kept out of step with the server."""
        conn = self.conn
        if conn.broken:
            verdict = cut_verdict(exc, self)
            return Verdict.BROKEN if verdict is Verdict.UNKNOWN_STATE else verdict
        if self.resetting:
            return Verdict.UNKNOWN_STATE
        if self.stream_id and not self.ended:
            self.ended = self.resetting = True  # (one step: no call in between)
            for event in self.events:  # return unread data's window
                if isinstance(event, h2.events.DataReceived) and event.flow_controlled_length:
                    conn.ack(event.flow_controlled_length, self.stream_id)
            self.events.clear()
            if self.live:
                conn.reset(self)
            self.resetting = False
        return None

    async def abandon(self, exc: BaseException) -> Verdict | None:
        reason = self.cut(exc)
        if reason is None and self.conn.pending_output():
            try:
                await self.conn.flush(_INTERNAL, _NO_TIMEOUTS)
            except httpx.TransportError:
                return Verdict.BROKEN
        return reason
