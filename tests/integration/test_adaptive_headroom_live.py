"""The adaptive limit's headroom tests in a real transport, on real time, against the lab's
dependency (``benchmarks/capacity_server.js``: N workers and a FIFO queue, run by Node.js).

What the pure tests cannot show: the transport's timer (``Timers.call_later``, asyncio's
loop, trio's timer task, the sync transport's timer thread) opens a test's slot, the limiter
grants it to the head waiter, the test's verdict grows the limit when the capacity rose, and
closing the transport leaves no timer (and no thread) behind; and a dependency that sheds
its excess with fast 503s does not lure the limit into its refusals.  The callers keep more
requests waiting than the limit (an open loop above the capacity, as in the lab).
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from benchmarks.adaptive_lab import CapacityServer
from httpx_bulkhead import AdaptiveLimit, Policy
from httpx_bulkhead._adaptive import TEST_BELOW, AdaptiveController
from tests.flavours import Flavour, client_for, make_transport

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js"),
]

SERVICE_MS = 40.0
#: Seconds at 4 workers before the capacity rises to 24 (counted from the server's start).
LOW_PHASE = 3.0


@pytest.fixture
def dependency() -> Iterator[CapacityServer]:
    server = CapacityServer(1, SERVICE_MS, [(LOW_PHASE, 4), (600.0, 24)])
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The instants at which a controller's timer opened a test's slot."""
    instants: list[float] = []
    original = AdaptiveController._open

    def counting(self: AdaptiveController) -> None:
        before = self.algorithm.applied
        original(self)
        if self.algorithm.applied > before:
            instants.append(time.monotonic())

    monkeypatch.setattr(AdaptiveController, "_open", counting)
    return instants


async def test_timed_tests_run_find_the_capacity_that_rose_and_leave_no_timer(
    flavour: Flavour, dependency: CapacityServer, opened: list[float]
) -> None:
    spec = AdaptiveLimit(initial_limit=4, max_limit=64, probe_interval=None)
    transport = make_transport(flavour, default=Policy(max_concurrency=spec, max_pending=256))
    url = f"http://127.0.0.1:{dependency.ports[0]}/"
    name = f"http://127.0.0.1:{dependency.ports[0]}"
    failures: list[BaseException] = []
    done = anyio.Event()

    async def caller(client: Any) -> None:
        while not done.is_set():
            try:
                response = await client.get(url)
                assert response.status_code == 200
            except BaseException as exc:  # (reported below; the loop must not hang)
                failures.append(exc)
                raise

    async with client_for(transport, timeout=30) as client:
        stats = None
        async with anyio.create_task_group() as tg:
            for _ in range(48):  # more waiting than any limit the test reaches
                tg.start_soon(caller, client)
            dependency.command("start")
            started = time.monotonic()
            with anyio.fail_after(40):
                # The low phase: the limit settles at the 4 workers, timers open tests.
                while time.monotonic() - started < LOW_PHASE:
                    await anyio.sleep(0.05)
                low = [limit for _, limit in transport.statistics()[name].limit_history]
                # The capacity rose to 24: the tests succeed and the windows grow it on.
                while (stats := transport.statistics()[name]).limit <= TEST_BELOW + 4:
                    await anyio.sleep(0.05)
            done.set()
        assert not failures, failures
        assert stats is not None
    assert opened, "no test's slot was opened by the transport's timer"
    assert any(started < at < started + LOW_PHASE for at in opened), opened
    assert min(low[1:]) <= 5, low  # (after the first probe, at 1 slot)
    assert stats.limit > TEST_BELOW + 4
    compartment = transport._router.compartments[name]
    assert compartment.adaptive is not None and compartment.adaptive._timer is None
    if flavour == "sync":
        assert not [t for t in threading.enumerate() if t.name.startswith("httpx_bulkhead")]


@pytest.fixture
def shedding() -> Iterator[CapacityServer]:
    """4 workers, answering 503 at once to a request that finds 2 queued."""
    server = CapacityServer(1, SERVICE_MS, [(600.0, 4)], shed=2)
    try:
        yield server
    finally:
        server.close()


async def test_a_shedding_dependency_does_not_grow_the_limit_into_its_refusals(
    flavour: Flavour, shedding: CapacityServer
) -> None:
    """The dependency refuses beyond 6 in flight, with a 503 at once.  Taken as samples,
    those fast answers read as a dependency without load and the limit grew into them,
    the callers getting mostly 503s; not fed, the real answers show the queue and the limit
    comes down to the 4 workers and the queue the dependency allows."""
    spec = AdaptiveLimit(initial_limit=16, max_limit=64, probe_interval=None)
    transport = make_transport(flavour, default=Policy(max_concurrency=spec, max_pending=256))
    url = f"http://127.0.0.1:{shedding.ports[0]}/"
    name = f"http://127.0.0.1:{shedding.ports[0]}"
    statuses: list[tuple[float, int]] = []
    done = anyio.Event()

    async def caller(client: Any) -> None:
        while not done.is_set():
            response = await client.get(url)
            statuses.append((time.monotonic(), response.status_code))

    async with client_for(transport, timeout=30) as client:
        async with anyio.create_task_group() as tg:
            for _ in range(48):
                tg.start_soon(caller, client)
            shedding.command("start")
            with anyio.fail_after(30):
                while len([s for _, s in statuses if s == 200]) < 200:  # about 2 s of answers
                    await anyio.sleep(0.05)
                since = time.monotonic()
                while len([t for t, s in statuses if t > since and s == 200]) < 100:
                    await anyio.sleep(0.05)
            done.set()
    history = [limit for _, limit in transport.statistics()[name].limit_history]
    # (the first entry: the first probe's 1 slot; then the initial 16, and no more: fed
    # as samples, the refusals grew it to 24-54 in every run.  How many requests are
    # refused once it came down depends on the machine's load, and is not asserted: a
    # busy loop reads as a queue, probes, and climbs again into the refusals now and then)
    assert max(history[1:]) <= 16, history
    assert history[-1] <= 8, history
    refused = [status for _, status in statuses].count(503)
    assert refused < len(statuses), (refused, len(statuses))  # (answers came through)
