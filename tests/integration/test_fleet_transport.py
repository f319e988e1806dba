"""``Policy(fleet=RedisFleetLimit(...))`` through ``BulkheadTransport``: real redis-server,
real HTTP servers on 127.0.0.1 (hypercorn; raw sockets for a peer that never answers).

Several transports in one event loop stand for several processes (each has its own
``FleetLimiter``, Redis client and place in the fleet's line); the tests with real worker
processes are in ``test_fleet_processes.py``.  After every test the invariants hold:
nothing running or waiting (``statistics()``), no lease left in Redis, the next request
succeeds.  Waits are on conditions with a deadline, never fixed sleeps.
"""

from __future__ import annotations

import gc
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
import httpx
import pytest

from httpx_bulkhead import (
    AcquireTimeout,
    BulkheadTransport,
    CompartmentStats,
    FleetUnavailable,
    Policy,
    RedisFleetLimit,
    RequestTimeout,
)
from tests.conftest import until
from tests.servers import HypercornServer, TestApp
from tests.servers.redis import RedisServer, free_port, importorskip_redis_py

importorskip_redis_py()

pytestmark = pytest.mark.anyio
DEADLINE = 10.0
#: Schedules of the adversarial cancellation loop in CI; more with this variable.
SCHEDULES = int(os.environ.get("BULKHEAD_FLEET_SCHEDULES", "3"))
SEED = int(os.environ.get("BULKHEAD_FLEET_SEED", "0"))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # redis-py's asyncio client: see test_under_trio_the_first_request_...


@pytest.fixture(scope="module")
def shared_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A server of the test's own, for the tests that stop, restart or pause it."""
    with RedisServer() as server:
        yield server


class Fleet:
    """Transports ("processes") sharing one fleet key, all routed to ``origin``."""

    def __init__(self, redis: RedisServer, key: str, origin: str) -> None:
        self.redis = redis
        self.key = key
        self.origin = origin  # 127.0.0.1:PORT: the compartment's name too
        self.transports: list[BulkheadTransport] = []

    def transport(
        self, limit: int, *, policy: dict[str, Any] | None = None, **fleet: Any
    ) -> BulkheadTransport:
        # "reject" and a long redis_timeout unless the test says otherwise: a slow answer on
        # a loaded machine must fail the test visibly, not admit on the local limit
        fleet.setdefault("on_unavailable", "reject")
        fleet.setdefault("redis_timeout", 5.0)
        fleet.setdefault("poll_interval", 0.05)
        config = RedisFleetLimit(self.redis.url, key=self.key, limit=limit, **fleet)
        settings: dict[str, Any] = {"max_concurrency": 10, "acquire_timeout": DEADLINE}
        settings.update(policy or {})
        transport = BulkheadTransport(hosts={self.origin: Policy(**settings, fleet=config)})
        self.transports.append(transport)
        return transport

    def stats(self, transport: BulkheadTransport) -> CompartmentStats:
        return transport.statistics()[self.origin]

    def in_redis(self) -> int:
        return int(self.redis.client().zcard(f"{self.key}:leases"))

    async def at_rest(self) -> None:
        """Nothing running, waiting or held anywhere; Redis holds no lease."""
        for transport in self.transports:
            await until(lambda t=transport: _idle(self.stats(t)), DEADLINE)  # type: ignore[misc]
        await until(lambda: self.in_redis() == 0, DEADLINE)
        for transport in self.transports:
            s = self.stats(transport)
            assert s.acquired == s.completed + s.failed + s.cancelled, s


def _idle(s: CompartmentStats) -> bool:
    return (s.running, s.waiting, s.fleet_waiting, s.fleet_leases_held, s.fleet_leases_local) == (
        0,
        0,
        0,
        0,
        0,
    )


@pytest.fixture
async def fleet(
    shared_redis: RedisServer, server: HypercornServer, unique: Callable[[str], str]
) -> AsyncIterator[Fleet]:
    made = Fleet(shared_redis, unique("fleet-transport"), f"127.0.0.1:{server.port}")
    yield made
    for transport in made.transports:
        await transport.aclose()


async def test_a_local_slot_first_then_a_lease_both_given_back(
    fleet: Fleet, server: HypercornServer, app: TestApp, unique: Callable[[str], str]
) -> None:
    """Two transports (local limits 2 and 5), fleet limit 3, 9 requests parked at a gate:
    3 reach the server; a request queued locally holds no lease (4 wait for a lease, 2 for
    a local slot); the leases live in Redis and come back with the slots."""
    small, big = fleet.transport(3, policy={"max_concurrency": 2}), fleet.transport(3)
    gate = app.gate(unique("g"))
    bucket = unique("b")
    url = f"{server.url}/gate/{gate.name}"
    async with (
        httpx.AsyncClient(transport=small) as c1,
        httpx.AsyncClient(transport=big) as c2,
        anyio.create_task_group() as tg,
    ):
        for client, n in ((c1, 4), (c2, 5)):
            for _ in range(n):
                tg.start_soon(_get_ok, client, url, bucket)
        await until(lambda: fleet.stats(small).waiting == 2 and fleet.stats(big).running == 5)
        await until(lambda: sum(fleet.stats(t).fleet_waiting for t in (small, big)) == 4)
        await gate.until_entered(3)
        s1, s2 = fleet.stats(small), fleet.stats(big)
        assert (s1.running, s1.waiting) == (2, 2)  # the two queued locally...
        assert s1.fleet_leases_held + s1.fleet_waiting == 2  # ...hold no lease, nor wait for one
        assert s1.fleet_leases_held + s2.fleet_leases_held == 3 == fleet.in_redis()
        assert app.current(bucket) == 3
        assert s1.fleet_limit == 3 and s1.fleet_unavailable is False
        gate.open()
    assert app.max_concurrent(bucket) == 3 and app.total(bucket) == 9
    await fleet.at_rest()
    stats = [fleet.stats(t) for t in (small, big)]
    assert sum(s.fleet_acquired for s in stats) == 9 and sum(s.completed for s in stats) == 9
    assert all(s.fleet_fallbacks == s.fleet_timeouts == s.fleet_lost == 0 for s in stats)
    assert all(s.wait_max > 0 for s in stats)  # the lease waits are acquire waits


async def _get_ok(client: httpx.AsyncClient, url: str, bucket: str) -> None:
    response = await client.get(url, headers={"x-bucket": bucket})
    assert response.status_code == 200


# ------------------------------------------------------------ every end gives both back


async def test_every_end_of_a_request_gives_the_lease_back_with_the_slot(
    fleet: Fleet, server: HypercornServer
) -> None:
    """Response read, closed early, request_timeout abandonment (held unread), the garbage
    collector's hand-off: after each, no slot and no lease is held, here or in Redis."""
    transport = fleet.transport(5, policy={"request_timeout": 2.0})
    async with httpx.AsyncClient(transport=transport) as client:
        assert (await client.get(f"{server.url}/")).status_code == 200  # read to the end
        await fleet.at_rest()

        async with client.stream("GET", f"{server.url}/stream/100") as response:
            await response.aiter_bytes().__anext__()  # closed early
        await fleet.at_rest()

        response = await client.send(
            client.build_request("GET", f"{server.url}/stream/100"), stream=True
        )
        assert fleet.stats(transport).fleet_leases_held == 1
        await until(lambda: fleet.stats(transport).running == 0, DEADLINE)  # held unread
        with pytest.raises(RequestTimeout):
            await response.aread()
        await response.aclose()
        await fleet.at_rest()

        response = await client.send(
            client.build_request("GET", f"{server.url}/stream/100"), stream=True
        )
        assert fleet.stats(transport).fleet_leases_held == 1
        with pytest.warns(ResourceWarning, match="never closed"):
            del response
            gc.collect()
        await fleet.at_rest()
        s = fleet.stats(transport)
        assert (s.leaked_responses, s.completed, s.failed, s.cancelled) == (1, 1, 1, 2)
        assert s.fleet_acquired == 4


async def test_an_error_in_send_gives_the_lease_back_with_the_slot(
    shared_redis: RedisServer, unique: Callable[[str], str]
) -> None:
    """Nothing listens on the origin: ConnectError after the lease was granted; the slot
    and the lease are given back together."""
    port = free_port()
    fleet = Fleet(shared_redis, unique("fleet-error"), f"127.0.0.1:{port}")
    transport = fleet.transport(5)
    async with transport, httpx.AsyncClient(transport=transport) as client:
        for _ in range(2):
            with pytest.raises(httpx.ConnectError):
                await client.get(f"http://127.0.0.1:{port}/")
        s = fleet.stats(transport)
        assert (s.running, s.failed, s.fleet_acquired, s.fleet_leases_held) == (0, 2, 2, 0)
        await _at_rest(fleet, transport)


async def test_cancelled_while_waiting_for_a_lease_holds_nothing(
    fleet: Fleet, server: HypercornServer, app: TestApp, unique: Callable[[str], str]
) -> None:
    """A request holding its local slot and waiting for a lease (the fleet is full), then
    cancelled: its slot goes back, it never holds a lease; the one behind it goes on."""
    holder, waiter = fleet.transport(1), fleet.transport(1)
    gate = app.gate(unique("g"))
    async with (
        httpx.AsyncClient(transport=holder) as c1,
        httpx.AsyncClient(transport=waiter) as c2,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(_get_ok, c1, f"{server.url}/gate/{gate.name}", "x")
        await gate.until_entered(1)
        with anyio.CancelScope() as scope:
            tg.start_soon(_cancel_when, scope, lambda: fleet.stats(waiter).fleet_waiting == 1)
            await c2.get(f"{server.url}/")
        assert scope.cancelled_caught
        s = fleet.stats(waiter)
        assert (s.running, s.cancelled, s.fleet_leases_held, s.fleet_acquired) == (0, 1, 0, 0)
        assert fleet.in_redis() == 1
        gate.open()
        await _get_ok(c2, f"{server.url}/", "x")  # the next one goes on
    await fleet.at_rest()


async def _cancel_when(scope: anyio.CancelScope, condition: Callable[[], bool]) -> None:
    await until(condition, DEADLINE)
    scope.cancel()


async def test_a_lease_timeout_names_the_fleet_and_gives_the_slot_back(
    fleet: Fleet, server: HypercornServer, app: TestApp, unique: Callable[[str], str]
) -> None:
    """No lease within what is left of the acquire timeout: AcquireTimeout (counted in
    acquire_timeouts and fleet_timeouts), the slot given back, nothing left in Redis."""
    holder = fleet.transport(1)
    late = fleet.transport(1, policy={"acquire_timeout": 0.3})
    gate = app.gate(unique("g"))
    async with (
        httpx.AsyncClient(transport=holder) as c1,
        httpx.AsyncClient(transport=late) as c2,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(_get_ok, c1, f"{server.url}/gate/{gate.name}", "x")
        await gate.until_entered(1)
        started = time.monotonic()
        with pytest.raises(AcquireTimeout, match="fleet limit"):
            await c2.get(f"{server.url}/")
        assert time.monotonic() - started < 0.3 + 1.0
        s = fleet.stats(late)
        assert (s.running, s.failed, s.acquire_timeouts, s.fleet_timeouts) == (0, 1, 1, 1)
        gate.open()
    await fleet.at_rest()


# --------------------------------------------------- adversarial: cancel at random points


async def test_random_cancellations_leave_no_lease_and_no_slot(
    fleet: Fleet, server: HypercornServer, app: TestApp, unique: Callable[[str], str]
) -> None:
    """Seeded schedules: three transports (local limits 2-4), fleet limit 3, 24 requests
    each cancelled at a random point: queued locally, waiting for a lease, being sent,
    mid-body; some run to the end.  Afterwards the server never saw more than 3 at once,
    Redis holds no lease, nothing runs or waits, the counters add up, the next request
    succeeds.  ``BULKHEAD_FLEET_SCHEDULES=N`` (default 3), ``BULKHEAD_FLEET_SEED=S``."""
    group = [fleet.transport(3, policy={"max_concurrency": n}) for n in (2, 3, 4)]
    clients = [httpx.AsyncClient(transport=t) for t in group]
    try:
        for schedule in range(SCHEDULES):
            rng = random.Random(SEED * 1000 + schedule)
            bucket = unique("adv")
            await _one_schedule(rng, clients, server, bucket)
            assert app.max_concurrent(bucket) <= 3, (schedule, app.max_concurrent(bucket))
            await fleet.at_rest()
            for client in clients:  # the next request succeeds
                await _get_ok(client, f"{server.url}/", bucket)
        await fleet.at_rest()
        cancelled = sum(fleet.stats(t).cancelled + fleet.stats(t).cancelled_waiting for t in group)
        assert cancelled > 0  # the schedules did cancel (a vacuous run would not)
    finally:
        for client in clients:
            await client.aclose()


async def _one_schedule(
    rng: random.Random, clients: list[httpx.AsyncClient], server: HypercornServer, bucket: str
) -> None:
    async def one(client: httpx.AsyncClient, route: str, delay: float | None) -> None:
        with anyio.CancelScope() as scope:
            if delay is not None:
                scope.deadline = anyio.current_time() + delay
            async with client.stream(
                "GET", f"{server.url}/{route}", headers={"x-bucket": bucket}
            ) as response:
                async for _ in response.aiter_bytes():
                    await anyio.sleep(0)  # a slow reader: cancelled mid-body at times

    async with anyio.create_task_group() as tg:
        for _ in range(24):
            route = rng.choice(["", "slow/5", "slow/20", "stream/64"])
            delay = rng.choice([None, 0.0, 0.0005, 0.002, 0.005, 0.01, 0.03])
            tg.start_soon(one, rng.choice(clients), route, delay)
            if rng.random() < 0.3:
                await anyio.sleep(0)


# -------------------------------------------------------------- Redis failing under load


async def test_redis_stopped_then_restarted_local_fallback_through_the_transport(
    redis_server: RedisServer, server: HypercornServer, app: TestApp, unique: Callable[[str], str]
) -> None:
    """``on_unavailable="local"``: while Redis is down requests are admitted on the local
    limit (counted as fallbacks), none waits past the acquire timeout, no slot leaks; after
    the restart the running ones are counted in Redis again and the limit holds."""
    fleet = Fleet(redis_server, unique("fleet-down"), f"127.0.0.1:{server.port}")
    transport = fleet.transport(
        2,
        on_unavailable="local",
        redis_timeout=0.2,
        retry_interval=0.2,
        lease=1.0,
        policy={"max_concurrency": 4, "acquire_timeout": 2.0},
    )
    gate = app.gate(unique("g"))
    bucket = unique("b")
    try:
        async with httpx.AsyncClient(transport=transport) as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_get_ok, client, f"{server.url}/gate/{gate.name}", bucket)
                await gate.until_entered(1)
                redis_server.stop()
                started = time.monotonic()
                for _ in range(3):  # past the fleet limit of 2: the local limit alone
                    tg.start_soon(_get_ok, client, f"{server.url}/gate/{gate.name}", bucket)
                await gate.until_entered(4)
                assert time.monotonic() - started < 2.0  # no hang past acquire_timeout
                s = fleet.stats(transport)
                assert s.fleet_unavailable and s.fleet_outages == 1 and s.fleet_fallbacks == 3
                assert (s.running, s.fleet_leases_held + s.fleet_leases_local) == (4, 4)
                redis_server.start()  # empty: the first lease is lost, all are adopted
                await until(lambda: fleet.stats(transport).fleet_leases_held == 4, DEADLINE)
                assert fleet.in_redis() == 4 and fleet.stats(transport).fleet_lost == 1
                gate.open()
            await _at_rest(fleet, transport)
            # the limit holds again: 6 parked requests, 2 reach the server
            gate2, bucket2 = app.gate(unique("g")), unique("b")
            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    tg.start_soon(_get_ok, client, f"{server.url}/gate/{gate2.name}", bucket2)
                await gate2.until_entered(2)
                await until(lambda: fleet.stats(transport).fleet_waiting == 2, DEADLINE)
                assert fleet.in_redis() == 2 and app.current(bucket2) == 2
                gate2.open()
            assert app.max_concurrent(bucket2) == 2
            await _at_rest(fleet, transport)
    finally:
        await transport.aclose()


async def _at_rest(fleet: Fleet, transport: BulkheadTransport) -> None:
    await until(lambda: _idle(fleet.stats(transport)), DEADLINE)
    await until(lambda: fleet.in_redis() == 0, DEADLINE)
    s = fleet.stats(transport)
    assert s.acquired == s.completed + s.failed + s.cancelled, s


async def test_redis_stopped_then_restarted_reject_through_the_transport(
    redis_server: RedisServer, server: HypercornServer, unique: Callable[[str], str]
) -> None:
    """``on_unavailable="reject"``: FleetUnavailable at once (within redis_timeout), the
    slot given back; after the restart requests are admitted again by the fleet."""
    fleet = Fleet(redis_server, unique("fleet-reject"), f"127.0.0.1:{server.port}")
    transport = fleet.transport(
        2, on_unavailable="reject", redis_timeout=0.2, retry_interval=0.2, lease=1.0
    )
    try:
        async with httpx.AsyncClient(transport=transport) as client:
            assert (await client.get(f"{server.url}/")).status_code == 200
            redis_server.stop()
            for _ in range(3):
                started = time.monotonic()
                with pytest.raises(FleetUnavailable, match="Redis is unavailable"):
                    await client.get(f"{server.url}/")
                assert time.monotonic() - started < 1.0
            s = fleet.stats(transport)
            assert (s.running, s.waiting, s.failed, s.fleet_rejected) == (0, 0, 3, 3)
            redis_server.start()

            async def admitted() -> bool:
                try:
                    await client.get(f"{server.url}/")
                except FleetUnavailable:
                    return False
                return True

            with anyio.fail_after(DEADLINE):
                while not await admitted():
                    await anyio.sleep(0.05)
            s = fleet.stats(transport)
            assert s.fleet_unavailable is False and s.fleet_acquired >= 2
            await _at_rest(fleet, transport)
    finally:
        await transport.aclose()


async def test_a_paused_redis_never_holds_a_request_past_its_acquire_timeout(
    redis_server: RedisServer, server: HypercornServer, unique: Callable[[str], str]
) -> None:
    """SIGSTOP: Redis keeps its sockets and answers nothing.  With a redis_timeout longer
    than the acquire timeout, the acquire timeout ends the wait (AcquireTimeout), the slot
    is given back, and Redis is not declared down for it."""
    fleet = Fleet(redis_server, unique("fleet-paused"), f"127.0.0.1:{server.port}")
    transport = fleet.transport(2, policy={"acquire_timeout": 0.5}, redis_timeout=5.0)
    try:
        async with httpx.AsyncClient(transport=transport) as client:
            assert (await client.get(f"{server.url}/")).status_code == 200
            redis_server.pause()
            try:
                for _ in range(2):
                    started = time.monotonic()
                    with pytest.raises(AcquireTimeout):
                        await client.get(f"{server.url}/")
                    assert time.monotonic() - started < 0.5 + 0.5
            finally:
                redis_server.resume()
            s = fleet.stats(transport)
            assert (s.running, s.waiting, s.fleet_timeouts, s.fleet_outages) == (0, 0, 2, 0)
            assert (await client.get(f"{server.url}/")).status_code == 200
            await _at_rest(fleet, transport)
    finally:
        await transport.aclose()


# ------------------------------------------------------------------ lifecycle and trio


async def test_aclose_returns_held_leases_and_closes_the_redis_connections(
    fleet: Fleet, server: HypercornServer, app: TestApp, unique: Callable[[str], str]
) -> None:
    """``aclose`` with a request holding a lease: the lease is gone from Redis, and every
    Redis connection of the transport (commands, the pub/sub listener; named by the URL's
    ``client_name``) is closed."""
    name = unique("aclose")
    redis = fleet.redis.client()
    config = RedisFleetLimit(
        f"{fleet.redis.url}?client_name={name}", key=fleet.key, limit=3, redis_timeout=5.0
    )
    transport = BulkheadTransport(hosts={fleet.origin: Policy(fleet=config)})
    gate = app.gate(unique("g"))
    errors: list[BaseException] = []

    def ours() -> int:
        return sum(1 for client in redis.client_list() if client["name"] == name)

    async def parked() -> None:
        try:
            await httpx.AsyncClient(transport=transport).get(f"{server.url}/gate/{gate.name}")
        except httpx.TransportError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(parked)
        await gate.until_entered(1)
        await until(lambda: fleet.stats(transport).fleet_leases_held == 1)
        await until(lambda: ours() == 2)  # the acquire's connection, the pub/sub listener
        assert fleet.in_redis() == 1
        await transport.aclose()
        assert fleet.in_redis() == 0
        await until(lambda: ours() == 0, DEADLINE)
        gate.open()
    assert len(errors) == 1  # the parked request failed with a read error, nothing hung


async def test_an_evicted_compartment_closes_its_limiter_and_keeps_its_counters(
    shared_redis: RedisServer, unique: Callable[[str], str], app: TestApp
) -> None:
    """A fleet limit on the default policy: every unlisted origin's compartment shares the
    key.  Evicted at rest, a compartment closes its Redis connections and its fleet
    counters join ``"(evicted)"``."""
    redis = shared_redis.client()
    key = unique("fleet-default")
    url = f"{shared_redis.url}?client_name={key}"
    config = RedisFleetLimit(url, key=key, limit=5, redis_timeout=5.0)

    def ours() -> int:
        return sum(1 for client in redis.client_list() if client["name"] == key)

    transport = BulkheadTransport(
        default=Policy(fleet=config, acquire_timeout=DEADLINE), max_default_compartments=1
    )
    with HypercornServer(app) as one, HypercornServer(app) as two, HypercornServer(app) as three:
        async with transport, httpx.AsyncClient(transport=transport) as client:
            for origin in (one, two, three):  # the bound is 1: the first is evicted at rest
                assert (await client.get(f"{origin.url}/")).status_code == 200
            stats = transport.statistics()
            assert "(evicted)" in stats and one.url not in stats
            assert sum(s.fleet_acquired for s in stats.values()) == 3
            evicted = stats.pop("(evicted)")
            assert evicted.fleet_acquired >= 1 and evicted.fleet_round_trips >= 1
            assert evicted.fleet_limit is None and evicted.fleet_leases_held == 0
            assert all(s.fleet_limit == 5 for s in stats.values())
            # each live compartment: a command connection and its pub/sub listener; the
            # evicted ones' are closed
            await until(lambda: ours() == 2 * len(stats), DEADLINE)
    await until(lambda: ours() == 0, DEADLINE)
    assert int(redis.zcard(f"{key}:leases")) == 0


async def test_a_request_cancelled_as_it_evicts_still_closes_the_evicted_compartment(
    shared_redis: RedisServer, unique: Callable[[str], str], app: TestApp
) -> None:
    """The request whose new origin evicts a compartment closes it (its connections, its
    fleet limiter's Redis connections) even when that request is cancelled meanwhile: the
    evicted compartment is out of the router, so nobody else would close it."""
    redis = shared_redis.client()
    key = unique("fleet-evict-cancel")
    config = RedisFleetLimit(f"{shared_redis.url}?client_name={key}", key=key, limit=5)

    def ours() -> int:
        return sum(1 for client in redis.client_list() if client["name"] == key)

    transport = BulkheadTransport(
        default=Policy(fleet=config, acquire_timeout=DEADLINE), max_default_compartments=1
    )
    with HypercornServer(app) as one, HypercornServer(app) as two, HypercornServer(app) as three:
        async with transport, httpx.AsyncClient(transport=transport) as client:
            for origin in (one, two):  # one gets a second chance: the bound is passed
                assert (await client.get(f"{origin.url}/")).status_code == 200
            await until(lambda: ours() == 4, DEADLINE)  # a command connection, a listener
            with anyio.CancelScope() as scope:
                scope.cancel()  # cancelled at its first await: closing the evicted one
                await transport.handle_async_request(httpx.Request("GET", f"{three.url}/"))
            assert scope.cancelled_caught
            stats = transport.statistics()
            assert one.url not in stats and stats["(evicted)"].fleet_acquired == 1
            assert stats["(evicted)"].closed == stats["(evicted)"].connections_created == 1
            await until(lambda: ours() == 2, DEADLINE)  # two's; one's are closed
            assert (await client.get(f"{three.url}/")).status_code == 200
    await until(lambda: ours() == 0, DEADLINE)
    assert int(redis.zcard(f"{key}:leases")) == 0


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_under_trio_the_first_request_says_redis_py_needs_asyncio(
    shared_redis: RedisServer, server: HypercornServer, unique: Callable[[str], str]
) -> None:
    """redis-py's client is asyncio only: under trio each request fails with a
    RuntimeError naming the backend, gives its slot back, and the transport closes."""
    config = RedisFleetLimit(shared_redis.url, key=unique("k"), limit=1)
    origin = f"127.0.0.1:{server.port}"
    transport = BulkheadTransport(hosts={origin: Policy(fleet=config)})
    async with transport, httpx.AsyncClient(transport=transport) as client:
        for _ in range(2):
            with pytest.raises(RuntimeError, match=r"needs asyncio.*cannot run under trio"):
                await client.get(f"{server.url}/")
        s = transport.statistics()[origin]
        assert (s.running, s.acquired, s.failed, s.fleet_leases_held) == (0, 2, 2, 0)


# --------------------------------------------------------------------------- exporters


async def test_both_exporters_carry_the_fleet_figures(
    fleet: Fleet, server: HypercornServer, app: TestApp, unique: Callable[[str], str]
) -> None:
    """Prometheus and OpenTelemetry, read back through the real libraries while leases
    are held and waited for: every fleet sample equals what ``statistics()`` says."""
    pytest.importorskip("prometheus_client")
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from httpx_bulkhead import otel
    from tests.integration.test_exporters import (
        expected_otel,
        expected_prometheus,
        read_otel,
        read_prometheus,
    )

    transport = fleet.transport(2)
    reader = InMemoryMetricReader()
    instrumentation = otel.instrument(transport, MeterProvider(metric_readers=[reader]))
    gate = app.gate(unique("g"))
    try:
        async with (
            httpx.AsyncClient(transport=transport) as client,
            anyio.create_task_group() as tg,
        ):
            for _ in range(3):
                tg.start_soon(_get_ok, client, f"{server.url}/gate/{gate.name}", "x")
            await until(lambda: fleet.stats(transport).fleet_waiting == 1)
            for read, expected in (
                (read_prometheus, expected_prometheus),
                (_otel(reader, read_otel), expected_otel),
            ):
                samples, stats = read(transport)
                assert samples == expected(stats)
                fleet_samples = {k: v for k, v in samples.items() if "fleet" in k[0]}
                assert len(fleet_samples) >= 13 and 2 in fleet_samples.values()
            gate.open()
    finally:
        instrumentation.uninstrument()
    await fleet.at_rest()


def _otel(reader: Any, read_otel: Callable[..., Any]) -> Callable[[BulkheadTransport], Any]:
    return lambda transport: read_otel(reader, transport)
