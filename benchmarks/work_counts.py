"""Count the event-loop work per request, contestant by contestant (no timing).

    python -m benchmarks.work_counts                       # h11 and httptools, c=1 and 64
    python -m benchmarks.work_counts --requests 4000 --contestants bulkhead,h11-floor
    python -m benchmarks.work_counts --level client --verbose

Per request, at the transport level (``--level client``: inside ``httpx.AsyncClient``,
whose default timeouts arm a timer per read) against ``server.js``:

* ``callbacks``: loop callbacks run (``asyncio.Handle._run``: task steps and wakeups,
  the selector's read callbacks, timers that fired), i.e. loop wakeups;
* ``steps``: task steps among them (each is one resumption of a suspended coroutine, or
  a task's first step), i.e. awaits that actually suspended;
* ``futures``: futures made with ``loop.create_future`` (tasks' own are not counted);
* ``timers``: timer handles armed (``loop.call_at``, which ``call_later`` goes through).

The bare floors have one future, one task step and one read callback per request: what
is above that is work a transport adds.  Counts are exact and the same on a quiet or busy
machine, so they are the figure to compare when the CPU figures are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
from collections.abc import Sequence
from typing import Any

from benchmarks import harness as h
from benchmarks.models_floor import H11_MODELS, HTTPTOOLS_MODELS

DEFAULT_CONTESTANTS = (
    h.FLOOR,
    H11_MODELS,
    h.BULKHEAD,
    h.HTTPTOOLS_FLOOR,
    HTTPTOOLS_MODELS,
    h.HTTPTOOLS,
)


class _Counter:
    """Patches the running loop and ``asyncio.Handle._run`` while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.counts: collections.Counter[str] = collections.Counter()
        self.by_callback: collections.Counter[str] = collections.Counter()

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        counter = self
        run = asyncio.Handle._run
        create_future = loop.create_future
        call_at = loop.call_at

        def counted_run(handle: asyncio.Handle) -> None:
            if counter.on:
                counter.counts["callbacks"] += 1
                callback: Any = getattr(handle, "_callback", None)
                name = getattr(callback, "__qualname__", None) or type(callback).__name__
                if name in ("Task.task_wakeup", "TaskStepMethWrapper", "TaskWakeupMethWrapper"):
                    counter.counts["steps"] += 1
                counter.by_callback[name] += 1
            run(handle)

        def counted_future() -> asyncio.Future[Any]:
            if counter.on:
                counter.counts["futures"] += 1
            return create_future()

        def counted_call_at(when: float, callback: Any, *args: Any, **kw: Any) -> Any:
            if counter.on:
                counter.counts["timers"] += 1
            return call_at(when, callback, *args, **kw)

        self._saved = run
        asyncio.Handle._run = counted_run  # type: ignore[method-assign,assignment]
        loop.create_future = counted_future  # type: ignore[method-assign]
        loop.call_at = counted_call_at  # type: ignore[method-assign,assignment]

    def uninstall(self) -> None:
        asyncio.Handle._run = self._saved  # type: ignore[method-assign]


async def count(
    contestant: str, url: str, concurrency: int, requests: int, level: h.Level = "transport"
) -> dict[str, float | dict[str, float]]:
    """Per-request counts for ``contestant`` (warmed up first)."""
    counter = _Counter()
    counter.install(asyncio.get_running_loop())
    driver = await h.make_driver(contestant, level, [url], concurrency)
    try:
        await h.run_batch(driver, max(200, 4 * concurrency), concurrency)
        counter.on = True
        sample = await h.run_batch(driver, requests, concurrency)
        counter.on = False
    finally:
        await driver.aclose()
        counter.uninstall()
    n = sample.requests
    per: dict[str, float | dict[str, float]] = {
        k: counter.counts[k] / n for k in ("callbacks", "steps", "futures", "timers")
    }
    per["by_callback"] = {k: v / n for k, v in counter.by_callback.most_common(8)}
    return per


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--contestants", default=",".join(DEFAULT_CONTESTANTS))
    parser.add_argument("--level", choices=("transport", "client"), default="transport")
    parser.add_argument("--verbose", action="store_true", help="callbacks by name too")
    args = parser.parse_args(argv)
    names = [n for n in args.contestants.split(",") if n]
    with h.NodeServer(1) as server:
        for concurrency in (1, 64):
            print(f"\nconcurrency {concurrency}, per request:")
            print(f"{'contestant':26} callbacks  steps  futures  timers")
            for name in names:
                # a fresh loop per contestant: the patches stay with it
                per = asyncio.run(
                    count(name, server.url(0), concurrency, args.requests, args.level)
                )
                print(
                    f"{name:26} {per['callbacks']:9.2f} {per['steps']:6.2f}"
                    f" {per['futures']:8.2f} {per['timers']:7.2f}"
                )
                if args.verbose:
                    by = per["by_callback"]
                    assert isinstance(by, dict)
                    for k, v in by.items():
                        print(f"    {v:6.2f}  {k}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
