"""Adaptive limits against a real server (hypercorn), under asyncio and trio.

The latencies the algorithm sees are made with gates and the transport's injected clock,
not with time: a round of requests parks at a gate, the test moves the clock by the
latency it wants the round to have, then opens the gate.  Assertions read
``statistics()``.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable

import anyio
import httpx
import pytest

from httpx_bulkhead import AcquireTimeout, AdaptiveLimit, BulkheadFull, BulkheadTransport, Policy
from httpx_bulkhead._adaptive import FIRST_PROBE_SAMPLES
from tests.conftest import until
from tests.servers import HypercornServer, TestApp

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def one_round(
    client: httpx.AsyncClient,
    transport: BulkheadTransport,
    name: str,
    app: TestApp,
    gate_name: str,
    clock: Clock,
    latency: Callable[[int], float],
) -> int:
    """As many requests as the limit allows park at a gate; the clock moves by
    ``latency(limit)``; the gate opens; all complete.  Returns the limit they ran under."""
    stats = transport.statistics().get(name)
    limit = 1 if stats is None else stats.limit  # (the first probe runs at min_limit)
    gate = app.gate(gate_name)
    url = f"/gate/{gate_name}"
    async with anyio.create_task_group() as tg:
        for _ in range(limit):
            tg.start_soon(client.get, url)
        await until(
            lambda: gate.entered == limit,
            state=lambda: (gate.entered, limit, transport.statistics()[name]),
        )
        assert transport.statistics()[name].running == limit
        clock.now += latency(limit)
        gate.open()
    return limit


def waiting_is(transport: BulkheadTransport, name: str, n: int) -> Callable[[], bool]:
    return lambda: transport.statistics()[name].waiting == n


def dependency(service: float, capacity: int) -> Callable[[int], float]:
    """A server of ``capacity`` workers and a queue: latency grows with the requests in
    flight above ``capacity``."""
    return lambda limit: service * max(1.0, limit / capacity)


async def test_the_limit_falls_as_the_server_slows_and_rises_as_it_recovers(
    server: HypercornServer, app: TestApp, unique: Callable[[str], str]
) -> None:
    clock = Clock()
    spec = AdaptiveLimit(min_limit=1, max_limit=32, initial_limit=8, probe_interval=None)
    transport = BulkheadTransport(default=Policy(max_concurrency=spec), _clock=clock)
    name = server.url
    async with httpx.AsyncClient(transport=transport, base_url=server.url, timeout=10) as client:

        async def run(rounds: int, latency: Callable[[int], float]) -> list[int]:
            return [
                await one_round(client, transport, name, app, unique("a"), clock, latency)
                for _ in range(rounds)
            ]

        # The first probe (at min_limit) measures the no-load latency.
        await run(FIRST_PROBE_SAMPLES, dependency(0.1, 8))
        stats = transport.statistics()[name]
        assert stats.no_load_latency == pytest.approx(0.1)
        healthy = await run(30, dependency(0.1, 8))
        assert 8 <= healthy[-1] <= 11, healthy  # near 8 workers, at most tolerance x 8 + 1
        # The server slows down under load: 2 workers.
        slowed = await run(30, dependency(0.1, 2))
        assert slowed[-1] <= 3, slowed
        assert transport.statistics()[name].limit <= 3
        # It recovers.
        recovered = await run(30, dependency(0.1, 8))
        assert recovered[-1] >= 8, recovered
        final = transport.statistics()[name]
        history = [limit for _, limit in final.limit_history]
        assert min(history) <= 3 and history[-1] == final.limit >= 8
        assert [t for t, _ in final.limit_history] == sorted(t for t, _ in final.limit_history)
        assert final.acquired == final.completed and final.running == final.waiting == 0
        assert "adaptive, no-load latency 100.0 ms" in str(final)


async def test_a_live_limit_change_keeps_fifo_max_pending_and_acquire_timeout(
    server: HypercornServer, app: TestApp, unique: Callable[[str], str]
) -> None:
    """AIMD with a read timeout as the drop: the limit falls from 4 to 2 under 4 holders
    and 3 waiters; nobody is admitted until running < 2; then successes raise it and the
    waiters are admitted in their order; the queue bound and the acquire timeout hold."""
    spec = AdaptiveLimit(algorithm="aimd", min_limit=1, max_limit=8, initial_limit=4, backoff=0.5)
    transport = BulkheadTransport(default=Policy(max_concurrency=spec, max_pending=3))
    name = server.url
    holders = [app.gate(unique("h")) for _ in range(4)]
    waiters = [app.gate(unique("w")) for _ in range(3)]
    async with httpx.AsyncClient(transport=transport, base_url=server.url, timeout=10) as client:

        async def get(gate_name: str, timeout: httpx.Timeout | None = None) -> None:
            try:
                response = await client.get(f"/gate/{gate_name}", timeout=timeout or 10)
                assert response.status_code == 200
            except httpx.ReadTimeout:
                pass

        async with anyio.create_task_group() as tg:
            for gate in holders[1:]:
                tg.start_soon(get, gate.name)
            await until(lambda: sum(g.entered for g in holders) == 3)
            # The read timeout of holder 0 is a drop: 4 -> 2, below the 3 still running.
            # (Whether the server saw it before the client gave up does not matter here.)
            tg.start_soon(get, holders[0].name, httpx.Timeout(10, read=0.05))
            await until(lambda: transport.statistics()[name].limit == 2)
            assert transport.statistics()[name].running == 3
            for i, gate in enumerate(waiters):
                tg.start_soon(get, gate.name)
                await until(waiting_is(transport, name, i + 1))
                if i == 1:  # a queue place left: it waits, and times out as with a static limit
                    with pytest.raises(AcquireTimeout):
                        await client.get("/", timeout=httpx.Timeout(10, pool=0.05))
            with pytest.raises(BulkheadFull):  # max_pending holds with the adaptive limit
                await client.get("/")
            stats = transport.statistics()[name]
            assert (stats.running, stats.waiting, stats.limit) == (3, 3, 2)

            def admitted() -> list[int]:
                return [i for i, gate in enumerate(waiters) if gate.entered]

            holders[1].open()  # running 3 -> 2: still not below the limit
            await until(lambda: holders[1].passed == 1)
            await until(lambda: transport.statistics()[name].running == 2)
            assert admitted() == [] and transport.statistics()[name].waiting == 3
            holders[2].open()  # running would fall below 2: the head waiter gets the slot
            await until(lambda: admitted() == [0])
            holders[3].open()  # successes raise the limit: the others follow, in order
            await until(lambda: len(admitted()) == 3)
            for gate in waiters:
                gate.open()
    final = transport.statistics()[name]
    assert final.running == final.waiting == 0
    assert final.acquired == final.completed + final.failed + final.cancelled
    assert final.acquire_timeouts == 1 and final.rejected == 1
    history = [limit for _, limit in final.limit_history]
    assert history[:2] == [4, 2] and history[-1] == final.limit >= 3


async def test_cancellation_at_every_await_leaves_the_counters_consistent(
    server: HypercornServer, app: TestApp, unique: Callable[[str], str]
) -> None:
    """A request cancelled after 0, 1, 2, ... checkpoints of its own (whichever await it
    is in then: the slot queue, the connect, the write, the read of the head or body)."""
    spec = AdaptiveLimit(min_limit=1, max_limit=4, initial_limit=2)
    transport = BulkheadTransport(default=Policy(max_concurrency=spec, max_pending=None))
    name = server.url
    async with httpx.AsyncClient(transport=transport, base_url=server.url, timeout=10) as client:
        for steps in itertools.chain(range(40), range(40, 400, 20)):
            async with anyio.create_task_group() as tg:
                for path in ("/", "/bytes/200000", "/stream/20"):
                    with anyio.CancelScope() as scope:

                        async def cancel_after(n: int, scope: anyio.CancelScope = scope) -> None:
                            for _ in range(n):
                                await anyio.sleep(0)
                            scope.cancel()

                        tg.start_soon(cancel_after, steps)
                        response = await client.get(path)
                        assert response.status_code == 200
            stats = transport.statistics()[name]
            assert stats.running == stats.waiting == 0, (steps, stats)
            assert stats.acquired == stats.completed + stats.failed + stats.cancelled, stats
            assert 1 <= stats.limit <= 4
        response = await client.get("/")  # the next request succeeds
        assert response.status_code == 200
    final = transport.statistics()[name]
    assert final.cancelled + final.cancelled_waiting > 0 and final.completed > 0


async def test_the_exporters_follow_the_adaptive_limit(
    server: HypercornServer, app: TestApp, unique: Callable[[str], str]
) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from httpx_bulkhead.prometheus import BulkheadCollector

    clock = Clock()
    spec = AdaptiveLimit(initial_limit=6, probe_interval=None, drop_statuses={503})
    transport = BulkheadTransport(default=Policy(max_concurrency=spec), _clock=clock)
    registry = CollectorRegistry()
    registry.register(BulkheadCollector(transport))
    name = server.url
    label = f'compartment="{name}"'
    async with httpx.AsyncClient(transport=transport, base_url=server.url, timeout=10) as client:
        for _ in range(FIRST_PROBE_SAMPLES):  # the first probe
            await one_round(client, transport, name, app, unique("e"), clock, lambda n: 0.25)
        stats = transport.statistics()[name]
        assert (stats.limit, stats.no_load_latency) == (6, 0.25)
        scraped = generate_latest(registry).decode()
        assert f"httpx_bulkhead_concurrency_limit{{{label}}} 6.0" in scraped
        assert f"httpx_bulkhead_no_load_latency_seconds{{{label}}} 0.25" in scraped
        for _ in range(8):  # 503s are drops here: the limit is cut, and the scrape follows
            assert (await client.get("/status/503")).status_code == 503
        limit = transport.statistics()[name].limit
        assert limit < 6
        assert f"httpx_bulkhead_concurrency_limit{{{label}}} {limit:.1f}" in (
            generate_latest(registry).decode()
        )
    static = BulkheadTransport(default=Policy(max_concurrency=3))
    registry = CollectorRegistry()
    registry.register(BulkheadCollector(static))
    async with httpx.AsyncClient(transport=static, base_url=server.url, timeout=10) as client:
        await client.get("/")
    assert static.statistics()[name].no_load_latency is None
    assert "httpx_bulkhead_no_load_latency_seconds{" not in generate_latest(registry).decode()


async def test_each_change_of_the_limit_is_logged_and_alone_if_asked_alone(
    server: HypercornServer,
    app: TestApp,
    unique: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``httpx_bulkhead.adaptive`` at DEBUG: one line per change of the limit, with the
    compartment, the limits and the algorithm's reason, matching ``limit_history``; the
    parent's per-request DEBUG lines (a rejection) stay off unless the parent is on too."""
    caplog.set_level(logging.DEBUG, logger="httpx_bulkhead.adaptive")
    clock = Clock()
    spec = AdaptiveLimit(min_limit=1, max_limit=32, initial_limit=8, probe_interval=None)
    policy = Policy(max_concurrency=spec, max_pending=0)
    transport = BulkheadTransport(default=policy, _clock=clock)
    name = server.url

    async with httpx.AsyncClient(transport=transport, base_url=server.url, timeout=10) as client:

        async def run(rounds: int, latency: Callable[[int], float]) -> None:
            for _ in range(rounds):
                await one_round(client, transport, name, app, unique("r"), clock, latency)

        async def rejected() -> None:
            """One request over the limit while a round holds every slot."""
            limit = transport.statistics()[name].limit
            gate_name = unique("full")
            gate = app.gate(gate_name)
            async with anyio.create_task_group() as tg:
                for _ in range(limit):
                    tg.start_soon(client.get, f"/gate/{gate_name}")
                await until(
                    lambda: gate.entered == limit,
                    state=lambda: (gate.entered, limit, transport.statistics()[name]),
                )
                with pytest.raises(BulkheadFull):
                    await client.get("/")
                gate.open()

        await run(FIRST_PROBE_SAMPLES, dependency(0.1, 8))  # the first probe: 1 -> 8
        await run(20, dependency(0.1, 2))  # 2 workers: cut
        await rejected()
        final = transport.statistics()[name]
        records = [r for r in caplog.records if r.name.startswith("httpx_bulkhead")]
        assert {r.name for r in records} == {"httpx_bulkhead.adaptive"}  # no rejection line
        fields = [
            (r.__dict__["previous"], r.__dict__["limit"], r.__dict__["reason"]) for r in records
        ]
        history = [limit for _, limit in final.limit_history]
        assert [(p, n) for p, n, _ in fields] == list(itertools.pairwise(history))
        assert fields[0] == (1, 8, "probed") and "queue" in [why for _, _, why in fields]
        assert {r.__dict__["compartment"] for r in records} == {name}
        assert records[0].getMessage() == (
            f"compartment {name!r}: adaptive limit 1 -> 8 (probed: no-load latency 100.0 ms)"
        )
        # The parent on too: the rejection's own line (so the check above could fail).
        caplog.set_level(logging.DEBUG, logger="httpx_bulkhead")
        await rejected()
        events = [r.__dict__["event"] for r in caplog.records if r.name == "httpx_bulkhead"]
        assert "rejected" in events, events
