"""``Policy(leak_threshold=...)``: a slot held too long is reported once, with where it was
acquired, and its release is reported too; nothing otherwise, and no timer left behind.

A timer left armed would fire after the test's request ended and report a leak that is
not one: the checks below wait past the threshold (a short sleep is the only way to see
that nothing happens) and assert ``slot_leaks == 0`` and no WARNING, beside the
detector's count of armed timers.
"""

from __future__ import annotations

import gc
import logging
import math
import sys
import warnings
from collections.abc import Callable, Iterator

import anyio
import anyio.lowlevel
import httpx
import pytest

from httpx_bulkhead import BulkheadTransport, Policy
from tests.conftest import until
from tests.servers import HypercornServer, TestApp

pytestmark = pytest.mark.anyio

THRESHOLD = 0.2


def leak_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r for r in caplog.records if r.name == "httpx_bulkhead" and r.levelno >= logging.WARNING
    ]


def armed(transport: BulkheadTransport, name: str) -> int:
    """Leak timers armed in the compartment (private: no public figure counts timers)."""
    detector = transport._router.compartments[name]._leaks
    assert detector is not None
    return detector.watching


async def test_a_held_response_is_reported_once_then_its_release(
    server: HypercornServer, app: TestApp, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="httpx_bulkhead")
    transport = BulkheadTransport(default=Policy(leak_threshold=THRESHOLD))
    name = server.url
    async with transport, httpx.AsyncClient(transport=transport) as client:
        acquiring_line = sys._getframe().f_lineno + 1
        async with client.stream("GET", f"{server.url}/stream/4") as response:
            assert response.status_code == 200
            await until(lambda: transport.statistics()[name].slot_leaks == 1)
            [warning] = leak_records(caplog)
            assert warning.levelno == logging.WARNING
            message = warning.getMessage()
            assert f"compartment {name!r}" in message and "leak_threshold=0.2 s" in message
            # The acquiring stack names this test's line (the ``client.stream`` call).
            assert f'"{__file__}", line {acquiring_line}, in ' in message, message
            assert "httpx_bulkhead/_" not in message  # our own frames are left out
            assert warning.compartment == name and warning.event == "slot_leak"  # type: ignore[attr-defined]
            await anyio.sleep(2 * THRESHOLD)  # held on: still one warning, one count
            assert len(leak_records(caplog)) == 1
            assert transport.statistics()[name].slot_leaks == 1
            await response.aread()
        records = leak_records(caplog)
        assert len(records) == 2
        released = records[1].getMessage()
        assert "was released after" in released and records[1].event == "slot_leak_released"  # type: ignore[attr-defined]
        held = float(released.rsplit("after ", 1)[1].removesuffix(" s"))
        assert held >= 3 * THRESHOLD
        stats = transport.statistics()[name]
        assert (stats.slot_leaks, stats.running, stats.completed) == (1, 0, 1)
        assert armed(transport, name) == 0
        # The counter is exported.
        pytest.importorskip("prometheus_client")
        from prometheus_client import CollectorRegistry, generate_latest

        from httpx_bulkhead.prometheus import BulkheadCollector

        registry = CollectorRegistry()
        registry.register(BulkheadCollector(transport, histograms=False))
        line = f'httpx_bulkhead_slot_leaks_total{{compartment="{name}"}} 1.0'
        assert line in generate_latest(registry).decode()


async def test_a_request_under_the_threshold_reports_nothing(
    server: HypercornServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="httpx_bulkhead")
    # A threshold no request of a loaded machine reaches: only the disarming is under test.
    transport = BulkheadTransport(default=Policy(leak_threshold=30.0))
    async with transport, httpx.AsyncClient(transport=transport) as client:
        for _ in range(3):
            assert (await client.get(f"{server.url}/")).status_code == 200
        assert armed(transport, server.url) == 0  # no timer left to fire later
        await anyio.sleep(2 * THRESHOLD)
    assert transport.statistics()[server.url].slot_leaks == 0
    assert not leak_records(caplog)


async def test_cancellation_anywhere_leaves_no_timer_behind(
    server: HypercornServer,
    app: TestApp,
    caplog: pytest.LogCaptureFixture,
    unique: Callable[[str], str],
) -> None:
    """Requests cancelled after 0, 1, 2, ... scheduler steps (so at each of their awaits in
    turn: waiting for a slot, connecting, sending, reading the head, reading the body),
    others waiting behind a held slot, a response dropped unclosed: afterwards no timer is
    armed, the counters agree, and nothing is reported past the threshold."""
    caplog.set_level(logging.WARNING, logger="httpx_bulkhead")
    gate = app.gate(unique("leak-cancel"))
    name = server.url
    transport = BulkheadTransport(default=Policy(max_concurrency=2, leak_threshold=1.0))
    async with (
        transport,
        httpx.AsyncClient(transport=transport, timeout=10) as client,
        httpx.AsyncClient(timeout=10) as plain,
    ):

        async def read(path: str) -> None:
            async with client.stream("GET", f"{server.url}{path}") as response:
                await response.aread()  # (cancelled inside httpx's generators: they end)

        def step_counts() -> Iterator[int]:
            """Every step count up to 200, then 10% more each time until requests finish:
            the exchange may need many more scheduler steps than 200 (its I/O is not ready
            yet).  The deadline below turns a request that never finishes into a failure."""
            yield from range(200)
            steps = 200.0
            while True:
                steps *= 1.1
                yield round(steps)

        completed = 0
        with anyio.fail_after(60):  # a request that never finishes fails here
            for steps in step_counts():
                done = False

                async def one(path: str) -> None:
                    nonlocal done
                    await read(path)
                    done = True

                async with anyio.create_task_group() as tg:
                    tg.start_soon(one, "/stream/3")
                    for _ in range(steps):
                        await anyio.lowlevel.checkpoint()
                    tg.cancel_scope.cancel()
                completed += done
                if completed >= 3:  # the whole exchange fits in ``steps``: every await was hit
                    break
                # The server runs in a thread of this process: steps spent spinning here are
                # time it does not get, and the connections cut so far are work it has left.
                # Under trio it fell further behind at each attempt, and no request finished
                # (none in 60 s).  A round trip of its own, on httpx's transport, waits until
                # it has caught up.
                assert (await plain.get(f"{server.url}/")).status_code == 200
        # Waiters cancelled behind a slot held at the gate.
        async with anyio.create_task_group() as tg:
            tg.start_soon(read, f"/gate/{gate.name}")
            tg.start_soon(read, f"/gate/{gate.name}")
            await gate.until_entered(2)
            with anyio.move_on_after(0.05):
                await read("/")  # queued for a slot, then cancelled
            tg.cancel_scope.cancel()
        # A response dropped unclosed: the garbage collector gives its slot back.
        response = await client.send(client.build_request("GET", f"{server.url}/"), stream=True)
        del response
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()
        await until(lambda: transport.statistics()[name].running == 0)
        assert armed(transport, name) == 0
        stats = transport.statistics()[name]
        assert stats.acquired == stats.completed + stats.failed + stats.cancelled
        assert stats.cancelled > 0 and stats.cancelled_waiting >= 1
        gate.open()
        assert (await client.get(f"{server.url}/")).status_code == 200  # the next one works
        await anyio.sleep(1.2)  # past the threshold of the last slots cancelled
    assert transport.statistics()[name].slot_leaks == 0
    assert not leak_records(caplog)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (0, ValueError),
        (-1, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        (True, TypeError),
        ("1", TypeError),
    ],
)
def test_leak_threshold_is_validated(value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="leak_threshold"):
        Policy(leak_threshold=value)  # type: ignore[arg-type]


def test_leak_threshold_off_by_default() -> None:
    transport = BulkheadTransport(
        hosts={"a.example": Policy(), "b.example": Policy(leak_threshold=1)}
    )
    compartments = transport._router.compartments
    assert Policy().leak_threshold is None and compartments["a.example"]._leaks is None
    assert compartments["b.example"]._leaks is not None
