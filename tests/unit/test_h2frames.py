"""The GOAWAY splitter: every other frame passes through byte for byte, however the
stream is cut into reads; GOAWAYs are reported in order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from httpx_bulkhead._h2frames import FrameSplitter, GoAway


def frame(kind: int, stream_id: int, payload: bytes) -> bytes:
    return (
        len(payload).to_bytes(3, "big") + bytes([kind, 0]) + stream_id.to_bytes(4, "big") + payload
    )


def goaway(last: int, code: int, debug: bytes = b"") -> bytes:
    return frame(0x7, 0, last.to_bytes(4, "big") + code.to_bytes(4, "big") + debug)


frames = st.lists(
    st.one_of(
        st.tuples(st.just("data"), st.integers(1, 99), st.binary(max_size=40)),
        st.tuples(st.just("goaway"), st.integers(0, 99), st.binary(max_size=12)),
    ),
    max_size=12,
)


@given(frames, st.lists(st.integers(1, 30), max_size=40))
def test_any_split_gives_the_same_frames_and_goaways(
    spec: list[tuple[str, int, bytes]], cuts: list[int]
) -> None:
    wire = b""
    expected_out = b""
    expected_goaways: list[GoAway] = []
    for kind, number, payload in spec:
        if kind == "data":
            raw = frame(0x0, number, payload)
            expected_out += raw
        else:
            raw = goaway(number, 2, payload)
            expected_goaways.append(GoAway(number, 2))
        wire += raw
    splitter = FrameSplitter()
    out = b""
    seen: list[GoAway] = []
    pos = 0
    for cut in [*cuts, len(wire)]:
        piece = wire[pos : pos + cut]
        pos += len(piece)
        data, found = splitter.feed(piece)
        out += data
        seen += found
        if pos >= len(wire):
            break
    if pos < len(wire):
        data, found = splitter.feed(wire[pos:])
        out += data
        seen += found
    assert out == expected_out
    assert seen == expected_goaways


def test_payload_fast_path_passes_large_reads_through() -> None:
    splitter = FrameSplitter()
    header = frame(0x0, 1, b"")[:9]
    big = (100_000).to_bytes(3, "big") + header[3:]
    data, found = splitter.feed(big + b"x" * 10)
    assert data == big + b"x" * 10 and not found
    chunk = b"y" * 50_000
    assert splitter.feed(chunk) == (chunk, [])


def test_oversized_goaway_is_refused_before_it_is_buffered() -> None:
    import pytest

    from httpx_bulkhead._h2frames import FrameSizeError

    splitter = FrameSplitter()
    header = (16 * 1024 * 1024 - 1).to_bytes(3, "big") + bytes([0x7, 0]) + (0).to_bytes(4, "big")
    with pytest.raises(FrameSizeError):
        splitter.feed(header[:5])  # even split inside the header
        splitter.feed(header[5:])


def test_a_goaway_shorter_than_its_fixed_fields_is_a_frame_size_error() -> None:
    """RFC 9113 §6.8: a GOAWAY carries at least 8 bytes (last stream id, error code); a
    shorter one is malformed (§4.2: a connection error), not something to drop silently.
    Before: dropped without a word, and the connection went on as if nothing came."""
    import pytest

    from httpx_bulkhead._h2frames import FrameSizeError

    for length in range(8):
        short = frame(0x7, 0, b"\0" * length)
        with pytest.raises(FrameSizeError, match="shorter"):
            FrameSplitter().feed(short)
        splitter = FrameSplitter()  # the same, its header split across reads
        with pytest.raises(FrameSizeError, match="shorter"):
            splitter.feed(short[:4])
            splitter.feed(short[4:])
    assert FrameSplitter().feed(goaway(1, 0)) == (b"", [GoAway(1, 0)])  # 8 bytes: fine
