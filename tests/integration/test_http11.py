"""HTTP/1.1 fidelity: BulkheadTransport as a drop-in for httpx's default transport.

Against hypercorn (``server``) and scripted raw-socket servers, all on 127.0.0.1.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import httpx
import pytest

from httpx_bulkhead import BulkheadTransport, ExchangeInfo, Policy
from tests.conftest import until
from tests.flavours import Flavour, client_for, make_transport
from tests.servers import (
    HypercornServer,
    RawConn,
    RawServer,
    default_server_tls,
    keepalive_ok,
    never_answer,
)

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("http1_parser")]

TIMEOUT = 10.0


# ----------------------------------------------------------------------------- helpers


class Trace:
    """An httpx ``trace`` extension callback recording event names in order."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.infos: list[dict[str, Any]] = []

    async def __call__(self, name: str, info: dict[str, Any]) -> None:
        self.events.append(name)
        self.infos.append(info)


def is_subsequence(wanted: list[str], events: list[str]) -> bool:
    it = iter(events)
    return all(name in it for name in wanted)


def info(response: httpx.Response) -> ExchangeInfo:
    value = response.extensions["bulkhead"]
    assert isinstance(value, ExchangeInfo)
    return value


def closed_port() -> int:
    """A port on 127.0.0.1 nobody listens on (bound, then closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def recording(store: list[bytes], body: bytes = b"ok") -> Callable[[RawConn], None]:
    """Keep-alive handler recording each complete raw request (head and body)."""

    def handler(conn: RawConn) -> None:
        while (request := conn.read_request()) is not None:
            store.append(request)
            conn.send_response(200, body)

    return handler


def with_reason(status: int, reason: str) -> Callable[[RawConn], None]:
    def handler(conn: RawConn) -> None:
        while conn.read_request() is not None:
            conn.send_response(status, b"body", reason=reason)

    return handler


def http10_response(conn: RawConn) -> None:
    """Answers each request with an HTTP/1.0 response (``Content-Length``, no keep-alive)."""
    while conn.read_request() is not None:
        conn.send(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")


def early_hints(conn: RawConn) -> None:
    """A ``103 Early Hints`` interim response before each final one."""
    while conn.read_request() is not None:
        conn.send(b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n")
        conn.send_response(200, b"final", [("Set-Cookie", "a=1"), ("Set-Cookie", "b=2")])


async def chunks(parts: list[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


# ----------------------------------------------------------------- basic round trips


async def test_get_and_post_echo(server: HypercornServer, flavour: Flavour) -> None:
    body = bytes(range(256)) * 64  # every byte value, 16 KiB
    async with client_for(make_transport(flavour), timeout=TIMEOUT) as client:
        response = await client.get(f"{server.url}/")
        assert (response.status_code, response.content) == (200, b"hello")
        for method in ("POST", "PUT", "PATCH"):
            echoed = await client.request(method, f"{server.url}/echo", content=body)
            assert echoed.status_code == 200
            assert echoed.headers["x-method"] == method
            assert echoed.content == body


async def test_streaming_request_body_arrives_whole(server: HypercornServer) -> None:
    parts = [bytes([i]) * (1000 + i) for i in range(64)] + [b"", b"tail"]
    async with httpx.AsyncClient(transport=BulkheadTransport(), timeout=TIMEOUT) as client:
        response = await client.post(f"{server.url}/echo", content=chunks(parts))
    assert response.status_code == 200
    assert response.content == b"".join(parts)


async def test_streaming_request_body_is_sent_chunked() -> None:
    store: list[bytes] = []
    with RawServer(recording(store)) as srv:
        async with httpx.AsyncClient(transport=BulkheadTransport(), timeout=TIMEOUT) as client:
            response = await client.post(srv.url, content=chunks([b"abc", b"", b"defgh"]))
    assert response.content == b"ok"
    head, _, body = store[0].partition(b"\r\n\r\n")
    assert b"\r\nTransfer-Encoding: chunked" in head
    assert body == b"3\r\nabc\r\n5\r\ndefgh\r\n0\r\n\r\n"


async def test_streaming_response_delivers_every_byte(server: HypercornServer) -> None:
    key = server.url
    transport = BulkheadTransport()
    async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
        async with client.stream("GET", f"{server.url}/bytes/1000000") as response:
            assert response.headers["content-length"] == "1000000"
            sizes: list[int] = []
            async for chunk in response.aiter_bytes():
                assert chunk == b"x" * len(chunk)
                sizes.append(len(chunk))
                if len(sizes) == 1:  # mid-body: the slot and the connection are held
                    stats = transport.statistics()[key]
                    assert (stats.running, stats.in_use_connections) == (1, 1)
        assert sum(sizes) == 1_000_000 and len(sizes) > 1
        stats = transport.statistics()[key]
        assert (stats.running, stats.idle_connections, stats.completed) == (0, 1, 1)

        # chunked (no Content-Length), streamed the same way
        async with client.stream("GET", f"{server.url}/stream/300") as response:
            assert "content-length" not in response.headers
            total = b"".join([chunk async for chunk in response.aiter_bytes()])
        assert total == b"x" * 300 * 1024
        assert info(response).reused is True


async def test_http_version_and_reason_phrase(server: HypercornServer) -> None:
    async with httpx.AsyncClient(transport=BulkheadTransport(), timeout=TIMEOUT) as client:
        response = await client.get(f"{server.url}/")
        assert response.http_version == "HTTP/1.1"
        assert response.headers["x-http-version"] == "1.1"
        with RawServer(with_reason(418, "Teapot Rules")) as srv:
            teapot = await client.get(srv.url)
            assert (teapot.status_code, teapot.reason_phrase) == (418, "Teapot Rules")
            assert teapot.http_version == "HTTP/1.1"
        with RawServer(with_reason(404, "Not Found")) as srv:
            missing = await client.get(srv.url)
            assert (missing.status_code, missing.reason_phrase) == (404, "Not Found")


# ------------------------------------------------------------------------ extensions


async def test_bulkhead_extension_reports_compartment_and_reuse(server: HypercornServer) -> None:
    async with httpx.AsyncClient(transport=BulkheadTransport(), timeout=TIMEOUT) as client:
        first = info(await client.get(f"{server.url}/"))
        second = info(await client.get(f"{server.url}/echo"))
    assert first.compartment == second.compartment == f"http://127.0.0.1:{server.port}"
    assert (first.reused, second.reused) == (False, True)
    assert first.connection_id == second.connection_id
    assert (first.retried, second.retried) == (False, False)
    assert first.queue_wait == second.queue_wait == 0.0

    key = f"127.0.0.1:{server.port}"
    transport = BulkheadTransport(hosts={key: Policy(max_concurrency=2)})
    async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
        listed = info(await client.get(f"{server.url}/"))
    assert listed.compartment == key
    assert list(transport.statistics()) == [key]


async def test_trace_extension_gets_httpcore_events_in_order(server: HypercornServer) -> None:
    first, second = Trace(), Trace()
    async with httpx.AsyncClient(transport=BulkheadTransport(), timeout=TIMEOUT) as client:
        response = await client.post(
            f"{server.url}/echo", content=b"data", extensions={"trace": first}
        )
        assert response.content == b"data"
        await client.get(f"{server.url}/", extensions={"trace": second})
    exchange = [
        "http11.send_request_headers.started",
        "http11.send_request_headers.complete",
        "http11.send_request_body.started",
        "http11.send_request_body.complete",
        "http11.receive_response_headers.started",
        "http11.receive_response_headers.complete",
    ]
    connect = ["connection.connect_tcp.started", "connection.connect_tcp.complete"]
    assert is_subsequence(connect + exchange, first.events), first.events
    assert all(e.startswith(("connection.", "http11.")) for e in first.events), first.events
    # httpcore's payload for the response head: (http_version, status, reason, headers)
    head = first.infos[first.events.index("http11.receive_response_headers.complete")]
    assert head["return_value"][:2] == (b"HTTP/1.1", 200)
    # The reused connection: no connect events, the same exchange events.
    assert is_subsequence(exchange, second.events), second.events
    assert not [e for e in second.events if e.startswith("connection.connect")]


async def test_target_extension_overrides_the_request_target(server: HypercornServer) -> None:
    store: list[bytes] = []
    with RawServer(recording(store)) as srv:
        async with httpx.AsyncClient(transport=BulkheadTransport(), timeout=TIMEOUT) as client:
            await client.get(f"{srv.url}/ignored?y=2", extensions={"target": b"/echo?x=1"})
            await client.get(f"{srv.url}/plain?y=2")
    assert store[0].split(b"\r\n", 1)[0] == b"GET /echo?x=1 HTTP/1.1"
    assert store[1].split(b"\r\n", 1)[0] == b"GET /plain?y=2 HTTP/1.1"

    # hypercorn routes by the target that was sent, not by the URL's path
    async with httpx.AsyncClient(transport=BulkheadTransport(), timeout=TIMEOUT) as client:
        response = await client.post(
            f"{server.url}/nothing-here", content=b"via-target", extensions={"target": b"/echo"}
        )
    assert (response.status_code, response.content) == (200, b"via-target")


async def test_per_request_timeout_raises_read_timeout(flavour: Flavour) -> None:
    with RawServer(never_answer()) as srv:
        transport = make_transport(flavour)
        async with client_for(transport, timeout=TIMEOUT) as client:
            with pytest.raises(httpx.ReadTimeout) as caught:
                await client.get(srv.url, timeout=httpx.Timeout(0.2))
            assert caught.value.request.url == httpx.URL(srv.url)
            assert len(srv.requests) == 1  # it timed out waiting for the answer
            stats = transport.statistics()[srv.url]
            assert (stats.running, stats.connections, stats.unknown_state) == (0, 0, 1)


async def test_connect_retries_make_extra_attempts() -> None:
    url = f"http://127.0.0.1:{closed_port()}/"
    for retries, attempts in ((0, 1), (1, 2)):
        trace = Trace()
        transport = BulkheadTransport(retries=retries)
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
            with pytest.raises(httpx.ConnectError):
                await client.get(url, extensions={"trace": trace})
        assert trace.events.count("connection.connect_tcp.started") == attempts
        assert trace.events.count("connection.connect_tcp.failed") == attempts


# ------------------------------------------------------------- protocol behaviours


async def test_expect_100_continue_against_hypercorn(server: HypercornServer) -> None:
    body = b"y" * 200_000
    trace = Trace()
    async with httpx.AsyncClient(transport=BulkheadTransport(), timeout=TIMEOUT) as client:
        response = await client.post(
            f"{server.url}/echo",
            content=body,
            headers={"Expect": "100-continue"},
            extensions={"trace": trace},
        )
        assert (response.status_code, response.content) == (200, body)
        again = await client.get(f"{server.url}/")
        assert info(again).reused is True
    assert "http11.send_request_body.complete" in trace.events


async def test_expect_100_continue_final_answer_skips_the_body() -> None:
    """A server answering ``401`` instead of ``100 Continue`` gets no body; the connection,
    with a request half sent, is not pooled."""
    received: list[bytes] = []

    def refuse(conn: RawConn) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv()
            if not chunk:
                return
            data += chunk
        conn.send(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")
        rest = data.partition(b"\r\n\r\n")[2]
        while chunk := conn.recv():  # until the client closes the connection
            rest += chunk
        received.append(rest)
        conn.server.set_event("client-closed")

    trace = Trace()
    with RawServer(refuse) as srv:
        transport = BulkheadTransport()
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
            response = await client.post(
                srv.url,
                content=b"z" * 5000,
                headers={"Expect": "100-continue"},
                extensions={"trace": trace},
            )
            assert response.status_code == 401
            stats = transport.statistics()[srv.url]
            assert (stats.not_reusable, stats.connections, stats.running) == (1, 0, 0)
            await srv.wait_event("client-closed")
    assert received == [b""]  # not one body byte was sent
    assert "http11.send_request_body.started" not in trace.events


async def test_expect_100_continue_holds_the_body_until_continue() -> None:
    """The body is sent only once the server said ``100 Continue``."""
    early: list[bool] = []

    def continue_on_cue(conn: RawConn) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv()
            if not chunk:
                return
            data += chunk
        conn.server.set_event("head")
        if not conn.wait("go"):
            return
        try:
            pending = conn.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            pending = b""
        early.append(bool(data.partition(b"\r\n\r\n")[2] or pending))
        conn.send(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = b""
        while len(body) < 5:
            chunk = conn.recv()
            if not chunk:
                return
            body += chunk
        conn.send_response(200, body)
        keepalive_ok(b"next")(conn)

    with RawServer(continue_on_cue) as srv:
        transport = BulkheadTransport()
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
            responses: list[httpx.Response] = []

            async def post() -> None:
                responses.append(
                    await client.post(srv.url, content=b"hello", headers={"Expect": "100-continue"})
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(post)
                await srv.wait_event("head")
                srv.set_event("go")
            assert responses[0].content == b"hello"
            after = await client.get(srv.url)
            assert (after.content, info(after).reused) == (b"next", True)
    assert early == [False]


async def test_request_connection_close_is_not_reused() -> None:
    with RawServer(keepalive_ok(b"ok")) as srv:
        transport = BulkheadTransport()
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
            await client.get(srv.url, headers={"Connection": "close"})
            stats = transport.statistics()[srv.url]
            assert (stats.not_reusable, stats.connections) == (1, 0)
            assert info(await client.get(srv.url)).reused is False
        assert srv.connections == 2


async def test_304_with_a_content_length_has_no_body() -> None:
    """``304`` (and ``HEAD``) responses end at the head whatever ``Content-Length`` says;
    the next response on the connection is read correctly."""

    def not_modified(conn: RawConn) -> None:
        request = conn.read_request()
        if request is None:
            return
        conn.send(b'HTTP/1.1 304 Not Modified\r\nContent-Length: 1234\r\nETag: "v1"\r\n\r\n')
        request = conn.read_request()
        if request is None:
            return
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")  # HEAD: no body
        keepalive_ok(b"third")(conn)

    with RawServer(not_modified) as srv:
        transport = BulkheadTransport()
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
            first = await client.get(srv.url, headers={"If-None-Match": '"v1"'})
            assert (first.status_code, first.content) == (304, b"")
            second = await client.head(srv.url)
            assert (second.status_code, second.content) == (200, b"")
            third = await client.get(srv.url)
            assert third.content == b"third"
            assert [info(r).reused for r in (first, second, third)] == [False, True, True]
        assert srv.connections == 1


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("HEAD", "/", 200), ("GET", "/status/204", 204), ("GET", "/status/304", 304)],
)
async def test_bodyless_responses_leave_the_connection_reusable(
    server: HypercornServer, method: str, path: str, status: int
) -> None:
    transport = BulkheadTransport()
    async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
        first = await client.request(method, f"{server.url}{path}")
        assert (first.status_code, first.content) == (status, b"")
        second = await client.get(f"{server.url}/")
        assert second.text == "hello"
        assert info(second).reused is True
        assert second.headers["x-conn"] == first.headers["x-conn"]
        stats = transport.statistics()[server.url]
        assert (stats.connections_created, stats.not_reusable, stats.error) == (1, 0, 0)
    if method == "HEAD":
        assert first.headers["content-length"] == "5"  # of the body it did not send


async def test_connection_close_response_is_not_reused(server: HypercornServer) -> None:
    transport = BulkheadTransport()
    async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
        closing = await client.get(f"{server.url}/close")
        assert (closing.text, closing.headers["connection"]) == ("close", "close")
        stats = transport.statistics()[server.url]
        assert (stats.not_reusable, stats.connections, stats.running) == (1, 0, 0)
        after = await client.get(f"{server.url}/")
        assert after.text == "hello" and info(after).reused is False
        assert after.headers["x-conn"] != closing.headers["x-conn"]
        assert transport.statistics()[server.url].connections_created == 2


async def test_http10_response_is_not_reused() -> None:
    with RawServer(http10_response) as srv:
        transport = BulkheadTransport()
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
            first = await client.get(srv.url)
            assert (first.http_version, first.text) == ("HTTP/1.0", "ok")
            assert transport.statistics()[srv.url].not_reusable == 1
            second = await client.get(srv.url)
            assert info(second).reused is False
        assert srv.connections == 2


async def test_keep_alive_header_is_honoured(server: HypercornServer) -> None:
    transport = BulkheadTransport()
    async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
        long = await client.get(f"{server.url}/keepalive/10")
        assert (long.text, long.headers["keep-alive"]) == ("keepalive", "timeout=10")
        assert info(await client.get(f"{server.url}/")).reused is True

        # "timeout=0": the server may close at once, so the connection is not kept.
        await client.get(f"{server.url}/keepalive/0")
        stats = transport.statistics()[server.url]
        assert (stats.idle_expired, stats.connections) == (1, 0)
        assert info(await client.get(f"{server.url}/")).reused is False


async def test_interim_1xx_response_is_skipped() -> None:
    with RawServer(early_hints) as srv:
        async with httpx.AsyncClient(transport=BulkheadTransport(), timeout=TIMEOUT) as client:
            response = await client.get(srv.url)
            assert (response.status_code, response.text) == (200, "final")
            assert response.headers.get_list("set-cookie") == ["a=1", "b=2"]
            assert info(await client.get(srv.url)).reused is True


async def test_unsupported_protocol_and_missing_host() -> None:
    transport = BulkheadTransport()
    async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
        with pytest.raises(httpx.UnsupportedProtocol, match="ftp"):
            await client.get("ftp://127.0.0.1/file")
        for url in ("http:///path", "https://:443/path"):
            request = httpx.Request("GET", url)
            with pytest.raises(httpx.UnsupportedProtocol, match="host") as caught:
                await transport.handle_async_request(request)
            assert caught.value.request is request
    assert transport.statistics() == {}  # refused before any compartment was involved


# --------------------------------------------------- compared with httpx's own transport


async def test_same_observable_response_as_default_transport(server: HypercornServer) -> None:
    cases: list[tuple[str, str, bytes | None]] = [
        ("GET", "/", None),
        ("POST", "/echo", b"payload" * 1000),
        ("GET", "/stream/3", None),
        ("HEAD", "/bytes/10", None),
        ("GET", "/status/404", None),
        ("DELETE", "/headers?q=1", None),
        ("GET", "/no/such/route", None),
    ]
    ignored = {b"date", b"x-conn"}

    def observable(r: httpx.Response) -> tuple[object, ...]:
        headers = [(k, v) for k, v in r.headers.raw if k.lower() not in ignored]
        return r.status_code, r.reason_phrase, r.http_version, headers, r.content

    async def run(transport: httpx.AsyncBaseTransport) -> list[tuple[object, ...]]:
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
            return [
                observable(
                    await client.request(
                        method, f"{server.url}{path}", content=body, headers={"X-Custom": "1"}
                    )
                )
                for method, path, body in cases
            ]

    ours, theirs = await run(BulkheadTransport()), await run(httpx.AsyncHTTPTransport())
    assert ours == theirs
    received = json.loads(ours[5][4])  # type: ignore[arg-type]
    assert received["x-custom"] == "1"


async def test_same_request_bytes_as_default_transport() -> None:
    """What reaches the server is byte for byte what httpx's own transport sends."""

    async def send_all(transport: httpx.AsyncBaseTransport, url: str) -> None:
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
            await client.get(f"{url}/a/b?q=1%202&r=%C3%A9", headers={"X-Mixed-Case": "V"})
            await client.post(f"{url}/form", data={"k": "v w"})
            await client.put(f"{url}/bin", content=b"\x00\x01" * 100)
            await client.post(f"{url}/stream", content=chunks([b"one", b"two"]))

    ours: list[bytes] = []
    theirs: list[bytes] = []
    with RawServer(recording(ours)) as srv_a, RawServer(recording(theirs)) as srv_b:
        await send_all(BulkheadTransport(), srv_a.url)
        await send_all(httpx.AsyncHTTPTransport(), srv_b.url)
        assert srv_a.connections == srv_b.connections == 1
    normalise = [r.replace(str(srv_b.port).encode(), str(srv_a.port).encode()) for r in theirs]
    assert len(ours) == 4
    assert ours == normalise


async def test_keepalive_raw_server_single_connection(flavour: Flavour) -> None:
    with RawServer(keepalive_ok(b"hi")) as srv:
        async with client_for(make_transport(flavour), timeout=TIMEOUT) as client:
            bodies = [(await client.get(f"{srv.url}/{i}")).content for i in range(5)]
        assert bodies == [b"hi"] * 5
        assert srv.connections == 1
        assert [r.split(b" ")[1] for r in srv.requests] == [b"/%d" % i for i in range(5)]


# ---------------------------------------------------- early answers, bad headers, hints


def answers_413_before_the_body(conn: RawConn) -> None:
    """Reads the request head only, answers 413, and once the test says the client holds
    the answer, resets the connection with the body unread (the upload fails mid-way)."""
    while b"\r\n\r\n" not in conn._buffer:
        if not conn._fill():
            return
    conn.send_response(413, b"too large", [("Connection", "close")])
    conn.server.set_event("answered")
    conn.wait("reset")
    conn.reset()


async def test_an_early_answer_during_the_upload_is_returned() -> None:
    """RFC 9112 §9.5: the server may answer and close before the body is sent; its
    response is what the caller gets, not the write error.  (The reset waits until the
    client's stream holds the answer: a reset that overtakes it loses it in the kernel.)"""

    async def upload() -> AsyncIterator[bytes]:
        for _ in range(256):
            yield b"u" * 65536  # 16 MB: far more than the socket buffers hold
        raise AssertionError("the whole body was sent")

    streams: list[Any] = []

    async def trace(name: str, info: dict[str, Any]) -> None:
        if name == "connection.connect_tcp.complete":
            streams.append(info["return_value"])

    with RawServer(answers_413_before_the_body) as srv:
        transport = BulkheadTransport()
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
            responses: list[httpx.Response] = []

            async def post() -> None:
                extensions = {"trace": trace}
                responses.append(
                    await client.post(srv.url, content=upload(), extensions=extensions)
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(post)
                await srv.wait_event("answered")
                await until(lambda: bool(streams[0].get_extra_info("is_readable")))
                srv.set_event("reset")
            assert (responses[0].status_code, responses[0].text) == (413, "too large")
        stats = transport.statistics()[srv.url]
        assert (stats.completed, stats.failed, stats.connections) == (1, 0, 0)


def bad_response_header(conn: RawConn) -> None:
    while conn.read_request() is not None:
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nno colon here\r\n\r\nok")


async def test_an_invalid_response_header_is_a_protocol_error() -> None:
    with RawServer(bad_response_header) as srv:
        transport = BulkheadTransport()
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
            with pytest.raises(httpx.RemoteProtocolError):
                await client.get(srv.url)
            with pytest.raises(httpx.RemoteProtocolError):
                await client.get(srv.url)
        stats = transport.statistics()[srv.url]
        assert (stats.failed, stats.error, stats.running, stats.connections) == (2, 2, 0, 0)
        assert srv.connections == 2  # a connection in an unknown state is never reused


@pytest.mark.parametrize(
    "header",
    [{"bad name": "x"}, {"x-ok": "line\r\nInjected: 1"}, {"": "empty name"}],
    ids=["space-in-name", "crlf-in-value", "empty-name"],
)
async def test_an_invalid_request_header_is_refused_before_anything_is_sent(
    header: dict[str, str],
) -> None:
    received: list[bytes] = []
    with RawServer(recording(received)) as srv:
        transport = BulkheadTransport()
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
            with pytest.raises(httpx.LocalProtocolError):
                await client.get(srv.url, headers=header)
            assert (await client.get(srv.url)).text == "ok"
        stats = transport.statistics()[srv.url]
        assert (stats.failed, stats.completed, stats.running) == (1, 1, 0)
        assert len(received) == 1 and b"Injected" not in received[0]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("value", "kept_for"),
    [
        ("timeout=abc", 4.0),  # malformed: ignored, our idle_timeout applies
        ("timeout=-3", 4.0),
        ("timeout=", 4.0),
        ("max=100", 4.0),
        ("max=100, timeout=3", 2.0),  # 3 s minus a 1 s margin
        ("Timeout = 2 ", 1.0),
    ],
)
async def test_keep_alive_header_values(value: str, kept_for: float) -> None:
    clock = FakeClock()
    with RawServer(keepalive_ok(b"ok", [("Keep-Alive", value)])) as srv:
        transport = BulkheadTransport(default=Policy(idle_timeout=4.0), _clock=clock)
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
            await client.get(srv.url)
            clock.now += kept_for - 0.01
            assert info(await client.get(srv.url)).reused
            clock.now += kept_for
            assert not info(await client.get(srv.url)).reused
        assert transport.statistics()[srv.url].idle_expired == 1


# ------------------------------------------------------------------- back-pressure

BIG = 4 * 1024 * 1024


def big_download(conn: RawConn) -> None:
    """Answers with a 4 MB body of a known pattern, sent as fast as the client takes it."""
    while conn.read_request() is not None:
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % BIG)
        block = bytes(range(256)) * 256
        for _ in range(BIG // len(block)):
            conn.send(block)
        conn.server.set_event("sent")


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
async def test_a_download_the_caller_reads_late_arrives_whole(tls: bool) -> None:
    """Nobody reads the body until the server has pushed what the buffers hold: the
    stream stops reading from the socket (back-pressure) and resumes as the caller reads;
    no byte is lost or reordered (over TLS the plaintext buffer is what fills)."""
    server_tls = default_server_tls() if tls else None
    with RawServer(big_download, tls=server_tls) as srv:
        verify = server_tls.client_ssl_context() if server_tls else True
        transport = BulkheadTransport(verify=verify)
        url = srv.url
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
            async with client.stream("GET", url) as response:
                for _ in range(20):
                    await anyio.sleep(0.01)  # let the buffers fill (not a synchronisation)
                body = await response.aread()
            assert len(body) == BIG and body == (bytes(range(256)) * 256) * (BIG // 65536)
            await srv.wait_event("sent")
            assert info(await client.get(url)).reused
        assert transport.statistics()[url].completed == 2


def slow_reader(conn: RawConn) -> None:
    """Reads the head, waits for the test's go, then reads the whole body and reports its
    length and checksum."""
    while b"\r\n\r\n" not in conn._buffer:
        if not conn._fill():
            return
    conn.server.set_event("head")
    conn.wait("go")
    request = conn.read_request()
    if request is None:
        return
    body = request.split(b"\r\n\r\n", 1)[1]
    conn.send_response(200, b"%d %d" % (len(body), sum(body[::4096])))


async def test_an_upload_the_server_reads_late_is_sent_whole() -> None:
    """The server reads nothing for a while: writes stop at the transport's high-water
    mark (back-pressure) and resume as the server reads."""
    body = bytes(range(256)) * (BIG // 256)
    with RawServer(slow_reader) as srv:
        transport = BulkheadTransport()
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
            result: list[httpx.Response] = []
            async with anyio.create_task_group() as tg:

                async def upload() -> None:
                    result.append(await client.post(srv.url, content=body))

                tg.start_soon(upload)
                await srv.wait_event("head")
                srv.set_event("go")
            assert result[0].text == f"{len(body)} {sum(body[::4096])}"
