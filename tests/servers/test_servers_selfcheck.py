"""Self-checks for the test servers, using only stdlib sockets / ``httpx.Client`` with
its default transport as clients (never httpx_bulkhead)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from .asgi import HypercornServer, TestApp
from .raw import (
    Handler,
    RawConn,
    RawServer,
    chunked_garbage,
    close_after_response,
    garbage_status_line,
    huge_headers,
    keepalive_header,
    keepalive_ok,
    late_response,
    never_answer,
    no_length_keep_alive,
    reset_after_headers,
    reset_mid_body,
    run_blocking,
    slowloris,
    truncated_body,
)
from .tls import default_server_tls, untrusted_server_tls, wrong_host_server_tls

TIMEOUT = 5.0


# ------------------------------------------------------------------ helpers


@pytest.fixture
def app() -> TestApp:
    return TestApp()


@pytest.fixture
def server(app: TestApp) -> Iterator[HypercornServer]:
    with HypercornServer(app) as srv:
        yield srv


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    return sock


def read_response(sock: socket.socket, buffer: bytearray | None = None) -> tuple[bytes, bytes]:
    """Read one Content-Length-delimited HTTP/1.1 response: (head, body)."""
    buf = buffer if buffer is not None else bytearray()
    while b"\r\n\r\n" not in buf:
        data = sock.recv(65536)
        if not data:
            raise EOFError(bytes(buf))
        buf += data
    end = buf.index(b"\r\n\r\n") + 4
    head = bytes(buf[:end])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(buf) < end + length:
        data = sock.recv(65536)
        if not data:
            raise EOFError(bytes(buf))
        buf += data
    body = bytes(buf[end : end + length])
    del buf[: end + length]
    return head, body


def get(path: str, host: str = "x") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


# ------------------------------------------------------------ HypercornServer


def test_hypercorn_http11_routes(server: HypercornServer, app: TestApp) -> None:
    assert server.url == f"http://127.0.0.1:{server.port}"
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as client:
        r1 = client.get("/?q=1")
        r2 = client.get("/")
        assert (r1.status_code, r1.content, r1.http_version) == (200, b"hello", "HTTP/1.1")
        assert r1.headers["x-conn"] == r2.headers["x-conn"]  # keep-alive reuse

        echo = client.post("/echo", content=b"payload")
        assert (echo.content, echo.headers["x-method"]) == (b"payload", "POST")
        assert client.get("/status/418").status_code == 418
        assert client.get("/bytes/200000").content == b"x" * 200000
        streamed = client.get("/stream/3")
        assert streamed.content == b"x" * 3072
        assert "content-length" not in streamed.headers
        headers = json.loads(client.get("/headers", headers={"x-probe": "1"}).content)
        assert headers["x-probe"] == "1"
        assert client.get("/keepalive/7").headers["keep-alive"] == "timeout=7"
        assert client.get("/nope").status_code == 404
        assert client.get("/", headers={"x-bucket": "b1"}).headers["x-bucket"] == "b1"

    bucket = f"127.0.0.1:{server.port}"
    assert app.total(bucket) == 9
    assert app.max_concurrent(bucket) == 1
    assert app.current(bucket) == 0
    assert app.connections(bucket) == {r1.headers["x-conn"]}
    assert app.total("b1") == 1
    app.reset()
    assert app.total(bucket) == 0


def test_hypercorn_h2c_prior_knowledge(server: HypercornServer) -> None:
    with httpx.Client(http1=False, http2=True, timeout=TIMEOUT) as client:
        responses = [client.get(f"{server.url}/keepalive/3") for _ in range(2)]
    assert [r.http_version for r in responses] == ["HTTP/2", "HTTP/2"]
    assert responses[0].headers["x-conn"] == responses[1].headers["x-conn"]
    assert "keep-alive" not in responses[0].headers  # illegal on h2: omitted


def test_hypercorn_idle_close() -> None:
    with HypercornServer(TestApp(), keep_alive_timeout=0.2) as srv, connect(srv.port) as sock:
        sock.sendall(get("/"))
        head, body = read_response(sock)
        assert head.startswith(b"HTTP/1.1 200") and body == b"hello"
        assert sock.recv(1) == b""  # hypercorn closed the idle connection


def test_hypercorn_tls_alpn(app: TestApp) -> None:
    tls = default_server_tls()
    with HypercornServer(app, tls=tls) as srv:
        assert srv.url.startswith("https://127.0.0.1:")
        verify = tls.client_ssl_context()
        with httpx.Client(verify=verify, http2=True, timeout=TIMEOUT) as client:
            r = client.get(srv.url)
            assert (r.content, r.http_version) == (b"hello", "HTTP/2")
        with httpx.Client(verify=tls.client_ssl_context(), timeout=TIMEOUT) as client:
            assert client.get(srv.url).http_version == "HTTP/1.1"
        # Untrusted CA -> verification failure.
        bad = untrusted_server_tls().client_ssl_context()
        with httpx.Client(verify=bad, timeout=TIMEOUT) as client, pytest.raises(httpx.ConnectError):
            client.get(srv.url)
    assert app.records()[0].scheme == "https"


def test_hypercorn_tls_http11_only_and_wrong_host(tmp_path: Path) -> None:
    with HypercornServer(TestApp(), tls=default_server_tls(), alpn=("http/1.1",)) as srv:
        ctx = default_server_tls().client_ssl_context(alpn=("h2", "http/1.1"))
        with connect(srv.port) as raw, ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            assert tls.selected_alpn_protocol() == "http/1.1"

    wrong = wrong_host_server_tls()
    files = wrong.write_pem_files(tmp_path)
    assert files.key.read_bytes().startswith(b"-----BEGIN")
    with HypercornServer(TestApp(), tls=wrong) as srv:
        ctx = ssl.create_default_context(cafile=str(files.ca))
        with (
            connect(srv.port) as raw,
            pytest.raises(ssl.SSLCertVerificationError, match="mismatch"),
        ):
            ctx.wrap_socket(raw, server_hostname="127.0.0.1")


def test_gate_blocking(server: HypercornServer, app: TestApp) -> None:
    gate = app.gate("g1")
    results: list[bytes] = []

    def request() -> None:
        with httpx.Client(timeout=TIMEOUT) as client:
            resp = client.get(f"{server.url}/gate/g1", headers={"x-bucket": "gated"})
            results.append(resp.content)

    threads = [threading.Thread(target=request) for _ in range(2)]
    for t in threads:
        t.start()
    gate.wait_entered(2)
    assert app.current("gated") == 2 and gate.waiting == 2 and results == []
    gate.open()
    for t in threads:
        t.join(TIMEOUT)
    assert results == [b"released:g1"] * 2
    assert gate.passed == 2
    assert app.max_concurrent("gated") == 2
    assert app.current("gated") == 0


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_gate_async_and_abandon(server: HypercornServer, app: TestApp) -> None:
    gate = app.gate("g2")
    sock = connect(server.port)
    try:
        sock.sendall(get("/gate/g2", host="abandon"))
        await gate.until_entered(1)
        assert app.current("abandon") == 1
    finally:
        sock.close()  # client goes away while parked
    await app.until_current("abandon", 0)
    assert gate.abandoned == 1

    def fetch() -> bytes:
        with httpx.Client(timeout=TIMEOUT) as client:
            return client.get(f"{server.url}/gate/g2").content

    async with anyio.create_task_group() as tg:
        result: list[bytes] = []

        async def run() -> None:
            result.append(await run_blocking(fetch))

        tg.start_soon(run)
        await gate.until_entered(2)
        gate.open()
    assert result == [b"released:g2"]
    with pytest.raises(TimeoutError):
        gate.wait_entered(5, timeout=0.01)


def test_max_concurrent_leaves_out_a_request_whose_client_closed_its_connection() -> None:
    """``max_concurrent`` counts, at each arrival, the requests inside whose client has
    not closed its connection: a handler still parked after its client hung up is the
    server's lag, not the client's concurrency; a request whose client is connected
    counts, parked or not.  Driven through the ASGI app with real TCP connections (the
    kernel's table says which ones the client closed) and a ``receive`` that never
    reports the disconnect, as a server slow to notice it does not."""
    app = TestApp()
    gate = app.gate("lag")
    listener = socket.create_server(("127.0.0.1", 0))
    connections: list[tuple[socket.socket, socket.socket]] = []

    def connection() -> tuple[socket.socket, socket.socket]:
        client = socket.create_connection(listener.getsockname(), timeout=TIMEOUT)
        server_side, _ = listener.accept()
        connections.append((client, server_side))
        return client, server_side

    async def main() -> None:
        never = asyncio.Event()

        def request(server_side: socket.socket) -> Coroutine[Any, Any, None]:
            messages = [{"type": "http.request", "body": b"", "more_body": False}]

            async def receive() -> dict[str, Any]:
                if messages:
                    return messages.pop()
                await never.wait()  # the disconnect is never reported
                raise AssertionError

            async def send(message: Any) -> None:
                pass

            scope = {
                "type": "http",
                "http_version": "1.1",
                "scheme": "http",
                "method": "GET",
                "path": "/gate/lag",
                "headers": [(b"x-bucket", b"lag")],
                "client": server_side.getpeername(),
                "server": server_side.getsockname(),
            }
            return app(scope, receive, send)

        tasks = []
        try:
            client, server_side = connection()
            tasks.append(asyncio.ensure_future(request(server_side)))
            await gate.until_entered(1)
            client.close()  # hung up; its handler stays parked
            server_side.settimeout(TIMEOUT)
            assert server_side.recv(1) == b""  # the kernel has seen it closed
            for entered in (2, 3):
                tasks.append(asyncio.ensure_future(request(connection()[1])))
                await gate.until_entered(entered)
            assert app.current("lag") == 3  # three handlers inside...
            assert app.max_concurrent("lag") == 2  # ...two of them with a client
        finally:
            gate.open()
            never.set()
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), TIMEOUT)

    try:
        asyncio.run(main())
    finally:
        listener.close()
        for client, server_side in connections:
            client.close()
            server_side.close()


# ------------------------------------------------------------------ RawServer


def test_raw_keepalive_ok() -> None:
    with RawServer(keepalive_ok(b"hi")) as srv, connect(srv.port) as sock:
        sock.sendall(get("/a") + get("/b"))  # pipelined
        buf = bytearray()
        for _ in range(2):
            head, body = read_response(sock, buf)
            assert body == b"hi" and b"x-conn: 0" in head
        srv.wait_requests(2)
        assert srv.connections == 1
        assert [r.split(b"\r\n")[0] for r in srv.requests] == [
            b"GET /a HTTP/1.1",
            b"GET /b HTTP/1.1",
        ]


def test_raw_keepalive_header_with_httpx() -> None:
    with RawServer(keepalive_header(3)) as srv, httpx.Client(timeout=TIMEOUT) as client:
        r1, r2 = client.get(srv.url), client.post(srv.url, content=b"x" * 10)
        assert r1.headers["keep-alive"] == "timeout=3" and r2.content == b"ok"
        assert srv.connections == 1


def test_raw_close_after_response() -> None:
    with RawServer(close_after_response()) as srv, connect(srv.port) as sock:
        sock.sendall(get("/"))
        head, body = read_response(sock)
        assert b"connection: close" not in head.lower() and body == b"ok"
        srv.wait_event_sync("closed")
        assert sock.recv(1) == b""


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_raw_async_helpers() -> None:
    with RawServer(close_after_response()) as srv, connect(srv.port) as sock:
        sock.sendall(get("/"))
        await srv.until_connections(1)
        await srv.until_requests(1)
        await srv.wait_event("closed")
        assert read_response(sock)[1] == b"ok"
        assert sock.recv(1) == b""
        with pytest.raises(TimeoutError):
            await srv.wait_event("never", timeout=0.01)


def test_raw_late_response() -> None:
    with RawServer(late_response("go")) as srv, connect(srv.port) as first:
        first.sendall(get("/one"))
        srv.wait_requests(1)
        with connect(srv.port) as second:
            second.sendall(get("/two"))
            assert read_response(second)[1] == b"response-for:/two"
        srv.set_event("go")
        srv.wait_event_sync("go.sent")
        assert read_response(first)[1] == b"response-for:/one"


def test_raw_faults_with_httpx() -> None:
    with httpx.Client(timeout=TIMEOUT) as client:
        with RawServer(truncated_body()) as srv, pytest.raises(httpx.RemoteProtocolError):
            client.get(srv.url)
        with RawServer(garbage_status_line()) as srv, pytest.raises(httpx.RemoteProtocolError):
            client.get(srv.url)
        errors = (httpx.ReadError, httpx.RemoteProtocolError)
        with RawServer(reset_after_headers()) as srv, pytest.raises(errors):
            client.get(srv.url)


@pytest.mark.parametrize(
    ("handler", "error"),
    [
        (chunked_garbage(), httpx.RemoteProtocolError),
        (huge_headers(200_000), httpx.RemoteProtocolError),
        (reset_mid_body(), (httpx.ReadError, httpx.RemoteProtocolError)),
    ],
    ids=["chunked_garbage", "huge_headers", "reset_mid_body"],
)
def test_raw_more_faults(handler: Handler, error: type[Exception]) -> None:
    with (
        RawServer(handler) as srv,
        httpx.Client(timeout=TIMEOUT) as client,
        pytest.raises(error),
    ):
        client.get(srv.url)


def test_raw_no_length_body_until_eof() -> None:
    with RawServer(no_length_keep_alive(b"abc", close_on="eof")) as srv, connect(srv.port) as sock:
        sock.sendall(get("/"))
        data = b""
        while b"abc" not in data:
            data += sock.recv(65536)
        assert b"content-length" not in data.lower()
        srv.set_event("eof")
        assert sock.recv(1) == b""


def test_raw_shutdown_unblocks_never_answer() -> None:
    with contextlib.ExitStack() as stack:
        with RawServer(never_answer()) as srv:
            sock = stack.enter_context(connect(srv.port))
            sock.sendall(get("/"))
            srv.wait_requests(1)
        # Server exit interrupted the blocked handler and closed its socket.
        assert sock.recv(1) == b""


def test_raw_shutdown_unblocks_slowloris() -> None:
    with contextlib.ExitStack() as stack:
        with RawServer(slowloris(0.05)) as srv:
            sock = stack.enter_context(connect(srv.port))
            sock.sendall(get("/"))
            assert sock.recv(1) == b"H"
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        assert len(received) < 20  # trickling stopped at shutdown, then EOF


def test_raw_handler_bug_is_reported() -> None:
    def broken(conn: RawConn) -> None:
        raise ValueError("handler bug")

    with pytest.raises(RuntimeError, match="handler failed"):
        with RawServer(broken) as srv, connect(srv.port) as sock:
            srv.wait_connections(1)
            assert sock.recv(1) == b""
