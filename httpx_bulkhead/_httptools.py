"""The fast HTTP/1.1 codec: llhttp (through httptools) for responses, a direct encoder for
requests.  Optional: ``pip install 'httpx-bulkhead[fast]'``.

Theory of operation
-------------------
It must give h11's verdict on every input (see ``_codec.py``), several times cheaper on the
common shapes.  So:

* Requests are encoded by h11's rules: a token method, a visible-ASCII target, h11's field
  syntax, exactly one ``Host`` (written first), ``Content-Length`` normalized (equal
  comma-separated or repeated values collapse), only ``Transfer-Encoding: chunked`` (value
  lowercased), and never both framings.  Body bytes are counted against
  ``Content-Length``: one byte too many or too few is a ``LocalCodecError`` before it is
  written (a surplus would reach the server as the start of another request).
* llhttp parses a response head only in the shape where it reads like h11: a final
  response (status 200-999), HTTP/1.1 or 1.0, plain framing values (``Content-Length`` all
  digits, one ``Transfer-Encoding: chunked``), a reason phrase without NUL/VT/FF, no blank
  line first.  Anything else -- a head llhttp refuses, a 1xx or 101, an odd framing value,
  another version, a partial head at EOF -- is *replayed into h11*, which parses the rest
  of the exchange: the bytes read since the request are kept until the head is complete
  (at most ``max_head``).  HEAD and CONNECT go to h11 from the start (llhttp cannot be told
  what a response answers).
* A chunked body is decoded by ``ChunkedDecoder`` (h11's chunk grammar, ``_chunked.py``);
  llhttp, which was left inside the message, is replaced before the next exchange.
  Length- and close-delimited bodies stay with llhttp.
* After our response, llhttp keeps parsing what follows; anything there (or any byte while
  no request is outstanding, or the blank lines llhttp skips silently) is *trailing data*:
  the connection is not reused, and a parse error there does not fail our response.

* Errors read as h11's (``_codec.py``, "One message"): a refused request is re-encoded by
  h11 for its words (``_refused``, only then: the common path pays nothing), and the messages of the
  response side are h11's texts for the same input.

Bounded memory: the head (``max_head``), and through ``ChunkedDecoder`` an incomplete
chunk-size line and the trailer section; trailers are validated, then dropped.
"""

from __future__ import annotations

import enum
import re
from collections import deque
from typing import Any

import httptools

from ._chunked import ChunkedDecoder, ChunkedError
from ._codec import (
    BOTH_FRAMINGS,
    CLOSED,
    END,
    NEED_DATA,
    CodecError,
    Event,
    H11Codec,
    Head,
    Informational,
    LocalCodecError,
    framing_in_doubt,
    too_long,
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
_BODY_FRAMING = (b"content-length", b"transfer-encoding")


class _Phase(enum.Enum):
    """Where the fast codec is in the current exchange (response side)."""

    IDLE = "idle"  # no request outstanding: every byte is unsolicited
    HEAD = "head"  # awaiting the final response head (llhttp)
    BODY = "body"  # a length- or close-delimited body (llhttp)
    CHUNKED = "chunked"  # a chunked body (ChunkedDecoder)
    H11 = "h11"  # h11 parses the rest of this exchange
    DONE = "done"  # the response is complete
    CLOSED = "closed"  # the exchange failed or the connection ends with it
    # Set inside an llhttp callback, acted on when ``feed_data`` returns:
    TO_H11 = "to-h11"  # hand the head read so far to h11
    TO_CHUNKED = "to-chunked"  # the head announced a chunked body: decode it ourselves


class _Body(enum.Enum):
    """The request body being sent."""

    LENGTH = "length"  # counted against Content-Length (0 when there is none)
    CHUNKED = "chunked"
    DONE = "done"  # ``end()`` succeeded
    FAILED = "failed"  # no body may be sent (before a request, after an error)


# Reaching an Enum member as a class attribute costs about 0.2 µs on Python 3.11; the hot
# path compares with these module-level aliases instead.
_IDLE, _HEAD, _BODY, _CHUNKED, _H11, _DONE, _CLOSED = (
    _Phase.IDLE,
    _Phase.HEAD,
    _Phase.BODY,
    _Phase.CHUNKED,
    _Phase.H11,
    _Phase.DONE,
    _Phase.CLOSED,
)
_TO_H11, _TO_CHUNKED = _Phase.TO_H11, _Phase.TO_CHUNKED
_LENGTH_BODY, _CHUNKED_BODY, _BODY_SENT, _NO_BODY = (
    _Body.LENGTH,
    _Body.CHUNKED,
    _Body.DONE,
    _Body.FAILED,
)


class HttptoolsCodec:
    """llhttp (via httptools) for response heads, a direct encoder for requests.

    llhttp keeps parsing past the end of a message; anything after our response (or bytes
    while no request is outstanding) is recorded as trailing data instead of being taken
    for the next response, and a parse error there does not fail the response we have.
    """

    __slots__ = (
        "_at",
        "_close_requested",
        "_continue",
        "_decoder",
        "_events",
        "_framed",
        "_h11",
        "_head_bytes",
        "_head_chunks",
        "_headers",
        "_keep",
        "_max_head",
        "_method",
        "_mode",
        "_odd_head",
        "_parser",
        "_phase",
        "_reason",
        "_received",
        "_remaining",
        "_request_headers",
        "_target",
        "_te_chunked",
        "_trailing",
    )

    def __init__(self, max_head: int) -> None:
        self._max_head = max_head
        self._parser: Any = httptools.HttpResponseParser(self)  # None: make a fresh one
        self._events: deque[Event | _Fail] = deque()  # parsed, not yet taken
        self._phase = _IDLE
        self._trailing = False
        # request side
        self._mode = _NO_BODY
        self._remaining = 0  # Content-Length bytes still to send
        self._continue = False  # Expect: 100-continue sent, no answer taken yet
        self._close_requested = False  # our request said ``Connection: close``
        self._method = self._target = b""  # kept to hand the exchange to h11
        self._request_headers: list[tuple[bytes, bytes]] = []
        # response side
        self._head_chunks: list[bytes] = []  # what was fed since the request: for h11
        self._head_bytes = 0
        self._at = 0  # where in the current read our response ended (once it has)
        self._headers: list[tuple[bytes, bytes]] = []
        self._reason = b""
        self._odd_head = False  # a framing header llhttp reads more loosely than h11
        self._te_chunked = False  # ``Transfer-Encoding: chunked`` seen
        self._framed = b""  # the ``Content-Length`` value, if one was seen
        self._received = 0  # body bytes of a length-delimited response (for its error)
        self._keep = True  # False when the response ends the connection
        self._decoder = ChunkedDecoder(max_head)
        self._h11: H11Codec | None = None

    # -- request side ------------------------------------------------------------------
    def request(self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
        # Every refusal below is worded by h11 (``_refused``): the verdict is ours, the
        # words the reference's, and the common path pays nothing for it.
        if self._phase is not _IDLE:
            raise _refused(method, target, headers, "the connection cannot take a request now")
        self._mode = _NO_BODY
        if not _TOKEN.fullmatch(method) or not _TARGET.fullmatch(target):
            raise _refused(method, target, headers, "invalid request line")
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
                raise _refused(method, target, headers, f"illegal header {name!r}")
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
                    try:
                        value = _content_length(value)
                    except LocalCodecError as exc:
                        raise _refused(method, target, headers, str(exc)) from None
                if length is not None:
                    if value != length:
                        raise _refused(
                            method, target, headers, "conflicting Content-Length headers"
                        )
                    continue  # a repeated equal value is sent once, as h11 does
                length = value
            elif special == _TRANSFER_ENCODING:
                value = value.lower()
                if value != b"chunked":
                    raise _refused(
                        method, target, headers, "Only Transfer-Encoding: chunked is supported"
                    )
                if chunked:
                    raise _refused(method, target, headers, "multiple Transfer-Encoding headers")
                chunked = True
            elif special == _EXPECT:
                expect = expect or b"100-continue" in _tokens(value)
            elif b"close" in value.lower():  # Connection
                close = close or b"close" in _tokens(value)
            parts += (name, b": ", value, b"\r\n")
        if hosts != 1:
            raise _refused(method, target, headers, "a request needs exactly one Host header")
        if chunked:
            if length is not None:
                raise _refused(method, target, headers, BOTH_FRAMINGS)
            self._mode = _CHUNKED_BODY
        else:
            self._mode = _LENGTH_BODY
            self._remaining = 0 if length is None else int(length)
        parts.append(b"\r\n")
        self._continue = expect
        self._close_requested = close
        self._method = method  # kept in case h11 must take over the response
        self._target = target
        self._request_headers = headers
        self._keep = True
        if self._parser is None:
            self._parser = httptools.HttpResponseParser(self)
        if method == b"HEAD" or method == b"CONNECT":
            self._h11 = self._h11_for_response()
            self._phase = _H11
        else:
            self._phase = _HEAD
            self._head_bytes = 0
            self._odd_head = self._te_chunked = False
            self._framed = b""
        return b"".join(parts)

    def data(self, chunk: bytes) -> bytes:
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
        phase = self._phase
        if phase is _H11:
            self._delegate().feed(data)
            return
        if not data:
            self._eof()
            return
        if phase is _CHUNKED:
            self._decode_chunked(data)
            return
        if phase is _HEAD:
            self._head_chunks.append(data)
            if not self._head_bytes and data[0] != 0x48:  # not "H": let h11 judge
                self._to_h11()  # (llhttp would skip blank lines before the status line)
                return
            self._head_bytes += len(data)
        elif phase is not _BODY:  # idle, done, closed: nobody asked for these
            self._trailing = True
            return
        self._at = 0
        try:
            self._parser.feed_data(data)
        except Exception as exc:  # httptools' HttpParserError and friends
            self._parse_failed(exc)
        phase = self._phase
        if phase is _DONE:
            if self._at < len(data):  # llhttp skips blank lines silently: h11 does not
                self._trailing = True
        elif phase is _TO_CHUNKED:
            self._start_chunked(data)
        elif phase is _TO_H11:
            self._to_h11()
        elif phase is _HEAD and self._head_bytes > self._max_head:
            raise CodecError(too_long(True, self._max_head))

    def _parse_failed(self, exc: Exception) -> None:
        phase = self._phase
        if phase is _HEAD:  # h11 decides what llhttp refuses
            self._phase = _TO_H11
        elif phase is _BODY:
            if self._events:  # report it after what was parsed before it, as h11 does
                self._events.append(_Fail(f"invalid HTTP response: {exc}"))
                self._phase = _CLOSED
            else:
                raise CodecError(f"invalid HTTP response: {exc}") from exc
        elif phase is _DONE or phase is _IDLE:  # after our response
            self._trailing = True
        # TO_H11, TO_CHUNKED: llhttp went on past the point we stopped listening

    def _to_h11(self) -> None:
        """Replay the response bytes read so far into h11, which parses the rest."""
        codec = self._h11_for_response()
        for chunk in self._head_chunks:
            codec.feed(chunk)
        self._head_chunks.clear()
        self._events.clear()  # only a final head is ever queued, and none was
        self._h11 = codec
        self._phase = _H11

    def _delegate(self) -> H11Codec:
        """The h11 codec parsing this exchange (there is one in the H11 phase)."""
        codec = self._h11
        assert codec is not None
        return codec

    def _h11_for_response(self) -> H11Codec:
        """An h11 codec in our place, past our request (its body is ours to frame)."""
        codec = H11Codec(self._max_head)
        headers = [
            (name, value)
            for name, value in self._request_headers
            if name.lower() not in _BODY_FRAMING
        ]
        codec.request(self._method, self._target, headers)
        codec.end()
        return codec

    def _start_chunked(self, data: bytes) -> None:
        """The head ended inside ``data``; what follows it is chunked body."""
        start = self._at
        self._parser = None  # left inside a message: a fresh one for the next exchange
        self._phase = _CHUNKED
        self._decoder.reset()
        if start < len(data):
            self._decode_chunked(data, start)

    def _decode_chunked(self, data: bytes, start: int = 0) -> None:
        try:
            rest = self._decoder.feed(data, self._events, start)
        except ChunkedError as exc:
            self._phase = _CLOSED
            if not self._events:
                raise CodecError(str(exc)) from exc
            self._events.append(_Fail(str(exc)))  # after the body parsed before it
            return
        if rest is not None:
            self._phase = _DONE
            self._events.append(END)
            if rest:
                self._trailing = True

    def _eof(self) -> None:
        phase = self._phase
        if phase is _HEAD:
            if not self._head_bytes:
                self._events.append(CLOSED)
            else:  # a partial head: h11's verdict
                self._to_h11()
                self._delegate().feed(b"")
                return
        elif phase is _BODY:
            if self._framed:
                self._events.append(_Fail(self._short_body()))
            else:  # delimited by the close (RFC 9112 §6.3): complete
                self._events.append(END)
                self._phase = _DONE
                self._keep = False
        elif phase is _CHUNKED:
            self._events.append(_Fail(self._decoder.eof_message()))
        if self._phase is not _DONE:
            self._phase = _CLOSED
        else:
            self._keep = False

    def _short_body(self) -> str:
        """h11's words for a length-delimited body cut by the end of the stream."""
        return (
            "peer closed connection without sending complete message body"
            f" (received {self._received} bytes, expected {int(self._framed)})"
        )

    def next_event(self) -> Event:
        if self._events:  # never in the H11 phase
            event = self._events.popleft()
            if isinstance(event, _Fail):
                raise CodecError(event.message)
            kind = type(event)
        elif self._phase is _H11:
            event = self._delegate().next_event()
            kind = type(event)
        else:
            return NEED_DATA
        if kind is Head or kind is Informational:
            self._continue = False  # as with h11: cleared once the answer is taken
        return event

    @property
    def waiting_for_continue(self) -> bool:
        return self._continue

    @property
    def awaiting_response(self) -> bool:
        if self._phase is _H11:
            return self._delegate().awaiting_response
        return self._phase is _HEAD

    def reuse(self) -> bool:
        phase = self._phase
        if phase is _H11:
            codec = self._delegate()
            ok = codec.reuse()
            self._trailing = self._trailing or codec.has_trailing_data
            self._h11 = None
            self._parser = None  # llhttp may have seen part of this exchange
        else:
            ok = phase is _DONE and self._keep
        reusable = ok and self._mode is _BODY_SENT and not self._trailing
        reusable = reusable and not self._close_requested
        self._phase = _IDLE if reusable else _CLOSED
        return reusable

    @property
    def has_trailing_data(self) -> bool:
        if self._h11 is not None and self._h11.has_trailing_data:
            return True
        return self._trailing

    # -- llhttp callbacks ----------------------------------------------------------------
    # A head's list of fields and reason phrase are fresh for each message (a queued Head
    # keeps its own), so the callbacks can fill them without looking at the phase.
    def on_message_begin(self) -> None:
        if self._phase is _DONE:  # a message nobody asked for
            self._trailing = True
        self._headers = []
        self._reason = b""

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name)
        if size == 14 or size == 17:  # the length of the framing headers' names
            self._framing_header(name, value)
        if value and value[-1] < 0x21:
            # llhttp leaves trailing whitespace in a value; it is not part of it (RFC 9112
            # §5), h11 strips it.
            value = value.rstrip(b" \t")
        self._headers.append((name, value))

    def _framing_header(self, name: bytes, value: bytes) -> None:
        """Note a Content-Length or Transfer-Encoding; flag values h11 reads otherwise
        (h11 normalizes them, or refuses them where llhttp does not)."""
        lowered = name.lower()
        if lowered == b"transfer-encoding":
            if value != b"chunked" or self._te_chunked:
                self._odd_head = True
            self._te_chunked = True
        elif lowered == b"content-length":
            if not value.isdigit() or len(value) > _MAX_LENGTH_DIGITS:
                self._odd_head = True
            self._framed = value

    def on_headers_complete(self) -> None:
        if self._phase is not _HEAD:
            return
        parser = self._parser
        status = parser.get_status_code()
        version = parser.get_http_version()
        reason = self._reason
        chunks = self._head_chunks
        head = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if (
            status < 200  # 1xx, 101: h11 follows them
            or self._odd_head
            or (version != "1.1" and version != "1.0")
            or (reason != b"OK" and reason and min(reason) < 0x0D)  # NUL, VT, FF pass llhttp
        ):
            self._phase = _TO_H11
            return
        # llhttp (strict) accepted the head: its lines end in CRLF, its end is the first
        # empty line.
        end = head.find(b"\r\n\r\n") + 4
        self._at = end - (len(head) - len(chunks[-1]))  # where it ends in the current read
        chunks.clear()
        if version == "1.1":
            self._keep = parser.should_keep_alive()
            self._events.append(Head(status, self._headers, b"1.1", reason))
        else:
            self._keep = False  # h11 keeps no HTTP/1.0 connection alive
            self._events.append(Head(status, self._headers, b"1.0", reason))
        te_chunked = self._te_chunked
        if te_chunked and framing_in_doubt(version.encode(), bool(self._framed), te_chunked):
            # (today llhttp refuses both framings and h11 reads them: this holds the rule
            # should llhttp ever accept them)
            self._keep = False
        if te_chunked and status != 204 and status != 304:
            self._phase = _TO_CHUNKED
            self._headers = []  # llhttp may go on to the trailers: not for the Head
        else:
            self._phase = _BODY
            self._received = 0

    def on_body(self, body: bytes) -> None:
        if self._phase is _BODY:
            size = len(body)
            self._at += size
            self._received += size
            self._events.append(body)

    def on_message_complete(self) -> None:
        phase = self._phase
        if phase is _BODY:
            self._phase = _DONE
            self._events.append(END)
        elif phase is _DONE:
            self._trailing = True


def _refused(
    method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], own: str
) -> LocalCodecError:
    """The refusal of a request, in h11's words for the same request, which users read
    with either codec (both refuse the same requests: ``tests/fuzz``); ``own`` if h11
    would send it (a misuse of the codec rather than a bad request)."""
    try:
        H11Codec(_MAX_LENGTH_DIGITS).request(method, target, headers)
    except LocalCodecError as exc:
        return LocalCodecError(str(exc))
    return LocalCodecError(own)


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
