"""What h2 gets from the wire: the GOAWAY splitter passes every other frame through byte
for byte, however the stream is cut into reads, and reports GOAWAYs in order; and the h2
connection we drive (``_H2Connection``) treats a body that contradicts its content-length
as a stream error, which checks the one private h2 method it overrides."""

from __future__ import annotations

import h2.config
import h2.connection
import h2.errors
import h2.events
import pytest
from hyperframe.frame import RstStreamFrame
from hypothesis import given
from hypothesis import strategies as st

from httpx_bulkhead._h2frames import FrameSplitter, GoAway
from httpx_bulkhead._http2 import _BodyLengthMismatch, _H2Connection


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
    from httpx_bulkhead._h2frames import FrameSizeError

    splitter = FrameSplitter()
    header = (16 * 1024 * 1024 - 1).to_bytes(3, "big") + bytes([0x7, 0]) + (0).to_bytes(4, "big")
    with pytest.raises(FrameSizeError):
        splitter.feed(header[:5])  # even split inside the header
        splitter.feed(header[5:])


# -- content-length mismatches are stream errors (_H2Connection) -------------------------


def _pair() -> tuple[h2.connection.H2Connection, _H2Connection]:
    server = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=False, header_encoding=None)
    )
    client = _H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    client.initiate_connection()
    server.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    client.data_to_send()
    return server, client


def _request(server: h2.connection.H2Connection, client: _H2Connection, method: str) -> int:
    stream_id: int = client.get_next_available_stream_id()
    headers = [(":method", method), (":scheme", "http"), (":authority", "a"), (":path", "/")]
    client.send_headers(stream_id, headers, end_stream=True)
    server.receive_data(client.data_to_send())
    return stream_id


@pytest.mark.parametrize(
    ("method", "announced", "sent"), [("GET", 10, 20), ("GET", 20, 10), ("HEAD", 5, 5)]
)
def test_a_body_contradicting_its_length_fails_its_stream_only(
    method: str, announced: int, sent: int
) -> None:
    server, client = _pair()
    bad = _request(server, client, method)
    good = _request(server, client, "GET")
    server.send_headers(bad, [(":status", "200"), ("content-length", str(announced))])
    server.send_data(bad, b"x" * sent, end_stream=True)
    server.send_headers(good, [(":status", "200"), ("content-length", "2")])
    server.send_data(good, b"ok", end_stream=True)
    events = client.receive_data(server.data_to_send())  # h2 alone would raise here
    mismatches = [e for e in events if isinstance(e, _BodyLengthMismatch)]
    assert [(e.stream_id, "content-length" in e.message) for e in mismatches] == [(bad, True)]
    data = [e.data for e in events if isinstance(e, h2.events.DataReceived)]
    assert data == [b"ok"]  # the other stream is whole, the offending DATA never surfaced
    ended = [e.stream_id for e in events if isinstance(e, h2.events.StreamEnded)]
    assert ended == [good]
    # The stream was reset and the connection window given back; the connection goes on.
    out = client.data_to_send()
    assert RstStreamFrame(bad, error_code=h2.errors.ErrorCodes.PROTOCOL_ERROR).serialize() in out
    server.receive_data(out)
    assert client.open_outbound_streams == 0
    assert client.inbound_flow_control_window == server.outbound_flow_control_window
    third = _request(server, client, "GET")
    server.send_headers(third, [(":status", "204")], end_stream=True)
    last = client.receive_data(server.data_to_send())
    assert [type(e) for e in last] == [h2.events.ResponseReceived, h2.events.StreamEnded]


class _Quiet:
    """A ``NetStream`` never used: the test drives the connection's frame handling only."""

    alpn = "h2"


def test_nothing_is_queued_after_the_goaway_of_a_connection_error() -> None:
    """h2 queues a connection WINDOW_UPDATE for acknowledged data even after it closed the
    connection; a stream reading its buffered body after a connection error must not, or
    the frame follows our GOAWAY out (the adversary saw a server reject it, under trio)."""
    from httpx_bulkhead._http2 import ConnectionListener, HTTP2Connection

    conn = HTTP2Connection(
        ("http", "example", 80),
        _Quiet(),  # type: ignore[arg-type]
        listener=ConnectionListener(),
        max_streams=None,
        ping_after=None,
        ping_timeout=1.0,
    )
    client = conn._h2
    client.initiate_connection()
    client.send_headers(
        1,
        [
            (b":method", b"GET"),
            (b":path", b"/"),
            (b":scheme", b"http"),
            (b":authority", b"example"),
        ],
        end_stream=True,
    )
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    server.initiate_connection()
    server.receive_data(client.data_to_send())
    server.send_headers(1, [(b":status", b"200")])
    server.send_data(1, b"x" * 1000)
    conn._receive(server.data_to_send())
    client.data_to_send()  # what the reader flushed
    conn._receive(frame(0x4, 1, b""))  # SETTINGS on a stream: a connection error
    assert conn.broken
    assert client.data_to_send()[3] == 0x7  # h2's GOAWAY: the last frame we may send
    conn.ack(9_000_000, 1)  # the streams read what they had buffered: past half the window
    assert client.data_to_send() == b""


class _Recording:
    """A ``NetStream`` that records what is written."""

    alpn = "h2"

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def send(self, data: bytes, timeout: float | None) -> None:
        self.sent.append(bytes(data))


def test_output_looked_at_goes_out_first_and_once() -> None:
    """``pending_output`` uses h2's public API only, which hands the bytes over: what it
    took must be written before anything queued later, once, and then nothing is pending."""
    import anyio
    import httpx

    from httpx_bulkhead._exchange import Timeouts
    from httpx_bulkhead._http2 import ConnectionListener, HTTP2Connection

    net = _Recording()
    conn = HTTP2Connection(
        ("http", "example", 80),
        net,  # type: ignore[arg-type]
        listener=ConnectionListener(),
        max_streams=None,
        ping_after=None,
        ping_timeout=1.0,
    )
    reference = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding=None)
    )
    reference.initiate_connection()
    preface = reference.data_to_send()
    reference.ping(b"12345678")
    ping = reference.data_to_send()

    assert not conn.pending_output()
    conn._h2.initiate_connection()
    assert conn.pending_output() and conn.pending_output()  # asking twice loses nothing
    conn._h2.ping(b"12345678")  # queued after the bytes we took
    request = httpx.Request("GET", "http://example/")
    anyio.run(conn.flush, request, Timeouts(None, None, None))
    assert net.sent == [preface + ping]
    assert not conn.pending_output()
    anyio.run(conn.flush, request, Timeouts(None, None, None))
    assert net.sent == [preface + ping]


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
