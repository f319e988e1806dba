"""The fast HTTP/1.1 codec: llhttp (through httptools) for responses, a direct encoder for
requests.  Optional: ``pip install 'httpx-bulkhead[fast]'``; see ``_codec.py``."""

from __future__ import annotations

import re
from collections import deque
from typing import Any

from ._codec import (
    CLOSED,
    END,
    NEED_DATA,
    PAUSED,
    CodecError,
    H11Codec,
    Head,
    Informational,
    LocalCodecError,
)

__all__ = ["HttptoolsCodec"]

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
