"""One transport used by one event loop, then by another (``BulkheadTransport``'s theory of
operation, "one event loop at a time").

A module-level client is the common case: ``asyncio.run`` called twice in a script, or
pytest's per-test loops, or ``trio.run`` twice.  Before the hand-over existed, the second
loop's request found the first loop's pooled connection and failed with a raw
``RuntimeError: Event loop is closed`` (asyncio).  So these tests run each loop
themselves (no anyio plugin: each test is several runs), against hypercorn on 127.0.0.1,
and check what the user sees (every request succeeds), what the counters say (the old
loop's connection is a ``loop_changed`` discard; nothing in use, idle or waiting is left
from it) and what the process holds (no descriptor left open, no ``ResourceWarning``).
"""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest
import trio

from httpx_bulkhead import BulkheadTransport, Policy, RedisFleetLimit, TransportClosed
from tests.conftest import until
from tests.resources import FdSnapshot, assert_no_fd_growth
from tests.servers import HypercornServer, TestApp, default_server_tls
from tests.servers.redis import RedisServer

BACKENDS = ["asyncio", "trio"]
PROTOCOLS = ["HTTP/1.1", "HTTP/2"]


def run(backend: str, fn: Callable[[], Awaitable[Any]]) -> Any:
    """One event loop, from start to end, as a script's ``asyncio.run``/``trio.run``."""
    if backend == "asyncio":

        async def main() -> Any:
            return await fn()

        return asyncio.run(main())
    return trio.run(fn)


def transport_for(protocol: str, **kwargs: Any) -> BulkheadTransport:
    """HTTP/2 (over cleartext: prior knowledge, hypercorn speaks h2c; over TLS: ALPN) or
    HTTP/1.1."""
    http2 = protocol == "HTTP/2"
    return BulkheadTransport(http1=not http2, http2=http2, **kwargs)


@pytest.fixture
def no_leaks() -> Iterator[FdSnapshot]:
    """The descriptors before the test's server starts; and, at the end, no
    ``ResourceWarning`` from what the collector finds (an unclosed socket or transport)."""
    before = FdSnapshot.take()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        yield before
        gc.collect()
    leaks = [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert not leaks, [str(w.message) for w in leaks]


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_transport_reused_on_a_new_loop_discards_the_old_loops_connections(
    backend: str, protocol: str, tls: bool, no_leaks: FdSnapshot
) -> None:
    server_tls = default_server_tls() if tls else None
    with HypercornServer(TestApp(), tls=server_tls) as srv:
        verify = True if server_tls is None else server_tls.client_ssl_context()
        transport = transport_for(protocol, verify=verify)
        client = httpx.AsyncClient(transport=transport)  # made outside any loop

        async def get() -> httpx.Response:
            return await client.get(f"{srv.url}/echo")

        for run_number in range(3):
            response = run(backend, get)
            assert response.status_code == 200
            assert response.http_version == protocol
            stats = transport.statistics()[srv.url]
            assert stats.loop_changed == run_number  # each earlier loop's one connection
            assert stats.connections_created == run_number + 1
            assert (stats.connections, stats.idle_connections, stats.in_use_connections) == (
                1,
                1,
                0,
            )
            assert (stats.running, stats.waiting, stats.waiting_for_connection) == (0, 0, 0)
            assert stats.completed == run_number + 1 and stats.failed == 0
            assert stats.http2_connections == (protocol == "HTTP/2")
        run(backend, client.aclose)  # from a loop of its own, too: it hands over first
        stats = transport.statistics()[srv.url]
        assert (stats.loop_changed, stats.closed, stats.connections) == (3, 0, 0)
    assert_no_fd_growth(no_leaks, f"{backend} {protocol}")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_old_loops_sockets_are_closed_at_the_hand_over(
    protocol: str, no_leaks: FdSnapshot
) -> None:
    """Closed then, not when the transport is closed or collected: the first loop's socket
    is gone once the second loop's request has returned."""
    with HypercornServer(TestApp()) as srv:
        transport = transport_for(protocol)
        client = httpx.AsyncClient(transport=transport)
        before_first = FdSnapshot.take()

        async def get() -> None:
            (await client.get(f"{srv.url}/echo")).raise_for_status()

        run("asyncio", get)
        first = FdSnapshot.take().growth(before_first)  # our socket, the server's side
        assert first
        run("asyncio", get)
        still_open = set(first) & set(FdSnapshot.take().targets)
        # The server closes its side in its own time; ours must be gone already.
        ours = [t for t in still_open if _is_client_socket(t, srv.port)]
        assert not ours, ours
        run("asyncio", client.aclose)
    assert_no_fd_growth(no_leaks, protocol)


def _is_client_socket(target: str, port: int) -> bool:
    """Whether ``socket:[inode]`` is a TCP socket of ours to ``port`` (from /proc/net/tcp)."""
    inode = target.removeprefix("socket:[").removesuffix("]")
    with open("/proc/net/tcp", encoding="ascii") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].split(":")[1], 16)
            if fields[9] == inode and remote_port == port:
                return True
    return False


@pytest.mark.parametrize("reused", [False, True], ids=["new", "reused"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_request_under_way_on_the_loop_left_fails_cleanly_and_gives_its_slot_back(
    protocol: str, reused: bool, no_leaks: FdSnapshot
) -> None:
    """asyncio only: a loop can stop (``run_until_complete`` returns) with a request
    parked in the server; ``trio.run`` ends every task before it returns.  When that loop
    runs again, the request fails naming the hand-over, and is not sent again, not even
    from a reused connection whose failure reads as stale (it would take the new loop's
    connection, from the wrong loop)."""
    app = TestApp()
    gate = app.gate("parked")
    with HypercornServer(app) as srv:
        transport = transport_for(protocol, default=Policy(max_concurrency=2))
        client = httpx.AsyncClient(transport=transport)
        first = asyncio.new_event_loop()
        try:
            if reused:  # the parked request goes on a connection that served one already
                first.run_until_complete(client.get(f"{srv.url}/echo"))
            parked = first.create_task(client.get(f"{srv.url}/gate/parked"))
            first.run_until_complete(gate.until_entered(1))  # the loop stops; it waits on
            assert not parked.done()

            async def get() -> httpx.Response:
                return await client.get(f"{srv.url}/echo")

            response = run("asyncio", get)  # a second loop takes the transport over
            assert response.status_code == 200
            stats = transport.statistics()[srv.url]
            assert stats.loop_changed == 1  # the parked request's connection
            assert stats.running == 1  # its slot: held until it ends
            assert (stats.connections, stats.idle_connections) == (1, 1)

            gate.open()
            first.run_until_complete(asyncio.wait([parked]))  # the first loop runs again
            error = parked.exception()
            assert isinstance(error, httpx.ReadError), repr(error)  # its connection closed
            assert "taken over by another loop" in str(error)
        finally:
            first.run_until_complete(first.shutdown_asyncgens())
            first.close()
        stats = transport.statistics()[srv.url]
        assert (stats.running, stats.failed, stats.completed) == (0, 1, 1 + reused)
        assert (stats.connections, stats.idle_connections, stats.in_use_connections) == (1, 1, 0)
        assert (stats.stale_retries, stats.replays, stats.connections_created) == (0, 0, 2)
        run("asyncio", client.aclose)
    assert_no_fd_growth(no_leaks, protocol)


def test_waiters_of_the_loop_left_leave_the_queues(no_leaks: FdSnapshot) -> None:
    """A waiter for a slot stranded on a stopped loop is dropped at the hand-over (counted
    as ``cancelled_waiting``), so a slot the new loop frees is not handed to it; the new
    loop's requests queue behind nobody."""
    app = TestApp()
    gate = app.gate("held")
    with HypercornServer(app) as srv:
        transport = BulkheadTransport(default=Policy(max_concurrency=1))
        client = httpx.AsyncClient(transport=transport)
        first = asyncio.new_event_loop()
        try:
            holder = first.create_task(client.get(f"{srv.url}/gate/held"))
            waiter = first.create_task(client.get(f"{srv.url}/echo"))
            first.run_until_complete(gate.until_entered(1))
            assert transport.statistics()[srv.url].waiting == 1

            async def two() -> list[int]:
                gate.open()  # (the holder's slot stays held: its loop is stopped)
                return [(await client.get(f"{srv.url}/echo")).status_code]

            # The one slot is held by the first loop's request, which the hand-over does
            # not end: the new request waits for it, within its acquire budget.
            with pytest.raises(httpx.PoolTimeout):
                run("asyncio", lambda: _with_pool_timeout(client, srv.url))
            stats = transport.statistics()[srv.url]
            assert (stats.waiting, stats.cancelled_waiting, stats.running) == (0, 1, 1)
            first.run_until_complete(asyncio.wait([holder]))  # its connection was closed
            assert isinstance(holder.exception(), httpx.TransportError)
            assert run("asyncio", two) == [200]
            waiter.cancel()
            first.run_until_complete(asyncio.wait([waiter]))
        finally:
            first.run_until_complete(first.shutdown_asyncgens())
            first.close()
        stats = transport.statistics()[srv.url]
        assert (stats.running, stats.waiting) == (0, 0)
        run("asyncio", client.aclose)
    assert_no_fd_growth(no_leaks)


async def _with_pool_timeout(client: httpx.AsyncClient, url: str) -> None:
    await client.get(f"{url}/echo", timeout=httpx.Timeout(5.0, pool=0.05))


@pytest.mark.parametrize("backend", BACKENDS)
def test_idle_expiry_runs_on_the_new_loop(backend: str, no_leaks: FdSnapshot) -> None:
    """The first loop armed the idle sweep, then ended before it fired: the new loop's
    idle connection still expires with no traffic (the sweep is armed again there, not
    left to the old loop's timer, which will never fire)."""
    with HypercornServer(TestApp()) as srv:
        transport = BulkheadTransport(default=Policy(idle_timeout=0.3))
        client = httpx.AsyncClient(transport=transport)

        async def get() -> None:
            (await client.get(f"{srv.url}/echo")).raise_for_status()

        async def get_then_idle() -> None:
            await get()
            stats = transport.statistics
            await until(lambda: stats()[srv.url].idle_expired == 1, timeout=5)
            assert stats()[srv.url].connections == 0

        run(backend, get)  # armed, and never fired: the loop is gone
        run(backend, get_then_idle)
        assert transport.statistics()[srv.url].loop_changed == 1
        run(backend, client.aclose)
    assert_no_fd_growth(no_leaks, backend)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_dial_the_loop_left_completes_later_is_closed_not_pooled(
    protocol: str, no_leaks: FdSnapshot
) -> None:
    """A dial under way on the first loop when it stopped (held in a trace callback) frees
    its place at the hand-over; when the first loop runs again and the dial completes,
    the new connection is closed, not pooled beside the new loop's, and its request fails
    with ``TransportClosed`` naming the hand-over."""
    with HypercornServer(TestApp()) as srv:
        transport = transport_for(protocol, default=Policy(max_connections=1))
        client = httpx.AsyncClient(transport=transport)
        first = asyncio.new_event_loop()
        try:
            dialing, go_on = asyncio.Event(), asyncio.Event()

            async def hold_the_dial(event: str, info: dict[str, Any]) -> None:
                if event == "connection.connect_tcp.complete":
                    dialing.set()
                    await go_on.wait()

            request = client.build_request(
                "GET", f"{srv.url}/echo", extensions={"trace": hold_the_dial}
            )
            late = first.create_task(client.send(request))
            first.run_until_complete(dialing.wait())  # connected, not yet in the pool
            assert transport.statistics()[srv.url].connections == 1  # its place

            async def get() -> httpx.Response:
                return await client.get(f"{srv.url}/echo")

            assert run("asyncio", get).status_code == 200  # the place was freed for it
            go_on.set()
            first.run_until_complete(asyncio.wait([late]))
            error = late.exception()
            assert isinstance(error, TransportClosed), repr(error)
            assert "taken over by another loop" in str(error)
        finally:
            first.run_until_complete(first.shutdown_asyncgens())
            first.close()
        stats = transport.statistics()[srv.url]
        assert (stats.connections, stats.idle_connections, stats.in_use_connections) == (1, 1, 0)
        assert (stats.loop_changed, stats.connections_created) == (1, 2)  # the late dial's
        assert (stats.running, stats.completed, stats.failed) == (0, 1, 1)
        run("asyncio", client.aclose)
    assert_no_fd_growth(no_leaks, protocol)


def test_a_fleet_limit_follows_the_transport_to_a_new_loop(no_leaks: FdSnapshot) -> None:
    """asyncio only (redis-py's client).  The fleet limiter's own Redis client, listener
    task and events belong to the loop that made them: a new loop starts afresh, the old
    client's sockets closed without the old loop; a lease given back at the very end of a
    loop (its removal had no time to run there) is removed from the new one, so a fleet
    limit of one admits the next loop's request without waiting for the lease's expiry."""
    with RedisServer() as redis, HypercornServer(TestApp()) as srv:
        origin = f"127.0.0.1:{srv.port}"
        limit = RedisFleetLimit(
            redis.url, key="loop-change", limit=1, on_unavailable="reject", redis_timeout=5.0
        )
        policy = Policy(fleet=limit, acquire_timeout=5.0)  # < the lease (30 s)
        transport = BulkheadTransport(hosts={origin: policy})
        client = httpx.AsyncClient(transport=transport)

        async def get() -> httpx.Response:
            return await client.get(f"{srv.url}/echo")

        for run_number in range(3):
            assert run("asyncio", get).status_code == 200
            stats = transport.statistics()[origin]
            assert (stats.running, stats.fleet_leases_held, stats.fleet_leases_local) == (0, 0, 0)
            assert (stats.fleet_acquired, stats.fleet_fallbacks) == (run_number + 1, 0)
            assert (stats.fleet_outages, stats.fleet_timeouts) == (0, 0)
            assert stats.loop_changed == run_number
        run("asyncio", client.aclose)
        assert redis.client().zcard("loop-change:leases") == 0  # no lease left in Redis
    assert_no_fd_growth(no_leaks, "fleet")
