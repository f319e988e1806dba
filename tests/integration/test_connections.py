"""Connection lifecycle against real servers: unknown state, idle and lifetime expiry,
the server's keep-alive hint, stale keep-alive retry, connection waits, close."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable

import anyio
import httpx
import pytest

from httpx_bulkhead import (
    AcquireTimeout,
    BulkheadTransport,
    Policy,
    RequestTimeout,
    TransportClosed,
)
from tests.conftest import SLOW_NAME, HungResolver, lookup_deadline, until
from tests.flavours import Flavour, client_for, make_transport
from tests.servers import (
    HypercornServer,
    RawConn,
    RawServer,
    TestApp,
    keepalive_header,
    keepalive_ok,
    late_response,
)
from tests.servers.raw import close_after_response

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("http1_parser")]


class FakeClock:
    """The pool's clock, moved by the test (idle and lifetime expiry without waiting)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def origin_of(url: str) -> str:
    return url  # unlisted origins get a compartment named "http://127.0.0.1:PORT"


async def test_late_response_is_never_read_by_the_next_request(flavour: Flavour) -> None:
    with RawServer(late_response("release")) as srv:
        transport = make_transport(flavour)
        timeout = httpx.Timeout(10, read=0.2)
        async with client_for(transport, timeout=timeout) as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.get(f"{srv.url}/first")
            srv.set_event("release")  # the server now answers /first, late
            await srv.wait_event("release.sent")
            response = await client.get(f"{srv.url}/second")
            assert response.text == "response-for:/second"
            assert response.extensions["bulkhead"].reused is False
        stats = transport.statistics()[srv.url]
        assert stats.unknown_state == 1 and stats.connections_created == 2
        assert srv.connections == 2


async def test_connection_closed_by_server_while_idle_is_not_used(flavour: Flavour) -> None:
    with RawServer(close_after_response(b"ok")) as srv:
        transport = make_transport(flavour)
        async with client_for(transport) as client:
            assert (await client.get(srv.url)).text == "ok"
            await srv.wait_event("closed")
            second = await client.get(srv.url)
            assert second.text == "ok" and second.extensions["bulkhead"].reused is False
        stats = transport.statistics()[srv.url]
        assert stats.peer_closed == 1 and stats.connections_created == 2
        assert stats.failed == 0


def race_then_serve(conn: RawConn) -> None:
    """Connection 0 answers one request, then reads the next and closes without answering:
    the server closed an idle keep-alive connection just as the client reused it."""
    if conn.index == 0:
        if conn.read_request() is not None:
            conn.send_response(200, b"first")
            conn.read_request()
        conn.close()
        return
    keepalive_ok(b"fresh")(conn)


@pytest.mark.parametrize(
    ("method", "headers"),
    [("GET", {}), ("PUT", {}), ("POST", {"Idempotency-Key": "k1"})],
)
async def test_stale_connection_is_retried_when_safe(
    method: str, headers: dict[str, str], flavour: Flavour
) -> None:
    with RawServer(race_then_serve) as srv:
        transport = make_transport(flavour)
        async with client_for(transport) as client:
            assert (await client.get(srv.url)).text == "first"
            response = await client.request(method, srv.url, content=b"body", headers=headers)
            assert response.text == "fresh"
            info = response.extensions["bulkhead"]
            assert info.retried and not info.reused
        stats = transport.statistics()[srv.url]
        assert stats.stale_retries == 1 and stats.peer_closed == 1 and stats.failed == 0
        assert len(srv.requests) == 3  # first, the one lost in the race, its replay


async def test_post_whose_body_was_sent_is_not_retried(flavour: Flavour) -> None:
    with RawServer(race_then_serve) as srv:
        transport = make_transport(flavour)
        async with client_for(transport) as client:
            assert (await client.get(srv.url)).text == "first"
            with pytest.raises(httpx.RemoteProtocolError, match="disconnected"):
                await client.post(srv.url, content=b"not idempotent")
        stats = transport.statistics()[srv.url]
        assert stats.stale_retries == 0 and stats.failed == 1 and stats.running == 0
        assert len(srv.requests) == 2


async def test_idle_timeout_closes_before_the_server_would() -> None:
    clock = FakeClock()
    with RawServer(keepalive_ok(b"ok")) as srv:
        transport = BulkheadTransport(default=Policy(idle_timeout=1.0), _clock=clock)
        async with httpx.AsyncClient(transport=transport) as client:
            await client.get(srv.url)
            clock.now += 0.5
            assert (await client.get(srv.url)).extensions["bulkhead"].reused
            clock.now += 1.5
            assert not (await client.get(srv.url)).extensions["bulkhead"].reused
        stats = transport.statistics()[srv.url]
        assert stats.idle_expired == 1 and srv.connections == 2


async def test_keep_alive_timeout_hint_expires_earlier_than_our_idle_timeout() -> None:
    clock = FakeClock()
    with RawServer(keepalive_header(2)) as srv:  # "Keep-Alive: timeout=2"
        transport = BulkheadTransport(default=Policy(idle_timeout=4.0), _clock=clock)
        async with httpx.AsyncClient(transport=transport) as client:
            await client.get(srv.url)
            clock.now += 0.9  # under 2 s minus the 1 s margin: still reused
            assert (await client.get(srv.url)).extensions["bulkhead"].reused
            clock.now += 1.1  # past it, though under our own 4 s
            assert not (await client.get(srv.url)).extensions["bulkhead"].reused
        assert transport.statistics()[srv.url].idle_expired == 1


async def test_lifetime_jitter_rotates_connections_gradually(
    server: HypercornServer, app: TestApp, unique: Callable[[str], str]
) -> None:
    clock = FakeClock()
    seed = 11
    policy = Policy(max_concurrency=4, max_lifetime=100.0, lifetime_jitter=0.5, idle_timeout=None)
    transport = BulkheadTransport(default=policy, _clock=clock, _rng=random.Random(seed))
    draws = random.Random(seed)
    lifetimes = sorted(100.0 * (1 - 0.5 * draws.random()) for _ in range(4))
    gate = app.gate(unique("life"))
    url = f"{server.url}/gate/{gate.name}"
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:

        async def four_at_once(already: int) -> None:
            gate.close()
            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    tg.start_soon(client.get, url)
                await gate.until_entered(already + 4)
                gate.open()

        await four_at_once(0)
        name = server.url
        assert transport.statistics()[name].connections_created == 4
        # Half-way through the jitter range some connections are past their lifetime,
        # some are not: they are replaced gradually, not all at once.
        midpoint = (lifetimes[1] + lifetimes[2]) / 2
        clock.now += midpoint
        await four_at_once(4)
        stats = transport.statistics()[name]
        assert stats.lifetime_expired == 2 and stats.connections_created == 6
        clock.now += 100.0
        await four_at_once(8)
        assert transport.statistics()[name].lifetime_expired == 6


async def test_connection_wait_when_max_connections_is_below_concurrency(
    server: HypercornServer, app: TestApp, unique: Callable[[str], str]
) -> None:
    gate = app.gate(unique("conn"))
    policy = Policy(max_concurrency=3, max_connections=1)
    transport = BulkheadTransport(default=policy)
    name = server.url
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(client.get, f"{server.url}/gate/{gate.name}")
            await gate.until_entered(1)
            await until(lambda: transport.statistics()[name].waiting_for_connection == 2)
            assert transport.statistics()[name].running == 3
            gate.open()
    stats = transport.statistics()[name]
    assert stats.connections_created == 1 and stats.completed == 3
    assert len(app.connections(f"127.0.0.1:{server.port}")) == 1


async def test_randomized_cancellation_leaves_nothing_behind(server: HypercornServer) -> None:
    rng = random.Random(1234)
    transport = BulkheadTransport(default=Policy(max_concurrency=4, max_pending=None))
    name = server.url
    outcomes = {"ok": 0, "cancelled": 0}
    async with httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(10)) as client:

        async def call(delay_ms: int, cancel_after: float) -> None:
            with anyio.move_on_after(cancel_after) as scope:
                response = await client.get(f"{server.url}/slow/{delay_ms}")
                assert response.status_code == 200
                outcomes["ok"] += 1
            if scope.cancelled_caught:
                outcomes["cancelled"] += 1

        async with anyio.create_task_group() as tg:
            for i in range(150):
                # Cancelled at once, at a random point, or never (so both outcomes occur
                # however loaded the machine is).
                cancel_after = (0.0, rng.uniform(0, 0.05), rng.uniform(0, 0.05), 60.0)[i % 4]
                tg.start_soon(call, rng.randrange(0, 15), cancel_after)
        stats = transport.statistics()[name]
        assert (stats.running, stats.waiting, stats.in_use_connections) == (0, 0, 0)
        assert stats.acquired == stats.completed + stats.failed + stats.cancelled
        assert outcomes["ok"] + outcomes["cancelled"] == 150
        assert outcomes["cancelled"] > 0 and outcomes["ok"] > 0
        assert stats.acquired + stats.cancelled_waiting == 150
        # The compartment still works afterwards.
        assert (await client.get(f"{server.url}/")).text == "hello"


async def test_aclose_wakes_waiters_and_refuses_later_requests(
    server: HypercornServer, app: TestApp, unique: Callable[[str], str]
) -> None:
    gate = app.gate(unique("close"))
    transport = BulkheadTransport(default=Policy(max_concurrency=1))
    name = server.url
    errors: dict[str, BaseException] = {}
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:

        async def call(label: str) -> None:
            try:
                await client.get(f"{server.url}/gate/{gate.name}")
            except httpx.TransportError as exc:
                errors[label] = exc

        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "holder")
            await gate.until_entered(1)
            tg.start_soon(call, "waiter")
            await until(lambda: transport.statistics()[name].waiting == 1)
            await transport.aclose()
        assert isinstance(errors["waiter"], TransportClosed)
        assert isinstance(errors["holder"], httpx.ReadError)
        with pytest.raises(TransportClosed):
            await client.get(f"{server.url}/")
    stats = transport.statistics()[name]
    assert (stats.running, stats.waiting, stats.connections) == (0, 0, 0)
    gate.open()


async def test_unclosed_response_is_reported_and_its_slot_returned(
    server: HypercornServer,
) -> None:
    import gc

    transport = BulkheadTransport(default=Policy(max_concurrency=1))
    name = server.url
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:
        response = await client.send(client.build_request("GET", f"{server.url}/"), stream=True)
        assert transport.statistics()[name].running == 1
        with pytest.warns(ResourceWarning, match="never closed"):
            del response
            gc.collect()
        # The slot comes back on the loop, not inside the garbage collector.
        await until(lambda: transport.statistics()[name].running == 0)
        stats = transport.statistics()[name]
        assert (stats.running, stats.leaked_responses, stats.cancelled) == (0, 1, 1)
        assert (await client.get(f"{server.url}/")).text == "hello"


async def test_one_clock_drives_the_request_deadline_too(server: HypercornServer) -> None:
    """The clock injected into the transport bounds ``request_timeout`` as it bounds the
    pool's expiry: a deadline passed on that clock ends the exchange, with no real wait."""
    clock = FakeClock()
    transport = BulkheadTransport(default=Policy(request_timeout=30.0), _clock=clock)
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:
        async with client.stream("GET", f"{server.url}/stream/64") as response:
            assert response.status_code == 200
            clock.now += 31.0  # past the deadline on the transport's clock
            with pytest.raises(RequestTimeout, match="while reading the response body"):
                await response.aread()
        assert (await client.get(f"{server.url}/")).text == "hello"
    stats = transport.statistics()[server.url]
    assert stats.failed == 1 and stats.completed == 1 and stats.running == 0


async def test_streamed_body_is_never_retried_on_a_stale_connection() -> None:
    """Idempotent, but the body was a stream (consumed by the first attempt): it cannot be
    sent again, so the stale connection's failure is the answer."""

    async def body() -> AsyncIterator[bytes]:
        yield b"streamed "
        yield b"body"

    with RawServer(race_then_serve) as srv:
        transport = BulkheadTransport()
        async with httpx.AsyncClient(transport=transport) as client:
            assert (await client.get(srv.url)).text == "first"
            with pytest.raises(httpx.RemoteProtocolError, match="disconnected"):
                await client.put(srv.url, content=body())
            assert (await client.get(srv.url)).text == "fresh"  # the compartment goes on
        stats = transport.statistics()[srv.url]
        assert stats.stale_retries == 0 and stats.failed == 1 and stats.peer_closed == 1
        assert len(srv.requests) == 3  # first, the PUT lost in the race, the last GET


def connection_limited(**policy: object) -> BulkheadTransport:
    """Two slots but one connection: the second request holds a slot and waits for the
    connection (``waiting_for_connection``)."""
    return BulkheadTransport(default=Policy(max_concurrency=3, max_connections=1, **policy))  # type: ignore[arg-type]


async def test_connection_wait_times_out_with_acquire_timeout(
    server: HypercornServer, app: TestApp, unique: Callable[[str], str]
) -> None:
    gate = app.gate(unique("connwait"))
    transport = connection_limited(acquire_timeout=0.2)
    name = server.url
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.get, f"{server.url}/gate/{gate.name}")
            await gate.until_entered(1)
            with pytest.raises(AcquireTimeout, match="no connection within"):
                await client.get(f"{server.url}/")
            stats = transport.statistics()[name]
            assert (stats.running, stats.waiting_for_connection) == (1, 0)
            gate.open()
    stats = transport.statistics()[name]
    assert (stats.acquire_timeouts, stats.failed, stats.completed) == (1, 1, 1)
    assert stats.acquired == stats.completed + stats.failed + stats.cancelled
    assert stats.wait_max >= 0.2 and stats.connections_created == 1
    assert stats.wait_p99 == stats.wait_max  # two waits: p99 is the larger


async def test_aclose_wakes_connection_waiters(
    server: HypercornServer, app: TestApp, unique: Callable[[str], str]
) -> None:
    gate = app.gate(unique("closeconn"))
    transport = connection_limited()
    name = server.url
    errors: list[BaseException] = []
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:

        async def call() -> None:
            try:
                await client.get(f"{server.url}/gate/{gate.name}")
            except httpx.TransportError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await gate.until_entered(1)
            tg.start_soon(call)
            tg.start_soon(call)
            await until(lambda: transport.statistics()[name].waiting_for_connection == 2)
            await transport.aclose()
    gate.open()
    closed = [e for e in errors if isinstance(e, TransportClosed)]
    assert len(closed) == 2 and "was closed" in str(closed[0]) and len(errors) == 3
    stats = transport.statistics()[name]
    assert (stats.running, stats.waiting_for_connection, stats.connections) == (0, 0, 0)
    assert stats.failed == 3


async def test_connection_waiter_cancelled_right_after_its_grant_never_completes(
    server: HypercornServer,
) -> None:
    """The connection is granted to the first waiter, which is cancelled before it
    resumes: its request never completes, and the next waiter is served."""
    transport = connection_limited()
    name = server.url
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:
        held = await client.send(client.build_request("GET", f"{server.url}/"), stream=True)
        second: list[httpx.Response] = []

        async def first_waiter(scope: anyio.CancelScope) -> None:
            with scope:
                await client.get(f"{server.url}/")
                raise AssertionError("the cancelled waiter completed")

        async def second_waiter() -> None:
            second.append(await client.get(f"{server.url}/"))

        scope = anyio.CancelScope()
        async with anyio.create_task_group() as tg:
            tg.start_soon(first_waiter, scope)
            await until(lambda: transport.statistics()[name].waiting_for_connection == 1)
            tg.start_soon(second_waiter)
            await until(lambda: transport.statistics()[name].waiting_for_connection == 2)
            await held.aread()  # the connection is granted to the first waiter...
            scope.cancel()  # ...which is cancelled before it resumes
        assert second[0].text == "hello"
    stats = transport.statistics()[name]
    assert (stats.running, stats.completed, stats.cancelled, stats.failed) == (0, 2, 1, 0)
    assert stats.acquired == stats.completed + stats.failed + stats.cancelled
    assert stats.stream_waits >= 1  # the first waiter was granted the pooled connection


async def test_leaked_http2_response_resets_its_stream_and_keeps_the_connection(
    app: TestApp,
) -> None:
    import gc

    with HypercornServer(app) as srv:
        transport = BulkheadTransport(default=Policy(max_concurrency=1), http1=False, http2=True)
        name = srv.url
        async with httpx.AsyncClient(transport=transport, timeout=10) as client:
            request = client.build_request("GET", f"{srv.url}/stream/100")
            response = await client.send(request, stream=True)
            assert transport.statistics()[name].http2_connections == 1
            with pytest.warns(ResourceWarning, match="never closed"):
                del response
                gc.collect()
            await until(lambda: transport.statistics()[name].streams_reset == 1)
            await until(lambda: transport.statistics()[name].running == 0)
            again = await client.get(f"{srv.url}/")
            assert again.text == "hello" and again.extensions["bulkhead"].reused
            stats = transport.statistics()[name]
            assert (stats.leaked_responses, stats.cancelled, stats.completed) == (1, 1, 1)
            assert (stats.http2_connections, stats.connections_created) == (1, 1)
            assert stats.unknown_state == 0 and stats.error == 0


async def test_a_failure_while_building_the_response_returns_the_slot(
    server: HypercornServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection: the response object cannot be built (here: its extension raises)."""
    import httpx_bulkhead._compartment as compartment_module

    def broken(**kwargs: object) -> None:
        raise RuntimeError("cannot build the response")

    transport = BulkheadTransport(default=Policy(max_concurrency=1))
    name = server.url
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:
        with monkeypatch.context() as patch:
            patch.setattr(compartment_module, "ExchangeInfo", broken)
            with pytest.raises(RuntimeError, match="cannot build"):
                await client.get(f"{server.url}/")
        stats = transport.statistics()[name]
        assert (stats.running, stats.failed, stats.in_use_connections) == (0, 1, 0)
        assert stats.error == 1  # an exchange cut half-way: its connection is closed
        assert (await client.get(f"{server.url}/")).text == "hello"


def reset_when_told(conn: RawConn) -> None:
    """Connection 0 answers one request, then resets itself when the test says so (the
    server dropping an idle keep-alive connection); later connections answer "fresh"."""
    if conn.index == 0:
        if conn.read_request() is not None:
            conn.send_response(200, b"first")
            conn.wait("reset")
        conn.reset()
        conn.server.set_event("was-reset")
        return
    keepalive_ok(b"fresh")(conn)


async def test_non_idempotent_request_is_retried_when_nothing_was_written() -> None:
    """The stale connection fails the POST before any byte of it was written (the reset
    lands between the idle check and the write): nothing reached the server, so sending
    it again on a new connection is safe."""
    with RawServer(reset_when_told) as srv:
        transport = BulkheadTransport()
        async with httpx.AsyncClient(transport=transport) as client:
            first = await client.get(srv.url)
            stream = first.extensions["network_stream"]
            fired: list[str] = []

            async def trace(name: str, info: dict[str, object]) -> None:
                if name == "http11.send_request_headers.started" and not fired:
                    fired.append(name)
                    srv.set_event("reset")
                    await srv.wait_event("was-reset")
                    await until(lambda: bool(stream.get_extra_info("is_readable")))

            response = await client.post(srv.url, content=b"once", extensions={"trace": trace})
            assert response.text == "fresh" and response.extensions["bulkhead"].retried
        stats = transport.statistics()[srv.url]
        assert (stats.stale_retries, stats.peer_closed, stats.failed) == (1, 1, 0)
        assert [r.split(b" ")[0] for r in srv.requests] == [b"GET", b"POST"]


@pytest.mark.parametrize("bound", ["connect_timeout", "request_timeout"])
async def test_a_slow_name_lookup_is_cut_by_the_connect_deadline(
    server: HypercornServer, flavour: Flavour, bound: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A direct connect looks the name up inside the connect's deadline: a resolver that
    does not answer is cut by the connect timeout (or the request's budget), and the
    abandoned lookup ends when the resolver answers.  The sync transport's error names the
    lookup; the async one's is the connect's own (its lookup runs inside that scope)."""
    resolver = HungResolver().install(monkeypatch)
    timeout, policy, expected = lookup_deadline(bound)
    origin = f"http://{SLOW_NAME}:{server.port}"
    transport = make_transport(flavour, default=policy)
    error, cut_while_hung = await resolver.cut(transport, timeout, expected, f"{origin}/")
    assert isinstance(error, httpx.ConnectTimeout), repr(error)
    lookup = f" resolving {SLOW_NAME}" if flavour == "sync" else ""
    assert str(error) == f"connect timed out{lookup}"
    assert cut_while_hung  # after the error's check, which says what the deadline cut instead
    stats = transport.statistics()[origin]
    assert (stats.connections, stats.running, stats.failed) == (0, 0, 1)
    await resolver.ended()
