"""Isolation between compartments and the queue rules, against hypercorn on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import httpx
import pytest

from httpx_bulkhead import AcquireTimeout, BulkheadFull, BulkheadTransport, Policy, RequestTimeout
from httpx_bulkhead._stats import quantile
from tests.conftest import until
from tests.flavours import Flavour, client_for, make_transport
from tests.servers import HypercornServer, TestApp

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("http1_parser")]


async def test_gate_isolation_and_queue_rules(app: TestApp, unique: Callable[[str], str]) -> None:
    """A's only slot is held; a second A request waits without starting; B is served;
    a cancelled A waiter never runs; after the gate opens the queued one completes."""
    gate = app.gate(unique("iso"))
    with HypercornServer(app) as a, HypercornServer(app) as b:
        key = f"127.0.0.1:{a.port}"
        transport = BulkheadTransport(hosts={key: Policy(max_concurrency=1)})
        stats = transport.statistics
        results: dict[str, httpx.Response] = {}
        async with httpx.AsyncClient(transport=transport, timeout=10) as client:

            async def call(name: str) -> None:
                results[name] = await client.get(f"{a.url}/gate/{gate.name}")

            async with anyio.create_task_group() as tg:
                tg.start_soon(call, "holder")
                await gate.until_entered(1)
                tg.start_soon(call, "queued")
                await until(lambda: stats()[key].waiting == 1)

                # B is served while A is saturated.
                assert (await client.get(f"{b.url}/")).text == "hello"

                # A third A request, cancelled while queued, never reaches the server.
                scope = anyio.CancelScope()

                async def cancelled() -> None:
                    with scope:
                        await client.get(f"{a.url}/gate/{gate.name}")
                    results["cancelled"] = httpx.Response(499)

                tg.start_soon(cancelled)
                await until(lambda: stats()[key].waiting == 2)
                scope.cancel()
                await until(lambda: stats()[key].waiting == 1)
                assert stats()[key].cancelled_waiting == 1
                assert gate.entered == 1  # the queued one has not started
                assert stats()[key].running == 1
                gate.open()

        assert results["holder"].status_code == results["queued"].status_code == 200
        assert results["cancelled"].status_code == 499
        assert gate.entered == 2  # holder and queued; the cancelled waiter never ran
        snapshot = stats()[key]
        assert (snapshot.running, snapshot.waiting, snapshot.acquired) == (0, 0, 2)
        assert results["queued"].extensions["bulkhead"].queue_wait > 0


async def test_burst_never_exceeds_the_limit(
    server: HypercornServer, app: TestApp, flavour: Flavour
) -> None:
    bucket = f"127.0.0.1:{server.port}"
    transport = make_transport(flavour, hosts={bucket: Policy(max_concurrency=5)})
    async with client_for(transport, timeout=httpx.Timeout(10, pool=None)) as c:
        statuses: list[int] = []

        async def call() -> None:
            statuses.append((await c.get(f"{server.url}/stream/4")).status_code)

        async with anyio.create_task_group() as tg:
            for _ in range(500):
                tg.start_soon(call)
    assert statuses == [200] * 500
    assert 1 <= app.max_concurrent(bucket) <= 5
    snapshot = transport.statistics()[bucket]
    assert snapshot.acquired == snapshot.completed == 500
    assert snapshot.connections_created <= 5
    assert (snapshot.running, snapshot.waiting, snapshot.in_use_connections) == (0, 0, 0)


async def test_full_queue_rejects_at_once(
    server: HypercornServer,
    app: TestApp,
    unique: Callable[[str], str],
    flavour: Flavour,
) -> None:
    gate = app.gate(unique("full"))
    key = f"127.0.0.1:{server.port}"
    transport = make_transport(flavour, hosts={key: Policy(max_concurrency=1, max_pending=1)})
    async with client_for(transport, timeout=10) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.get, f"{server.url}/gate/{gate.name}")
            tg.start_soon(client.get, f"{server.url}/gate/{gate.name}")
            await until(lambda: transport.statistics()[key].waiting == 1)
            with pytest.raises(BulkheadFull) as info:
                await client.get(f"{server.url}/")
            assert isinstance(info.value, httpx.TransportError)
            assert transport.statistics()[key].rejected == 1
            gate.open()


async def test_exhaustion_same_compartment_times_out_other_host_is_served(
    app: TestApp,
    unique: Callable[[str], str],
    flavour: Flavour,
) -> None:
    """4 slow calls fill a compartment of 4: fast calls to it fail with AcquireTimeout,
    fast calls to another host all succeed; a request_timeout brings the slots back."""
    gate = app.gate(unique("slow"))
    with HypercornServer(app) as slow, HypercornServer(app) as fast:
        slow_key = f"127.0.0.1:{slow.port}"
        transport = make_transport(
            flavour, hosts={slow_key: Policy(max_concurrency=4, acquire_timeout=0.05)}
        )
        async with client_for(transport, timeout=10) as client:
            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    tg.start_soon(client.get, f"{slow.url}/gate/{gate.name}")
                await gate.until_entered(4)
                for _ in range(3):
                    with pytest.raises(AcquireTimeout):
                        await client.get(f"{slow.url}/")
                fast_results = [(await client.get(f"{fast.url}/")).status_code for _ in range(20)]
                assert fast_results == [200] * 20
                slow_stats = transport.statistics()[slow_key]
                assert slow_stats.acquire_timeouts == 3
                assert slow_stats.wait_max >= 0.04  # the failed waits are in the quantiles
                gate.open()

    # Recovery: the same, with a request_timeout on the slow compartment.
    gate2 = app.gate(unique("slow"))
    with HypercornServer(app) as slow:
        slow_key = f"127.0.0.1:{slow.port}"
        transport = make_transport(
            flavour, hosts={slow_key: Policy(max_concurrency=4, request_timeout=0.3)}
        )
        async with client_for(transport, timeout=10) as client:
            failures: list[BaseException] = []

            async def slow_call() -> None:
                try:
                    await client.get(f"{slow.url}/gate/{gate2.name}")
                except RequestTimeout as exc:
                    failures.append(exc)

            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    tg.start_soon(slow_call)
            assert len(failures) == 4
            assert all(isinstance(f, httpx.TimeoutException) for f in failures)
            snapshot = transport.statistics()[slow_key]
            assert snapshot.running == 0 and snapshot.unknown_state == 4
            assert (await client.get(f"{slow.url}/")).status_code == 200
        gate2.open()


async def test_slot_held_until_streaming_response_is_closed(
    server: HypercornServer,
) -> None:
    key = f"127.0.0.1:{server.port}"
    transport = BulkheadTransport(hosts={key: Policy(max_concurrency=1, acquire_timeout=0)})
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:
        async with client.stream("GET", f"{server.url}/bytes/200000") as response:
            assert transport.statistics()[key].running == 1
            with pytest.raises(AcquireTimeout):
                await client.get(f"{server.url}/")
            assert response.headers["content-length"] == "200000"
        # Closed before the body was read: the connection is discarded, the slot freed.
        snapshot = transport.statistics()[key]
        assert (snapshot.running, snapshot.unknown_state, snapshot.cancelled) == (0, 1, 1)
        assert (await client.get(f"{server.url}/")).text == "hello"


async def test_wait_quantiles_are_those_of_the_waits_reported_per_request(
    server: HypercornServer, app: TestApp, unique: Callable[[str], str]
) -> None:
    """Five requests through one slot: the first waits for nothing, the others queue.  The
    snapshot's quantiles are the nearest-rank quantiles of the ``queue_wait`` each response
    reported (the same numbers, not an estimate)."""
    gate = app.gate(unique("waits"))
    transport = BulkheadTransport(default=Policy(max_concurrency=1))
    name = server.url
    waits: list[float] = []
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:

        async def call() -> None:
            response = await client.get(f"{server.url}/gate/{gate.name}")
            waits.append(response.extensions["bulkhead"].queue_wait)

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(call)
            await gate.until_entered(1)
            await until(lambda: transport.statistics()[name].waiting == 4)
            gate.open()
    stats = transport.statistics()[name]
    ordered = sorted(waits)
    assert ordered[0] == 0.0 and all(w > 0 for w in ordered[1:])
    assert (stats.wait_p50, stats.wait_p95, stats.wait_p99, stats.wait_max) == (
        quantile(ordered, 0.5),
        quantile(ordered, 0.95),
        quantile(ordered, 0.99),
        ordered[-1],
    )
    assert 0 < stats.wait_p50 <= stats.wait_p95 <= stats.wait_p99 == stats.wait_max
