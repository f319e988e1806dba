"""The fast HTTP/1.1 codec: llhttp (through httptools) for responses, a direct encoder for
requests.  Optional: ``pip install 'httpx-bulkhead[fast]'``; see ``_codec.py``.

Requests are encoded by h11's rules: a token method, a visible-ASCII target, h11's field
syntax, exactly one ``Host`` (written first), ``Content-Length`` normalized (equal
comma-separated or repeated values collapse), only ``Transfer-Encoding: chunked`` (value
lowercased), and never both framings.  Body bytes are counted against ``Content-Length``:
one byte too many or too few is a ``LocalCodecError`` before it is written (a surplus would
reach the server as the start of another request).  HEAD and CONNECT go to h11 whole.
"""

from __future__ import annotations

import enum
import re
from collections import deque
from typing import Any

from ._codec import (
    BOTH_FRAMINGS,
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
_TARGET = re.compile(rb"[\x21-\x7e]+")
# A field value as h11 writes it: no NUL, CR, LF, VT or FF; no SP/HTAB at either end.
# Characters h11 refuses anywhere in a field value (it also refuses SP/HTAB at either end).
_BAD_VALUE = re.compile(rb"[\x00\n\r\x0b\x0c]")
# The request headers the encoder looks at (by lowercased name); the rest pass through.
_HOST, _CONTENT_LENGTH, _TRANSFER_ENCODING, _EXPECT, _CONNECTION = range(5)
_SPECIAL = {
    b"host": _HOST,
    b"content-length": _CONTENT_LENGTH,
    b"transfer-encoding": _TRANSFER_ENCODING,
    b"expect": _EXPECT,
    b"connection": _CONNECTION,
}
_MAX_LENGTH_DIGITS = 20  # h11's limit on a Content-Length value


class _Body(enum.Enum):
    """The request body being sent."""

    LENGTH = "length"  # counted against Content-Length (0 when there is none)
    CHUNKED = "chunked"
    DONE = "done"  # ``end()`` succeeded
    FAILED = "failed"  # no body may be sent (before a request, after an error)


# Reaching an Enum member as a class attribute costs about 0.2 µs on Python 3.11; the hot
# path compares with these module-level aliases instead.
_LENGTH_BODY, _CHUNKED_BODY, _BODY_SENT, _NO_BODY = (
    _Body.LENGTH,
    _Body.CHUNKED,
    _Body.DONE,
    _Body.FAILED,
)


class HttptoolsCodec:
    """llhttp (via httptools) for responses, a direct encoder for requests.

    llhttp keeps parsing past the end of a message; anything after our response (or bytes
    while no request is outstanding) is recorded as trailing data instead of being taken
    for the next response, and a parse error there does not fail the response we have.
    llhttp cannot be told a response answers HEAD, so HEAD exchanges use h11.
    """

    __slots__ = (
        "_close_requested",
        "_continue",
        "_events",
        "_h11",
        "_head_bytes",
        "_headers",
        "_keep",
        "_max_head",
        "_mode",
        "_parser",
        "_phase",
        "_reason",
        "_remaining",
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
        self._mode = _NO_BODY
        self._remaining = 0  # Content-Length bytes still to send
        self._continue = False
        self._trailing = False
        self._keep = True  # False when the body was delimited by the end of the stream
        self._close_requested = False  # our request said ``Connection: close``
        self._h11: H11Codec | None = None  # serves a HEAD exchange

    # -- request side ------------------------------------------------------------------
    def request(self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
        if self._phase != "idle":
            raise LocalCodecError("a request is already in progress")
        self._mode = _NO_BODY
        if method in (b"HEAD", b"CONNECT"):
            self._h11 = H11Codec(self._max_head)
            self._phase = "delegated"
            return self._h11.request(method, target, headers)
        if not _TOKEN.fullmatch(method) or not _TARGET.fullmatch(target):
            raise LocalCodecError("invalid request line")
        parts = [method, b" ", target, b" HTTP/1.1\r\n"]
        length: bytes | None = None
        chunked = expect = close = False
        hosts = 0
        for name, value in headers:
            if (
                not _TOKEN.fullmatch(name)
                or _BAD_VALUE.search(value)
                or value.strip(b" \t") != value  # h11: no whitespace at either end
            ):
                raise LocalCodecError(f"illegal header {name!r}")
            special = _SPECIAL.get(name.lower())
            if special is None:
                parts += (name, b": ", value, b"\r\n")
                continue
            if special == _HOST:
                hosts += 1
                if len(parts) > 4:  # h11 writes Host first (RFC 9110 §7.2 advises it)
                    parts[4:4] = (name, b": ", value, b"\r\n")
                    continue
            elif special == _CONTENT_LENGTH:
                if not value.isdigit() or len(value) > _MAX_LENGTH_DIGITS:
                    value = _content_length(value)
                if length is not None:
                    if value != length:
                        raise LocalCodecError("conflicting Content-Length headers")
                    continue  # a repeated equal value is sent once, as h11 does
                length = value
            elif special == _TRANSFER_ENCODING:
                value = value.lower()
                if value != b"chunked":
                    raise LocalCodecError("Only Transfer-Encoding: chunked is supported")
                if chunked:
                    raise LocalCodecError("multiple Transfer-Encoding headers")
                chunked = True
            elif special == _EXPECT:
                expect = expect or b"100-continue" in _tokens(value)
            elif b"close" in value.lower():  # Connection
                close = close or b"close" in _tokens(value)
            parts += (name, b": ", value, b"\r\n")
        if hosts != 1:
            raise LocalCodecError("a request needs exactly one Host header")
        if chunked:
            if length is not None:
                raise LocalCodecError(BOTH_FRAMINGS)
            self._mode = _CHUNKED_BODY
        else:
            self._mode = _LENGTH_BODY
            self._remaining = 0 if length is None else int(length)
        parts.append(b"\r\n")
        self._continue = expect
        self._phase = "head"
        self._head_bytes = 0
        self._keep = True
        self._close_requested = close
        return b"".join(parts)

    def data(self, chunk: bytes) -> bytes:
        if self._h11 is not None:
            return self._h11.data(chunk)
        mode = self._mode
        if mode is _LENGTH_BODY:
            self._remaining -= len(chunk)
            if self._remaining < 0:  # the surplus would be read as another request
                self._mode = _NO_BODY
                raise LocalCodecError("Too much data for declared Content-Length")
            return chunk
        if mode is _CHUNKED_BODY:
            return b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunk else b""
        raise LocalCodecError("no request body is being sent")

    def end(self) -> bytes:
        if self._h11 is not None:
            return self._h11.end()
        mode = self._mode
        self._continue = False  # as with h11: the body is sent, no point waiting
        if mode is _LENGTH_BODY:
            if self._remaining:  # the server would wait for the rest
                self._mode = _NO_BODY
                raise LocalCodecError("Too little data for declared Content-Length")
            self._mode = _BODY_SENT
            return b""
        if mode is _CHUNKED_BODY:
            self._mode = _BODY_SENT
            return b"0\r\n\r\n"
        raise LocalCodecError("no request body is being sent")

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
        if self._phase != "done" or self._mode is not _BODY_SENT or self._trailing:
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


def _content_length(value: bytes) -> bytes:
    """A request's Content-Length as h11 sends it: equal comma-separated values collapse
    to one (RFC 9110 §8.6); anything else that is not a decimal number is refused."""
    if not value.isdigit():
        values = {part.strip() for part in value.split(b",")}
        if len(values) != 1:
            raise LocalCodecError("conflicting Content-Length headers")
        value = values.pop()
        if not value.isdigit():
            raise LocalCodecError("bad Content-Length")
    if len(value) > _MAX_LENGTH_DIGITS:
        raise LocalCodecError("bad Content-Length")
    return value


def _tokens(value: bytes) -> list[bytes]:
    """The comma-separated, case-insensitive tokens of a header value."""
    return [part.strip() for part in value.lower().split(b",")]


class _Fail:
    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message
