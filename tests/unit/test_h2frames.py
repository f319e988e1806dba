"""The frame splitter: every byte but GOAWAYs passes through in order, however the stream
is cut into reads; GOAWAYs are reported in order; and a DATA frame that contradicts its
stream's content-length never reaches h2 on a stream that was not reset first.

The property test drives the splitter as the connection does (``feed``, hand the segment
to "h2", arm ``expect`` for the header blocks h2 decoded, reset on ``mismatch``,
``resume``) against a model of h2 that decodes header blocks as soon as their last frame
arrives and checks content-length on every DATA frame, as h2 does."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from httpx_bulkhead._h2frames import BodyMismatch, FrameSizeError, FrameSplitter, GoAway

DATA, HEADERS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0x0, 0x1, 0x6, 0x7, 0x8, 0x9
END_STREAM, END_HEADERS, PADDED = 0x1, 0x4, 0x8


def frame(kind: int, stream_id: int, payload: bytes, flags: int = 0) -> bytes:
    head = len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream_id.to_bytes(4, "big")
    return head + payload


def goaway(last: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, last.to_bytes(4, "big") + code.to_bytes(4, "big") + debug)


@dataclass
class ModelH2:
    """What h2 and the connection do with the deliveries, as far as content-length goes."""

    lengths: dict[int, int | None]  # the content-length each stream's head announces
    splitter: FrameSplitter = field(init=False)
    buffer: bytes = b""
    out: bytes = b""
    goaways: list[GoAway] = field(default_factory=list)
    decoded: set[int] = field(default_factory=set)  # header block decoded by "h2"
    received: dict[int, int] = field(default_factory=dict)
    reset_streams: set[int] = field(default_factory=set)
    mismatches: list[BodyMismatch] = field(default_factory=list)
    deliveries: list[tuple[bytes, GoAway | None, BodyMismatch | None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.splitter = FrameSplitter(self.deliver)

    def deliver(self, data: bytes, goaway: GoAway | None, mismatch: BodyMismatch | None) -> bool:
        self.deliveries.append((data, goaway, mismatch))
        self.receive(data)
        if goaway is not None:
            self.goaways.append(goaway)
        if mismatch is not None:
            self.reset(mismatch)
        return True

    def receive(self, data: bytes) -> None:
        self.out += data
        self.buffer += data
        newly: list[int] = []
        while len(self.buffer) >= 9:
            end = 9 + int.from_bytes(self.buffer[:3], "big")
            if len(self.buffer) < end:
                break
            raw, self.buffer = self.buffer[:end], self.buffer[end:]
            kind, flags, sid = raw[3], raw[4], int.from_bytes(raw[5:9], "big")
            assert kind != GOAWAY, "a GOAWAY reached h2"
            if kind in (HEADERS, CONTINUATION):
                trailers = sid in self.decoded and kind == HEADERS and flags & END_STREAM
                if trailers and sid not in self.reset_streams:
                    self.check_end(sid)  # trailers
                if flags & END_HEADERS and sid not in self.decoded:
                    self.decoded.add(sid)
                    newly.append(sid)
                    self.received[sid] = 0
                    if flags & END_STREAM:
                        self.lengths[sid] = None  # no body: nothing to check
            elif kind == DATA and sid not in self.reset_streams:
                assert sid in self.decoded, "DATA before its header block"
                size = len(raw) - 9
                if flags & PADDED and size:
                    size -= raw[9] + 1
                self.received[sid] += size
                length = self.lengths[sid]
                if length is not None:  # h2 would raise InvalidBodyLengthError here
                    assert self.received[sid] <= length, "h2 saw too much DATA"
                    if flags & END_STREAM:
                        self.check_end(sid)
        for sid in newly:  # the connection arms the check after h2's events
            length = self.lengths[sid]
            if length is not None and sid not in self.reset_streams:
                self.splitter.expect(sid, length)

    def check_end(self, sid: int) -> None:
        length = self.lengths[sid]
        assert length is None or self.received[sid] == length, "h2 saw a short body end"

    def reset(self, mismatch: BodyMismatch) -> None:
        self.mismatches.append(mismatch)
        self.reset_streams.add(mismatch.stream_id)
        self.splitter.forget(mismatch.stream_id)


@dataclass
class Exchange:
    sid: int
    length: int | None
    frames: list[bytes]
    mismatch: BodyMismatch | None


@st.composite
def exchanges(draw: st.DrawFn, sid: int) -> Exchange:
    length = draw(st.one_of(st.none(), st.integers(0, 40)))
    block = draw(st.lists(st.binary(max_size=6), min_size=1, max_size=3))
    datas = draw(st.lists(st.tuples(st.integers(0, 30), st.integers(-1, 5)), max_size=4))
    trailers = draw(st.booleans())
    no_body = not datas and not trailers  # every stream ends
    frames: list[bytes] = []
    for i, part in enumerate(block):  # HEADERS then CONTINUATIONs: one contiguous unit
        last = i == len(block) - 1
        flags = (END_HEADERS if last else 0) | (END_STREAM if (i == 0 and no_body) else 0)
        frames.append(frame(HEADERS if i == 0 else CONTINUATION, sid, part, flags))
    header_unit = b"".join(frames)
    units = [header_unit]
    received, mismatch = 0, None
    for j, (size, pad) in enumerate(datas):
        ends = j == len(datas) - 1 and not trailers
        flags = END_STREAM if ends else 0
        payload = b"d" * size
        if pad >= 0:
            flags |= PADDED
            payload = bytes([pad]) + payload + b"\0" * pad
        units.append(frame(DATA, sid, payload, flags))
        received += size
        over = length is not None and (received > length or (ends and received != length))
        if mismatch is None and over:
            assert length is not None
            mismatch = BodyMismatch(sid, length, received)
    if trailers:
        units.append(frame(HEADERS, sid, b"t", END_HEADERS | END_STREAM))
        if mismatch is None and length is not None and received != length:
            mismatch = BodyMismatch(sid, length, received)
    if no_body:
        length, mismatch = None, None
    return Exchange(sid, length, units, mismatch)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(1, 5), min_size=1, max_size=4, unique=True).flatmap(
        lambda ids: st.tuples(*(exchanges(2 * i - 1) for i in ids))
    ),
    st.lists(st.integers(0, 99), max_size=6),
    st.randoms(use_true_random=False),
    st.lists(st.integers(1, 40), max_size=60),
)
def test_no_mismatched_data_reaches_h2_however_reads_fall(
    streams: tuple[Exchange, ...], goaway_ids: list[int], rnd: random.Random, cuts: list[int]
) -> None:
    # Interleave the streams' units (a header block stays contiguous) and some GOAWAYs,
    # PINGs and WINDOW_UPDATEs.
    queues = [list(e.frames) for e in streams]
    extras = [goaway(n, 0, b"dbg") for n in goaway_ids] + [frame(PING, 0, b"12345678")]
    extras.append(frame(WINDOW_UPDATE, 1, b"\0\0\0\1"))
    wire = b""
    expected_out = b""
    expected_goaways: list[GoAway] = []
    while any(queues) or extras:
        pick = rnd.randrange(len(queues) + 1)
        if pick < len(queues) and queues[pick]:
            unit = queues[pick].pop(0)
            wire += unit
            expected_out += unit
        elif extras:
            unit = extras.pop(rnd.randrange(len(extras)))
            wire += unit
            if unit[3] != GOAWAY:
                expected_out += unit
            else:
                expected_goaways.append(GoAway(int.from_bytes(unit[9:13], "big"), 0))
    model = ModelH2({e.sid: e.length for e in streams})
    pos = 0
    for cut in [*cuts, len(wire)]:
        piece = wire[pos : pos + cut]
        pos += len(piece)
        model.splitter.feed(piece)
    model.splitter.feed(b"")
    assert model.out == expected_out
    assert model.goaways == expected_goaways
    assert sorted(model.mismatches) == sorted(e.mismatch for e in streams if e.mismatch)
    assert model.splitter.checking == 0  # every checked stream ended or was forgotten


Delivery = tuple[bytes, GoAway | None, BodyMismatch | None]


class Recorder:
    """A deliver callback that records what it got (and stops when told)."""

    def __init__(self, go_on: bool = True) -> None:
        self.got: list[bytes] = []
        self.go_on = go_on

    def __call__(self, data: bytes, goaway: GoAway | None, mismatch: BodyMismatch | None) -> bool:
        self.got.append(data)
        return self.go_on


def deliveries(wire: bytes, expect: dict[int, int] | None = None) -> list[Delivery]:
    """Feed ``wire`` in one read; the deliveries (``expect``: lengths to announce as
    soon as a stream's header block was delivered)."""
    out: list[Delivery] = []

    def deliver(data: bytes, goaway: GoAway | None, mismatch: BodyMismatch | None) -> bool:
        out.append((data, goaway, mismatch))
        for sid, length in (expect or {}).items():
            if frame(HEADERS, sid, b"h", END_HEADERS) in data:
                splitter.expect(sid, length)
        return True

    splitter = FrameSplitter(deliver)
    splitter.feed(wire)
    return out


def test_goaways_are_delivered_in_place() -> None:
    wire = goaway(3, 0) + frame(DATA, 1, b"abc") + goaway(1, 2, b"debug")
    assert deliveries(wire) == [
        (b"", GoAway(3, 0), None),
        (frame(DATA, 1, b"abc"), GoAway(1, 2), None),
        (b"", None, None),
    ]


def test_payload_fast_path_passes_large_reads_through() -> None:
    recorder = Recorder()
    splitter = FrameSplitter(recorder)
    big = (100_000).to_bytes(3, "big") + bytes([DATA, 0]) + (1).to_bytes(4, "big")
    splitter.feed(big + b"x" * 10)
    chunk = b"y" * 50_000
    splitter.feed(chunk)
    assert recorder.got[0] == big + b"x" * 10 and recorder.got[1] is chunk


def test_data_in_the_same_read_as_its_header_block_waits_for_the_block() -> None:
    head = frame(HEADERS, 1, b"h", END_HEADERS)
    body = frame(DATA, 1, b"x" * 20, END_STREAM)
    mismatch = BodyMismatch(1, 10, 20)
    assert deliveries(head + body, {1: 10}) == [
        (head, None, None),  # h2 decodes the block: content-length 10
        (b"", None, mismatch),  # the stream is reset before h2 sees its DATA
        (body, None, None),
    ]
    assert "10 bytes announced, 20 received" in str(mismatch)


def test_a_body_that_matches_passes_after_its_head() -> None:
    head = frame(HEADERS, 1, b"h", END_HEADERS)
    body = frame(DATA, 1, b"abc") + frame(DATA, 1, b"\2def\0\0", END_STREAM | PADDED)
    assert deliveries(head + body, {1: 6}) == [(head, None, None), (body, None, None)]


def test_oversized_goaway_is_refused_before_it_is_buffered() -> None:
    splitter = FrameSplitter(Recorder())
    header = (16 * 1024 * 1024 - 1).to_bytes(3, "big") + bytes([GOAWAY, 0]) + bytes(4)
    with pytest.raises(FrameSizeError):
        splitter.feed(header[:5])  # even split inside the header
        splitter.feed(header[5:])


def test_delivery_stops_when_the_connection_breaks() -> None:
    recorder = Recorder(go_on=False)
    splitter = FrameSplitter(recorder)
    head = frame(HEADERS, 1, b"h", END_HEADERS)
    splitter.feed(head + frame(DATA, 1, b"x"))
    assert recorder.got == [head]
