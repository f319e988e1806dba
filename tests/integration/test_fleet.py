"""FleetLimiter against a real redis-server on 127.0.0.1 (no mock of Redis).

Several ``FleetLimiter`` objects in one event loop stand for several processes (each has
its own Redis client, process id and place in the fleet's line); the tests with real
processes are in ``test_fleet_processes.py``.  Fault tests (stop, restart, SIGSTOP) get a
redis-server of their own.  Waits are on conditions with a deadline, never fixed sleeps;
leases are short (0.5-1 s) where expiry or renewal is the subject.
"""

from __future__ import annotations

import logging
import math
import os
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
import httpx
import pytest

from httpx_bulkhead import AcquireTimeout, TransportClosed
from httpx_bulkhead.fleet import (
    FleetLimiter,
    FleetUnavailable,
    Lease,
    RedisFleetLimit,
)
from tests.servers.redis import RedisServer, importorskip_redis_py

importorskip_redis_py()

pytestmark = pytest.mark.anyio
DEADLINE = 10.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # redis-py's asyncio client: see test_trio_is_refused_naming_the_backend


@pytest.fixture(scope="module")
def shared_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A server of the test's own, for the tests that stop, restart or pause it."""
    with RedisServer() as server:
        yield server


@pytest.fixture
async def limiters(
    unique: Callable[[str], str],
) -> AsyncIterator[Callable[..., FleetLimiter]]:
    """``make(server, limit, **config)``: limiters on one key per test, closed at the end."""
    made: list[FleetLimiter] = []
    key = unique("fleet")

    def make(server: RedisServer, limit: int, **config: Any) -> FleetLimiter:
        # "reject" unless a test says otherwise: Redis being unavailable, unexpectedly,
        # must fail the test rather than admit on the local limit
        config.setdefault("on_unavailable", "reject")
        config.setdefault("redis_timeout", 5.0)  # a loaded test machine is not an outage
        limiter = FleetLimiter(RedisFleetLimit(server.url, key=key, limit=limit, **config))
        made.append(limiter)
        return limiter

    yield make
    for limiter in made:
        await limiter.aclose()


async def until(predicate: Callable[[], bool], timeout: float = DEADLINE) -> None:
    """Poll ``predicate`` (it may read Redis) until it holds; fail after ``timeout``."""
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.01)


def in_redis(server: RedisServer, limiter: FleetLimiter) -> int:
    return int(server.client().zcard(f"{limiter.config.key}:leases"))


# ---------------------------------------------------------------------------- admission


async def test_concurrent_acquires_never_exceed_the_limit(
    shared_redis: RedisServer, limiters: Callable[..., FleetLimiter]
) -> None:
    """5 limiters x 20 concurrent requests, limit 7: never more than 7 hold a lease at once
    (counted here, where every holder lives, and in Redis), and every request gets one."""
    group = [limiters(shared_redis, 7, poll_interval=0.05) for _ in range(5)]
    in_flight = peak = done = 0

    async def one(limiter: FleetLimiter) -> None:
        nonlocal in_flight, peak, done
        lease = await limiter.acquire(DEADLINE)
        in_flight += 1
        peak = max(peak, in_flight)
        seen = limiter.statistics().fleet_in_use
        assert seen is not None and seen <= 7
        await anyio.sleep(0.005)
        in_flight -= 1
        lease.release()
        done += 1

    async with anyio.create_task_group() as tg:
        for limiter in group:
            for _ in range(20):
                tg.start_soon(one, limiter)
    assert done == 100 and 1 < peak <= 7
    stats = [limiter.statistics() for limiter in group]
    assert sum(s.acquired for s in stats) == 100
    assert all(s.held == s.held_local == s.waiting == 0 for s in stats)
    assert all(s.fallbacks == s.timeouts == s.lost == 0 for s in stats)
    await until(lambda: in_redis(shared_redis, group[0]) == 0)


async def test_a_burst_beyond_the_connection_pool_is_queued_not_failed(
    shared_redis: RedisServer, limiters: Callable[..., FleetLimiter]
) -> None:
    """150 acquires at once on one limiter (redis-py's pool holds 100 connections): all
    are admitted; none fails as if Redis were unavailable."""
    limiter = limiters(shared_redis, 200)
    leases: list[Lease] = []

    async def one() -> None:
        leases.append(await limiter.acquire(DEADLINE))

    async with anyio.create_task_group() as tg:
        for _ in range(150):
            tg.start_soon(one)
    stats = limiter.statistics()
    assert (len(leases), stats.held, stats.outages, stats.rejected) == (150, 150, 0, 0)
    assert in_redis(shared_redis, limiter) == 150
    for lease in leases:
        lease.release()
    await until(lambda: in_redis(shared_redis, limiter) == 0)


@pytest.mark.parametrize("seed", range(int(os.environ.get("BULKHEAD_FLEET_SCHEDULES", "2"))))
async def test_random_schedules_of_acquire_cancel_and_release(
    shared_redis: RedisServer, limiters: Callable[..., FleetLimiter], seed: int
) -> None:
    """3 limiters, limit 4, 60 requests with random budgets (some 0), cancellations at
    random points and holding times: never more than 4 leases held, every request ends
    (lease, AcquireTimeout or cancelled), and afterwards nothing is held or queued
    anywhere, in the limiters or in Redis.  ``BULKHEAD_FLEET_SCHEDULES`` runs more."""
    rng = random.Random(seed)
    group = [limiters(shared_redis, 4, poll_interval=0.05) for _ in range(3)]
    holding = peak = 0
    outcomes: list[str] = []

    async def one(limiter: FleetLimiter, budget: float, hold: int, cancel_at: float) -> None:
        nonlocal holding, peak
        with anyio.move_on_after(cancel_at) as scope:
            try:
                lease = await limiter.acquire(budget)
            except AcquireTimeout:
                outcomes.append("timeout")
                return
            holding += 1
            peak = max(peak, holding)
            try:
                for _ in range(hold):
                    await anyio.sleep(0)
            finally:
                holding -= 1
                lease.release()
            outcomes.append("lease")
        if scope.cancelled_caught:
            outcomes.append("cancelled")

    async with anyio.create_task_group() as tg:
        for _ in range(60):
            budget = rng.choice([0, 0.05, 0.5, DEADLINE])
            cancel_at = rng.choice([math.inf, math.inf, rng.uniform(0, 0.05)])
            tg.start_soon(one, rng.choice(group), budget, rng.randint(0, 20), cancel_at)
            if rng.random() < 0.3:
                await anyio.sleep(0)
    assert len(outcomes) == 60 and peak <= 4, (outcomes, peak)
    assert "lease" in outcomes
    for limiter in group:
        stats = limiter.statistics()
        assert (stats.held, stats.held_local, stats.waiting) == (0, 0, 0)
        assert (stats.fallbacks, stats.outages, stats.lost) == (0, 0, 0)
    await until(lambda: in_redis(shared_redis, group[0]) == 0)  # no phantom lease


async def test_one_round_trip_per_uncontended_acquire(
    shared_redis: RedisServer, limiters: Callable[..., FleetLimiter]
) -> None:
    limiter = limiters(shared_redis, 3)
    lease = await limiter.acquire(DEADLINE)
    assert limiter.statistics().round_trips == 1 and lease.fleet
    assert limiter.statistics().fleet_in_use == 1
    lease.release()
    lease.release()  # idempotent
    await until(lambda: limiter.statistics().round_trips == 2)  # the batched removal
    assert in_redis(shared_redis, limiter) == 0
    now = await limiter.acquire(0)  # "never wait" still asks once
    assert now.fleet and limiter.statistics().round_trips == 3
    now.release()


async def test_fifo_within_a_process_and_round_robin_between_processes(
    shared_redis: RedisServer, limiters: Callable[..., FleetLimiter]
) -> None:
    """Limit 1.  Process A queues 5 requests, then process B one: B is served second (A's
    first request took the lease and sent A to the back of the line), not sixth; A's
    requests are served in their arrival order."""
    holder, a, b = (limiters(shared_redis, 1, poll_interval=30.0) for _ in range(3))
    lease = await holder.acquire(DEADLINE)
    order: list[str] = []

    async def request(limiter: FleetLimiter, tag: str) -> None:
        got = await limiter.acquire(DEADLINE)
        order.append(tag)
        got.release()

    waiters = f"{holder.config.key}:waiters"
    async with anyio.create_task_group() as tg:
        for i in range(5):
            tg.start_soon(request, a, f"a{i}")
            await until(lambda i=i: a.statistics().waiting == i + 1)  # type: ignore[misc]
        await until(lambda: shared_redis.client().zcard(waiters) == 1)
        tg.start_soon(request, b, "b")
        await until(lambda: shared_redis.client().zcard(waiters) == 2)
        lease.release()
    assert order.index("b") == 1, order
    assert [tag for tag in order if tag != "b"] == [f"a{i}" for i in range(5)]


async def test_a_release_elsewhere_wakes_a_waiter_before_any_poll(
    shared_redis: RedisServer, limiters: Callable[..., FleetLimiter]
) -> None:
    """The waiter polls every 15-45 s and the lease would expire in 30 s: only the pub/sub
    announcement of the release can get it a lease within its 5 s budget."""
    holder = limiters(shared_redis, 1, lease=30.0)
    waiter = limiters(shared_redis, 1, lease=30.0, poll_interval=30.0)
    lease = await holder.acquire(DEADLINE)
    got: list[Lease] = []

    async def wait() -> None:
        got.append(await waiter.acquire(5.0))

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await until(lambda: waiter.statistics().waiting == 1)
        await until(lambda: waiter.statistics().subscribed)
        lease.release()
    assert got and got[0].fleet
    got[0].release()


async def test_timeout_names_the_limit_and_counts(
    shared_redis: RedisServer, limiters: Callable[..., FleetLimiter]
) -> None:
    holder, other = limiters(shared_redis, 2), limiters(shared_redis, 2)
    leases = [await holder.acquire(DEADLINE) for _ in range(2)]
    request = httpx.Request("GET", "http://127.0.0.1/")
    with pytest.raises(AcquireTimeout, match=r"fleet in use 2 of limit=2") as info:
        await other.acquire(0.2, request)
    assert info.value.request is request
    assert isinstance(info.value, httpx.PoolTimeout)
    with pytest.raises(AcquireTimeout):
        await other.acquire(0)
    stats = other.statistics()
    assert (stats.timeouts, stats.waiting, stats.acquired) == (2, 0, 0)
    for lease in leases:
        lease.release()
    (await other.acquire(DEADLINE)).release()


async def test_cancelled_waiters_leave_the_queue_in_order(
    shared_redis: RedisServer, limiters: Callable[..., FleetLimiter]
) -> None:
    holder, waiter = limiters(shared_redis, 1), limiters(shared_redis, 1, poll_interval=0.05)
    lease = await holder.acquire(DEADLINE)
    got: list[str] = []
    scopes: dict[str, anyio.CancelScope] = {}

    async def request(tag: str) -> None:
        with anyio.CancelScope() as scope:
            scopes[tag] = scope
            got.append(tag)
            (await waiter.acquire(DEADLINE)).release()
            got.append(f"{tag} done")

    async with anyio.create_task_group() as tg:
        for i, tag in enumerate(["head", "middle", "tail"]):
            tg.start_soon(request, tag)
            await until(lambda i=i: waiter.statistics().waiting == i + 1)  # type: ignore[misc]
        scopes["head"].cancel()  # the head, possibly mid round trip
        scopes["tail"].cancel()
        await until(lambda: waiter.statistics().waiting == 1)
        lease.release()
    assert got == ["head", "middle", "tail", "middle done"]
    assert waiter.statistics().waiting == 0
    await until(lambda: in_redis(shared_redis, waiter) == 0)  # no phantom lease left


async def test_release_from_another_thread(
    shared_redis: RedisServer, limiters: Callable[..., FleetLimiter]
) -> None:
    limiter = limiters(shared_redis, 1)
    lease = await limiter.acquire(DEADLINE)
    thread = threading.Thread(target=lease.release)
    thread.start()
    thread.join()
    await until(lambda: limiter.statistics().held == 0 and in_redis(shared_redis, limiter) == 0)
    (await limiter.acquire(0.5)).release()


async def test_aclose_wakes_waiters_and_returns_held_leases(
    shared_redis: RedisServer, limiters: Callable[..., FleetLimiter]
) -> None:
    limiter = limiters(shared_redis, 1)
    lease = await limiter.acquire(DEADLINE)
    outcome: list[BaseException] = []

    async def wait() -> None:
        try:
            await limiter.acquire(DEADLINE)
        except TransportClosed as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await until(lambda: limiter.statistics().waiting == 1)
        await limiter.aclose()
    assert len(outcome) == 1
    assert in_redis(shared_redis, limiter) == 0 and lease.released
    with pytest.raises(TransportClosed):
        await limiter.acquire(1.0)


async def test_a_client_of_the_callers_with_bytes_replies(
    shared_redis: RedisServer, unique: Callable[[str], str]
) -> None:
    """A ``redis.asyncio.Redis`` passed in (``decode_responses=False``) works, including a
    lost lease's id coming back as bytes, and is not closed by ``aclose``."""
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(shared_redis.url)
    try:
        limiter = FleetLimiter(RedisFleetLimit(client, key=unique("own"), limit=1, lease=0.5))
        lease = await limiter.acquire(DEADLINE)
        shared_redis.client().delete(f"{limiter.config.key}:leases")
        await until(lambda: limiter.statistics().lost == 1)
        assert lease.lost
        lease.release()
        await limiter.aclose()
        assert await client.ping()
    finally:
        await client.aclose()


# ---------------------------------------------------------------------------- leases


async def test_renewal_keeps_a_long_holders_lease(
    shared_redis: RedisServer, limiters: Callable[..., FleetLimiter]
) -> None:
    """Lease 0.5 s, renewed every 1/6 s: after 4 renewals (past the lease time) the lease is
    still held in Redis, and nobody else gets in."""
    holder, other = limiters(shared_redis, 1, lease=0.5), limiters(shared_redis, 1, lease=0.5)
    lease = await holder.acquire(DEADLINE)
    started = time.monotonic()
    await until(lambda: holder.statistics().renewals >= 4)
    assert time.monotonic() - started > 0.5  # longer than one lease
    with pytest.raises(AcquireTimeout):
        await other.acquire(0)
    assert in_redis(shared_redis, holder) == 1 and holder.statistics().lost == 0
    lease.release()
    (await other.acquire(DEADLINE)).release()


async def test_a_lost_lease_is_counted_logged_and_counted_again(
    shared_redis: RedisServer,
    limiters: Callable[..., FleetLimiter],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis forgets the lease (here: the key is deleted): the next renewal reports it lost
    (counted, logged); the request goes on, and the renewal after adopts it again."""
    holder = limiters(shared_redis, 1, lease=0.6)
    lease = await holder.acquire(DEADLINE)
    key = f"{holder.config.key}:leases"
    with caplog.at_level(logging.WARNING, logger="httpx_bulkhead"):
        shared_redis.client().delete(key)
        await until(lambda: holder.statistics().lost == 1)
        assert lease.lost and not lease.released
        assert "1 lease(s) lost" in caplog.text
        await until(lambda: holder.statistics().held == 1)  # adopted again
    assert shared_redis.client().zscore(key, lease.id) is not None
    assert holder.statistics().held_local == 0
    lease.release()
    await until(lambda: in_redis(shared_redis, holder) == 0)


# ---------------------------------------------------------------------------- faults


def _warnings(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(1 for r in caplog.records if r.levelno == logging.WARNING and text in r.getMessage())


async def test_redis_stopped_then_restarted_with_local_fallback(
    redis_server: RedisServer,
    limiters: Callable[..., FleetLimiter],
    caplog: pytest.LogCaptureFixture,
) -> None:
    limiter = limiters(
        redis_server,
        2,
        on_unavailable="local",
        lease=1.0,
        redis_timeout=0.2,
        retry_interval=0.2,
        poll_interval=0.05,
    )
    first = await limiter.acquire(DEADLINE)
    with caplog.at_level(logging.WARNING, logger="httpx_bulkhead"):
        redis_server.stop()
        fallback = []
        for _ in range(3):  # past the fleet limit: only the local limit applies now
            started = time.monotonic()
            fallback.append(await limiter.acquire(2.0))
            assert time.monotonic() - started < 1.0
        assert not any(lease.fleet for lease in fallback)
        stats = limiter.statistics()
        assert (stats.available, stats.outages, stats.fallbacks) == (False, 1, 3)
        assert stats.held_local == 3
        assert _warnings(caplog, "Redis is unavailable") == 1  # once per transition

        redis_server.start()  # empty: every lease is gone
        await until(lambda: limiter.statistics().held == 4)  # all adopted, `first` as lost
        assert _warnings(caplog, "answers again") == 1
    stats = limiter.statistics()
    assert stats.available and stats.held_local == 0 and stats.lost == 1
    assert first.lost and in_redis(redis_server, limiter) == 4
    # the limit holds again: 4 running requests are counted against limit=2
    with pytest.raises(AcquireTimeout):
        await limiter.acquire(0.3)
    for lease in [first, *fallback]:
        lease.release()
    await until(lambda: in_redis(redis_server, limiter) == 0)
    leases = [await limiter.acquire(DEADLINE) for _ in range(2)]
    with pytest.raises(AcquireTimeout):
        await limiter.acquire(0.2)
    for lease in leases:
        lease.release()
    assert limiter.statistics().held == limiter.statistics().held_local == 0


async def test_redis_stopped_then_restarted_with_reject(
    redis_server: RedisServer, limiters: Callable[..., FleetLimiter]
) -> None:
    limiter = limiters(
        redis_server, 2, on_unavailable="reject", lease=1.0, redis_timeout=0.2, retry_interval=0.2
    )
    held = await limiter.acquire(DEADLINE)
    redis_server.stop()
    request = httpx.Request("GET", "http://127.0.0.1/")
    started = time.monotonic()
    with pytest.raises(FleetUnavailable, match=r"Redis is unavailable .*'reject'") as info:
        await limiter.acquire(2.0, request)
    assert time.monotonic() - started < 1.0 and info.value.request is request
    trips = limiter.statistics().round_trips
    with pytest.raises(FleetUnavailable, match="retrying later"):
        await limiter.acquire(2.0)  # within retry_interval: refused without asking
    assert limiter.statistics().round_trips == trips
    assert limiter.statistics().rejected == 2

    redis_server.start()
    recovered: list[Lease] = []

    async def recover() -> bool:
        try:
            recovered.append(await limiter.acquire(1.0))
        except FleetUnavailable:
            return False
        return True

    with anyio.fail_after(DEADLINE):
        while not await recover():
            await anyio.sleep(0.05)
    # `held` (lost with Redis's data) is adopted again; with it, the limit of 2 is full
    await until(lambda: held.lost and limiter.statistics().held == 2)
    assert in_redis(redis_server, limiter) == 2
    with pytest.raises(AcquireTimeout):
        await limiter.acquire(0.2)
    held.release()
    recovered[0].release()
    await until(lambda: in_redis(redis_server, limiter) == 0)


@pytest.mark.parametrize("mode", ["local", "reject"])
async def test_paused_redis_never_holds_a_request_past_its_budget(
    redis_server: RedisServer, limiters: Callable[..., FleetLimiter], mode: str
) -> None:
    """SIGSTOP: connections stay open and nothing answers.  Each acquire returns or raises
    within its budget; after SIGCONT, ids cut mid-call are removed (no phantom lease)."""
    limiter = limiters(
        redis_server, 2, on_unavailable=mode, lease=30.0, redis_timeout=0.3, retry_interval=0.2
    )
    (await limiter.acquire(DEADLINE)).release()  # connections exist
    await until(lambda: in_redis(redis_server, limiter) == 0)
    redis_server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(AcquireTimeout):  # the budget (0.1) cuts the call: a timeout
            await limiter.acquire(0.1)
        assert time.monotonic() - started < 1.0
        assert limiter.statistics().available  # a cut call does not make Redis "down"
        with anyio.move_on_after(0.05) as scope:  # cancelled mid round trip
            await limiter.acquire(None)
        assert scope.cancelled_caught
        started = time.monotonic()
        if mode == "local":
            lease = await limiter.acquire(1.5)
            assert not lease.fleet and limiter.statistics().fallbacks == 1
            lease.release()
        else:
            with pytest.raises(FleetUnavailable):
                await limiter.acquire(1.5)
        assert time.monotonic() - started < 1.5
        assert not limiter.statistics().available
    finally:
        redis_server.resume()
    leases: list[Lease] = []

    async def recovered() -> bool:
        try:
            leases.append(await limiter.acquire(1.0))
        except FleetUnavailable:
            return False
        return leases[-1].fleet

    with anyio.fail_after(DEADLINE):
        while not await recovered():
            await anyio.sleep(0.05)
    for lease in leases:
        lease.release()
    # ids of calls cut while paused were sent for removal once Redis answered
    await until(lambda: in_redis(redis_server, limiter) == 0)
    assert limiter.statistics().available


async def test_redis_never_reachable_falls_back_from_the_start(
    unique: Callable[[str], str], caplog: pytest.LogCaptureFixture
) -> None:
    """A URL nobody listens on: "local" admits, "reject" raises; no redis-py exception,
    and the URL's password is in no message."""
    from tests.servers.redis import free_port

    url = f"redis://user:s3cr3t@127.0.0.1:{free_port()}/0"
    local = FleetLimiter(RedisFleetLimit(url, key=unique("k"), limit=1, redis_timeout=0.5))
    reject = FleetLimiter(RedisFleetLimit(url, key=unique("k"), limit=1, on_unavailable="reject"))
    try:
        with caplog.at_level(logging.WARNING, logger="httpx_bulkhead"):
            assert not (await local.acquire(1.0)).fleet
            with pytest.raises(FleetUnavailable, match="ConnectionError") as info:
                await reject.acquire(1.0)
        assert "s3cr3t" not in str(info.value) and "s3cr3t" not in caplog.text
        assert _warnings(caplog, "Redis is unavailable") == 2
    finally:
        await local.aclose()
        await reject.aclose()


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_trio_is_refused_naming_the_backend(
    shared_redis: RedisServer, unique: Callable[[str], str]
) -> None:
    """redis-py's asyncio client cannot run under trio: the first acquire says so."""
    limiter = FleetLimiter(RedisFleetLimit(shared_redis.url, key=unique("k"), limit=1))
    with pytest.raises(RuntimeError, match=r"needs asyncio.*cannot run under trio"):
        await limiter.acquire(1.0)
    await limiter.aclose()
