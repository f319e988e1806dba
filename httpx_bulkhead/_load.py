"""Open-loop load generation: the calls the demo (``python -m httpx_bulkhead demo``) makes,
reused by ``benchmarks/``.

Each call is recorded (``CallRecord``), never raised: a failed call is data.  A steady
caller sends at a fixed rate whatever the latency (each call on its own task, so a stuck
call does not slow the rate down); saturating workers call back to back.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from ._stats import quantile

__all__ = ["CallRecord", "cancel_all", "percentile", "saturate", "steady_calls", "timed_get"]


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One call: when it was sent (seconds from the start of the run), how long it took
    and how it ended (``None``: a 2xx response read to the end, else the exception name)."""

    host: str
    sent_at: float
    latency: float
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile (``q`` in [0, 1]); NaN for no values."""
    return quantile(sorted(values), q) if values else math.nan


async def timed_get(
    client: httpx.AsyncClient,
    url: str,
    host: str,
    t0: float,
    extensions: dict[str, Any] | None = None,
) -> CallRecord:
    """GET ``url`` and read the body; an exception is recorded, not raised (cancellation
    still propagates).  ``extensions`` are httpx request extensions (e.g. ``trace``)."""
    started = time.perf_counter()
    error: str | None = None
    try:
        response = await client.get(url, extensions=extensions)
        if not response.is_success:
            error = f"HTTP {response.status_code}"
    except Exception as exc:  # an httpx error, or a bug: either way a failed call, by name
        error = type(exc).__name__
    return CallRecord(host, started - t0, time.perf_counter() - started, error)


async def steady_calls(
    client: httpx.AsyncClient,
    url: Callable[[float], str],
    *,
    host: str,
    interval: float,
    duration: float,
    records: list[CallRecord],
    t0: float,
) -> None:
    """Call ``url(seconds since start)`` every ``interval`` seconds for ``duration`` seconds,
    each call on its own task (open loop), then wait for the calls still running."""
    pending: set[asyncio.Task[None]] = set()

    async def one(target: str) -> None:
        records.append(await timed_get(client, target, host, t0))

    start = time.perf_counter()
    try:
        for i in range(max(1, round(duration / interval))):
            delay = start + i * interval - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)  # the rate itself: not a synchronisation
            task = asyncio.create_task(one(url(time.perf_counter() - t0)))
            pending.add(task)
            task.add_done_callback(pending.discard)
        if pending:
            await asyncio.gather(*pending)
    finally:
        await cancel_all(pending)


async def saturate(
    client: httpx.AsyncClient,
    url: str,
    *,
    host: str,
    workers: int,
    records: list[CallRecord],
    t0: float,
    extensions: dict[str, Any] | None = None,
) -> list[asyncio.Task[None]]:
    """Start ``workers`` tasks calling ``url`` back to back until cancelled (the caller
    cancels them, e.g. with ``cancel_all``).  A refusal that comes back at once
    (``BulkheadFull``) is followed by a short pause so a worker never spins."""

    async def worker() -> None:
        while True:
            record = await timed_get(client, url, host, t0, extensions)
            records.append(record)
            if record.error == "BulkheadFull":
                await asyncio.sleep(0.05)  # back off: load generation, not synchronisation

    return [asyncio.create_task(worker()) for _ in range(workers)]


async def cancel_all(tasks: Iterable[asyncio.Task[None]]) -> None:
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
