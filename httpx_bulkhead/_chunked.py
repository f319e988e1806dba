"""The chunked transfer coding (RFC 9112 §7.1) of a response body, for the fast codec.

llhttp (through httptools) parses the fast codec's response heads, but its chunk grammar is
not h11's, and h11 is the reference: the two must give the same verdict on every input.  So
once a head announces ``Transfer-Encoding: chunked``, the rest of the message is decoded here.

Theory of operation
-------------------
The decoder accepts exactly what h11 accepts, as h11 reads it:

* a chunk-size line is everything up to the first CRLF, and must be 1 to 20 hex digits,
  optionally ``;`` and anything but LF (the extensions, ignored), then optional SP/HTAB;
* the chunk data is followed by exactly CRLF, which may arrive split over reads;
* after the last chunk (size 0), the trailer section ends at the first empty line (LF or
  CRLF, bare LF being accepted as h11 does); a non-empty section is handed to h11 itself
  for validation and then discarded, as the reference codec discards it.

Errors carry h11's messages for the same input (``eof_message`` too), so a user reads the
same text with either codec; an incomplete line past the limit is ``too_long``'s.

Memory is bounded: the only bytes kept between reads are an incomplete chunk-size line or
an incomplete trailer section, and those may not grow past ``limit`` (the head limit, the
same rule as h11's ``max_incomplete_event_size``).  Chunk data is never buffered: every
byte goes out as soon as it arrives.  Searches resume where the last one stopped, so a peer
trickling bytes costs linear time.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any

import h11

from ._codec import too_long

__all__ = ["ChunkedDecoder", "ChunkedError"]

# 1 to 20 hex digits, optional extensions (``;`` then anything but LF), optional SP/HTAB.
_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,20})(?:;[^\n]*)?[ \t]*\r\n")
_HEX_DIGITS = b"0123456789abcdefABCDEF"
_EMPTY_LINE = re.compile(rb"\n\r?\n")
_CRLF = b"\r\n"
#: What h11 sees before a trailer section it is asked to validate.
_TRAILER_PREFIX = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n"


class ChunkedError(Exception):
    """The chunked body is malformed, or an incomplete line outgrew the limit."""


class ChunkedDecoder:
    """Decodes one chunked message body.  ``feed`` appends body pieces to an output queue
    and returns ``None`` until the message ends, then the bytes that followed it."""

    __slots__ = ("_buffer", "_crlf", "_left", "_limit", "_scanned", "_trailers")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._buffer = bytearray()  # an incomplete size line or trailer section
        self._scanned = 0  # how much of ``_buffer`` a search already covered
        self._left = 0  # chunk data bytes still to come
        self._crlf = 0  # bytes of the CRLF after chunk data still to come (2, 1 or 0)
        self._trailers = False  # the last chunk was read: the trailer section follows

    def reset(self) -> None:
        """Get ready for a new body."""
        self._buffer.clear()
        self._scanned = self._left = self._crlf = 0
        self._trailers = False

    def feed(self, data: bytes, out: deque[Any], start: int = 0) -> bytes | None:
        """Decode ``data[start:]``; body pieces go to ``out``.

        Returns:
            ``None`` while the body continues; once it has ended, what followed it in
            ``data`` (``b""`` if nothing).

        Raises:
            ChunkedError: malformed framing, or an incomplete line longer than the limit.
        """
        buf: bytes | bytearray
        if self._buffer:
            self._buffer += data[start:] if start else data
            buf, pos = self._buffer, 0
        else:
            buf, pos = data, start
        end = len(buf)
        left, crlf = self._left, self._crlf  # locals: this loop is the hot path
        while pos < end:
            if left:
                stop = pos + left if pos + left < end else end
                piece = buf[pos:stop]  # the whole of ``data`` is not copied
                out.append(piece if type(piece) is bytes else bytes(piece))
                left -= stop - pos
                pos = stop
                if not left:
                    if buf[pos : pos + 2] == _CRLF:  # usually here already
                        pos += 2
                    else:
                        crlf = 2
            elif crlf:
                got = buf[pos : pos + crlf]
                expected = _CRLF[2 - crlf :]
                if got != expected[: len(got)]:
                    raise ChunkedError(
                        f"malformed chunk footer: {bytearray(got)!r} (expected {expected!r})"
                    )
                pos += len(got)
                crlf -= len(got)
            elif self._trailers:
                self._left = self._crlf = 0
                return self._trailer_section(buf, pos)
            else:
                scanned = self._scanned
                line_end = buf.find(_CRLF, pos if scanned <= pos else scanned - 1)
                if line_end < 0:
                    self._scanned = end
                    break
                self._scanned = 0
                line = buf[pos:line_end]
                if 0 < len(line) <= 20 and not line.translate(None, _HEX_DIGITS):
                    left = int(line, 16)  # the usual line: hex digits only
                else:
                    match = _SIZE_LINE.fullmatch(buf, pos, line_end + 2)
                    if match is None:  # h11 shows the whole line, CRLF included
                        header = bytearray(buf[pos : line_end + 2])
                        raise ChunkedError(f"illegal chunk header: {header!r}")
                    left = int(match[1], 16)
                pos = line_end + 2
                if not left:
                    self._trailers = True
        self._left, self._crlf = left, crlf
        self._keep(buf, pos)
        return None

    def _trailer_section(self, buf: bytes | bytearray, pos: int) -> bytes | None:
        """Find the end of the trailer section (an empty line, h11's rule); validate it."""
        if buf[pos : pos + 1] == b"\n":
            return bytes(buf[pos + 1 :])
        if buf[pos : pos + 2] == _CRLF:
            return bytes(buf[pos + 2 :])
        match = _EMPTY_LINE.search(buf, pos + max(0, self._scanned - 2))
        if match is None:
            self._keep(buf, pos)
            self._scanned = len(self._buffer)
            return None
        _check_trailers(bytes(buf[pos : match.end()]))
        return bytes(buf[match.end() :])

    def _keep(self, buf: bytes | bytearray, pos: int) -> None:
        """Keep ``buf[pos:]`` (an incomplete line) for the next read, within the limit."""
        if buf is self._buffer:
            del self._buffer[:pos]
            if pos:
                self._scanned = max(0, self._scanned - pos)
        elif pos < len(buf):
            self._buffer = bytearray(buf[pos:])
            self._scanned = max(0, self._scanned - pos)
        if len(self._buffer) > self._limit:
            raise ChunkedError(too_long(False, self._limit))

    def eof_message(self) -> str:
        """What the end of the stream inside this body is called (h11's words): inside a
        line (chunk size or trailer), or between the body's parts."""
        if self._buffer:
            return "peer unexpectedly closed connection"
        return (
            "peer closed connection without sending complete message body (incomplete chunked read)"
        )


def _check_trailers(section: bytes) -> None:
    """Validate a complete, non-empty trailer section exactly as h11 would (obs-fold,
    field syntax, ``Content-Length``/``Transfer-Encoding`` rules); the fields are
    discarded, as the reference codec discards them."""
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=len(section) + 1024)
    conn.send(h11.Request(method=b"GET", target=b"/", headers=[(b"Host", b"trailers")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(_TRAILER_PREFIX + section)
    try:
        while type(event := conn.next_event()) is not h11.EndOfMessage:
            if event is h11.NEED_DATA:  # cannot happen: the section is complete
                raise ChunkedError("incomplete trailer section")
    except h11.RemoteProtocolError as exc:
        raise ChunkedError(str(exc)) from exc
