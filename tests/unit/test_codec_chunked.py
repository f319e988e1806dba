"""The chunked body decoder of the fast codec, alone: bounded, resumable, h11's grammar
(the differential fuzzer in ``tests/fuzz`` compares it with h11 through the codec)."""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest

from httpx_bulkhead._chunked import ChunkedDecoder, ChunkedError

LIMIT = 1024


def test_chunked_decoder_keeps_at_most_the_limit() -> None:
    decoder = ChunkedDecoder(LIMIT)
    out: deque[Any] = deque()
    assert decoder.feed(b"3\r\nabc\r\n0\r\n", out) is None
    with pytest.raises(ChunkedError, match="trailer section too long"):
        for _ in range(1000):
            decoder.feed(b"X: " + b"b" * 60 + b"\r\n", out)
    assert b"".join(out) == b"abc"


def test_chunked_decoder_returns_what_follows_the_message() -> None:
    wire = b"3;x=y\r\nabc\r\n0\r\nX: 1\r\n\r\nNEXT"
    for size in (1, 2, 3, len(wire)):
        decoder = ChunkedDecoder(LIMIT)
        out: deque[Any] = deque()
        rest = None
        for pos in range(0, len(wire), size):
            rest = decoder.feed(wire[pos : pos + size], out)
            if rest is not None:
                rest += wire[pos + size :]
                break
        assert (b"".join(out), rest) == (b"abc", b"NEXT")


def test_a_trickled_size_line_costs_linear_time() -> None:
    """One byte at a time up to the limit: each read scans only what is new."""
    decoder = ChunkedDecoder(1 << 20)
    out: deque[Any] = deque()
    for _ in range(200_000):
        assert decoder.feed(b"a" if _ else b"5;", out) is None
    assert decoder.feed(b"\r\nhello\r\n0\r\n\r\n", out) == b""
    assert b"".join(out) == b"hello"
