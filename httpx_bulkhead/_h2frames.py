"""Taking GOAWAY frames out of the HTTP/2 byte stream before h2 sees them.

h2 closes its connection state machine on a received GOAWAY and then rejects every later
frame, so the streams a GOAWAY lets finish (RFC 9113 §6.8: those at or below
``last_stream_id``) could not complete.  This splitter walks frame headers (9 bytes: a
24-bit length, a type, flags and a stream id, §4.1), passes every other frame through
unchanged and reports GOAWAYs to the connection instead.  Pure and clock-free.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["FrameSizeError", "FrameSplitter", "GoAway"]

_GOAWAY = 0x7
_HEADER = 9
#: A GOAWAY's fixed fields: last stream id and error code (RFC 9113 §6.8).
_GOAWAY_FIXED = 8
#: SETTINGS_MAX_FRAME_SIZE we advertise (the protocol default, which we do not change).
MAX_FRAME_SIZE = 16_384


class FrameSizeError(Exception):
    """A GOAWAY longer than our SETTINGS_MAX_FRAME_SIZE, or shorter than its 8 bytes of
    fixed fields (RFC 9113 §4.2, §6.8): a connection error.  Raised from the frame header,
    before any payload is buffered, so memory stays bounded."""


class GoAway(NamedTuple):
    last_stream_id: int
    error_code: int


class FrameSplitter:
    """Feed it what the socket gave; it returns the bytes for h2 and the GOAWAYs seen."""

    __slots__ = ("_held", "_left")

    def __init__(self) -> None:
        self._left = 0  # bytes of the current frame still to pass through
        self._held = bytearray()  # an incomplete frame header, or an incomplete GOAWAY

    def feed(self, data: bytes) -> tuple[bytes, list[GoAway]]:
        if self._left >= len(data) and not self._held:  # inside a payload: the fast path
            self._left -= len(data)
            return data, []
        out = bytearray()
        goaways: list[GoAway] = []
        view = memoryview(data)
        pos, size = 0, len(view)
        while pos < size:
            if self._left:  # the rest of a frame's payload
                take = min(self._left, size - pos)
                out += view[pos : pos + take]
                pos += take
                self._left -= take
            elif self._held:  # complete a header (or GOAWAY) started in an earlier read
                need = self._needed()
                take = min(need, size - pos)
                self._held += view[pos : pos + take]
                pos += take
                if take < need:
                    break
                self._release(out, goaways)
            elif size - pos < _HEADER:
                self._held += view[pos:]
                break
            elif view[pos + 3] == _GOAWAY:
                self._check_goaway(int.from_bytes(view[pos : pos + 3], "big"))
                self._held += view[pos : pos + _HEADER]
                pos += _HEADER
                self._release(out, goaways)
            else:
                end = pos + _HEADER + int.from_bytes(view[pos : pos + 3], "big")
                stop = min(end, size)
                out += view[pos:stop]
                self._left = end - stop
                pos = stop
        return bytes(out), goaways

    def _needed(self) -> int:
        held = self._held
        if len(held) < _HEADER:
            return _HEADER - len(held)
        if held[3] == _GOAWAY:
            length = int.from_bytes(held[0:3], "big")
            self._check_goaway(length)
            return _HEADER + length - len(held)
        return 0

    @staticmethod
    def _check_goaway(length: int) -> None:
        if length > MAX_FRAME_SIZE:
            raise FrameSizeError(f"GOAWAY frame of {length} bytes exceeds {MAX_FRAME_SIZE}")
        if length < _GOAWAY_FIXED:
            raise FrameSizeError(f"GOAWAY frame of {length} bytes is shorter than {_GOAWAY_FIXED}")

    def _release(self, out: bytearray, goaways: list[GoAway]) -> None:
        """``_held`` is a complete header (or a complete GOAWAY frame): act on it."""
        held = self._held
        length = int.from_bytes(held[0:3], "big")
        if held[3] == _GOAWAY:
            self._check_goaway(length)
            if len(held) < _HEADER + length:
                return  # keep collecting its payload
            payload = held[_HEADER:]  # at least _GOAWAY_FIXED bytes (``_check_goaway``)
            last = int.from_bytes(payload[0:4], "big") & 0x7FFF_FFFF
            goaways.append(GoAway(last, int.from_bytes(payload[4:8], "big")))
            self._held = bytearray()
            return
        out += held
        self._held = bytearray()
        self._left = length
