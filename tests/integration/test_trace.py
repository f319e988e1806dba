"""The ``trace`` extension, side by side with httpx's default transport (httpcore): the same
requests against the same servers give the same event names, in the same order, with the
same ``info`` keys.

Where they must differ, ``EXPECTED_DIFFERENCE`` says so: httpcore waits for the server's
SETTINGS as a step of the first HTTP/2 request (``http2.receive_remote_settings.*``); we
take SETTINGS whenever they arrive, with no request to report them to.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from httpx_bulkhead import BulkheadTransport
from tests.servers import (
    HypercornServer,
    RawServer,
    TestApp,
    default_server_tls,
    keepalive_ok,
    never_answer,
    reset_mid_body,
    wrong_host_server_tls,
)

pytestmark = pytest.mark.anyio

#: Events httpcore emits for an operation we do not have (see the module docstring).
EXPECTED_DIFFERENCE = ("http2.receive_remote_settings.",)

Call = Callable[[httpx.AsyncClient, dict[str, Any]], Awaitable[None]]


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, tuple[str, ...]]] = []
        self.late: list[str] = []

    async def __call__(self, name: str, info: dict[str, Any]) -> None:
        if isinstance(info.get("exception"), GeneratorExit):
            # httpcore's body generator, finalized: when depends on the event loop and the
            # garbage collector, so the event may land in a later call's list.
            self.late.append(name)
            return
        self.events.append((name, tuple(sorted(info))))

    def names(self) -> list[str]:
        return [name for name, _ in self.events]


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, HypercornServer]]:
    app = TestApp()
    tls = default_server_tls()
    with (
        HypercornServer(app) as plain,
        HypercornServer(app, tls=tls, alpn=("http/1.1",)) as tls1,
        HypercornServer(app, tls=tls) as tls2,
        HypercornServer(TestApp(), tls=wrong_host_server_tls()) as wrong_host,
    ):
        yield {"plain": plain, "tls1": tls1, "tls2": tls2, "wrong_host": wrong_host}


def transports(http2: bool, uds: str | None) -> dict[str, Callable[[], httpx.AsyncBaseTransport]]:
    def verify() -> Any:
        return default_server_tls().client_ssl_context()

    return {
        "default": lambda: httpx.AsyncHTTPTransport(verify=verify(), http2=http2, uds=uds),
        "bulkhead": lambda: BulkheadTransport(verify=verify(), http2=http2, uds=uds),
    }


Seen = dict[str, list[list[tuple[str, tuple[str, ...]]]]]


async def run_both(
    url: str,
    calls: list[Call],
    *,
    http2: bool = False,
    uds: str | None = None,
    late: list[list[str]] | None = None,
) -> Seen:
    """Each call, in order, on one client per transport; the events of each call (and in
    ``late``, BulkheadTransport's events reporting a ``GeneratorExit``, per call)."""
    seen: Seen = {}
    for name, make in transports(http2, uds).items():
        seen[name] = []
        async with httpx.AsyncClient(transport=make(), timeout=httpx.Timeout(5, read=0.5)) as c:
            for call in calls:
                recorder = Recorder()
                try:
                    await call(c, {"trace": recorder, "url": url})
                except httpx.TransportError:
                    recorder.events.append(("<raised>", ()))
                seen[name].append(recorder.events)
                if name == "bulkhead" and late is not None:
                    late.append(recorder.late)
    return seen


def assert_same(seen: Seen) -> None:
    default = [
        [e for e in events if not e[0].startswith(EXPECTED_DIFFERENCE)]
        for events in seen["default"]
    ]
    assert seen["bulkhead"] == default


async def get(client: httpx.AsyncClient, ctx: dict[str, Any]) -> None:
    await client.get(ctx["url"], extensions={"trace": ctx["trace"]})


async def post(client: httpx.AsyncClient, ctx: dict[str, Any]) -> None:
    await client.post(ctx["url"] + "echo", content=b"x" * 100, extensions={"trace": ctx["trace"]})


async def stream_read(client: httpx.AsyncClient, ctx: dict[str, Any]) -> None:
    async with client.stream(
        "GET", ctx["url"] + "bytes/200000", extensions={"trace": ctx["trace"]}
    ) as response:
        await response.aread()


async def stream_closed_unread(client: httpx.AsyncClient, ctx: dict[str, Any]) -> None:
    async with client.stream(
        "GET", ctx["url"] + "bytes/1000000", extensions={"trace": ctx["trace"]}
    ):
        pass


async def stream_closed_mid_body(client: httpx.AsyncClient, ctx: dict[str, Any]) -> None:
    """Under trio, abandoning httpx's own body iterators warns (ResourceWarning) with any
    transport: asyncio only."""
    async with client.stream(
        "GET", ctx["url"] + "bytes/1000000", extensions={"trace": ctx["trace"]}
    ) as response:
        async for _ in response.aiter_raw():
            break


@pytest.mark.parametrize("server", ["plain", "tls1", "tls2"])
async def test_requests_and_streams_trace_alike(
    servers: dict[str, HypercornServer], server: str, anyio_backend: str
) -> None:
    """Two GETs (a new connection, then a reused one), a POST, a streamed body read to
    the end, streamed responses closed unread and in the middle of the body: HTTP/1.1 on
    TCP and TLS, HTTP/2 by ALPN."""
    url = servers[server].url + "/"
    calls: list[Call] = [get, get, post, stream_read, stream_closed_unread]
    if anyio_backend == "asyncio":
        calls.append(stream_closed_mid_body)
    late: list[list[str]] = []
    seen = await run_both(url, calls, http2=server == "tls2", late=late)
    prefix = "http2." if server == "tls2" else "http11."
    assert any(name.startswith(prefix) for name, _ in seen["bulkhead"][0])
    assert_same(seen)
    # A body closed in the middle ends "failed" (GeneratorExit) after response_closed, as
    # httpcore's body generator reports it when it is finalized; nothing else does.
    expected_late: list[list[str]] = [[], [], [], [], []]
    if anyio_backend == "asyncio":
        expected_late.append([f"{prefix}receive_response_body.failed"])
        assert seen["bulkhead"][-1][-1][0] == f"{prefix}response_closed.complete"
    assert late == expected_late


async def test_failed_tls_handshake_is_start_tls_failed(
    servers: dict[str, HypercornServer],
) -> None:
    seen = await run_both(servers["wrong_host"].url + "/", [get])
    assert [name for name, _ in seen["bulkhead"][0]][-2:] == [
        "connection.start_tls.failed",
        "<raised>",
    ]
    assert_same(seen)


async def test_refused_connection_is_connect_tcp_failed() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    seen = await run_both(f"http://127.0.0.1:{port}/", [get])
    assert seen["bulkhead"][0][-2][0] == "connection.connect_tcp.failed"
    assert_same(seen)


async def test_read_timeout_and_body_failure_trace_alike() -> None:
    """The operation a failure cuts ends ``failed``; then ``response_closed``."""
    with RawServer(never_answer()) as silent:
        seen = await run_both(silent.url + "/", [get])
    assert "http11.receive_response_headers.failed" in [n for n, _ in seen["bulkhead"][0]]
    assert_same(seen)
    with RawServer(reset_mid_body()) as resetting:
        seen = await run_both(resetting.url + "/", [get])
    assert "http11.receive_response_body.failed" in [n for n, _ in seen["bulkhead"][0]]
    assert_same(seen)


async def test_unix_socket_connect_traces_alike(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    with RawServer(keepalive_ok(b"ok"), uds=path) as srv:
        seen = await run_both(srv.url + "/", [get, get], uds=path)
    assert seen["bulkhead"][0][0][0] == "connection.connect_unix_socket.started"
    assert_same(seen)


async def test_a_failing_trace_callback_leaves_the_compartment_clean(
    servers: dict[str, HypercornServer],
) -> None:
    """A callback that raises while the response is being closed: the error reaches the
    caller, as with httpcore, and the slot and connection are settled all the same."""

    async def trace(name: str, info: dict[str, Any]) -> None:
        if name == "http11.response_closed.started":
            raise RuntimeError("trace callback failed")

    transport = BulkheadTransport()
    url = servers["plain"].url + "/"
    async with httpx.AsyncClient(transport=transport, timeout=5) as client:
        with pytest.raises(RuntimeError, match="trace callback failed"):
            await client.get(url, extensions={"trace": trace})
        (stats,) = transport.statistics().values()
        assert (stats.running, stats.in_use_connections, stats.acquired) == (0, 0, 1), stats
        assert (await client.get(url)).text == "hello"
