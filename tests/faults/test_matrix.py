"""The fault matrix: one row per misbehaving server, with the exact outcome promised.

Each row names a server fault, the request made against it and what must come out: the
httpx exception (exact type, optionally its message) or the response after a safe retry,
within ``deadline`` seconds (the call runs under ``anyio.fail_after``, so a hang fails the
row), and the compartment afterwards: no slot held or queued (``running == waiting == 0``),
no connection in use, the broken connection discarded (``connections``, usually 0) and
counted under the right reason (``error``, ``unknown_state``, ``peer_closed``,
``not_reusable``, ``ping_timeouts``, ...), with ``acquired == completed + failed +
cancelled``.  Rows that measure memory run the call under ``tracemalloc``.
Every row runs under asyncio and trio, and no row may leave a descriptor open: the
process's open descriptors (``/proc/self/fd``, sockets among them) are compared from
before the row's server starts to after it has stopped (``tests/resources.py``).
TLS rows use ``RawServer(tls=...)``, which scripts the records on the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import pytest

from httpx_bulkhead import CompartmentStats, Policy, RequestTimeout
from tests.conftest import until
from tests.faults.handlers import (
    MB,
    FloodReport,
    accept_then_close,
    canned,
    continuation_flood,
    desync_response,
    doubtful_framing,
    h2_partial_record_while_idle,
    h2_stale_race,
    h2_trickle,
    h2_zero_window,
    hpack_bomb,
    oversized_goaway,
    stale_race,
    stall_upload,
    tls_close_in_handshake,
    tls_garbage,
    tls_serve,
    tls_silent,
)
from tests.flavours import Client, Flavour, Transport, client_for, make_transport
from tests.resources import FdSnapshot, assert_no_fd_growth, settle_io
from tests.servers import (
    RawServer,
    ServerTLS,
    chunked_garbage,
    default_server_tls,
    extra_response_in_next_record,
    extra_response_while_idle,
    garbage_status_line,
    h2script,
    huge_headers,
    late_response,
    never_answer,
    no_length_keep_alive,
    reset_after_headers,
    reset_mid_body,
    slowloris,
    truncated_body,
    untrusted_server_tls,
    wrong_host_server_tls,
)
from tests.servers.raw import Handler

pytestmark = pytest.mark.anyio

BACKENDS = ("asyncio", "trio")
#: Bound on the client's extra memory while a server floods it (bytes, tracemalloc peak).
FLOOD_MEMORY_BOUND = 4 * 1024 * 1024
#: Patience for the steps that set a row up (they are not what the row promises).
SETUP_TIMEOUT = 10.0


# --------------------------------------------------------------------------- the rows


@dataclass
class Ctx:
    """What a row's steps get: the client, its transport, the server and its base URL."""

    client: Client
    transport: Transport
    server: Any
    url: str
    backend: str
    memory_peak: int | None = None
    notes: dict[str, Any] = field(default_factory=dict)


Step = Callable[[Ctx], Awaitable[Any]]


@dataclass(frozen=True)
class Fails:
    """The call raises exactly ``error`` (not a subclass), its message matching ``match``."""

    error: type[httpx.TransportError]
    match: str = ""


@dataclass(frozen=True)
class Succeeds:
    """The call returns responses (one, or a list) with these bodies and flags."""

    bodies: tuple[bytes, ...]
    retried: bool | None = None
    reused: bool | None = None


@dataclass(frozen=True)
class GivesUp:
    """The caller's own timeout ends the call (it returns ``GAVE_UP``): counted
    ``cancelled``, nothing held."""


GAVE_UP = "gave up"


@dataclass(frozen=True)
class Row:
    id: str
    server: Callable[[], contextlib.AbstractContextManager[Any]]
    outcome: Fails | Succeeds | GivesUp
    #: Seconds the promised call may take, at most (a hang fails the row).
    deadline: float
    #: Exact values of ``CompartmentStats`` counters afterwards.
    stats: Mapping[str, int]
    #: Connections left open afterwards (idle ones; none is ever left in use).
    connections: int = 0
    policy: Policy = field(default_factory=Policy)
    http2: bool = False
    #: https with this certificate's CA trusted (``None``: plain http).
    tls: ServerTLS | None = None
    timeout: httpx.Timeout = field(default_factory=lambda: httpx.Timeout(10.0))
    prepare: Step | None = None
    call: Step | None = None
    #: Extra assertions on the context and the error raised (if any).
    check: Callable[[Ctx, BaseException | None], Awaitable[None]] | None = None
    #: The call must not end sooner than this (a timeout must not fire early).
    min_elapsed: float = 0.0
    #: Run the call under tracemalloc and bound the client's peak extra memory.
    memory_bound: int | None = None

    def __str__(self) -> str:
        return self.id


class ClosedPort:
    """A "server" on a port of 127.0.0.1 nobody listens on (bound, then closed)."""

    def __enter__(self) -> ClosedPort:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            self.port: int = sock.getsockname()[1]
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


def raw(handler: Handler) -> Callable[[], RawServer]:
    return lambda: RawServer(handler)


def raw_tls(handler: Handler, alpn: tuple[str, ...] = ("http/1.1",)) -> Callable[[], RawServer]:
    """The handler behind TLS (the session CA's certificate); rows set ``tls=TLS``."""
    return lambda: RawServer(handler, tls=default_server_tls(), alpn=alpn)


TLS = default_server_tls()


async def get(ctx: Ctx, path: str = "/", **kwargs: Any) -> httpx.Response:
    return await ctx.client.get(ctx.url + path, **kwargs)


# -- steps of particular rows


async def wait_for_fin(ctx: Ctx) -> httpx.Response:
    """GET, but between the TCP connect and the first write wait until the server's FIN
    has arrived and the client's stream has seen it."""

    async def trace(name: str, info: dict[str, Any]) -> None:
        if name == "connection.connect_tcp.complete":
            await ctx.server.wait_event("fin")
            await fin_seen(info["return_value"])

    return await get(ctx, extensions={"trace": trace})


async def fin_seen(stream: Any) -> None:
    """Until the client's stream holds the peer's end of stream (asyncio: the loop has
    delivered it to our protocol; trio: the socket polls readable)."""
    await until(lambda: bool(stream.get_extra_info("is_readable")), timeout=5)


async def first_request_noting_its_stream(ctx: Ctx) -> None:
    response = await get(ctx)
    assert response.status_code == 200
    ctx.notes["stream"] = response.extensions["network_stream"]


async def first_request(ctx: Ctx) -> None:
    assert (await get(ctx)).status_code == 200


async def post_once(ctx: Ctx) -> httpx.Response:
    return await ctx.client.post(ctx.url + "/", content=b"not idempotent")


async def post_after_fin(ctx: Ctx) -> httpx.Response:
    """HTTP/2 POST whose HEADERS made the server close: the body is written only once
    the server's FIN has arrived and the client's stream has seen it."""

    async def trace(name: str, info: dict[str, Any]) -> None:
        if name == "http2.send_request_headers.complete":
            await ctx.server.wait_event("fin")
            await fin_seen(ctx.notes["stream"])

    return await ctx.client.post(ctx.url + "/", content=b"body", extensions={"trace": trace})


async def time_out_first(ctx: Ctx) -> None:
    """Request /first times out; then the server answers it, late, on that connection."""
    with pytest.raises(httpx.ReadTimeout):
        await get(ctx, "/first", timeout=httpx.Timeout(10.0, read=0.2))
    ctx.server.set_event("release")
    await ctx.server.wait_event("release.sent")


async def get_second(ctx: Ctx) -> httpx.Response:
    return await get(ctx, "/second")


async def stream_body(ctx: Ctx) -> httpx.Response:
    """Head first, then the body: the fault hits while the body is being read."""
    assert isinstance(ctx.client, httpx.AsyncClient)  # (an async-only step)
    async with ctx.client.stream("GET", ctx.url + "/bad") as response:
        assert response.status_code == 200
        await response.aread()
    return response


async def goaway_two_in_flight(ctx: Ctx) -> list[httpx.Response]:
    """Two streams held on one connection; the server sends GOAWAY keeping the first:
    the second was never processed and must be replayed on a new connection."""
    results: list[httpx.Response] = []

    async def one() -> None:
        results.append(await get(ctx, "/hold/g"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(one)
        tg.start_soon(one)
        await ctx.server.until_event("goaway-sent")
        await ctx.server.until_held("g", 3)  # two on the first connection, one replayed
        ctx.server.release("g")
    return results


async def after_cap_zero(ctx: Ctx) -> None:
    assert (await get(ctx)).status_code == 200
    await ctx.server.until_event("settings-acked-0")


async def flood_done(ctx: Ctx, error: BaseException | None) -> None:
    """The flood ended: the client closed the connection early, or it absorbed at least
    10 MB with bounded memory (checked by the harness)."""
    await ctx.server.wait_event("flood-done")
    report: FloodReport = ctx.notes["report"]
    assert report.closed_early or report.sent >= 10 * MB, report


def flood_server(
    factory: Callable[[FloodReport], Handler],
) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    @contextlib.contextmanager
    def start() -> Iterator[RawServer]:
        report = FloodReport()
        with RawServer(factory(report)) as srv:
            srv.report = report  # type: ignore[attr-defined]
            yield srv

    return start


async def cert_rejected(ctx: Ctx, error: BaseException | None) -> None:
    """The ConnectError comes from certificate verification (not some other failure)."""
    seen = error
    while seen is not None and not isinstance(seen, ssl.SSLCertVerificationError):
        seen = seen.__cause__ or seen.__context__
    assert seen is not None, repr(error)
    await ctx.server.wait_event("handshake-failed")


async def give_up_after_03(ctx: Ctx) -> str:
    """The caller gives up after 0.3 s with its event loop's own means: under asyncio one
    ``task.cancel()`` (what ``asyncio.timeout`` and ``asyncio.wait_for`` deliver), under
    trio a ``move_on_after`` scope.  Returns ``GAVE_UP`` once the call has ended."""
    if ctx.backend == "asyncio":
        task = asyncio.ensure_future(get(ctx))
        await asyncio.wait({task}, timeout=0.3)
        if not task.done():
            task.cancel()  # once, as asyncio.timeout and asyncio.wait_for do
            await asyncio.wait({task}, timeout=1.0)  # a bound, not a synchronisation
        if not task.done():
            task.cancel()  # a second cancellation gets it out: leave nothing running
            await asyncio.wait({task})
            return "still running 1 s after its cancellation"
        if task.cancelled():
            return GAVE_UP
        return repr(task.exception() or task.result())
    import trio

    with trio.move_on_after(0.3):
        await get(ctx)
    return GAVE_UP


async def post_big(ctx: Ctx) -> httpx.Response:
    return await ctx.client.post(ctx.url + "/", content=b"u" * (32 * MB))


async def post_200k(ctx: Ctx) -> httpx.Response:
    return await ctx.client.post(ctx.url + "/", content=b"u" * 200_000)


async def first_then_idle(ctx: Ctx) -> None:
    """The first request succeeds; then the server, told the connection is idle, sends
    part of something nobody asked for (event ``"partial"``), and the client's event loop
    has read it."""
    assert (await get(ctx)).status_code == 200
    ctx.server.set_event("idle")
    await ctx.server.wait_event("partial")
    for _ in range(10):
        await anyio.sleep(0)  # checkpoints, not a timed wait


async def first_then_ok(ctx: Ctx) -> None:
    """The first request succeeds (its body is what the server said it was)."""
    assert (await get(ctx)).content == b"ok"


async def nothing_after_timeout(ctx: Ctx, error: BaseException | None) -> None:
    assert isinstance(error, RequestTimeout) and isinstance(error, httpx.TimeoutException)


H2C = Policy(max_connections=4)
SLOW = Policy(request_timeout=0.8)
WRITE_03 = httpx.Timeout(10.0, write=0.3)
READ_03 = httpx.Timeout(10.0, read=0.3)
CONNECT_03 = httpx.Timeout(10.0, connect=0.3)

ROWS: list[Row] = [
    # ---------------------------------------------------------------- connecting
    Row(
        "connection_refused",
        ClosedPort,
        Fails(httpx.ConnectError),
        deadline=2.0,
        stats={"failed": 1, "connections_created": 0, "error": 0},
    ),
    Row(
        "accept_then_close",
        raw(accept_then_close()),
        Fails(httpx.RemoteProtocolError, "Server disconnected without sending a response"),
        deadline=2.0,
        call=wait_for_fin,
        stats={"failed": 1, "connections_created": 1, "error": 1},
    ),
    Row(
        "never_answers_read_timeout",
        raw(never_answer()),
        Fails(httpx.ReadTimeout),
        deadline=2.0,
        timeout=READ_03,
        min_elapsed=0.3,
        stats={"failed": 1, "unknown_state": 1, "error": 0},
    ),
    # ----------------------------------------------------------- HTTP/1.1 responses
    Row(
        "reset_after_headers",
        raw(reset_after_headers()),
        Fails(httpx.ReadError),
        deadline=2.0,
        stats={"failed": 1, "error": 1, "unknown_state": 0},
    ),
    Row(
        "reset_mid_body",
        raw(reset_mid_body()),
        Fails(httpx.ReadError),
        deadline=2.0,
        stats={"failed": 1, "error": 1, "unknown_state": 0},
    ),
    Row(
        "truncated_body",
        raw(truncated_body()),
        Fails(httpx.RemoteProtocolError),
        deadline=2.0,
        stats={"failed": 1, "error": 1},
    ),
    Row(
        "chunked_garbage",
        raw(chunked_garbage()),
        Fails(httpx.RemoteProtocolError),
        deadline=2.0,
        stats={"failed": 1, "error": 1},
    ),
    Row(
        "invalid_status_line",
        raw(garbage_status_line()),
        Fails(httpx.RemoteProtocolError),
        deadline=2.0,
        stats={"failed": 1, "error": 1},
    ),
    Row(
        "header_block_over_64k",
        raw(huge_headers(70_000)),
        Fails(httpx.RemoteProtocolError),
        deadline=2.0,
        stats={"failed": 1, "error": 1},
    ),
    Row(
        "conflicting_content_lengths",
        raw(canned(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 5\r\n\r\nokxyz")),
        Fails(httpx.RemoteProtocolError),
        deadline=2.0,
        stats={"failed": 1, "error": 1},
    ),
    Row(
        "extra_response_after_body",
        raw(desync_response()),
        Succeeds((b"fresh",), reused=False),
        deadline=2.0,
        prepare=first_then_ok,
        stats={"completed": 2, "not_reusable": 1, "connections_created": 2},
        connections=1,
    ),
    # Framing in doubt (RFC 9112 §6.3, §6.1): read by Transfer-Encoding, then closed.
    Row(
        "content_length_and_chunked",
        raw(doubtful_framing()),
        Succeeds((b"fresh",), reused=False),
        deadline=2.0,
        prepare=first_then_ok,
        stats={"completed": 2, "not_reusable": 1, "connections_created": 2},
        connections=1,
    ),
    Row(
        "response_split_by_content_length",
        raw(doubtful_framing(smuggled=b"smuggled")),
        Succeeds((b"fresh",), reused=False),
        deadline=2.0,
        prepare=first_then_ok,
        stats={"completed": 2, "not_reusable": 1, "connections_created": 2},
        connections=1,
    ),
    Row(
        "response_split_in_one_write",
        raw(doubtful_framing(smuggled=b"smuggled", together=True)),
        Succeeds((b"fresh",), reused=False),
        deadline=2.0,
        prepare=first_then_ok,
        stats={"completed": 2, "not_reusable": 1, "connections_created": 2},
        connections=1,
    ),
    Row(
        "http10_chunked_keep_alive",
        raw(
            doubtful_framing(
                b"1.0",
                content_length=False,
                fields=(b"Connection: keep-alive",),
                smuggled=b"smuggled",
            )
        ),
        Succeeds((b"fresh",), reused=False),
        deadline=2.0,
        prepare=first_then_ok,
        stats={"completed": 2, "not_reusable": 1, "connections_created": 2},
        connections=1,
    ),
    Row(
        "content_length_and_gzip",
        raw(
            canned(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: gzip\r\n\r\nhello")
        ),
        Fails(httpx.RemoteProtocolError, "Only Transfer-Encoding: chunked is supported"),
        deadline=2.0,
        stats={"failed": 1, "error": 1},
    ),
    Row(
        "server_never_reads_upload",
        raw(stall_upload()),
        Fails(httpx.WriteTimeout),
        deadline=2.0,
        timeout=WRITE_03,
        call=post_big,
        min_elapsed=0.3,
        stats={"failed": 1, "unknown_state": 1},
    ),
    Row(
        "no_length_then_close",
        raw(no_length_keep_alive(b"until-eof", close_after=0.1)),
        Succeeds((b"until-eof",), reused=False),
        deadline=2.0,
        stats={"completed": 1, "failed": 0, "not_reusable": 1},
    ),
    Row(
        "no_length_never_closes",
        raw(no_length_keep_alive(b"until-eof", close_on="never")),
        Fails(httpx.ReadTimeout),
        deadline=2.0,
        timeout=READ_03,
        min_elapsed=0.3,
        stats={"failed": 1, "unknown_state": 1},
    ),
    # ------------------------------------------------------------- keep-alive reuse
    Row(
        "stale_keepalive_get_retried",
        raw(stale_race()),
        Succeeds((b"fresh",), retried=True, reused=False),
        deadline=2.0,
        prepare=first_request,
        stats={"completed": 2, "failed": 0, "stale_retries": 1, "peer_closed": 1},
        connections=1,
    ),
    Row(
        "stale_keepalive_post_fails",
        raw(stale_race()),
        Fails(httpx.RemoteProtocolError, "disconnected"),
        deadline=2.0,
        prepare=first_request,
        call=post_once,
        stats={"completed": 1, "failed": 1, "stale_retries": 0, "peer_closed": 1},
    ),
    Row(
        "late_response_after_timeout",
        raw(late_response("release")),
        Succeeds((b"response-for:/second",), reused=False, retried=False),
        deadline=2.0,
        prepare=time_out_first,
        call=get_second,
        stats={"completed": 1, "failed": 1, "unknown_state": 1, "connections_created": 2},
        connections=1,
    ),
    # --------------------------------------------------------------------- slowloris
    Row(
        "slowloris_head_request_timeout",
        raw(slowloris(0.1)),
        Fails(RequestTimeout),
        deadline=2.5,
        policy=SLOW,
        min_elapsed=0.8,
        check=nothing_after_timeout,
        stats={"failed": 1, "unknown_state": 1},
    ),
    Row(
        "slowloris_body_request_timeout",
        raw(slowloris(0.1, trickle_head=False)),
        Fails(RequestTimeout),
        deadline=2.5,
        policy=SLOW,
        min_elapsed=0.8,
        check=nothing_after_timeout,
        stats={"failed": 1, "unknown_state": 1},
    ),
    # --------------------------------------------------------------------------- TLS
    Row(
        "tls_plain_http_answer",
        raw(tls_garbage()),
        Fails(httpx.ConnectError),
        deadline=2.0,
        tls=default_server_tls(),
        stats={"failed": 1, "connections_created": 0, "error": 0},
    ),
    Row(
        "tls_closed_in_handshake",
        raw(tls_close_in_handshake()),
        Fails(httpx.ConnectError),
        deadline=2.0,
        tls=default_server_tls(),
        stats={"failed": 1, "connections_created": 0},
    ),
    Row(
        "tls_silent_handshake",
        raw(tls_silent()),
        Fails(httpx.ConnectTimeout),
        deadline=2.0,
        tls=default_server_tls(),
        timeout=CONNECT_03,
        min_elapsed=0.3,
        stats={"failed": 1, "connections_created": 0},
    ),
    Row(
        "tls_silent_handshake_caller_gives_up",
        raw(tls_silent()),
        GivesUp(),
        deadline=2.0,
        tls=default_server_tls(),
        call=give_up_after_03,
        min_elapsed=0.3,
        stats={"cancelled": 1, "failed": 0, "connections_created": 0},
    ),
    Row(
        "tls_wrong_host_certificate",
        raw(tls_serve(wrong_host_server_tls())),
        Fails(httpx.ConnectError),
        deadline=2.0,
        tls=default_server_tls(),
        check=cert_rejected,
        stats={"failed": 1, "connections_created": 0},
    ),
    Row(
        "tls_extra_response_in_next_record",
        raw_tls(extra_response_in_next_record()),
        Succeeds((b"fresh",), reused=False),
        deadline=2.0,
        tls=TLS,
        prepare=first_then_ok,
        stats={"completed": 2, "not_reusable": 1, "connections_created": 2},
        connections=1,
    ),
    Row(
        "tls_partial_record_while_idle",
        raw_tls(extra_response_while_idle()),
        Succeeds((b"fresh",), reused=False),
        deadline=2.0,
        tls=TLS,
        prepare=first_then_idle,
        stats={"completed": 2, "peer_closed": 1, "connections_created": 2},
        connections=1,
    ),
    Row(
        "tls_late_response_after_timeout",
        raw_tls(late_response("release")),
        Succeeds((b"response-for:/second",), reused=False, retried=False),
        deadline=2.0,
        tls=TLS,
        prepare=time_out_first,
        call=get_second,
        stats={"completed": 1, "failed": 1, "unknown_state": 1, "connections_created": 2},
        connections=1,
    ),
    Row(
        "tls_stale_keepalive_get_retried",
        raw_tls(stale_race()),
        Succeeds((b"fresh",), retried=True, reused=False),
        deadline=2.0,
        tls=TLS,
        prepare=first_request,
        stats={"completed": 2, "failed": 0, "stale_retries": 1, "peer_closed": 1},
        connections=1,
    ),
    Row(
        "tls_stale_keepalive_post_fails",
        raw_tls(stale_race()),
        Fails(httpx.RemoteProtocolError, "disconnected"),
        deadline=2.0,
        tls=TLS,
        prepare=first_request,
        call=post_once,
        stats={"completed": 1, "failed": 1, "stale_retries": 0, "peer_closed": 1},
    ),
    Row(
        "tls_reset_mid_body",
        raw_tls(reset_mid_body()),
        Fails(httpx.ReadError),
        deadline=2.0,
        tls=TLS,
        stats={"failed": 1, "error": 1, "unknown_state": 0},
    ),
    Row(
        "tls_truncated_body",
        raw_tls(truncated_body()),
        Fails(httpx.RemoteProtocolError),
        deadline=2.0,
        tls=TLS,
        stats={"failed": 1, "error": 1},
    ),
    Row(
        "tls_slowloris_body_request_timeout",
        raw_tls(slowloris(0.1, trickle_head=False)),
        Fails(RequestTimeout),
        deadline=2.5,
        tls=TLS,
        policy=SLOW,
        min_elapsed=0.8,
        check=nothing_after_timeout,
        stats={"failed": 1, "unknown_state": 1},
    ),
    Row(
        "h2_tls_partial_record_while_idle",
        raw_tls(h2_partial_record_while_idle(), alpn=("h2",)),
        Succeeds((b"fresh",), reused=False),
        deadline=1.0,  # the idle check must not wait for the rest of the record
        http2=True,
        tls=TLS,
        policy=Policy(acquire_timeout=1.0),
        timeout=httpx.Timeout(2.0),
        prepare=first_then_idle,
        stats={"completed": 2, "peer_closed": 1, "connections_created": 2},
        connections=1,
    ),
    Row(
        "tls_untrusted_certificate",
        raw(tls_serve(untrusted_server_tls())),
        Fails(httpx.ConnectError),
        deadline=2.0,
        tls=default_server_tls(),
        check=cert_rejected,
        stats={"failed": 1, "connections_created": 0},
    ),
    # ------------------------------------------------------------------- HTTP/2 (h2c)
    Row(
        "h2_goaway_mid_flight_replays",
        lambda: h2script.goaway_after(2, hold="g"),
        Succeeds((b"stream:1", b"stream:1"), retried=None),
        deadline=3.0,
        http2=True,
        policy=H2C,
        call=goaway_two_in_flight,
        stats={
            "completed": 2,
            "failed": 0,
            "goaways": 1,
            "replays": 1,
            "connections_created": 2,
            "not_reusable": 1,
        },
        connections=1,
    ),
    Row(
        "h2_goaway_every_connection_gives_up",
        lambda: h2script.goaway_after(1, keep=0, hold="never"),
        Fails(httpx.RemoteProtocolError, "refused"),
        deadline=3.0,
        http2=True,
        policy=H2C,
        stats={
            "failed": 1,
            "goaways": 4,
            "replays": 3,
            "connections_created": 4,
            "not_reusable": 4,
        },
    ),
    Row(
        "h2_rst_stream_before_response",
        lambda: h2script.reset_stream("/"),
        Fails(httpx.RemoteProtocolError, "reset"),
        deadline=2.0,
        http2=True,
        stats={"failed": 1, "error": 0, "streams_reset": 0, "connections_created": 1},
        connections=1,
    ),
    Row(
        "h2_rst_stream_mid_response",
        lambda: h2script.reset_stream("/bad", after_headers=True),
        Fails(httpx.RemoteProtocolError, "reset"),
        deadline=2.0,
        http2=True,
        call=stream_body,
        stats={"failed": 1, "error": 0, "streams_reset": 0, "connections_created": 1},
        connections=1,
    ),
    Row(
        "h2_stale_connection_get_retried",
        raw(h2_stale_race()),
        Succeeds((b"fresh",), retried=True, reused=False),
        deadline=2.0,
        http2=True,
        prepare=first_request,
        stats={"completed": 2, "stale_retries": 1, "peer_closed": 1, "connections_created": 2},
        connections=1,
    ),
    Row(
        "h2_stale_connection_post_fails",
        raw(h2_stale_race()),
        Fails(httpx.RemoteProtocolError, "disconnected"),
        deadline=2.0,
        http2=True,
        prepare=first_request_noting_its_stream,
        call=post_after_fin,
        stats={"completed": 1, "failed": 1, "stale_retries": 0, "peer_closed": 1},
    ),
    Row(
        "h2_zero_window_upload",
        raw(h2_zero_window()),
        Fails(httpx.WriteTimeout),
        deadline=2.0,
        http2=True,
        timeout=WRITE_03,
        call=post_200k,
        min_elapsed=0.3,
        stats={"failed": 1, "streams_reset": 1, "unknown_state": 0, "error": 0},
        connections=1,
    ),
    Row(
        "h2_refused_stream_replayed",
        lambda: h2script.refuse_stream("/", times=1),
        # The replay prefers another connection (the refusing one stays, idle).
        Succeeds((b"stream:1",), retried=True, reused=False),
        deadline=2.0,
        http2=True,
        stats={"completed": 1, "replays": 1, "connections_created": 2},
        connections=2,
    ),
    Row(
        "h2_settings_cap_zero",
        h2script.settings_zero,
        Succeeds((b"stream:1",), reused=False),
        deadline=2.0,
        http2=True,
        policy=Policy(max_connections=1),
        prepare=after_cap_zero,
        stats={"completed": 2, "connections_created": 2, "surplus": 1},
        connections=1,
    ),
    Row(
        "h2_ping_never_answered",
        h2script.never_ping,
        Succeeds((b"stream:1",), reused=False),
        deadline=1.5,
        http2=True,
        policy=Policy(ping_after=0, ping_timeout=0.2),
        prepare=first_request,
        min_elapsed=0.2,
        stats={"completed": 2, "ping_timeouts": 1, "connections_created": 2},
        connections=1,
    ),
    Row(
        "h2_slowloris_data_request_timeout",
        raw(h2_trickle(0.1)),
        Fails(RequestTimeout),
        deadline=2.5,
        http2=True,
        policy=SLOW,
        min_elapsed=0.8,
        stats={"failed": 1, "streams_reset": 1, "unknown_state": 0, "error": 0},
        connections=1,
    ),
    Row(
        "h2_continuation_flood",
        flood_server(continuation_flood),
        Fails(httpx.RemoteProtocolError, "(?i)continuation"),
        deadline=5.0,
        http2=True,
        memory_bound=FLOOD_MEMORY_BOUND,
        check=flood_done,
        stats={"failed": 1, "error": 1},
    ),
    Row(
        "h2_hpack_bomb",
        raw(hpack_bomb()),
        Fails(httpx.RemoteProtocolError),
        deadline=3.0,
        http2=True,
        memory_bound=FLOOD_MEMORY_BOUND,
        stats={"failed": 1, "error": 1},
    ),
    Row(
        "h2_oversized_goaway",
        flood_server(oversized_goaway),
        Fails(httpx.RemoteProtocolError),
        deadline=5.0,
        http2=True,
        memory_bound=FLOOD_MEMORY_BOUND,
        check=flood_done,
        stats={"failed": 1, "error": 1},
    ),
]


#: Steps only an event loop can take (an async trace callback, ``client.stream`` of the
#: async client, a task cancelled): their rows run against the async transport only.
ASYNC_ONLY_STEPS = frozenset({wait_for_fin, post_after_fin, stream_body, give_up_after_03})


def _cases() -> Iterator[Any]:
    for row in ROWS:
        for backend in BACKENDS:
            yield pytest.param(row, backend, "async", id=f"{row.id}-{backend}")
        if not {row.prepare, row.call, row.check} & ASYNC_ONLY_STEPS:
            # BulkheadHTTPTransport, called from worker threads (tests/flavours.py)
            yield pytest.param(row, "asyncio", "sync", id=f"{row.id}-sync")


# ------------------------------------------------------------------------ the harness


def compartment_stats(transport: Transport) -> CompartmentStats:
    (stats,) = transport.statistics().values()
    return stats


@contextlib.contextmanager
def traced_memory(ctx: Ctx) -> Iterator[None]:
    """Record in ``ctx.memory_peak`` the peak of traced memory above where it started."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        start = tracemalloc.get_traced_memory()[0]
        yield
        ctx.memory_peak = tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()


def check_outcome(row: Row, result: Any, error: BaseException | None) -> None:
    expected = row.outcome
    if isinstance(expected, GivesUp):
        assert error is None and result == GAVE_UP, (result, error)
        return
    if isinstance(expected, Fails):
        assert error is not None, f"{row.id}: expected {expected.error.__name__}, got {result!r}"
        assert type(error) is expected.error, repr(error)
        assert isinstance(error.request, httpx.Request)
        if expected.match:
            with pytest.raises(type(error), match=expected.match):
                raise error
        return
    assert error is None, f"{row.id}: expected success, got {error!r}"
    responses = result if isinstance(result, list) else [result]
    assert sorted(r.content for r in responses) == sorted(expected.bodies)
    for response in responses:
        assert response.status_code == 200
        info = response.extensions["bulkhead"]
        if expected.retried is not None:
            assert info.retried is expected.retried, info
        if expected.reused is not None:
            assert info.reused is expected.reused, info


def check_clean(row: Row, stats: CompartmentStats) -> None:
    assert (stats.running, stats.waiting) == (0, 0), stats
    assert stats.in_use_connections == 0, stats
    assert stats.connections == row.connections, stats
    assert stats.idle_connections == row.connections, stats
    assert stats.acquired == stats.completed + stats.failed + stats.cancelled, stats
    for name, value in row.stats.items():
        assert getattr(stats, name) == value, (name, getattr(stats, name), value, stats)


@pytest.mark.explicit_parser  # h11, the reference (httptools: the test below)
@pytest.mark.parametrize(("row", "anyio_backend", "flavour"), list(_cases()))
async def test_fault(row: Row, anyio_backend: str, flavour: Flavour) -> None:
    before = FdSnapshot.take()
    await run_row(row, anyio_backend, flavour)
    await settle_io()
    assert_no_fd_growth(before, row.id)


@pytest.mark.explicit_parser
@pytest.mark.parametrize("row", [pytest.param(row, id=row.id) for row in ROWS if not row.http2])
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_fault_with_httptools(row: Row, anyio_backend: str) -> None:
    """Every HTTP/1.1 row with the optional codec: the same verdict, error, deadline and
    counters (discard reasons included) as with h11, the reference."""
    pytest.importorskip("httptools")
    before = FdSnapshot.take()
    await run_row(row, anyio_backend, parser="httptools")
    await settle_io()
    assert_no_fd_growth(before, row.id)


async def run_row(
    row: Row, anyio_backend: str, flavour: Flavour = "async", parser: str = "h11"
) -> None:
    with row.server() as srv:
        scheme = "https" if row.tls is not None else "http"
        url = f"{scheme}://127.0.0.1:{srv.port}"
        verify: ssl.SSLContext | bool = True if row.tls is None else row.tls.client_ssl_context()
        transport = make_transport(
            flavour,
            default=row.policy,
            http1=not row.http2,
            http2=row.http2,
            verify=verify,
            http1_parser=parser,
        )
        async with client_for(transport, timeout=row.timeout) as client:
            ctx = Ctx(client, transport, srv, url, anyio_backend)
            ctx.notes["report"] = getattr(srv, "report", None)
            if row.prepare is not None:
                with anyio.fail_after(SETUP_TIMEOUT):
                    await row.prepare(ctx)
            call = row.call or get
            result: Any = None
            error: BaseException | None = None
            memory = traced_memory(ctx) if row.memory_bound else contextlib.nullcontext()
            started = time.monotonic()
            with memory, anyio.fail_after(row.deadline) as deadline:
                try:
                    result = await call(ctx)
                except httpx.TransportError as exc:
                    error = exc
            elapsed = time.monotonic() - started
            # The deadline's cancellation must not have been needed (nor swallowed).
            assert not deadline.cancel_called, f"{row.id}: still running after {elapsed:.3f}s"
            check_outcome(row, result, error)
            assert elapsed >= row.min_elapsed * 0.95, f"ended after {elapsed:.3f}s"
            if row.memory_bound is not None:
                assert ctx.memory_peak is not None
                assert ctx.memory_peak < row.memory_bound, f"peak {ctx.memory_peak} bytes"
            if row.check is not None:
                with anyio.fail_after(SETUP_TIMEOUT):
                    await row.check(ctx, error)
            check_clean(row, compartment_stats(transport))


def test_every_row_has_a_unique_id() -> None:
    ids = [row.id for row in ROWS]
    assert len(ids) == len(set(ids))
