"""A worker process of the fleet-limit tests: ``python -m tests.integration.fleet_worker``.

Each worker is one ``httpx.AsyncClient`` whose ``BulkheadTransport`` has a default policy
carrying the fleet limit (``Policy(max_concurrency=--calls, fleet=RedisFleetLimit(...))``):
the requests are plain ``client.get`` calls, as in an application.

Modes (one JSON line per event on stdout, commands on stdin):

* ``calls``: print ``{"ready": true}``, wait for a line on stdin (the start gate), then make
  ``--calls`` concurrent ``GET --target`` and print ``{"done": ..., "failed": [...],
  "stats": {CompartmentStats fields}}``.
* ``hold``: make ``--calls`` concurrent ``GET --target`` to a server that never answers;
  once they all hold a lease print ``{"held": N}`` and sleep until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time

import httpx

from httpx_bulkhead import BulkheadTransport, CompartmentStats, Policy, RedisFleetLimit


def _say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def _transport(config: RedisFleetLimit, calls: int, budget: float) -> BulkheadTransport:
    return BulkheadTransport(
        default=Policy(max_concurrency=calls, acquire_timeout=budget, fleet=config)
    )


def _stats(transport: BulkheadTransport) -> CompartmentStats | None:
    """The one compartment's snapshot (one origin), once a request made it."""
    return next(iter(transport.statistics().values()), None)


async def _calls(config: RedisFleetLimit, target: str, calls: int, budget: float) -> None:
    failed: list[str] = []
    done = 0

    async def one(client: httpx.AsyncClient) -> None:
        nonlocal done
        try:
            response = await client.get(target)
            response.raise_for_status()
        except Exception as exc:
            failed.append(f"{type(exc).__name__}: {exc}")
        else:
            done += 1

    transport = _transport(config, calls, budget)
    async with httpx.AsyncClient(transport=transport, timeout=30.0) as client:
        _say(ready=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        started = time.monotonic()
        await asyncio.gather(*(one(client) for _ in range(calls)))
        elapsed = time.monotonic() - started
        stats = _stats(transport)
        assert stats is not None
    _say(done=done, failed=failed, seconds=elapsed, stats=dataclasses.asdict(stats))


async def _hold(config: RedisFleetLimit, target: str, calls: int, budget: float) -> None:
    transport = _transport(config, calls, budget)
    async with httpx.AsyncClient(transport=transport, timeout=None) as client:
        tasks = [asyncio.ensure_future(client.get(target)) for _ in range(calls)]
        while (stats := _stats(transport)) is None or stats.fleet_leases_held < calls:
            if any(task.done() for task in tasks):
                _say(failed=[repr(task.exception()) for task in tasks if task.done()])
                return
            await asyncio.sleep(0.01)  # a poll of our own statistics, in the worker
        _say(held=stats.fleet_leases_held, stats=dataclasses.asdict(stats))
        await asyncio.Event().wait()  # until killed


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["calls", "hold"])
    parser.add_argument("--redis", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--limit", type=int, required=True)
    parser.add_argument("--lease", type=float, default=30.0)
    parser.add_argument("--calls", type=int, default=25)
    parser.add_argument("--budget", type=float, default=30.0)
    parser.add_argument("--target", default="")
    parser.add_argument("--redis-timeout", type=float, default=5.0)  # a loaded test machine
    parser.add_argument("--on-unavailable", choices=["local", "reject"], default="reject")
    args = parser.parse_args()
    config = RedisFleetLimit(
        args.redis,
        key=args.key,
        limit=args.limit,
        lease=args.lease,
        redis_timeout=args.redis_timeout,
        on_unavailable=args.on_unavailable,
    )
    if args.mode == "calls":
        await _calls(config, args.target, args.calls, args.budget)
    else:
        await _hold(config, args.target, args.calls, args.budget)


if __name__ == "__main__":
    asyncio.run(main())
