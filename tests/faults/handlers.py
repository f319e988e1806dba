"""Fault servers that ``tests/servers`` lacks: RawServer handler factories for the fault
matrix and the soak.

* HTTP/1.1: :func:`accept_then_close`, :func:`stale_race`, :func:`canned`,
  :func:`desync_response`, :func:`doubtful_framing`, :func:`stall_upload`,
  :func:`random_faults`.
* TLS (on a plain :class:`~tests.servers.raw.RawServer`): :func:`tls_garbage`,
  :func:`tls_close_in_handshake`, :func:`tls_silent`, :func:`tls_serve`.
* HTTP/2 at the frame level (h2c, prior knowledge; hyperframe + hpack, no h2 state
  machine, so the server can say what h2 would refuse to): :func:`continuation_flood`,
  :func:`hpack_bomb`, :func:`oversized_goaway`, :func:`h2_trickle`, :func:`h2_stale_race`,
  :func:`h2_zero_window`; over TLS (``RawServer(tls=..., alpn=("h2",))``):
  :func:`h2_partial_record_while_idle`.
* Soak accounting: :class:`IntervalLog` (when each request was inside a server), used by
  :func:`random_faults`, :class:`TimedApp` (ASGI middleware) and :class:`TimedH2Server`.

Each handler runs in its RawServer thread; reads return early when the server stops.
"""

from __future__ import annotations

import contextlib
import random
import re
import socket
import ssl
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import h2.events
import h2.exceptions
from hpack import Encoder
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    HeadersFrame,
    PingFrame,
    SettingsFrame,
)

from tests.servers import H2ScriptServer, H2Stream, RawConn, ServerTLS, keepalive_ok, response_bytes
from tests.servers.asgi import ASGIApp, Message, Receive, Scope, Send
from tests.servers.h2script import Outcome, _Connection
from tests.servers.raw import Handler, first_answer_then_ok

__all__ = [
    "FAULTS",
    "FloodReport",
    "H2Peer",
    "IntervalLog",
    "TimedApp",
    "TimedH2Server",
    "accept_then_close",
    "canned",
    "continuation_flood",
    "desync_response",
    "doubtful_framing",
    "h2_partial_record_while_idle",
    "h2_stale_race",
    "h2_trickle",
    "h2_zero_window",
    "hpack_bomb",
    "oversized_goaway",
    "random_faults",
    "stale_race",
    "stall_upload",
    "tls_close_in_handshake",
    "tls_garbage",
    "tls_serve",
    "tls_silent",
]

MB = 1_000_000
#: HTTP/2 connection preface a client sends first (RFC 9113 §3.4).
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#: SETTINGS_MAX_FRAME_SIZE until the client says otherwise (RFC 9113 §6.5.2).
DEFAULT_MAX_FRAME = 16_384
_GOAWAY = 0x7


def _drain(conn: RawConn) -> None:
    """Read and discard until the client closes (or the server stops): closing with
    unread input would turn our FIN into an RST."""
    while conn.recv():
        pass


# ------------------------------------------------------------------------- HTTP/1.1


def accept_then_close(event: str = "fin") -> Handler:
    """Accept, send FIN at once (before the request could arrive), set ``event``, then
    read until the client closes.  Deterministically a clean close, never an RST."""

    def handler(conn: RawConn) -> None:
        conn.sock.shutdown(socket.SHUT_WR)
        conn.server.set_event(event)
        _drain(conn)

    return handler


def stale_race(first: bytes = b"first", fresh: bytes = b"fresh") -> Handler:
    """Connection #0 answers one request (keep-alive), then reads the next one and closes
    without answering: the server closed an idle keep-alive connection just as the client
    reused it.  Every later connection serves ``fresh``."""

    def handler(conn: RawConn) -> None:
        if conn.index != 0:
            keepalive_ok(fresh)(conn)
            return
        if conn.read_request() is not None:
            conn.send_response(200, first)
            conn.read_request()
        conn.close()

    return handler


def canned(response: bytes) -> Handler:
    """Read one request, send ``response`` verbatim, close cleanly."""

    def handler(conn: RawConn) -> None:
        if conn.read_request() is not None:
            conn.send(response)
            conn.sock.shutdown(socket.SHUT_WR)
            _drain(conn)

    return handler


def desync_response(smuggled: bytes = b"smuggled") -> Handler:
    """Connection #0 answers its first request with ``Content-Length: 2`` followed, in the
    same write, by a second complete response (``smuggled``) nobody asked for; then
    answers each later request on it ``second-on-0``.  A client that reuses the connection
    reads ``smuggled`` as the answer to its next request.  Other connections: ``fresh``."""
    first = response_bytes(200, b"ok") + response_bytes(200, smuggled)
    return first_answer_then_ok(lambda conn: conn.send(first))


def doubtful_framing(
    version: bytes = b"1.1",
    *,
    content_length: bool = True,
    fields: tuple[bytes, ...] = (),
    smuggled: bytes = b"",
    together: bool = False,
) -> Handler:
    """Connection #0 answers its first request ``ok`` in chunks (``Transfer-Encoding:
    chunked``) under a head whose framing is in doubt: HTTP/``version``, ``fields``, and
    (``content_length``) a ``Content-Length`` counting the chunked body *and* the response
    ``smuggled`` that follows it, so a peer framing by ``Content-Length`` (a proxy) takes
    both for one response: response splitting (RFC 9112 §6.3, §11.1).  The smuggled
    response is sent in the same write (``together``) or only once another request
    arrives on the connection: a client that reuses the connection then reads it as the
    answer.  Later requests on it get ``second-on-0``; other connections ``fresh``."""
    rest = response_bytes(200, smuggled) if smuggled else b""
    body = b"2\r\nok\r\n0\r\n\r\n"
    lines = [b"HTTP/" + version + b" 200 OK", *fields, b"Transfer-Encoding: chunked"]
    if content_length:
        lines.append(b"Content-Length: %d" % (len(body) + len(rest)))
    first = b"\r\n".join(lines) + b"\r\n\r\n" + body

    def answer(conn: RawConn) -> None:
        conn.send(first + rest if together else first)
        if rest and not together and conn.read_request() is not None:
            conn.send(rest)

    return first_answer_then_ok(answer)


def stall_upload(event: str = "head") -> Handler:
    """Read a request head, set ``event``, then never read again nor answer: a request
    body larger than the socket buffers can never be sent."""

    def handler(conn: RawConn) -> None:
        seen = b""
        while b"\r\n\r\n" not in seen:
            data = conn.recv()
            if not data:
                return
            seen += data
        conn.server.set_event(event)
        conn.wait("never")

    return handler


# ------------------------------------------------------------------------------ TLS


def tls_garbage() -> Handler:
    """A plain HTTP server on the TLS port: reads the ClientHello and answers with a
    plain-text HTTP error (not a TLS record), then closes cleanly."""

    def handler(conn: RawConn) -> None:
        if conn.recv():
            conn.send(response_bytes(400, b"plain HTTP here", [("Connection", "close")]))
            conn.sock.shutdown(socket.SHUT_WR)
            _drain(conn)

    return handler


def tls_close_in_handshake() -> Handler:
    """Reads the ClientHello, then closes without a word (FIN)."""

    def handler(conn: RawConn) -> None:
        if conn.recv():
            conn.sock.shutdown(socket.SHUT_WR)
            _drain(conn)

    return handler


def tls_silent() -> Handler:
    """Reads the ClientHello and never answers (until the client goes away)."""
    return _drain


def tls_serve(tls: ServerTLS, body: bytes = b"secure") -> Handler:
    """A TLS server presenting ``tls``'s certificate (ALPN ``http/1.1``) answering every
    request with ``body``.  A failed handshake (the client rejected the certificate) sets
    event ``"handshake-failed"``."""

    def handler(conn: RawConn) -> None:
        context = tls.server_ssl_context(alpn=("http/1.1",))
        conn.sock.settimeout(10.0)
        try:
            secure = context.wrap_socket(conn.sock, server_side=True)
        except (ssl.SSLError, OSError):
            conn.server.set_event("handshake-failed")
            return
        with secure:
            buffer = b""
            while True:
                while b"\r\n\r\n" not in buffer:
                    try:
                        data = secure.recv(65536)
                    except OSError:
                        return
                    if not data:
                        return
                    buffer += data
                _, _, buffer = buffer.partition(b"\r\n\r\n")
                secure.sendall(response_bytes(200, body))

    return handler


# --------------------------------------------------------------- HTTP/2, frame level


class H2Peer:
    """The server side of an h2c connection, at the frame level."""

    def __init__(self, conn: RawConn) -> None:
        self.conn = conn
        self._buffer = bytearray()

    def _read_exact(self, n: int) -> bytes | None:
        while len(self._buffer) < n:
            data = self.conn.recv()
            if not data:
                return None
            self._buffer += data
        out = bytes(self._buffer[:n])
        del self._buffer[:n]
        return out

    def read_frame(self) -> Frame | None:
        header = self._read_exact(9)
        if header is None:
            return None
        frame, length = Frame.parse_frame_header(memoryview(header))
        body = self._read_exact(length)
        if body is None:
            return None
        frame.parse_body(memoryview(body))
        return frame

    def send(self, *frames: Frame) -> None:
        self.conn.send(b"".join(f.serialize() for f in frames))

    def accept(self, settings: dict[int, int] | None = None) -> int | None:
        """Read the preface, send our SETTINGS (``settings``, default none), ACK the
        client's, and return the stream id of the first request; ``None`` if the client
        went away first."""
        if self._read_exact(len(PREFACE)) != PREFACE:
            return None
        self.send(SettingsFrame(0, settings=settings))
        return self.next_request()

    def next_request(self) -> int | None:
        """Read frames (ACKing SETTINGS) up to the next request's HEADERS: its stream id,
        or ``None`` if the client went away."""
        while True:
            frame = self.read_frame()
            if frame is None:
                return None
            if isinstance(frame, SettingsFrame) and "ACK" not in frame.flags:
                self.send(SettingsFrame(0, flags=["ACK"]))
            elif isinstance(frame, HeadersFrame):
                return frame.stream_id

    def answer(self, stream_id: int, body: bytes) -> None:
        """A complete ``200`` response with ``body``."""
        headers = HeadersFrame(stream_id, data=_head_block(("content-length", str(len(body)))))
        headers.flags.add("END_HEADERS")
        self.send(headers, DataFrame(stream_id, data=body, flags=["END_STREAM"]))

    def drain(self) -> None:
        _drain(self.conn)


@dataclass
class FloodReport:
    """What a flooding server managed to send (read after event ``"flood-done"``)."""

    sent: int = 0
    #: The client closed (or reset) the connection before the flood was over.
    closed_early: bool = False


def _head_block(*extra: tuple[str, str]) -> bytes:
    return Encoder().encode([(":status", "200"), *extra])


def _send_until(conn: RawConn, chunk: bytes, total: int, report: FloodReport) -> bool:
    """Send ``chunk`` repeatedly until ``total`` bytes went out; false if the client
    closed first (``report.closed_early``)."""
    try:
        while report.sent < total:
            conn.send(chunk)
            report.sent += len(chunk)
    except OSError:
        report.closed_early = True
        return False
    return True


def continuation_flood(
    report: FloodReport, total: int = 12 * MB, frame_size: int = DEFAULT_MAX_FRAME
) -> Handler:
    """Answer the first request with HEADERS *without* END_HEADERS, then CONTINUATION
    frames of ``frame_size`` bytes (none with END_HEADERS) until ``total`` bytes were sent
    or the client closed.  Sets event ``"flood-done"``, then waits for the client's EOF."""

    def handler(conn: RawConn) -> None:
        peer = H2Peer(conn)
        sid = peer.accept()
        if sid is None:
            return
        filler = Encoder().encode([("x-flood", "a" * frame_size)], huffman=False)
        frame = ContinuationFrame(sid, data=filler[:frame_size]).serialize()
        try:
            peer.send(HeadersFrame(sid, data=_head_block()))  # no END_HEADERS
            report.sent = 0
            if _send_until(conn, frame, total, report):
                peer.drain()
        finally:
            conn.server.set_event("flood-done")

    return handler


def hpack_bomb(inflated: int = 40 * MB, value_size: int = 4000) -> Handler:
    """Answer with a small header block that inflates to ``inflated`` bytes of headers:
    one ``x-bomb`` literal of ``value_size`` bytes added to the HPACK dynamic table, then
    referenced by index (one byte each) over and over."""

    def handler(conn: RawConn) -> None:
        peer = H2Peer(conn)
        sid = peer.accept()
        if sid is None:
            return
        pair = ("x-bomb", "b" * value_size)
        block = Encoder().encode([(":status", "200")] + [pair] * (inflated // value_size))
        pieces = [block[i : i + DEFAULT_MAX_FRAME] for i in range(0, len(block), DEFAULT_MAX_FRAME)]
        frames: list[Frame] = [HeadersFrame(sid, data=pieces[0])]
        frames += [ContinuationFrame(sid, data=p) for p in pieces[1:]]
        frames[-1].flags.add("END_HEADERS")
        try:
            peer.send(*frames)
        except OSError:
            return
        conn.server.set_event("bomb-sent")
        peer.drain()

    return handler


def oversized_goaway(report: FloodReport, size: int = (1 << 24) - 1) -> Handler:
    """Send a GOAWAY frame (last_stream_id 2^31-1: every stream kept, NO_ERROR) whose
    payload is ``size`` bytes, far beyond SETTINGS_MAX_FRAME_SIZE (16 KiB, RFC 9113 §4.2:
    a FRAME_SIZE_ERROR), then answer the request ``200 ok`` as if nothing happened.
    Sets event ``"flood-done"`` once the frame is out (or the client closed)."""

    def handler(conn: RawConn) -> None:
        peer = H2Peer(conn)
        sid = peer.accept()
        if sid is None:
            return
        header = size.to_bytes(3, "big") + bytes([_GOAWAY, 0]) + b"\0\0\0\0"
        try:
            report.sent = 0
            conn.send(header + struct.pack(">II", 0x7FFF_FFFF, 0))
            chunk = b"d" * 65536
            left = size - 8
            try:
                while left > 0:
                    conn.send(chunk[:left])
                    report.sent += min(left, len(chunk))
                    left -= len(chunk)
            except OSError:
                report.closed_early = True
                return
        finally:
            conn.server.set_event("flood-done")
        try:
            peer.answer(sid, b"ok")
        except OSError:
            return
        peer.drain()

    return handler


def h2_trickle(interval: float = 0.1, body_size: int = 1000) -> Handler:
    """Answer the first request's head at once (``content-length: body_size``), then
    trickle the body one DATA frame of one byte every ``interval`` seconds."""

    def handler(conn: RawConn) -> None:
        peer = H2Peer(conn)
        sid = peer.accept()
        if sid is None:
            return
        headers = HeadersFrame(sid, data=_head_block(("content-length", str(body_size))))
        headers.flags.add("END_HEADERS")
        try:
            peer.send(headers)
            for _ in range(body_size):
                if not conn.sleep(interval):
                    return
                peer.send(DataFrame(sid, data=b"x"))
        except OSError:
            return

    return handler


def h2_stale_race(first: bytes = b"first", fresh: bytes = b"fresh") -> Handler:
    """HTTP/2 twin of :func:`stale_race`: connection #0 answers one request, then reads
    the next request's HEADERS and closes (FIN, then event ``"fin"``) without answering.
    Later connections answer every request ``fresh``."""

    def handler(conn: RawConn) -> None:
        peer = H2Peer(conn)
        sid = peer.accept()
        if conn.index != 0:
            while sid is not None:
                peer.answer(sid, fresh)
                sid = peer.next_request()
            return
        if sid is None:
            return
        peer.answer(sid, first)
        if peer.next_request() is not None:
            conn.sock.shutdown(socket.SHUT_WR)
            conn.server.set_event("fin")
            peer.drain()

    return handler


def h2_partial_record_while_idle(split: int = 12, idle: str = "idle") -> Handler:
    """HTTP/2 over TLS.  Connection #0 answers its first request ``first``; once the test
    sets ``idle``, it sends the first ``split`` bytes of a TLS record holding a PING, sets
    ``"partial"`` and never sends the rest (nor answers anything more).  A client that
    reads that connection without a timeout before reusing it waits for ever.  Later
    connections answer every request ``fresh``."""

    def handler(conn: RawConn) -> None:
        peer = H2Peer(conn)
        sid = peer.accept()
        if conn.index != 0:
            while sid is not None:
                peer.answer(sid, b"fresh")
                sid = peer.next_request()
            return
        if sid is None:
            return
        peer.answer(sid, b"first")
        if not conn.wait(idle):
            return
        conn.send_raw(conn.seal(PingFrame(0, opaque_data=b"12345678").serialize())[:split])
        conn.server.set_event("partial")
        peer.drain()

    return handler


def h2_zero_window() -> Handler:
    """SETTINGS_INITIAL_WINDOW_SIZE=0 and never a WINDOW_UPDATE: a request body cannot be
    sent beyond the 65,535 bytes allowed before our SETTINGS arrive.  Never answers."""

    def handler(conn: RawConn) -> None:
        peer = H2Peer(conn)
        if peer.accept({SettingsFrame.INITIAL_WINDOW_SIZE: 0}) is not None:
            peer.drain()

    return handler


# ------------------------------------------------------------------------- the soak


@dataclass
class IntervalLog:
    """Server-side accounting for the soak: when each request was inside the server.

    ``enter(key)`` returns a token; ``leave(token)`` closes its interval (idempotent).
    ``key`` identifies the client request (its ``x-req-id``), so the test can cut an
    interval at the moment the client gave the request up.  Thread-safe.
    """

    current: int = 0
    peak: int = 0
    intervals: list[tuple[str, float, float]] = field(default_factory=list)
    _open: dict[int, tuple[str, float]] = field(default_factory=dict)
    _next: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def enter(self, key: str) -> int:
        with self._lock:
            self._next += 1
            self._open[self._next] = (key, time.monotonic())
            self.current += 1
            self.peak = max(self.peak, self.current)
            return self._next

    def leave(self, token: int) -> None:
        with self._lock:
            entry = self._open.pop(token, None)
            if entry is not None:
                self.current -= 1
                self.intervals.append((entry[0], entry[1], time.monotonic()))

    def snapshot(self) -> list[tuple[str, float, float]]:
        """Closed intervals, plus open ones as if they closed now."""
        with self._lock:
            now = time.monotonic()
            return [*self.intervals, *((k, t, now) for k, t in self._open.values())]


#: What :func:`random_faults` may do with one request.
FAULTS: Sequence[str] = (
    "ok",
    "ok",
    "ok",
    "delay",
    "close_after",
    "close_before",
    "reset_mid_body",
    "truncated",
    "garbage",
    "never",
    "trickle",
)

_REQ_ID = re.compile(rb"(?im)^x-req-id:\s*(\S+)\s*$")


def random_faults(seed: int, log: IntervalLog, faults: Sequence[str] = FAULTS) -> Handler:
    """Serve requests on each connection with a fault drawn per request from ``faults``
    (seeded by ``seed`` and the connection index, so a run can be replayed): answer
    (``ok``), answer after up to 50 ms (``delay``), answer then close (``close_after``),
    close without answering (``close_before``), RST mid-body, truncated body, garbage
    status line, never answer (``never``: until the client leaves), or trickle the body
    (``trickle``).  Each request is logged in ``log`` from its head read to its last byte
    sent (or the connection closed)."""

    def handler(conn: RawConn) -> None:
        rng = random.Random(seed * 100_003 + conn.index)
        while (request := conn.read_request()) is not None:
            match = _REQ_ID.search(request.split(b"\r\n\r\n", 1)[0])
            token = log.enter(match.group(1).decode() if match else "?")
            try:
                if not _fault(conn, rng.choice(faults), rng):
                    return
            finally:
                log.leave(token)

    return handler


def _fault(conn: RawConn, fault: str, rng: random.Random) -> bool:
    """Do ``fault`` for one request; false when the connection is done."""
    body = b"r" * rng.choice((2, 100, 5000))
    if fault == "delay" and not conn.sleep(rng.uniform(0.0, 0.05)):
        return False
    if fault in ("ok", "delay"):
        conn.send_response(200, body)
        return True
    if fault == "close_after":
        conn.send_response(200, body)
    elif fault == "reset_mid_body":
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
        conn.reset()
        return False
    elif fault == "truncated":
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
    elif fault == "garbage":
        conn.send(b"HTTX/9.9 banana\r\n\r\n")
    elif fault == "never":
        conn.wait("never", timeout=1.0)
    elif fault == "trickle":
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n")
        for _ in range(40):
            if not conn.sleep(0.02):
                return False
            conn.send(b"t")
        return True
    conn.sock.shutdown(socket.SHUT_WR)  # a clean close: FIN, then wait for the client's
    _drain(conn)
    return False


def _req_id(headers: Sequence[tuple[str, str]] | Sequence[tuple[bytes, bytes]]) -> str:
    for name, value in headers:
        text = name.decode("latin-1") if isinstance(name, bytes) else name
        if text.lower() == "x-req-id":
            return value.decode("latin-1") if isinstance(value, bytes) else value
    return "?"


class TimedApp:
    """ASGI middleware logging each HTTP request in ``log``: from dispatch until its last
    body message is sent (or the app returns)."""

    def __init__(self, app: ASGIApp, log: IntervalLog) -> None:
        self.app = app
        self.log = log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = self.log.enter(_req_id(scope["headers"]))

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body"):
                self.log.leave(token)
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            self.log.leave(token)


class _TolerantConnection(_Connection):
    """``h2script``'s connection, surviving a client that resets a stream in the same read
    as its request: h2 has already closed the stream when the server, handling the
    request's events first, answers or resets it (``StreamClosedError`` or
    ``StreamIDTooLowError``, which kill the connection's thread in ``h2script``).  The
    stream's own ``StreamReset`` event, later in the same batch, then closes it as
    ``cancelled``."""

    def handle(self, event: h2.events.Event) -> None:
        # StreamIDTooLowError: h2 has already forgotten the closed stream and takes the
        # answer for an attempt to open a new one.
        with contextlib.suppress(
            h2.exceptions.StreamClosedError, h2.exceptions.StreamIDTooLowError
        ):
            super().handle(event)


class TimedH2Server(H2ScriptServer):
    """:class:`H2ScriptServer` that also logs each stream in ``log``, from its HEADERS to
    its end (answered, reset, refused, ignored or dropped with its connection), and
    tolerates streams reset by the client before it could answer them."""

    def __init__(self, log: IntervalLog, **options: Any) -> None:
        super().__init__(**options)
        self.log = log
        self._tokens: dict[tuple[int, int], int] = {}

    def __enter__(self) -> TimedH2Server:
        super().__enter__()
        return self

    def _serve_connection(self, raw: RawConn) -> None:
        _TolerantConnection(self, raw).run()

    def _stream_opened(self, rec: H2Stream) -> None:
        super()._stream_opened(rec)
        with self._cond:
            self._tokens[(rec.conn, rec.stream_id)] = self.log.enter(_req_id(rec.headers))

    def _stream_closed(
        self, rec: H2Stream, outcome: Outcome, error_code: int | None = None
    ) -> None:
        with self._cond:
            token = self._tokens.pop((rec.conn, rec.stream_id), None)
        if token is not None:
            self.log.leave(token)
        super()._stream_closed(rec, outcome, error_code)
