"""The HTTP/2 adversary: h2 (server side) on a raw socket, one thread per connection,
playing the ``Plan`` each request carries in its path (see ``plans.py``).

::

    with AdversaryServer() as srv:      # h2c, prior knowledge, 127.0.0.1:0
        ... requests to srv.url + plan.path() ...
        srv.benign()                    # from now on: plain answers, windows and caps back
        srv.open_connections()          # [(index, streams the server holds open)]

It keeps the books the test checks afterwards: per connection, the streams h2 holds open
(until both sides ended them or either reset them; streams ignored after a GOAWAY stay
open until the client resets them), whether the client ever opened a stream beyond a cap it
had acknowledged (``violations``), and h2 protocol errors the client caused
(``protocol_errors``).  Time-based behaviours (late PING answers, windows given back,
delayed closes) run from a timer heap in each connection's loop.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import itertools
import os
import selectors
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
from hyperframe.frame import GoAwayFrame, PingFrame, WindowUpdateFrame

from tests.servers.h2script import _LenientSettings, _strip_ping_acks
from tests.servers.raw import RECV_SIZE, RawConn, RawServer

from .plans import Plan, body_of

__all__ = ["AdversaryServer"]

_MCS = h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS
_WINDOW = h2.settings.SettingCodes.INITIAL_WINDOW_SIZE
_REFUSED = h2.errors.ErrorCodes.REFUSED_STREAM
_UNLIMITED = 2**31 - 1


@dataclass
class _Stream:
    plan: Plan
    unread: bool = False  # its body is not read (stream window never reopened)
    received: int = 0  # body bytes, while unread
    answering: bool = False  # response HEADERS sent
    triggered: bool = False  # a stall* plan has acted


class AdversaryServer(RawServer):
    """See the module docstring.  Use as a context manager."""

    def __init__(self, *, initial_cap: int | None = 100) -> None:
        super().__init__(self._serve)
        self.initial_cap = initial_cap
        self._benign = False
        self._open: dict[int, int] = {}  # connection index -> streams held open (live ones)
        self.violations: list[tuple[int, int]] = []
        self.protocol_errors: list[str] = []
        self.streams_seen = 0
        self._once: set[int] = set()
        self._wakers: dict[int, socket.socket] = {}
        self._commands: list[Callable[[_Connection], None]] = []

    def __enter__(self) -> AdversaryServer:
        super().__enter__()
        return self

    # -- control ----------------------------------------------------------------------------
    def benign(self) -> None:
        """Plain answers from now on; every open connection gives caps and windows back
        and answers PINGs again."""
        with self._cond:
            self._benign = True
            self._commands.append(_Connection.make_benign)
        self._wake_all()

    def hostile(self, initial_cap: int | None = 100) -> None:
        """Play the plans again; connections accepted from now on announce
        ``initial_cap`` streams."""
        with self._cond:
            self._benign = False
            self.initial_cap = initial_cap

    @property
    def is_benign(self) -> bool:
        with self._cond:
            return self._benign

    def open_connections(self) -> list[tuple[int, int]]:
        """``(connection index, streams the server holds open)`` of live connections."""
        with self._cond:
            return sorted(self._open.items())

    # -- books (connection threads) --------------------------------------------------------
    def _opened(self, index: int) -> None:
        with self._cond:
            self._open[index] = 0

    def _count(self, index: int, open_now: int) -> None:
        with self._cond:
            if index in self._open:
                self._open[index] = open_now

    def _closed(self, index: int) -> None:
        with self._cond:
            self._open.pop(index, None)
            self._cond.notify_all()

    def _violation(self, index: int, stream_id: int) -> None:
        with self._cond:
            self.violations.append((index, stream_id))

    def _protocol_error(self, index: int, exc: Exception) -> None:
        with self._cond:
            self.protocol_errors.append(f"conn {index}: {exc!r}")

    def _seen(self, once: int) -> bool:
        """Count a stream; whether its plan id (if any) was seen before."""
        with self._cond:
            self.streams_seen += 1
            again = once in self._once
            if once:
                self._once.add(once)
            return again

    def _pending(self, seen: int) -> list[Callable[[_Connection], None]]:
        with self._cond:
            return self._commands[seen:]

    def _wake_all(self) -> None:
        for waker in list(self._wakers.values()):
            with contextlib.suppress(OSError):
                waker.send(b"\0")

    def _serve(self, raw: RawConn) -> None:
        _Connection(self, raw).run()


class _Connection:
    """One connection; everything runs in its handler thread."""

    def __init__(self, server: AdversaryServer, raw: RawConn) -> None:
        self.server = server
        self.raw = raw
        self.index = raw.index
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        self.h2 = h2.connection.H2Connection(config=config)
        initial = {h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 65_536}
        if server.initial_cap is not None:
            initial[_MCS] = server.initial_cap
        self.h2.local_settings = _LenientSettings(client=False, initial_values=initial)
        # The SETTINGS frame sent and not acknowledged yet (at most one: h2 applies a pending
        # value on the next ACK of *any* SETTINGS frame, the initial one included, so a
        # second frame in flight would take effect one ACK early): the cap it carried
        # (None: unlimited).  Changes wanted meanwhile wait in ``deferred``.
        self.caps: list[int | None] = [server.initial_cap]
        self.cap = _UNLIMITED if server.initial_cap is None else server.initial_cap
        self.window = 65_535
        self.deferred = False
        self.acked_cap: int | None = None
        self.streams: dict[int, _Stream] = {}
        self.sending: dict[int, tuple[bytearray, bool, int]] = {}  # body, trailers, reset code
        self.ping = "answer"
        self.timers: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = itertools.count()
        self.goaway_last: int | None = None
        self.spared: set[int] = set()  # above the GOAWAY, but answered all the same
        self.commands_seen = len(server._pending(0))
        self.finished = False
        self.abort = False

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> None:
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        self.server._wakers[self.index] = wake_w
        self.server._opened(self.index)
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(self.raw.sock, selectors.EVENT_READ)
                sel.register(wake_r, selectors.EVENT_READ)
                self.h2.initiate_connection()
                self.flush()
                while not self.finished and not self.raw.stopping:
                    self.guarded(self.step)
                    if self.finished:
                        break
                    for key, _ in sel.select(self.until_next_timer()):
                        if key.fileobj is wake_r:
                            with contextlib.suppress(OSError):
                                wake_r.recv(4096)
                            continue
                        data = self.raw.recv(RECV_SIZE)
                        if not data:
                            self.finished = True
                            break
                        self.guarded(functools.partial(self.receive, data))
            if self.abort:
                with contextlib.suppress(OSError):
                    self.raw.sock.shutdown(socket.SHUT_RDWR)
            elif self.goaway_last is not None:
                self.linger()
        finally:
            self.server._wakers.pop(self.index, None)
            wake_r.close()
            wake_w.close()
            self.server._closed(self.index)

    def guarded(self, action: Callable[[], None]) -> None:
        """Run ``action``: a stream the client closed meanwhile is no error; once h2 has
        closed the connection (the client's GOAWAY, a protocol error), we are done.

        h2 reports a send on a stream the client reset as ``StreamClosedError`` while it
        remembers the stream, and as ``StreamIDTooLowError`` once it has forgotten it (it
        prunes closed streams when it next counts open ones): both mean "closed
        meanwhile".  (Frames *from* the client are checked in ``receive``, not here.)"""
        try:
            action()
        except (h2.exceptions.StreamClosedError, h2.exceptions.StreamIDTooLowError):
            pass
        except h2.exceptions.ProtocolError:
            if self.h2.state_machine.state is not h2.connection.ConnectionState.CLOSED:
                raise
            self.finished = True

    def step(self) -> None:
        commands = self.server._pending(self.commands_seen)
        self.commands_seen += len(commands)
        for command in commands:
            command(self)
        now = time.monotonic()
        while self.timers and self.timers[0][0] <= now and not self.finished:
            _, _, action = heapq.heappop(self.timers)
            self.guarded(action)
        self.pump()
        kept = self.goaway_last
        if kept is not None and not any(
            (sid <= kept or sid in self.spared) and not stream.closed
            for sid, stream in self.h2.streams.items()
        ):
            self.finished = True  # the kept streams are done
        self.flush()
        self.server._count(self.index, self.h2.open_inbound_streams)

    def until_next_timer(self) -> float | None:
        return max(0.0, self.timers[0][0] - time.monotonic()) if self.timers else None

    def later(self, ms: float, action: Callable[[], None]) -> None:
        heapq.heappush(self.timers, (time.monotonic() + ms / 1000, next(self.seq), action))

    def flush(self, extra: bytes = b"") -> None:
        data = self.h2.data_to_send()
        if self.ping != "answer":
            data = _strip_ping_acks(data)
        with contextlib.suppress(OSError):
            if data or extra:
                self.raw.sock.sendall(data + extra)

    def linger(self) -> None:
        """After a GOAWAY: half-close, read until the client's EOF (bounded)."""
        with contextlib.suppress(OSError):
            self.raw.sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + 5.0
        with selectors.DefaultSelector() as sel:
            sel.register(self.raw.sock, selectors.EVENT_READ)
            while (left := deadline - time.monotonic()) > 0:
                if sel.select(left) and not self.raw.recv(RECV_SIZE):
                    return

    # -- incoming -----------------------------------------------------------------------------
    def receive(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self.server._protocol_error(self.index, exc)
            self.flush()  # h2's GOAWAY
            self.finished = True
            return
        for event in events:
            self.guarded(functools.partial(self.handle, event))
            if self.finished:
                return
        self.step()

    def handle(self, event: h2.events.Event) -> None:
        ev = h2.events
        if isinstance(event, ev.RequestReceived):
            self.on_request(event)
        elif isinstance(event, ev.DataReceived):
            stream = self.streams.get(event.stream_id)
            size = event.flow_controlled_length
            if stream is not None and stream.unread:
                if size:  # the connection window only: the stream's stays used up
                    self.h2.increment_flow_control_window(size)
                    stream.received += size
                    self.stalled(event.stream_id, stream)
            elif size:
                with contextlib.suppress(h2.exceptions.ProtocolError):
                    self.h2.acknowledge_received_data(size, event.stream_id)
        elif isinstance(event, ev.StreamEnded):
            self.on_request_complete(event.stream_id)
        elif isinstance(event, ev.StreamReset):
            self.close_stream(event.stream_id)
        elif isinstance(event, ev.SettingsAcknowledged):
            if self.caps:
                self.acked_cap = self.caps.pop(0)
            if self.deferred:
                self.deferred = False
                self.settings()
        elif isinstance(event, ev.PingReceived):
            self.on_ping(event.ping_data)
        elif isinstance(event, ev.ConnectionTerminated):
            self.finished = True

    def on_ping(self, payload: bytes) -> None:
        if self.ping == "late":
            self.later(300, lambda: self.flush(_ping_ack(payload)))
        elif self.ping == "wrong":
            self.flush(_ping_ack(bytes(b ^ 0x5A for b in payload)))
        # "never": h2's own ACK is filtered out; "answer": h2's ACK goes out

    def on_request(self, event: h2.events.RequestReceived) -> None:
        sid = event.stream_id
        path = dict(event.headers).get(b":path", b"/").decode("ascii", "replace")
        plan = Plan.from_path(path) or Plan()
        if self.server._seen(plan.once):
            plan = Plan(status=plan.status, size=plan.size)
        if self.server.is_benign:
            plan = Plan(size=plan.size)
        enforced = self.enforced_cap()
        self.streams[sid] = _Stream(plan)
        if enforced is not None and self.h2.open_inbound_streams > enforced:
            self.server._violation(self.index, sid)
            self.reset(sid, _REFUSED)
            return
        if self.goaway_last is not None and sid > self.goaway_last:
            self.close_stream(sid)  # ignored: never processed
            return
        self.connection_effects(sid, plan)
        if sid not in self.streams or self.finished:
            return
        mode = plan.mode
        if mode == "refuse":
            self.reset(sid, _REFUSED)
            return
        if mode == "reset" and plan.at == "head":
            self.reset(sid, plan.code)
            return
        for status in (100, 103)[: plan.interim]:
            self.h2.send_headers(sid, [(":status", str(status))])
        if mode == "early":
            self.streams[sid].unread = True
            self.respond(sid, plan.status, plan.size, plan.size)
        elif mode in ("stall", "stallreset", "stallgoaway"):
            self.streams[sid].unread = True
        if event.stream_ended:
            self.on_request_complete(sid)

    def connection_effects(self, sid: int, plan: Plan) -> None:
        if plan.cap >= 0:
            self.settings(cap=plan.cap)
        if plan.window >= 0:
            self.settings(window=plan.window)
            if plan.window_back:
                self.later(plan.window_back, self.window_back)
        if plan.ping:
            self.ping = plan.ping
        if plan.server_ping:
            self.h2.ping(os.urandom(8))
        if plan.overflow:  # twice: one alone fits when the client's window is 0
            update = WindowUpdateFrame(0, window_increment=2**31 - 1).serialize()
            self.flush(update + update)
        if plan.goaway and self.goaway_last is None:
            self.goaway(sid if plan.goaway == 1 else sid - 2)
        if plan.close:
            self.later(plan.close, self.close_abruptly)

    def stalled(self, sid: int, stream: _Stream) -> None:
        """A stall* plan acts once the client has used up the stream's window."""
        mode = stream.plan.mode
        window = self.h2.local_settings.initial_window_size
        if stream.triggered or mode == "stall" or stream.received < window:
            return
        stream.triggered = True
        if mode == "stallreset":
            self.reset(sid, stream.plan.code)
        elif mode == "stallgoaway" and self.goaway_last is None:
            self.goaway(sid - 2, spare_answered=True)
        elif mode == "stallgoaway":  # kept by an earlier GOAWAY: refuse it on its own
            self.reset(sid, _REFUSED)

    def goaway(self, last: int, *, spare_answered: bool = False) -> None:
        """GOAWAY(NO_ERROR, ``last``): streams above it are ignored (never processed), but
        with ``spare_answered`` those already being answered are finished (the GOAWAY
        fibs about them, but the client can tell: it has their heads)."""
        last = max(0, last)
        self.flush(GoAwayFrame(0, last_stream_id=last, error_code=0).serialize())
        self.goaway_last = last
        for other, stream in list(self.streams.items()):
            if other > last:
                if spare_answered and stream.answering:
                    self.spared.add(other)
                else:
                    self.close_stream(other)

    def enforced_cap(self) -> int | None:
        """The cap the client must respect now (``None``: none): the acknowledged one, or
        a higher one sent since (it may have applied that already)."""
        if self.acked_cap is None or None in self.caps:
            return None
        return max([self.acked_cap, *(c for c in self.caps if c is not None)])

    def on_request_complete(self, sid: int) -> None:
        stream = self.streams.get(sid)
        if stream is None or stream.answering:
            return
        plan = stream.plan
        if plan.mode == "ok":
            self.respond(sid, plan.status, plan.size, plan.size, trailers=bool(plan.trailers))
        elif plan.mode == "lie":
            self.respond(sid, plan.status, plan.size, plan.actual)
        elif plan.mode == "reset":  # at "body": half the body, then the reset
            self.respond(sid, plan.status, plan.size, plan.size // 2, reset=plan.code)
        # hang, stall: never answered

    # -- outgoing -------------------------------------------------------------------------------
    def respond(
        self,
        sid: int,
        status: int,
        announced: int,
        actual: int,
        *,
        trailers: bool = False,
        reset: int = -1,
    ) -> None:
        self.streams[sid].answering = True
        head = [(":status", str(status)), ("content-length", str(announced))]
        ends = actual == 0 and not trailers and reset < 0
        self.h2.send_headers(sid, head, end_stream=ends)
        if ends:
            self.answered(sid)
            return
        self.sending[sid] = (bytearray(body_of(actual)), trailers, reset)
        self.pump()

    def pump(self) -> None:
        for sid in list(self.sending):
            try:
                self.pump_one(sid)
            except h2.exceptions.StreamClosedError:  # reset by the client meanwhile
                self.close_stream(sid)

    def pump_one(self, sid: int) -> None:
        buf, trailers, reset = self.sending[sid]
        while buf:
            window = self.h2.local_flow_control_window(sid)
            n = min(len(buf), window, self.h2.max_outbound_frame_size)
            if n <= 0:
                return
            last = n == len(buf) and not trailers and reset < 0
            self.h2.send_data(sid, bytes(buf[:n]), end_stream=last)
            del buf[:n]
        del self.sending[sid]
        if reset >= 0:
            self.reset(sid, reset)
            return
        if trailers:
            self.h2.send_headers(sid, [("x-trailer", "yes")], end_stream=True)
        self.answered(sid)

    def answered(self, sid: int) -> None:
        stream = self.streams.get(sid)
        if stream is not None and stream.plan.mode == "early" and stream.plan.rst_after:
            self.reset(sid, h2.errors.ErrorCodes.NO_ERROR)  # "stop sending", as Node does

    def reset(self, sid: int, code: int) -> None:
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.h2.reset_stream(sid, code)
        self.close_stream(sid)

    def close_stream(self, sid: int) -> None:
        self.sending.pop(sid, None)
        self.streams.pop(sid, None)

    def settings(self, *, cap: int | None = None, window: int | None = None) -> None:
        """Send SETTINGS with both values (those not given: as last wanted), once the
        frame in flight (if any) is acknowledged."""
        self.cap = self.cap if cap is None else cap
        self.window = self.window if window is None else window
        if self.caps:
            self.deferred = True
            return
        self.h2.update_settings({_MCS: self.cap, _WINDOW: self.window})
        self.caps.append(self.cap)

    def window_back(self) -> None:
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.settings(window=65_535)

    def close_abruptly(self) -> None:
        self.abort = self.finished = True

    def make_benign(self) -> None:
        self.ping = "answer"
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.settings(cap=100, window=65_535)


def _ping_ack(payload: bytes) -> bytes:
    return PingFrame(0, opaque_data=payload, flags=["ACK"]).serialize()
