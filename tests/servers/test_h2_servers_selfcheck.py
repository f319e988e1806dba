"""Self-checks for the HTTP/2 test servers (scripted h2 server, Node ``http2`` server),
using only a raw ``h2`` client over a socket, or ``httpx`` with its default transport, as
clients (never httpx_bulkhead)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable

import anyio
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import httpx
import pytest
from hyperframe.frame import Frame, GoAwayFrame

from . import h2script
from .h2script import H2ScriptServer, _LenientSettings
from .node import NodeH2Server
from .raw import request_path
from .tls import default_server_tls

TIMEOUT = 5.0
MCS = h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS
GOAWAY = 0x7


class H2TestClient:
    """A minimal blocking h2 client (prior knowledge) for protocol-level checks.

    GOAWAY frames are taken out of the byte stream and decoded here (``self.goaway``):
    h2 moves its connection state machine to CLOSED on GOAWAY and would then reject the
    responses RFC 9113 still allows on streams at/below ``last_stream_id``.
    ``lenient``: ignore the server's MAX_CONCURRENT_STREAMS (to provoke violations).
    """

    def __init__(self, port: int, *, lenient: bool = False) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.h2 = h2.connection.H2Connection(config=config)
        if lenient:
            self.h2.remote_settings = _LenientSettings(client=False)
        self.h2.initiate_connection()
        self.flush()
        self.buffer = b""
        self.events: list[h2.events.Event] = []
        self.goaway: GoAwayFrame | None = None
        self.eof = False

    def close(self) -> None:
        self.sock.close()

    def flush(self) -> None:
        if data := self.h2.data_to_send():
            self.sock.sendall(data)

    def get(self, path: str) -> int:
        sid = self.h2.get_next_available_stream_id()
        headers = [(":method", "GET"), (":scheme", "http"), (":authority", "t"), (":path", path)]
        self.h2.send_headers(sid, headers, end_stream=True)
        self.flush()
        return sid

    def ping(self, data: bytes) -> None:
        self.h2.ping(data)
        self.flush()

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk
        while len(self.buffer) >= 9:
            end = 9 + int.from_bytes(self.buffer[:3], "big")
            if len(self.buffer) < end:
                break
            raw, self.buffer = self.buffer[:end], self.buffer[end:]
            if raw[3] == GOAWAY:
                frame, _ = Frame.parse_frame_header(memoryview(raw[:9]))
                frame.parse_body(memoryview(raw[9:]))
                assert isinstance(frame, GoAwayFrame)
                self.goaway = frame
            else:
                self.events.extend(self.h2.receive_data(raw))

    def read_until(self, predicate: Callable[[], bool]) -> None:
        """Read (answering SETTINGS/PING as h2 does) until ``predicate()``; EOFError at EOF."""
        while not predicate():
            chunk = self.sock.recv(65536)
            if not chunk:
                self.eof = True
                raise EOFError("server closed the connection")
            self.feed(chunk)
            self.flush()

    def read_to_eof(self) -> None:
        with contextlib.suppress(EOFError):
            self.read_until(lambda: False)

    # ---- what arrived

    @property
    def peer_cap(self) -> int | None:
        return self.h2.remote_settings.get(MCS)

    def _of(self, sid: int) -> list[h2.events.Event]:
        return [e for e in self.events if getattr(e, "stream_id", None) == sid]

    def done(self, sid: int) -> bool:
        return any(
            isinstance(e, h2.events.StreamEnded | h2.events.StreamReset) for e in self._of(sid)
        )

    def response(self, sid: int) -> tuple[int, bytes]:
        """``(status, body)`` of a complete response (reads until the stream ends)."""
        self.read_until(lambda: self.done(sid))
        status = 0
        body = b""
        for event in self._of(sid):
            if isinstance(event, h2.events.ResponseReceived):
                status = int(dict(event.headers)[b":status"])
            elif isinstance(event, h2.events.DataReceived):
                body += event.data
            elif isinstance(event, h2.events.StreamReset):
                raise AssertionError(f"stream {sid} reset: {event.error_code!r}")
        return status, body

    def reset_code(self, sid: int) -> int:
        self.read_until(lambda: self.done(sid))
        resets = [e for e in self._of(sid) if isinstance(e, h2.events.StreamReset)]
        assert resets, f"stream {sid} was not reset"
        return int(resets[0].error_code)

    @property
    def ping_acks(self) -> list[bytes]:
        return [e.ping_data for e in self.events if isinstance(e, h2.events.PingAckReceived)]


def outcomes(srv: H2ScriptServer) -> dict[tuple[int, int], str]:
    return {(s.conn, s.stream_id): s.outcome for s in srv.streams}


# ------------------------------------------------------------------ scripted server


def test_scripted_h2c_with_httpx() -> None:
    with h2script.serve() as srv:
        with httpx.Client(http2=True, http1=False, timeout=TIMEOUT) as client:
            r = client.get(f"{srv.url}/x?q=1")
            assert (r.http_version, r.content) == ("HTTP/2", b"stream:1")
            assert (r.headers["x-conn"], r.headers["x-stream-id"]) == ("0", "1")
            # beyond the 64 KiB initial windows, both ways
            assert client.get(f"{srv.url}/bytes/200000").content == b"x" * 200000
            body = b"y" * 150000
            assert client.post(f"{srv.url}/echo", content=body).content == body
        srv.wait_event_sync("settings-acked-100")
        assert srv.answered == [(0, 1), (0, 3), (0, 5)]
        assert srv.streams[0].path == "/x?q=1" and srv.streams[2].method == "POST"
        assert request_path(srv.requests[0]) == b"/x?q=1"
        assert (srv.connections, srv.max_open_streams, srv.open_streams) == (1, 1, 0)


def test_scripted_stream_accounting_and_progress_while_held() -> None:
    with h2script.serve(max_streams=2) as srv:
        with contextlib.closing(H2TestClient(srv.port)) as a:
            a.read_until(lambda: a.peer_cap is not None)
            assert a.peer_cap == 2
            with contextlib.closing(H2TestClient(srv.port)) as b:
                b1, b3 = b.get("/hold/g"), b.get("/other")
                assert b.response(b3) == (200, b"stream:3")  # served while stream 1 is held
                a1, a3 = a.get("/hold/g"), a.get("/hold/g")
                srv.wait_held("g", 3)
                assert srv.event("g.entered").is_set() and srv.held("g") == 3
                assert (srv.open_streams, srv.max_open_streams) == (3, 3)
                assert srv.max_open_streams_per_connection == 2
                stats = srv.connection_stats
                assert [(s.index, s.open_streams, s.max_open_streams) for s in stats] == [
                    (0, 2, 2),  # a connected first
                    (1, 1, 2),
                ]
                assert [s.stream_ids for s in stats] == [[1, 3], [1, 3]]
                assert sorted(srv.stream_ids) == [(0, 1), (0, 3), (1, 1), (1, 3)]
                srv.release("g")
                assert a.response(a1) == (200, b"stream:1")
                assert a.response(a3) == (200, b"stream:3")
                assert b.response(b1) == (200, b"stream:1")
            srv.wait_idle()
            assert (srv.held("g"), srv.entered("g"), srv.max_open_streams) == (0, 3, 3)
            # a released name answers at once from then on
            assert a.response(a.get("/hold/g")) == (200, b"stream:5")
        assert srv.violations == [] and srv.protocol_errors == []


def test_scripted_over_cap_stream_is_recorded_and_refused() -> None:
    with h2script.serve(max_streams=1) as srv:
        with contextlib.closing(H2TestClient(srv.port, lenient=True)) as c:
            c.read_until(lambda: c.peer_cap == 1)  # and ACKs it
            srv.wait_event_sync("settings-acked-1")
            held, extra = c.get("/hold/g"), c.get("/x")
            assert c.reset_code(extra) == h2.errors.ErrorCodes.REFUSED_STREAM
            assert srv.event("over-cap").is_set()
            assert [(v.conn, v.stream_id) for v in srv.violations] == [(0, 3)]
            assert srv.max_open_streams_per_connection == 2  # the violation shows here too
            srv.release("g")
            assert c.response(held) == (200, b"stream:1")
        assert outcomes(srv) == {(0, 1): "answered", (0, 3): "refused"}


def test_scripted_cap_change_mid_connection() -> None:
    with h2script.change_cap(max_streams=3) as srv:
        with contextlib.closing(H2TestClient(srv.port)) as c:
            c.read_until(lambda: c.peer_cap == 3)
            srv.wait_event_sync("settings-acked-3")
            held = c.get("/hold/g")
            srv.wait_held("g")
            srv.set_max_streams(1)  # sent by the connection's own thread, woken at once
            c.read_until(lambda: c.peer_cap == 1)
            srv.wait_event_sync("settings-acked-1")
            (stats,) = srv.connection_stats
            assert (stats.advertised_cap, stats.acked_cap) == (1, 1)
            with contextlib.closing(H2TestClient(srv.port)) as d:  # new connections too
                d.read_until(lambda: d.peer_cap is not None)
                assert d.peer_cap == 1
            srv.release("g")
            assert c.response(held) == (200, b"stream:1")
        assert srv.settings_acks[:2] == [(0, 3), (0, 1)]


def test_scripted_goaway_after_k_held() -> None:
    with h2script.goaway_after(3) as srv:
        c = H2TestClient(srv.port)
        with contextlib.closing(c):
            ids = [c.get("/hold/g") for _ in range(3)]
            assert ids == [1, 3, 5]
            c.read_to_eof()  # GOAWAY, the answer to stream 1, then FIN
            assert c.goaway is not None
            assert (c.goaway.last_stream_id, c.goaway.error_code) == (1, 0)
            assert c.response(1) == (200, b"stream:1")
            assert not c._of(3) and not c._of(5)
            srv.wait_event_sync("goaway-done")
        srv.wait_event_sync("conn-0.closed")
        assert srv.goaways == [(0, 1)] and srv.answered == [(0, 1)]
        assert outcomes(srv) == {(0, 1): "answered", (0, 3): "ignored", (0, 5): "ignored"}
        assert (srv.held("g"), srv.open_streams) == (0, 0)


def test_scripted_goaway_keep_two_refuse_later_streams() -> None:
    with h2script.goaway_after(2, keep=2, answer_kept=False, refuse_above=True) as srv:
        with contextlib.closing(H2TestClient(srv.port)) as c:
            first, second = c.get("/hold/g"), c.get("/hold/g")
            c.read_until(lambda: c.goaway is not None)
            assert c.goaway is not None and c.goaway.last_stream_id == 3
            late = c.get("/late")  # opened after the GOAWAY: never processed
            assert c.reset_code(late) == h2.errors.ErrorCodes.REFUSED_STREAM
            assert srv.answered == []  # the kept streams wait for their event
            srv.release("g")
            assert c.response(first) == (200, b"stream:1")
            assert c.response(second) == (200, b"stream:3")
            c.read_to_eof()
        assert outcomes(srv) == {(0, 1): "answered", (0, 3): "answered", (0, 5): "refused"}


@pytest.mark.parametrize("acks", [True, False])
def test_scripted_never_ping(acks: bool) -> None:
    with h2script.serve() if acks else h2script.never_ping() as srv:
        with contextlib.closing(H2TestClient(srv.port)) as c:
            c.ping(b"pingpong")
            sid = c.get("/x")
            # The server handles frames in order: an ACK would be sent before the response.
            assert c.response(sid) == (200, b"stream:1")
            assert c.ping_acks == ([b"pingpong"] if acks else [])
            srv.wait_event_sync("ping-received")
            assert srv.pings == [(0, b"pingpong")]
            if not acks:  # and none comes later: the one bounded wait
                c.sock.settimeout(0.2)
                with pytest.raises(TimeoutError):
                    c.sock.recv(1)


@pytest.mark.parametrize(
    ("server", "code"),
    [
        (lambda: h2script.reset_stream("/boom"), h2.errors.ErrorCodes.INTERNAL_ERROR),
        (lambda: h2script.refuse_stream("/boom"), h2.errors.ErrorCodes.REFUSED_STREAM),
    ],
)
def test_scripted_reset_stream(server: Callable[[], H2ScriptServer], code: int) -> None:
    with server() as srv, contextlib.closing(H2TestClient(srv.port)) as c:
        assert c.reset_code(c.get("/boom?x")) == code
        assert c.response(c.get("/ok")) == (200, b"stream:3")
        assert c.reset_code(c.get("/boom")) == code
        assert outcomes(srv) == {(0, 1): "reset", (0, 3): "answered", (0, 5): "reset"}


def test_scripted_reset_after_headers_only_once() -> None:
    with h2script.reset_stream("/boom", after_headers=True, times=1) as srv:
        with contextlib.closing(H2TestClient(srv.port)) as c:
            first = c.get("/boom")
            assert c.reset_code(first) == h2.errors.ErrorCodes.INTERNAL_ERROR
            assert any(isinstance(e, h2.events.ResponseReceived) for e in c._of(first))
            assert c.response(c.get("/boom")) == (200, b"stream:3")


def test_scripted_settings_zero_after_first_response() -> None:
    with h2script.settings_zero(max_streams=5) as srv:
        with contextlib.closing(H2TestClient(srv.port)) as c:
            assert c.response(c.get("/x")) == (200, b"stream:1")
            c.read_until(lambda: c.peer_cap == 0)
            srv.wait_event_sync("settings-acked-0")
            assert srv.connection_stats[0].acked_cap == 0


def test_scripted_shutdown_with_held_streams() -> None:
    with contextlib.ExitStack() as stack:
        srv = stack.enter_context(h2script.serve())
        c = stack.enter_context(contextlib.closing(H2TestClient(srv.port)))
        c.get("/hold/never")
        srv.wait_held("never")
        srv.close()  # while the client keeps the connection open
        c.read_to_eof()
    assert outcomes(srv) == {(0, 1): "dropped"}
    assert srv.open_streams == 0


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_scripted_async_helpers() -> None:
    with h2script.serve(max_streams=10, hold="all") as srv:
        bodies: list[bytes] = []
        async with httpx.AsyncClient(http2=True, http1=False, timeout=TIMEOUT) as client:

            async def call(i: int) -> None:
                bodies.append((await client.get(f"{srv.url}/any/{i}")).content)

            async with anyio.create_task_group() as tg:
                for i in range(3):
                    tg.start_soon(call, i)
                await srv.until_held("all", 3)
                await srv.until_event("all.entered")
                await srv.until_open_streams(3)
                assert (srv.connections, srv.max_open_streams_per_connection) == (1, 3)
                srv.set_max_streams(5)
                await srv.until_event("settings-acked-5")
                srv.release("all")
            await srv.until_answered(3)
            await srv.until_idle()
            with pytest.raises(TimeoutError):
                await srv.until_held("all", 4, timeout=0.01)
        assert sorted(bodies) == [b"stream:1", b"stream:3", b"stream:5"]


# ------------------------------------------------------------------ node server


def test_node_h2c_and_tls_alpn() -> None:
    with NodeH2Server(max_concurrent_streams=3) as srv:
        assert srv.url == f"http://127.0.0.1:{srv.port}" and srv.control_port != srv.port
        with httpx.Client(http2=True, http1=False, timeout=TIMEOUT) as client:
            r = client.get(f"{srv.url}/")
            assert (r.http_version, r.content, r.headers["x-session"]) == ("HTTP/2", b"hello", "1")
            assert client.get(f"{srv.url}/nope").status_code == 404
    tls = default_server_tls()
    with NodeH2Server(tls=tls) as srv:
        assert srv.url.startswith("https://127.0.0.1:")
        with httpx.Client(http2=True, verify=tls.client_ssl_context(), timeout=TIMEOUT) as client:
            r = client.get(f"{srv.url}/")
            assert (r.http_version, r.content) == ("HTTP/2", b"hello")
        with httpx.Client(verify=tls.client_ssl_context(), timeout=TIMEOUT) as client:
            r = client.get(f"{srv.url}/")  # allowHTTP1: ALPN http/1.1 works too
            assert (r.http_version, r.content, r.headers["x-session"]) == (
                "HTTP/1.1",
                b"hello",
                "h1",
            )
        ctx = tls.client_ssl_context(alpn=["h2", "http/1.1"])
        with socket.create_connection(("127.0.0.1", srv.port), timeout=TIMEOUT) as raw:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
                assert sock.selected_alpn_protocol() == "h2"
        assert srv.stats()["sessions"] == 2  # the HTTP/1.1 client is no h2 session


def test_node_per_session_stream_accounting() -> None:
    with NodeH2Server(max_concurrent_streams=3) as srv:
        with (
            contextlib.closing(H2TestClient(srv.port)) as a,
            contextlib.closing(H2TestClient(srv.port)) as b,
        ):
            a.read_until(lambda: a.peer_cap is not None)
            assert a.peer_cap == 3
            a_ids = [a.get("/hold/g") for _ in range(3)]
            b_ids = [b.get("/hold/g") for _ in range(2)]
            stats = srv.wait_held("g", 5)
            assert stats["maxStreamsPerSession"] == 3
            assert (stats["maxOpenStreams"], stats["openStreams"], stats["sessions"]) == (5, 5, 2)
            assert stats["held"] == {"g": 5}
            assert sorted(s["max"] for s in stats["perSession"]) == [2, 3]
            assert srv.release("g") == 5
            for client, ids in ((a, a_ids), (b, b_ids)):
                for sid in ids:
                    assert client.response(sid) == (200, b"released:g")
            stats = srv.wait_idle()
            assert (stats["openStreams"], stats["maxOpenStreams"], stats["held"]) == (0, 5, {})
            assert a.response(a.get("/hold/g")) == (200, b"released:g")  # released for good
            stats = srv.reset()
            assert (stats["maxOpenStreams"], stats["entered"], stats["sessions"]) == (0, {}, 0)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_node_async_helpers() -> None:
    with NodeH2Server(max_concurrent_streams=2) as srv:
        bodies: list[bytes] = []
        async with httpx.AsyncClient(http2=True, http1=False, timeout=TIMEOUT) as client:

            async def call() -> None:
                bodies.append((await client.get(f"{srv.url}/hold/n")).content)

            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(call)
                stats = await srv.until_held("n", 2)
                assert stats["maxStreamsPerSession"] == 2
                srv.release("n")
            with pytest.raises(TimeoutError):
                await srv.until_held("n", 4, timeout=0.01)
        assert bodies == [b"released:n"] * 3
        assert (await srv.until_idle())["openStreams"] == 0


def test_node_startup_failure_is_reported() -> None:
    srv = NodeH2Server(max_concurrent_streams=-1)  # node rejects the setting
    with pytest.raises(RuntimeError, match="node exited at startup"):
        srv.__enter__()
    assert srv.close() == (None, "")
    with pytest.raises(RuntimeError, match="not running"):
        _ = srv.url
