"""Frame-level work on the HTTP/2 byte stream before h2 sees it.  Pure and clock-free.

Two jobs, both done on frame headers (9 bytes: a 24-bit length, a type, flags and a
stream id, RFC 9113 §4.1); every byte that is not taken out reaches h2 unchanged and in
order, however the stream was cut into reads.  The splitter hands the bytes on through
its ``deliver`` callback, in one or more runs per read.

GOAWAY.  h2 closes its connection state machine on a received GOAWAY and then rejects
every later frame, so the streams a GOAWAY lets finish (§6.8: those at or below
``last_stream_id``) could not complete.  GOAWAY frames are taken out and delivered (after
the bytes in front of them) as ``GoAway`` values instead.

content-length.  A response whose DATA does not add up to its ``content-length`` is
malformed, a *stream* error (§8.1.1), but h2 raises it as a connection error and closes
its state machine, failing every stream on the connection.  So the splitter counts each
DATA frame's payload (padding excluded) against the length announced with ``expect`` and
stops in front of an offending frame: it delivers what comes before with a
``BodyMismatch``, the connection resets that stream, then h2 reads the frame as data on a
reset stream, which it accepts (and credits to the connection window).  The length is
known only once h2 has decoded the response's header block, so the splitter also delivers
the bytes in front of a DATA frame whose stream's header block has not been delivered yet:
h2 decodes the block, the connection calls ``expect`` (from the callback), and the walk
goes on.  (So a response whose HEADERS and DATA share a read costs two deliveries.)  h2
checks DATA frames only; the splitter also reports a trailer block that ends a stream short
of its length, and for that delivers in front of a second header block of a stream too.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import NamedTuple, TypeAlias

__all__ = ["BodyMismatch", "Deliver", "FrameSizeError", "FrameSplitter", "GoAway"]

_DATA = 0x0
_HEADERS = 0x1
_GOAWAY = 0x7
_CONTINUATION = 0x9
_END_STREAM = 0x1
_END_HEADERS = 0x4
_PADDED = 0x8
_HEADER = 9
_STREAM_MASK = 0x7FFF_FFFF
#: A frame header: length (high byte, low 16 bits), type, flags, stream id (R bit included).
_FRAME = struct.Struct(">BHBBI")
#: SETTINGS_MAX_FRAME_SIZE we advertise (the protocol default, which we do not change).
MAX_FRAME_SIZE = 16_384


class FrameSizeError(Exception):
    """A GOAWAY longer than our SETTINGS_MAX_FRAME_SIZE (RFC 9113 §4.2): a connection error.
    Raised before its payload is buffered, so memory stays bounded."""


class GoAway(NamedTuple):
    last_stream_id: int
    error_code: int


class BodyMismatch(NamedTuple):
    """A stream's DATA contradicts its ``content-length``: more than announced, or the
    stream ends short of it."""

    stream_id: int
    expected: int
    received: int  # counting the offending frame

    def __str__(self) -> str:
        return (
            f"response body does not match its content-length: {self.expected} bytes "
            f"announced, {self.received} received"
        )


#: ``deliver(data, goaway, mismatch)``: hand ``data`` to h2 and act on its events, then on
#: ``goaway`` (taken out right after ``data``) and ``mismatch`` (reset that stream: the
#: next delivery holds the offending frame).  Returns False to stop (connection broken).
Deliver: TypeAlias = Callable[[bytes, GoAway | None, BodyMismatch | None], bool]


class FrameSplitter:
    """Feed it what the socket gave; see the module docstring."""

    __slots__ = (
        "_block",
        "_block_ends",
        "_deliver",
        "_expect",
        "_fresh",
        "_held",
        "_left",
        "_received",
    )

    def __init__(self, deliver: Deliver) -> None:
        self._deliver = deliver
        self._left = 0  # bytes of the current frame's payload still to pass through
        self._held = b""  # a frame header (or a GOAWAY) not complete yet
        self._expect: dict[int, int] = {}  # stream -> announced length
        self._received: dict[int, int] = {}  # stream -> DATA bytes so far (if any)
        self._fresh: set[int] = set()  # streams whose header block h2 has not decoded
        self._block = 0  # stream of a header block whose last frame has not passed
        self._block_ends = False  # the frame passing now ends that block

    # -- what the connection tells us ---------------------------------------------------
    def expect(self, stream_id: int, length: int) -> None:
        """Check ``stream_id``'s DATA against ``length`` bytes from now on."""
        self._expect[stream_id] = length

    def forget(self, stream_id: int) -> None:
        """``stream_id`` is closed (reset): stop checking it."""
        if self._expect.pop(stream_id, None) is not None:
            self._received.pop(stream_id, None)

    @property
    def checking(self) -> int:
        """Streams whose DATA is being checked (for tests: nothing leaks)."""
        return len(self._expect)

    # -- reading ------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        """Walk ``data`` and deliver it.

        Raises:
            FrameSizeError: an oversized GOAWAY (nothing after it was delivered).
        """
        if self._left >= len(data) and not self._held:  # inside a payload: the fast path
            self._left -= len(data)
            if not self._left and self._block_ends:  # h2 gets the whole header block now
                self._block = 0
                self._block_ends = False
                self._fresh.clear()
            self._deliver(data, None, None)
            return
        if self._held:
            data, self._held = self._held + data, b""
        self._walk(data)

    def _walk(self, data: bytes) -> None:
        size = len(data)
        pos = start = 0  # ``start``: first byte not delivered yet
        fresh = self._fresh
        expect = self._expect
        if self._left:
            pos = min(self._left, size)
            self._left -= pos
            if not self._left and self._block_ends:
                self._block = 0
                self._block_ends = False
        while pos < size:
            if size - pos < _HEADER:
                self._held = data[pos:]
                break
            high, low, kind, flags, stream_id = _FRAME.unpack_from(data, pos)
            length = high << 16 | low
            if kind == _DATA:
                stream_id &= _STREAM_MASK
                if stream_id in fresh and stream_id != self._block:
                    # h2 must decode its header block (and we learn the length) first.
                    if not self._flush(data[start:pos], None, None):
                        return
                    start = pos
                expected = expect.get(stream_id)
                if expected is not None:
                    size_ = length
                    if flags & _PADDED and length:
                        if size - pos == _HEADER:
                            self._held = data[pos:]  # the pad length is the first byte
                            break
                        size_ = max(0, length - data[pos + _HEADER] - 1)
                    received = self._received.get(stream_id, 0) + size_
                    if received > expected or (flags & _END_STREAM and received != expected):
                        self.forget(stream_id)
                        mismatch = BodyMismatch(stream_id, expected, received)
                        if not self._flush(data[start:pos], None, mismatch):
                            return
                        start = pos
                    elif flags & _END_STREAM:
                        self.forget(stream_id)
                    else:
                        self._received[stream_id] = received
            elif kind == _HEADERS:
                stream_id &= _STREAM_MASK
                if stream_id in fresh and stream_id != self._block:
                    if not self._flush(data[start:pos], None, None):
                        return
                    start = pos
                fresh.add(stream_id)
                self._block = stream_id
                self._block_ends = bool(flags & _END_HEADERS)
                expected = expect.get(stream_id)
                if expected is not None and flags & _END_STREAM:  # trailers end the body
                    received = self._received.get(stream_id, 0)
                    self.forget(stream_id)
                    if received != expected:
                        mismatch = BodyMismatch(stream_id, expected, received)
                        if not self._flush(data[start:pos], None, mismatch):
                            return
                        start = pos
            elif kind == _CONTINUATION:
                self._block_ends = bool(flags & _END_HEADERS)
            elif kind == _GOAWAY:
                if length > MAX_FRAME_SIZE:
                    raise FrameSizeError(f"GOAWAY frame of {length} bytes exceeds {MAX_FRAME_SIZE}")
                end = pos + _HEADER + length
                if end > size:
                    self._held = data[pos:]
                    break
                goaway = None
                if length >= 8:
                    last = int.from_bytes(data[pos + 9 : pos + 13], "big") & _STREAM_MASK
                    goaway = GoAway(last, int.from_bytes(data[pos + 13 : pos + 17], "big"))
                if not self._flush(data[start:pos], goaway, None):
                    return
                pos = start = end
                continue
            end = pos + _HEADER + length
            if end > size:
                self._left = end - size
                pos = size
                break
            pos = end
            if self._block_ends:
                self._block = 0
                self._block_ends = False
        self._flush(data if start == 0 and pos == size else data[start:pos], None, None)

    def _flush(self, data: bytes, goaway: GoAway | None, mismatch: BodyMismatch | None) -> bool:
        """Deliver; then only a header block still open is unknown to h2."""
        go_on = self._deliver(data, goaway, mismatch)
        fresh = self._fresh
        if fresh:
            fresh.clear()
            if self._block:
                fresh.add(self._block)
        return go_on
