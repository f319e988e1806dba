"""The GOAWAY splitter over the whole range of the frame header's fields: lengths that need
all three length bytes, stream ids and error codes that need all four bytes (and the
reserved bit), GOAWAYs at the size bound, any split of the stream into reads, and the
fast path that passes a payload through without a copy."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from httpx_bulkhead._h2frames import MAX_FRAME_SIZE, FrameSizeError, FrameSplitter, GoAway


def frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    header = len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream_id.to_bytes(4, "big")
    return header + payload


other_frames = st.builds(
    lambda kind, flags, stream, size: frame(kind, flags, stream, b"\xab" * size),
    st.integers(0, 255).filter(lambda kind: kind != 0x7),
    st.integers(0, 255),
    st.integers(0, 2**32 - 1),
    st.one_of(st.integers(0, 300), st.integers(65_536, 70_000)),  # the top length byte too
)
goaways = st.tuples(
    st.integers(0, 2**32 - 1),  # the reserved bit may be set: it is not part of the id
    st.integers(0, 2**32 - 1),
    st.one_of(st.integers(0, 40), st.just(MAX_FRAME_SIZE - 8)),  # debug data, to the bound
)


def split(wire: bytes, cuts: list[int]) -> list[bytes]:
    pieces, pos = [], 0
    for cut in cuts:
        if pos >= len(wire):
            break
        pieces.append(wire[pos : pos + cut])
        pos += cut
    if pos < len(wire):
        pieces.append(wire[pos:])
    return pieces


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(other_frames, goaways), max_size=8),
    st.lists(st.one_of(st.integers(1, 12), st.integers(1, 80_000)), max_size=30),
)
def test_every_other_frame_passes_through_and_every_goaway_is_reported(
    spec: list[bytes | tuple[int, int, int]], cuts: list[int]
) -> None:
    wire, expected_out, expected = b"", b"", []
    for item in spec:
        if isinstance(item, bytes):
            wire += item
            expected_out += item
        else:
            last, code, debug = item
            payload = last.to_bytes(4, "big") + code.to_bytes(4, "big") + b"d" * debug
            wire += frame(0x7, 0, 0, payload)
            expected.append(GoAway(last & 0x7FFF_FFFF, code))
    splitter = FrameSplitter()
    out, seen = b"", []
    for piece in split(wire, cuts):
        data, found = splitter.feed(piece)
        out += data
        seen += found
    assert out == expected_out
    assert seen == expected


def test_a_goaway_at_the_size_bound_is_read_and_one_byte_more_is_refused() -> None:
    payload = (5).to_bytes(4, "big") + (0).to_bytes(4, "big")
    largest = frame(0x7, 0, 0, payload + b"d" * (MAX_FRAME_SIZE - 8))
    assert FrameSplitter().feed(largest) == (b"", [GoAway(5, 0)])
    too_large = frame(0x7, 0, 0, payload + b"d" * (MAX_FRAME_SIZE - 7))
    with pytest.raises(FrameSizeError, match="exceeds"):
        FrameSplitter().feed(too_large[:9])  # the header alone is enough to refuse it


def test_inside_a_payload_reads_pass_through_uncopied() -> None:
    splitter = FrameSplitter()
    head = frame(0x0, 0, 1, b"")[:9]
    big = (100_000).to_bytes(3, "big") + head[3:]
    assert splitter.feed(big) == (big, [])
    chunk = b"y" * 60_000
    data, found = splitter.feed(chunk)
    assert data is chunk and found == []  # the fast path: no copy
    rest = b"z" * 40_000  # exactly what is left of the payload
    data, found = splitter.feed(rest)
    assert data is rest and found == []
    after = frame(0x0, 0, 1, b"next")
    assert splitter.feed(after) == (after, [])
