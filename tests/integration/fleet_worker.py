"""A worker process of the fleet-limit tests: ``python -m tests.integration.fleet_worker``.

Modes (one JSON line per event on stdout, commands on stdin):

* ``calls``: print ``{"ready": true}``, wait for a line on stdin (the start gate), then make
  ``--calls`` concurrent requests, each ``lease = acquire(); GET --target; release``, and
  print ``{"done": ..., "failed": [...], "stats": {...}}``.
* ``hold``: acquire ``--calls`` leases, print ``{"held": N}`` and sleep until killed.

Once ``Policy(fleet=...)`` is wired, ``calls`` becomes one ``httpx.AsyncClient`` with a
``BulkheadTransport`` whose policy carries the fleet limit, and ``client.get`` alone.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time

import httpx

from httpx_bulkhead.fleet import FleetLimiter, RedisFleetLimit


def _say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def _calls(limiter: FleetLimiter, target: str, calls: int, budget: float) -> None:
    failed: list[str] = []
    done = 0

    async def one(client: httpx.AsyncClient) -> None:
        nonlocal done
        try:
            lease = await limiter.acquire(budget)
            try:
                response = await client.get(target)
                response.raise_for_status()
            finally:
                lease.release()
        except Exception as exc:
            failed.append(f"{type(exc).__name__}: {exc}")
        else:
            done += 1

    limits = httpx.Limits(max_connections=calls, max_keepalive_connections=calls)
    async with httpx.AsyncClient(limits=limits, timeout=30.0) as client:
        _say(ready=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        started = time.monotonic()
        await asyncio.gather(*(one(client) for _ in range(calls)))
        elapsed = time.monotonic() - started
    stats = dataclasses.asdict(limiter.statistics())
    _say(done=done, failed=failed, seconds=elapsed, stats=stats)


async def _hold(limiter: FleetLimiter, calls: int, budget: float) -> None:
    leases = [await limiter.acquire(budget) for _ in range(calls)]
    _say(held=len(leases), stats=dataclasses.asdict(limiter.statistics()))
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
    limiter = FleetLimiter(config)
    try:
        if args.mode == "calls":
            await _calls(limiter, args.target, args.calls, args.budget)
        else:
            await _hold(limiter, args.calls, args.budget)
    finally:
        await limiter.aclose()


if __name__ == "__main__":
    asyncio.run(main())
