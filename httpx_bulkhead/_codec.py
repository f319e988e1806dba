"""HTTP/1.1 message codecs: bytes to events and back, for one client connection.

``HTTP11Connection`` talks to a codec, not to h11 directly, so the parser can be swapped:

* ``H11Codec`` (the default and the reference): h11, pure Python, strict.
* ``HttptoolsCodec`` (optional, ``pip install 'httpx-bulkhead[fast]'``): llhttp through
  httptools for responses and a direct encoder for requests; several times cheaper per
  exchange.  The test suite runs the HTTP/1.1 tests against both.

A codec is pure: it does no I/O and reads no clock.  Events returned by ``next_event``:
``NEED_DATA``; a ``Head`` (final response head) or ``Informational`` (1xx); ``bytes`` (body
data); ``END`` (response complete); ``CLOSED`` (the peer closed before any response);
``PAUSED`` (101 or CONNECT: the connection left HTTP).  Malformed input raises
``CodecError``; misuse of the request side raises ``LocalCodecError``.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any, NamedTuple, Protocol

import h11

__all__ = [
    "CLOSED",
    "END",
    "NEED_DATA",
    "PAUSED",
    "Codec",
    "CodecError",
    "H11Codec",
    "Head",
    "HttptoolsCodec",
    "Informational",
    "LocalCodecError",
    "make_codec",
]


class _Sentinel:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


NEED_DATA = _Sentinel("NEED_DATA")
END = _Sentinel("END")
CLOSED = _Sentinel("CLOSED")
PAUSED = _Sentinel("PAUSED")


class Head(NamedTuple):
    status: int
    headers: list[tuple[bytes, bytes]]  # as received (original case)
    http_version: bytes  # b"1.1", b"1.0"
    reason: bytes


class Informational(NamedTuple):
    status: int


class CodecError(Exception):
    """The peer sent something that is not valid HTTP/1.1."""


class LocalCodecError(Exception):
    """We were asked to send something that is not valid HTTP/1.1."""


class Codec(Protocol):
    def request(self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
        """The request head, as bytes to write."""
        ...

    def data(self, chunk: bytes) -> bytes:
        """A piece of the request body, framed."""
        ...

    def end(self) -> bytes:
        """The end of the request body (the last chunk marker, if chunked)."""
        ...

    def feed(self, data: bytes) -> None:
        """Bytes from the peer; ``b""`` at end of stream."""
        ...

    def next_event(self) -> Any: ...

    @property
    def waiting_for_continue(self) -> bool:
        """We sent ``Expect: 100-continue`` and neither 100 nor a final response came."""
        ...

    @property
    def awaiting_response(self) -> bool:
        """No part of the final response has been parsed yet."""
        ...

    def reuse(self) -> bool:
        """After ``END``: if both sides completed and keep the connection alive, get ready
        for the next exchange and return True; else False (the connection must close)."""
        ...

    @property
    def has_trailing_data(self) -> bool:
        """Bytes arrived that belong to no request (the connection is not safe to reuse)."""
        ...


def make_codec(name: str, max_head: int) -> Codec:
    """A fresh codec: ``"h11"`` or ``"httptools"``."""
    if name == "httptools":
        return HttptoolsCodec(max_head)
    return H11Codec(max_head)


class H11Codec:
    """The reference codec, on h11."""

    __slots__ = ("_eof", "_h11")

    def __init__(self, max_head: int) -> None:
        self._h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=max_head)
        self._eof = False

    def _send(self, event: Any) -> bytes:
        try:
            return self._h11.send(event) or b""
        except h11.LocalProtocolError as exc:
            raise LocalCodecError(str(exc)) from exc

    def request(self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
        try:
            event = h11.Request(method=method, target=target, headers=headers)
        except h11.LocalProtocolError as exc:
            raise LocalCodecError(str(exc)) from exc
        return self._send(event)

    def data(self, chunk: bytes) -> bytes:
        return self._send(h11.Data(data=chunk))

    def end(self) -> bytes:
        return self._send(h11.EndOfMessage())

    def feed(self, data: bytes) -> None:
        if not data:
            self._eof = True
        self._h11.receive_data(data)

    def next_event(self) -> Any:
        try:
            event = self._h11.next_event()
        except h11.RemoteProtocolError as exc:
            raise CodecError(str(exc) or "protocol error") from exc
        if isinstance(event, h11.Data):
            return bytes(event.data)
        if isinstance(event, h11.Response):
            headers = event.headers.raw_items()
            return Head(event.status_code, headers, event.http_version, event.reason)
        if isinstance(event, h11.EndOfMessage):
            return END
        if isinstance(event, h11.InformationalResponse):
            return Informational(event.status_code)
        if isinstance(event, h11.ConnectionClosed):
            return CLOSED
        if event is h11.PAUSED:
            return PAUSED
        return NEED_DATA

    @property
    def waiting_for_continue(self) -> bool:
        return self._h11.client_is_waiting_for_100_continue

    @property
    def awaiting_response(self) -> bool:
        return self._h11.their_state is h11.SEND_RESPONSE

    def reuse(self) -> bool:
        # After a body delimited by the end of the stream h11 reports both sides DONE, but
        # the peer has closed: nothing can follow.
        if self._eof:
            return False
        if self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE:
            self._h11.start_next_cycle()
            return True
        return False

    @property
    def has_trailing_data(self) -> bool:
        return bool(self._h11.trailing_data[0])


# -- the fast codec ---------------------------------------------------------------------

_TOKEN = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(rb"[\x00\r\n]")


class HttptoolsCodec:
    """llhttp (via httptools) for responses, a direct encoder for requests.

    llhttp keeps parsing past the end of a message; anything after our response (or bytes
    while no request is outstanding) is recorded as trailing data instead of being taken
    for the next response, and a parse error there does not fail the response we have.
    llhttp cannot be told a response answers HEAD, so HEAD exchanges use h11.
    """

    __slots__ = (
        "_body_mode",
        "_close_requested",
        "_continue",
        "_done_sending",
        "_events",
        "_h11",
        "_head_bytes",
        "_headers",
        "_keep",
        "_max_head",
        "_parser",
        "_phase",
        "_reason",
        "_trailing",
    )

    def __init__(self, max_head: int) -> None:
        import httptools  # an optional dependency: imported only when chosen

        self._max_head = max_head
        self._parser: Any = httptools.HttpResponseParser(self)
        self._events: deque[Any] = deque()
        self._headers: list[tuple[bytes, bytes]] = []
        self._reason = b""
        self._phase = "idle"  # idle, head (awaiting response), body, done, closed
        self._head_bytes = 0
        self._body_mode = "none"  # "length", "chunked", "none"
        self._continue = False
        self._done_sending = True
        self._trailing = False
        self._keep = True  # False when the body was delimited by the end of the stream
        self._close_requested = False  # our request said ``Connection: close``
        self._h11: H11Codec | None = None  # serves a HEAD exchange

    # -- request side ------------------------------------------------------------------
    def request(self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
        if self._phase != "idle":
            raise LocalCodecError("a request is already in progress")
        if method in (b"HEAD", b"CONNECT"):
            self._h11 = H11Codec(self._max_head)
            self._phase = "delegated"
            return self._h11.request(method, target, headers)
        if not _TOKEN.fullmatch(method) or not target or b" " in target:
            raise LocalCodecError("invalid request line")
        parts = [method, b" ", target, b" HTTP/1.1\r\n"]
        mode = "none"
        expect = False
        close = False
        for name, value in headers:
            if not _TOKEN.fullmatch(name) or _BAD_VALUE.search(value):
                raise LocalCodecError(f"illegal header {name!r}")
            lowered = name.lower()
            if lowered == b"content-length":
                mode = "length"
            elif lowered == b"transfer-encoding" and value.lower() == b"chunked":
                mode = "chunked"
            elif lowered == b"expect" and value.lower() == b"100-continue":
                expect = True
            elif lowered == b"connection" and b"close" in value.lower():
                close = True
            parts += (name, b": ", value, b"\r\n")
        parts.append(b"\r\n")
        self._body_mode = mode
        self._continue = expect
        self._done_sending = False
        self._phase = "head"
        self._head_bytes = 0
        self._keep = True
        self._close_requested = close
        return b"".join(parts)

    def data(self, chunk: bytes) -> bytes:
        if self._h11 is not None:
            return self._h11.data(chunk)
        if self._body_mode == "chunked":
            return b"%x\r\n%s\r\n" % (len(chunk), chunk)
        if self._body_mode == "length":
            return chunk
        raise LocalCodecError("request body without Content-Length or Transfer-Encoding")

    def end(self) -> bytes:
        if self._h11 is not None:
            return self._h11.end()
        self._done_sending = True
        return b"0\r\n\r\n" if self._body_mode == "chunked" else b""

    # -- response side -----------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        if self._h11 is not None:
            self._h11.feed(data)
            return
        if not data:
            self._eof()
            return
        if self._phase in ("idle", "done", "closed"):
            self._trailing = True
            return
        if self._phase == "head":
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except Exception as exc:  # httptools' HttpParserError and friends
            self._parse_failed(exc)
        if self._phase == "head" and self._head_bytes > self._max_head:
            raise CodecError("response head too long")

    def _parse_failed(self, exc: Exception) -> None:
        name = type(exc).__name__
        if self._phase in ("done", "idle"):  # after our response: not ours to report
            self._trailing = True
        elif name == "HttpParserUpgrade":
            self._events.append(PAUSED)
        elif self._events:  # report it after what was parsed before it, as h11 does
            self._events.append(_Fail(f"invalid HTTP response: {exc}"))
            self._phase = "closed"
        else:
            raise CodecError(f"invalid HTTP response: {exc}") from exc

    def _eof(self) -> None:
        if self._phase == "head" and not self._events:
            self._events.append(CLOSED if self._head_bytes == 0 else _Fail("incomplete head"))
        elif self._phase == "body":
            if self._body_mode_of_response() == "eof":
                self._events.append(END)
                self._phase = "done"
                self._keep = False
            else:
                self._events.append(_Fail("peer closed connection without sending complete body"))
        self._phase = "closed" if self._phase != "done" else "done"

    def next_event(self) -> Any:
        if self._h11 is not None:
            event = self._h11.next_event()
            return event
        if self._events:
            event = self._events.popleft()
            kind = type(event)
            if kind is _Fail:
                raise CodecError(event.message)
            if kind is Head or kind is Informational:
                self._continue = False  # as with h11: cleared once the answer is taken
            return event
        return NEED_DATA

    @property
    def waiting_for_continue(self) -> bool:
        if self._h11 is not None:
            return self._h11.waiting_for_continue
        return self._continue

    @property
    def awaiting_response(self) -> bool:
        if self._h11 is not None:
            return self._h11.awaiting_response
        return self._phase == "head" and self._head_bytes == 0

    def reuse(self) -> bool:
        if self._h11 is not None:
            reusable = self._h11.reuse() and not self._h11.has_trailing_data
            self._h11 = None
            self._phase = "idle" if reusable else "closed"
            return reusable
        if self._phase != "done" or not self._done_sending or self._trailing:
            return False
        reusable = self._keep and not self._close_requested
        self._phase = "idle" if reusable else "closed"
        return reusable

    @property
    def has_trailing_data(self) -> bool:
        if self._h11 is not None:
            return self._h11.has_trailing_data
        return self._trailing

    # -- llhttp callbacks ----------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self._phase not in ("head", "body"):
            self._trailing = True
        self._headers = []
        self._reason = b""

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self._phase != "head":
            self._trailing = True
            return
        status = self._parser.get_status_code()
        version = self._parser.get_http_version().encode("ascii")
        if 100 <= status < 200:
            if status == 101:
                return  # httptools raises HttpParserUpgrade: reported as PAUSED
            self._events.append(Informational(status))
            return
        self._phase = "body"
        self._keep = bool(self._parser.should_keep_alive())  # llhttp forgets after the body
        self._events.append(Head(status, self._headers, version, self._reason))

    def on_body(self, body: bytes) -> None:
        if self._phase == "body":
            self._events.append(body)

    def on_message_complete(self) -> None:
        if self._phase == "body":
            self._phase = "done"
            self._events.append(END)
        elif self._phase != "head":  # a 1xx completes without changing our phase
            self._trailing = True

    def _body_mode_of_response(self) -> str:
        for name, value in self._headers:
            lowered = name.lower()
            if lowered == b"content-length" or (
                lowered == b"transfer-encoding" and b"chunked" in value.lower()
            ):
                return "framed"
        return "eof"


class _Fail:
    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message
