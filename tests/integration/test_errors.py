"""Malformed responses and network failures: the httpx exception the default transport
raises, never a raw ``OSError``/h11/anyio one, and a compartment left clean (no slot held,
the broken connection discarded and counted)."""

from __future__ import annotations

import socket
from collections.abc import Callable

import anyio
import httpx
import pytest

from httpx_bulkhead import BulkheadTransport, CompartmentStats
from tests.flavours import Flavour, client_for, make_transport
from tests.servers import (
    RawConn,
    RawServer,
    chunked_garbage,
    garbage_status_line,
    huge_headers,
    never_answer,
    no_length_keep_alive,
    reset_after_headers,
    reset_mid_body,
    truncated_body,
)
from tests.servers.raw import Handler

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("http1_parser")]

TIMEOUT = 10.0
#: ``_http11.MAX_HEAD_SIZE``: the largest response head accepted (64 KiB).
MAX_HEAD = 64 * 1024


def closed_port() -> int:
    """A port on 127.0.0.1 nobody listens on (bound, then closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def assert_clean(stats: CompartmentStats, **counters: int) -> None:
    """No slot held, no connection left (the broken one was discarded), and the given
    counters (e.g. ``error=1``) have exactly these values."""
    assert (stats.running, stats.waiting) == (0, 0), stats
    assert (stats.connections, stats.in_use_connections, stats.idle_connections) == (0, 0, 0), stats
    for name, value in counters.items():
        assert getattr(stats, name) == value, (name, stats)


def assert_mapped(exc: BaseException, expected: type[httpx.TransportError]) -> None:
    """Exactly ``expected`` (not a subclass, not a raw low-level error), request attached."""
    assert type(exc) is expected, repr(exc)
    assert isinstance(exc, httpx.TransportError)
    assert isinstance(exc.request, httpx.Request)


def close_without_response(conn: RawConn) -> None:
    """Read the request, then close without a byte of response."""
    if conn.read_request() is not None:
        conn.close()


def staged_head(size: int, first: int) -> Handler:
    """A 200 whose head (``x-huge`` of ``size`` bytes) is sent in two parts: ``first``
    bytes, event ``"part1"``; then, once the test sets ``"rest"``, the remainder."""

    def handler(conn: RawConn) -> None:
        if conn.read_request() is None:
            return
        head = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nx-huge: %s\r\n\r\nok" % (b"a" * size)
        conn.send(head[:first])
        conn.server.set_event("part1")
        if conn.wait("rest"):
            conn.send(head[first:])
            while conn.read_request() is not None:
                conn.send_response(200, b"ok")

    return handler


# ------------------------------------------------------------------------- connect


async def test_connection_refused_is_connect_error(flavour: Flavour) -> None:
    port = closed_port()
    transport = make_transport(flavour)
    async with client_for(transport, timeout=TIMEOUT) as client:
        with pytest.raises(httpx.TransportError) as caught:
            await client.get(f"http://127.0.0.1:{port}/")
        assert_mapped(caught.value, httpx.ConnectError)
        assert isinstance(caught.value.__cause__, OSError)
        stats = transport.statistics()[f"http://127.0.0.1:{port}"]
        assert_clean(stats, failed=1, connections_created=0, error=0)


# -------------------------------------------------------------- malformed responses


@pytest.mark.parametrize(
    ("handler", "expected"),
    [
        (garbage_status_line(), httpx.RemoteProtocolError),
        (chunked_garbage(), httpx.RemoteProtocolError),
        (truncated_body(), httpx.RemoteProtocolError),
        (close_without_response, httpx.RemoteProtocolError),
        (huge_headers(200_000), httpx.RemoteProtocolError),
        # A TCP RST is a read error (ECONNRESET), as with the default transport, whether
        # it cuts the head or the body.
        (reset_after_headers(), httpx.ReadError),
        (reset_mid_body(), httpx.ReadError),
    ],
    ids=[
        "garbage_status_line",
        "chunked_garbage",
        "truncated_body",
        "close_without_response",
        "huge_headers",
        "reset_after_headers",
        "reset_mid_body",
    ],
)
async def test_fault_maps_to_httpx_error_and_discards_the_connection(
    handler: Handler,
    expected: type[httpx.TransportError],
    flavour: Flavour,
) -> None:
    with RawServer(handler) as srv:
        transport = make_transport(flavour)
        async with client_for(transport, timeout=TIMEOUT) as client:
            with pytest.raises(httpx.TransportError) as caught:
                await client.get(srv.url)
            assert_mapped(caught.value, expected)
            assert_clean(
                transport.statistics()[srv.url],
                error=1,
                failed=1,
                completed=0,
                unknown_state=0,
                peer_closed=0,
            )
        assert srv.connections == 1


async def test_default_transport_agrees_on_the_fault_types() -> None:
    """The expectations above are the default transport's behaviour."""
    cases: list[tuple[Handler, type[httpx.TransportError]]] = [
        (garbage_status_line(), httpx.RemoteProtocolError),
        (truncated_body(), httpx.RemoteProtocolError),
        (close_without_response, httpx.RemoteProtocolError),
        (reset_mid_body(), httpx.ReadError),
    ]
    for handler, expected in cases:
        with RawServer(handler) as srv:
            async with httpx.AsyncClient(timeout=TIMEOUT) as client:
                with pytest.raises(httpx.TransportError) as caught:
                    await client.get(srv.url)
            assert type(caught.value) is expected


@pytest.mark.parametrize("handler", [reset_after_headers, reset_mid_body])
async def test_reset_while_streaming_the_body_is_read_error(
    handler: Callable[..., Handler],
) -> None:
    """Deterministic variant: the head is in hand before the server resets."""
    with RawServer(handler(before_reset="rst")) as srv:
        transport = BulkheadTransport()
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
            async with client.stream("GET", srv.url) as response:
                assert (response.status_code, response.headers["content-length"]) == (200, "100")
                assert transport.statistics()[srv.url].running == 1
                srv.set_event("rst")
                with pytest.raises(httpx.TransportError) as caught:
                    await response.aread()
            assert_mapped(caught.value, httpx.ReadError)
            assert_clean(transport.statistics()[srv.url], error=1, failed=1, unknown_state=0)


async def test_head_under_the_limit_is_accepted() -> None:
    with RawServer(huge_headers(MAX_HEAD - 4096)) as srv:
        transport = BulkheadTransport()
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
            response = await client.get(srv.url)
            assert response.content == b"ok"
            assert len(response.headers["x-huge"]) == MAX_HEAD - 4096
            again = await client.get(srv.url)
            assert again.extensions["bulkhead"].reused is True


def exact_head(total: int) -> Handler:
    """A 200 whose head (status line to blank line included) is exactly ``total`` bytes."""
    prefix = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nx-huge: "
    head = prefix + b"a" * (total - len(prefix) - 4) + b"\r\n\r\n"
    assert len(head) == total

    def handler(conn: RawConn) -> None:
        if conn.read_request() is not None:
            conn.send(head + b"ok")

    return handler


@pytest.mark.parametrize("total", [MAX_HEAD - 64, MAX_HEAD + 64])
async def test_head_size_limit_near_the_boundary(total: int) -> None:
    with RawServer(exact_head(total)) as srv:
        transport = BulkheadTransport()
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
            if total <= MAX_HEAD:
                assert (await client.get(srv.url)).content == b"ok"
                return
            with pytest.raises(httpx.TransportError) as caught:
                await client.get(srv.url)
            assert_mapped(caught.value, httpx.RemoteProtocolError)
            assert_clean(transport.statistics()[srv.url], error=1)


async def test_head_over_the_limit_is_rejected_however_it_is_split() -> None:
    """A 66 000-byte head (over 64 KiB), sent as 60 000 bytes and then the rest: h11 alone
    checks only an *incomplete* buffer, so a head completed by the next read used to get
    through (any head up to ~128 KiB)."""
    with RawServer(staged_head(66_000, first=60_000)) as srv:
        transport = BulkheadTransport()
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
            outcome: list[BaseException | httpx.Response] = []

            async def call() -> None:
                try:
                    outcome.append(await client.get(srv.url))
                except httpx.TransportError as exc:
                    outcome.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await srv.wait_event("part1")
                srv.set_event("rest")
            assert len(outcome) == 1
            assert isinstance(outcome[0], httpx.RemoteProtocolError), outcome
            assert_clean(transport.statistics()[srv.url], error=1)


# ---------------------------------------------------------- EOF-delimited body, timeouts


async def test_body_delimited_by_eof_succeeds_and_is_not_reused() -> None:
    with RawServer(no_length_keep_alive(b"until-eof", close_on="eof")) as srv:
        transport = BulkheadTransport()
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
            async with client.stream("GET", srv.url) as response:
                assert "content-length" not in response.headers
                srv.set_event("eof")  # the server closes: that ends the body
                assert await response.aread() == b"until-eof"
            second = await client.get(srv.url)
            assert second.content == b"until-eof"
            assert second.extensions["bulkhead"].reused is False
            stats = transport.statistics()[srv.url]
            assert (stats.connections_created, stats.completed, stats.failed) == (2, 2, 0)
        assert srv.connections == 2


async def test_body_delimited_by_eof_discards_the_connection_at_once() -> None:
    """h11 reports both sides DONE after an EOF-delimited body, as if the connection could
    carry another exchange; the server has closed it, so it must not be pooled."""
    with RawServer(no_length_keep_alive(b"until-eof", close_on="eof")) as srv:
        transport = BulkheadTransport()
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
            async with client.stream("GET", srv.url) as response:
                srv.set_event("eof")
                assert await response.aread() == b"until-eof"
            assert_clean(transport.statistics()[srv.url], not_reusable=1, completed=1)


async def test_never_answer_read_timeout(flavour: Flavour) -> None:
    with RawServer(never_answer()) as srv:
        transport = make_transport(flavour)
        timeout = httpx.Timeout(TIMEOUT, read=0.2)
        async with client_for(transport, timeout=timeout) as client:
            with pytest.raises(httpx.TransportError) as caught:
                await client.get(srv.url)
            assert_mapped(caught.value, httpx.ReadTimeout)
            assert srv.requests  # the request was sent; the answer never came
            assert_clean(
                transport.statistics()[srv.url], unknown_state=1, error=0, failed=1, running=0
            )


async def test_compartment_serves_again_after_a_failure(flavour: Flavour) -> None:
    """A failed exchange leaves nothing behind: the next request to the same origin
    opens a fresh connection and succeeds."""
    served = 0

    def first_garbage_then_ok(conn: RawConn) -> None:
        nonlocal served
        served += 1
        if conn.index == 0:
            garbage_status_line()(conn)
        else:
            while conn.read_request() is not None:
                conn.send_response(200, b"recovered")

    with RawServer(first_garbage_then_ok) as srv:
        transport = make_transport(flavour)
        async with client_for(transport, timeout=TIMEOUT) as client:
            with pytest.raises(httpx.RemoteProtocolError):
                await client.get(srv.url)
            response = await client.get(srv.url)
            assert response.text == "recovered"
            assert response.extensions["bulkhead"].reused is False
            stats = transport.statistics()[srv.url]
            assert (stats.error, stats.failed, stats.completed, stats.running) == (1, 1, 1, 0)
            assert (stats.connections, stats.idle_connections) == (1, 1)
    assert served == 2


# ------------------------------------------------------------------ protocol upgrades


async def test_101_switching_protocols_is_refused_clearly() -> None:
    """BulkheadTransport does not hand connections over for upgrades (WebSocket, h2c
    Upgrade): a 101 answer is a RemoteProtocolError saying so, and the connection, in the
    other protocol now, is closed.  (httpx's default transport returns the 101 response
    with the connection in ``extensions["network_stream"]``.)"""
    switching = (
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
    )

    def upgrade(conn: RawConn) -> None:
        if conn.read_request() is not None:
            conn.send(switching)
            conn.wait("never")

    with RawServer(upgrade) as srv:
        transport = BulkheadTransport()
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
            headers = {"Upgrade": "websocket", "Connection": "Upgrade"}
            with pytest.raises(httpx.TransportError) as caught:
                await client.get(srv.url, headers=headers)
            assert_mapped(caught.value, httpx.RemoteProtocolError)
            assert "not supported" in str(caught.value)
            assert_clean(transport.statistics()[srv.url], failed=1, error=1)
