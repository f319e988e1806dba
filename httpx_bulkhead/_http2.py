"""One HTTP/2 connection, driven by h2 over an anyio byte stream.

Theory of operation
-------------------
On HTTP/2 a request borrows a *stream*; the connection carries up to ``cap`` of them, where
``cap = min(peer's SETTINGS_MAX_CONCURRENT_STREAMS, our max_streams_per_connection)``
(RFC 9113 §5.1.2).  The cap is one stream until the peer's first SETTINGS frame arrives, and
follows the peer whenever it changes: every change is reported to the pool (``on_cap``),
which admits new streams only below it, so a lowered cap lets streams in flight finish and a
raised one wakes waiters at once.

There is no background task (a transport owns no task group).  The task that needs the next
frame becomes the *reader* if nobody is reading; the others sleep on their own wake-up event.
The reader dispatches every frame it reads to the stream it belongs to and wakes that stream;
when it stops reading (it got what it wanted, was cancelled or timed out) it wakes one sleeper
to take over.  So a stream is never stuck behind another stream's read, and one stream's
timeout or cancellation costs only that stream.

State stays known when a stream is cut: the stream is reset (RST_STREAM CANCEL) and the
connection goes on serving others.  Only connection-level failures (read/write error,
protocol error, unanswered PING) break it, failing its streams with the matching httpx error.
Writes are serialized by a lock and shielded from cancellation (a half-written frame would
corrupt the connection for every stream); they are bounded by a timeout instead.

GOAWAY (RFC 9113 §6.8): no new stream; streams above ``last_stream_id`` were not processed
and fail with ``Refused`` (the compartment replays them on another connection); the others
finish; the pool closes the connection when its last stream ends.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterable, Callable
from typing import Any

import anyio
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import httpx

from ._exchange import (
    Refused,
    ResponseHead,
    Timeouts,
    body_chunks,
    discard_reason,
    run_io,
    run_waiting,
)
from ._h2frames import FrameSizeError, FrameSplitter
from ._http11 import next_connection_id
from ._pool import Discard, Origin, PoolEntry
from ._streams import NetStream, NetworkStream
from ._trace import TraceFn, Tracer, emit

__all__ = ["DEFAULT_PEER_STREAMS", "HTTP2Connection"]

#: Streams allowed when the peer's SETTINGS do not mention SETTINGS_MAX_CONCURRENT_STREAMS
#: (unlimited by the RFC; 100 is the floor it recommends servers to allow).
DEFAULT_PEER_STREAMS = 100
#: Our connection-level receive window: large, so concurrent downloads do not stall on
#: WINDOW_UPDATE round trips.
RECEIVE_WINDOW = 2**24
READ_SIZE = 65536
#: Longest a shielded write may take when httpx gives no write timeout.
MAX_SHIELDED_WRITE = 60.0
#: Longest the check of an idle connection reads what arrived while it was idle: only the
#: end of a TLS record can be missing, and a peer that does not send it within this bound
#: is not waited on (the connection is discarded).
IDLE_READ_BOUND = 0.1

#: Stand-ins for flushes that serve no one request (acks, resets, PINGs): errors there only
#: mark the connection broken, and each stream then raises with its own request.
_INTERNAL = httpx.Request("GET", "http://internal.invalid/")
_NO_TIMEOUTS = Timeouts(None, None, None)

_CONNECTION_HEADERS = frozenset(
    {b"host", b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"}
)


class _Sleeper:
    """Something that waits for the connection: a stream, or a PING."""

    __slots__ = ("wakeup",)

    def __init__(self) -> None:
        self.wakeup: anyio.Event | None = None

    def wake(self) -> None:
        if self.wakeup is not None:
            self.wakeup.set()


class ConnectionListener:
    """What the compartment wants to hear from a connection (set by the compartment)."""

    def on_cap(self, conn: HTTP2Connection, cap: int) -> None:
        del conn, cap

    def on_goaway(self, conn: HTTP2Connection) -> None:
        del conn

    def on_reset(self, conn: HTTP2Connection) -> None:
        """We reset one of ``conn``'s streams (the request was cancelled or timed out)."""
        del conn


class HTTP2Connection(PoolEntry):
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
        super().__init__(origin)
        self.id = next_connection_id()
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self._h2 = h2.connection.H2Connection(config=config)
        self._net = stream
        self.network_stream = NetworkStream(stream)  # the response extension
        self._listener = listener
        self._max_streams = max_streams
        self._ping_after = ping_after
        self._ping_timeout = ping_timeout
        self._streams: dict[int, H2Stream] = {}
        self._sleepers: OrderedDict[_Sleeper, None] = OrderedDict()
        self._reading = False
        self._write_lock = anyio.Lock()
        self._broken: tuple[type[httpx.TransportError], str] | None = None
        self._got_settings = False
        self._pong: _Sleeper | None = None
        self._frames = FrameSplitter()
        self.last_frame_at = time.monotonic()

    # -- setup -------------------------------------------------------------------------
    async def start(self, request: httpx.Request, timeout: float | None) -> None:
        """Send our connection preface and SETTINGS (RFC 9113 §3.4)."""
        settings = self._h2.local_settings
        settings.enable_push = 0
        settings.max_concurrent_streams = 100
        settings.max_header_list_size = 64 * 1024
        # The stream window stays at the protocol's 65,535 bytes (some servers, hypercorn
        # among them, do not apply a larger SETTINGS_INITIAL_WINDOW_SIZE to the streams they
        # send on); h2 grants more as the body is consumed.  The connection window is
        # raised at once so concurrent streams do not starve each other.
        self._h2.initiate_connection()
        self._h2.increment_flow_control_window(RECEIVE_WINDOW - 65535)
        trace: TraceFn | None = request.extensions.get("trace")
        await emit(trace, "http2.send_connection_init.started", {"request": request})
        try:
            await self._flush(request, Timeouts(None, timeout, None))
        except httpx.TransportError as exc:
            await emit(trace, "http2.send_connection_init.failed", {"exception": exc})
            raise
        await emit(trace, "http2.send_connection_init.complete", {"return_value": None})

    # -- the Connection protocol -----------------------------------------------------------
    def start_exchange(self) -> H2Stream:
        return H2Stream(self, reused=self.served > 1)

    async def check_reusable(self) -> Discard | None:
        """Process frames that arrived while idle (GOAWAY, SETTINGS, PING) and, if the
        connection has been silent for ``ping_after``, check it answers a PING."""
        if self._broken is not None:
            return Discard.ERROR
        if not self._reading and self._net.is_readable():
            await self._read_once(IDLE_READ_BOUND)
        if self._broken is not None:
            return Discard.PEER_CLOSED
        if self.draining:
            return Discard.NOT_REUSABLE
        silent = time.monotonic() - self.last_frame_at
        due = self._ping_after is not None and silent >= self._ping_after
        if due and not await self._ping():
            self._break(httpx.ReadTimeout, "PING not answered in time")
            return Discard.PING_TIMEOUT
        return None

    async def aclose(self) -> None:
        self._break(httpx.ReadError, "connection closed")
        await self._net.aclose()

    def abort(self) -> None:
        self._break(httpx.ReadError, "connection closed")
        self._net.abort()

    @property
    def broken(self) -> bool:
        return self._broken is not None

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    # -- writing -------------------------------------------------------------------------
    def pending_output(self) -> bool:
        """Whether h2 has bytes queued (so a flush is needed)."""
        return bool(getattr(self._h2, "_data_to_send", True))

    async def _flush(self, request: httpx.Request, timeouts: Timeouts) -> None:
        """Send what h2 has queued.  Shielded: a cancelled write would leave a partial frame
        on the wire; bounded by the write timeout instead.  A failure breaks the connection."""
        with anyio.CancelScope(shield=True):
            async with self._write_lock:
                data = self._h2.data_to_send()
                if not data:
                    return
                write_timeout = timeouts.write or MAX_SHIELDED_WRITE
                try:
                    await run_io(self._net.send, data, "write", write_timeout, request, timeouts)
                except httpx.TransportError as exc:
                    self._break(type(exc), str(exc))
                    raise

    # -- reading -------------------------------------------------------------------------
    async def wait_until(self, sleeper: _Sleeper, ready: Callable[[], bool]) -> None:
        """Return once ``ready()`` holds, reading frames as the reader when nobody else is.

        Raises:
            httpx.TransportError: the connection broke.
        """
        while not ready():
            self._raise_if_broken()
            if self._reading:
                sleeper.wakeup = anyio.Event()
                self._sleepers[sleeper] = None
                try:
                    await sleeper.wakeup.wait()
                finally:
                    self._sleepers.pop(sleeper, None)
                    sleeper.wakeup = None
                continue
            try:
                await self._read_once()
            finally:
                if self._sleepers:  # hand the reader role on
                    first, _ = self._sleepers.popitem(last=False)
                    first.wake()

    async def _read_once(self, timeout: float | None = None) -> None:
        """Read once and dispatch what arrived.  Without ``timeout`` the caller's cancel
        scope bounds the read (``run_waiting``, the PING's ``move_on_after``)."""
        self._reading = True
        try:
            data = await self._net.receive(READ_SIZE, timeout)
        except Exception as exc:
            self._break(httpx.ReadError, str(exc) or type(exc).__name__)
            return
        finally:
            self._reading = False
        if not data:
            self._break(httpx.RemoteProtocolError, "Server disconnected.")
            return
        self.last_frame_at = time.monotonic()
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
        if self.pending_output():  # SETTINGS acks, window updates, PING answers
            with contextlib.suppress(httpx.TransportError):  # _flush broke the connection
                await self._flush(_INTERNAL, _NO_TIMEOUTS)

    def _dispatch(self, event: h2.events.Event) -> None:
        stream_id = getattr(event, "stream_id", 0) or 0
        stream = self._streams.get(stream_id)
        if isinstance(
            event,
            h2.events.ResponseReceived
            | h2.events.DataReceived
            | h2.events.StreamEnded
            | h2.events.TrailersReceived
            | h2.events.InformationalResponseReceived,
        ):
            if stream is None:  # a stream we reset: give the connection window back
                if isinstance(event, h2.events.DataReceived) and event.flow_controlled_length:
                    self._ack(event.flow_controlled_length, stream_id)
                return
            stream.events.append(event)
            self._wake(stream)
        elif isinstance(event, h2.events.StreamReset):
            if stream is not None:
                if event.error_code == h2.errors.ErrorCodes.REFUSED_STREAM:
                    stream.refused = True
                else:
                    stream.reset_code = int(event.error_code or 0)
                self._wake(stream)
        elif isinstance(event, h2.events.WindowUpdated):
            targets = list(self._streams.values()) if stream is None else [stream]
            for target in targets:
                if target.wants_window:
                    self._wake(target)
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self._settings_changed(event)
        elif isinstance(event, h2.events.ConnectionTerminated):  # pragma: no cover
            self._goaway(event.last_stream_id or 0)  # GOAWAYs are taken out before h2
        elif isinstance(event, h2.events.PingAckReceived) and self._pong is not None:
            pong, self._pong = self._pong, None
            self._wake(pong)

    def _settings_changed(self, event: h2.events.RemoteSettingsChanged) -> None:
        codes = h2.settings.SettingCodes
        changed = event.changed_settings
        window_change = codes.INITIAL_WINDOW_SIZE in changed
        if codes.MAX_CONCURRENT_STREAMS in changed or not self._got_settings:
            self._got_settings = True
            peer = (
                changed[codes.MAX_CONCURRENT_STREAMS].new_value
                if (codes.MAX_CONCURRENT_STREAMS in changed)
                else DEFAULT_PEER_STREAMS
            )
            cap = peer if self._max_streams is None else min(peer, self._max_streams)
            self._listener.on_cap(self, cap)
        if window_change:
            for stream in list(self._streams.values()):
                if stream.wants_window:
                    self._wake(stream)

    def _goaway(self, last: int) -> None:
        """GOAWAY (RFC 9113 §6.8): streams above ``last`` were not processed; the others
        may finish.  The pool stops giving out streams on this connection (``on_goaway``)."""
        for stream_id, stream in self._streams.items():
            if stream_id > last:
                stream.refused = True  # never processed: safe to replay elsewhere
                self._wake(stream)
        self._listener.on_goaway(self)

    def _wake(self, sleeper: _Sleeper) -> None:
        self._sleepers.pop(sleeper, None)
        sleeper.wake()

    def _break(self, kind: type[httpx.TransportError], message: str) -> None:
        if self._broken is None:
            self._broken = (kind, message)
        for sleeper in list(self._sleepers):
            self._wake(sleeper)

    def _raise_if_broken(self, request: httpx.Request = _INTERNAL) -> None:
        if self._broken is not None:
            kind, message = self._broken
            raise kind(message, request=request)

    def _ack(self, size: int, stream_id: int) -> None:
        # If the stream is already gone, h2 has credited the connection window itself.
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self._h2.acknowledge_received_data(size, stream_id)

    async def _ping(self) -> bool:
        pong = _Sleeper()
        self._pong = pong
        self._h2.ping(os.urandom(8))
        with anyio.move_on_after(self._ping_timeout):
            try:
                await self._flush(_INTERNAL, Timeouts(None, self._ping_timeout, None))
                await self.wait_until(pong, lambda: self._pong is not pong)
            except httpx.TransportError:
                return False
            return True
        return False


class H2Stream(_Sleeper):
    """One request/response exchange on an HTTP/2 connection (an ``Exchange``)."""

    __slots__ = (
        "conn",
        "ended",
        "events",
        "received_any",
        "refused",
        "reset_code",
        "reused",
        "stream_id",
        "tracer",
        "wants_window",
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
        self.refused = False
        self.reset_code: int | None = None
        self.ended = False
        self.wants_window = False
        self.tracer: Tracer | None = None  # when the request is traced

    # -- sending -------------------------------------------------------------------------
    async def send_request(
        self, request: httpx.Request, timeouts: Timeouts, trace: TraceFn | None
    ) -> ResponseHead:
        conn, h2c = self.conn, self.conn._h2
        conn._raise_if_broken(request)
        if conn.draining:
            raise Refused()
        has_body = "content-length" in request.headers or "transfer-encoding" in request.headers
        self.tracer = tracer = None if trace is None else Tracer(trace, "http2")
        try:
            self.stream_id = h2c.get_next_available_stream_id()
            h2c.send_headers(self.stream_id, _request_headers(request), end_stream=not has_body)
        except h2.exceptions.TooManyStreamsError:
            raise Refused() from None  # the peer lowered its cap after we were admitted
        except h2.exceptions.ProtocolError as exc:
            raise httpx.LocalProtocolError(str(exc), request=request) from exc
        conn._streams[self.stream_id] = self
        if tracer is not None:  # (another task may flush our HEADERS during the callback)
            self.wrote_any = True
            tracer.stream_id = self.stream_id
            info = {"request": request, "stream_id": self.stream_id}
            await tracer.started("send_request_headers", info)
        await conn._flush(request, timeouts)
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
                head = _response_head(event.headers, self.stream_id)
                if tracer is not None:
                    await tracer.complete("receive_response_headers", (head.status, head.headers))
                return head
            if isinstance(event, h2.events.StreamEnded):  # pragma: no cover - h2 forbids it
                raise httpx.RemoteProtocolError("stream ended without a response", request=request)
            # InformationalResponseReceived (1xx): keep reading.

    async def _send_body(self, request: httpx.Request, timeouts: Timeouts) -> None:
        stream = request.stream
        if not isinstance(stream, AsyncIterable):
            raise RuntimeError("BulkheadTransport needs an async request stream")
        conn = self.conn
        async with body_chunks(stream) as chunks:
            async for chunk in chunks:
                if not await self._send_chunk(memoryview(chunk), request, timeouts):
                    return  # the server answered (or gave up) early: stop sending
        h2c = conn._h2
        try:
            h2c.end_stream(self.stream_id)
        except h2.exceptions.StreamClosedError:
            return
        await conn._flush(request, timeouts)

    async def _send_chunk(
        self, data: memoryview, request: httpx.Request, timeouts: Timeouts
    ) -> bool:
        """Send ``data`` as flow control allows; False if the stream stopped taking data."""
        conn, h2c = self.conn, self.conn._h2
        while data:
            if self.events or self.refused or self.reset_code is not None:
                return False
            window = self._window()
            if window <= 0:
                self.wants_window = True
                try:
                    await run_waiting(
                        conn.wait_until(self, lambda: self._window() > 0 or bool(self.events)),
                        "write",
                        timeouts.write,
                        request,
                        timeouts,
                    )
                finally:
                    self.wants_window = False
                continue
            piece, data = data[:window], data[window:]
            try:
                h2c.send_data(self.stream_id, bytes(piece))
            except h2.exceptions.StreamClosedError:
                return False
            await conn._flush(request, timeouts)
        return True

    def _window(self) -> int:
        h2c = self.conn._h2
        try:
            window = h2c.local_flow_control_window(self.stream_id)
        except h2.exceptions.StreamClosedError:
            return 0
        return min(window, h2c.max_outbound_frame_size)

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
                    self.conn._ack(event.flow_controlled_length, self.stream_id)
                    if self.conn.pending_output():
                        await self.conn._flush(request, timeouts)
                if event.data:
                    return bytes(event.data)
            elif isinstance(event, h2.events.StreamEnded):
                self._end()
        if tracer is not None:
            await tracer.complete("receive_response_body")
        return None

    async def _next_event(self, request: httpx.Request, timeouts: Timeouts) -> h2.events.Event:
        conn = self.conn
        ready = self._ready
        try:
            if not ready():  # often the reader already queued it: no timeout scope needed
                await run_waiting(
                    conn.wait_until(self, ready), "read", timeouts.read, request, timeouts
                )
        except httpx.TransportError as exc:
            if self.events or self.refused or self.reset_code is not None:
                pass  # our outcome arrived with the failure: report that instead
            elif conn.broken:
                conn._raise_if_broken(request)
            else:
                raise exc
        if self.refused:
            raise Refused()
        if self.events:
            self.received_any = True
            return self.events.popleft()
        if self.reset_code is not None:
            self.received_any = True  # the server answered (with a reset): not a stale connection
            raise httpx.RemoteProtocolError(
                f"stream reset by the server (error code {self.reset_code})", request=request
            )
        conn._raise_if_broken(request)
        raise AssertionError("woken with nothing to report")  # pragma: no cover

    def _ready(self) -> bool:
        return bool(self.events) or self.refused or self.reset_code is not None

    def _end(self) -> None:
        self.ended = True
        self.conn._streams.pop(self.stream_id, None)

    # -- ending ----------------------------------------------------------------------------
    def finish_buffered(self) -> bool:
        while self.events and not self.ended:
            event = self.events.popleft()
            if isinstance(event, h2.events.DataReceived) and event.flow_controlled_length:
                self.conn._ack(event.flow_controlled_length, self.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                self._end()
        return self.ended

    def completed(self) -> tuple[bool, float | None]:
        return not self.conn.broken, None

    def cut(self, exc: BaseException) -> Discard | None:
        """Reset the stream (RFC 9113 §5.4.2; the frame is queued); the connection stays,
        unless it is broken."""
        conn = self.conn
        if conn.broken:
            reason = discard_reason(exc, self)
            return Discard.ERROR if reason is Discard.UNKNOWN_STATE else reason
        if self.stream_id and not self.ended:
            self.ended = True
            conn._streams.pop(self.stream_id, None)
            for event in self.events:  # return unread data's window
                if isinstance(event, h2.events.DataReceived) and event.flow_controlled_length:
                    conn._ack(event.flow_controlled_length, self.stream_id)
            self.events.clear()
            if not self.refused and self.reset_code is None:
                try:
                    conn._h2.reset_stream(self.stream_id, h2.errors.ErrorCodes.CANCEL)
                    conn._listener.on_reset(conn)
                except h2.exceptions.ProtocolError:
                    pass  # already closed on the peer's side
        return None

    async def abandon(self, exc: BaseException) -> Discard | None:
        reason = self.cut(exc)
        if reason is None and self.conn.pending_output():
            try:
                await self.conn._flush(_INTERNAL, _NO_TIMEOUTS)
            except httpx.TransportError:
                return Discard.ERROR
        return reason


def _request_headers(request: httpx.Request) -> list[tuple[bytes, bytes]]:
    url = request.url
    authority = request.headers.get("host", url.netloc.decode("ascii")).encode("ascii")
    target: bytes = request.extensions.get("target", url.raw_path)
    headers = [
        (b":method", request.method.encode("ascii")),
        (b":authority", authority),
        (b":scheme", url.raw_scheme),
        (b":path", target),
    ]
    for name, value in request.headers.raw:
        lowered = name.lower()
        if lowered in _CONNECTION_HEADERS:
            continue
        if lowered == b"te" and value.lower() != b"trailers":
            continue
        headers.append((lowered, value))
    return headers


def _response_head(raw: Any, stream_id: int) -> ResponseHead:
    status = 200
    headers: list[tuple[bytes, bytes]] = []
    for name, value in raw:
        if name == b":status":
            status = int(value)
        elif not name.startswith(b":"):
            headers.append((name, value))
    return ResponseHead(status, headers, b"HTTP/2", b"", stream_id)
