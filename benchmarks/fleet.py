"""Cost of the fleet limit: acquire + release on Redis against the in-process ``Limiter``,
and the throughput ceiling of one redis-server for this use.

    python -m benchmarks.fleet                  # about 30 s
    python -m benchmarks.fleet --seconds 5 --requests 20000 --rounds 12

Starts its own redis-server on 127.0.0.1 (``tests/servers/redis.py``; Debian's
``redis-server`` must be installed) and prints a table:

* ``local``: ``Limiter.try_acquire()`` + ``release()``, the decision a compartment takes
  per request today (no await).
* ``fleet, sequential``: one task, ``await acquire()`` then ``release()``, ``N`` times:
  wall and CPU time per request (CPU includes the background release round trip), and
  Redis round trips per acquire (the target is 1: one Lua script).
* ``fleet, contended``: 100 tasks, limit 10, each holding its lease over one event-loop
  turn: round trips per granted lease when most acquires wait.
* ``ceiling``: P client processes x 64 tasks doing acquire/release in a loop for
  ``--seconds`` against a limit nobody reaches: leases per second, and Redis's own CPU per
  acquire+release (from ``INFO``).  On 2 shared cores the Python clients saturate first,
  so the Redis side is also measured alone: ``Redis time per script call`` (from
  ``INFO commandstats``), whose inverse is what one Redis core can serve.

* ``through the transport``: ``BulkheadTransport`` against a local Node.js server (pinned
  to the other core), a compartment with ``Policy(fleet=...)`` (limit 1000: never reached)
  against the same compartment without one, same process, batches interleaved (the order
  rotates every round): client CPU and wall time per request, at 1 and 16 concurrent
  requests.  CPU includes the background release round trip; Redis's own CPU is not in it.

Absolute figures drift on a small shared machine; the ratios and the round-trip counts
are the point.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import time
import uuid
from typing import Any

from benchmarks import harness as h
from httpx_bulkhead import BulkheadTransport, Policy
from httpx_bulkhead._limiter import Limiter
from httpx_bulkhead.fleet import FleetLimiter, RedisFleetLimit
from tests.servers.redis import RedisServer


def bench_local(n: int) -> tuple[float, float]:
    """(wall, cpu) seconds per try_acquire + release."""
    limiter = Limiter(10, None)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        limiter.try_acquire()
        limiter.release()
    return (time.perf_counter() - wall) / n, (time.process_time() - cpu) / n


async def bench_sequential(url: str, n: int) -> dict[str, float]:
    limiter = FleetLimiter(RedisFleetLimit(url, key=f"bench-{uuid.uuid4().hex}", limit=10))
    try:
        (await limiter.acquire(5.0)).release()  # connect, load the script
        await asyncio.sleep(0.05)
        before = limiter.statistics()
        acquire_wall = 0.0
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            started = time.perf_counter()
            lease = await limiter.acquire(5.0)
            acquire_wall += time.perf_counter() - started
            lease.release()
        while limiter.statistics().held:  # pragma: no cover - releases are synchronous
            await asyncio.sleep(0)
        await asyncio.sleep(0.05)  # the last background release
        total_wall, total_cpu = time.perf_counter() - wall, time.process_time() - cpu
        after = limiter.statistics()
        trips = after.round_trips - before.round_trips
        acquired = after.acquired - before.acquired
        return {
            "wall": total_wall / n,
            "cpu": total_cpu / n,
            "acquire_wall": acquire_wall / n,
            "trips_per_request": trips / acquired,
            "acquired": acquired,
        }
    finally:
        await limiter.aclose()


async def bench_contended(url: str, tasks: int, rounds: int) -> dict[str, float]:
    limiter = FleetLimiter(
        RedisFleetLimit(url, key=f"bench-{uuid.uuid4().hex}", limit=10, poll_interval=0.05)
    )
    try:
        (await limiter.acquire(5.0)).release()
        await asyncio.sleep(0.05)
        before = limiter.statistics()

        async def one() -> None:
            for _ in range(rounds):
                lease = await limiter.acquire(30.0)
                await asyncio.sleep(0)
                lease.release()

        wall = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(tasks)))
        wall = time.perf_counter() - wall
        await asyncio.sleep(0.05)
        after = limiter.statistics()
        acquired = after.acquired - before.acquired
        return {
            "per_second": acquired / wall,
            "trips_per_grant": (after.round_trips - before.round_trips) / acquired,
        }
    finally:
        await limiter.aclose()


def _ceiling_worker(url: str, key: str, seconds: float, tasks: int, queue: Any) -> None:
    async def run() -> int:
        config = RedisFleetLimit(
            url, key=key, limit=1_000_000, on_unavailable="reject", redis_timeout=10.0
        )
        limiter = FleetLimiter(config)
        done = 0

        async def loop(stop: float) -> None:
            nonlocal done
            while time.monotonic() < stop:
                lease = await limiter.acquire(10.0)
                lease.release()
                done += lease.fleet

        try:  # warm up: one connection per task, the script loaded
            await asyncio.gather(*(loop(time.monotonic() + 0.3) for _ in range(tasks)))
            done = 0
            queue.put("ready")
            stop = time.monotonic() + seconds
            await asyncio.gather(*(loop(stop) for _ in range(tasks)))
            await asyncio.sleep(0.05)
        finally:
            await limiter.aclose()
        return done

    queue.put(asyncio.run(run()))


def bench_ceiling(server: RedisServer, processes: int, seconds: float) -> dict[str, float]:
    client = server.client()
    key = f"bench-{uuid.uuid4().hex}"
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    workers = [
        context.Process(target=_ceiling_worker, args=(server.url, key, seconds, 64, queue))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    for _ in workers:
        assert queue.get(timeout=60) == "ready"
    client.config_resetstat()
    cpu_before = _redis_cpu(client)
    done = sum(queue.get(timeout=seconds + 60) for _ in workers)
    for worker in workers:
        worker.join(30)
    cpu = _redis_cpu(client) - cpu_before
    stats: Any = client.info("commandstats")
    evalsha = stats.get("cmdstat_evalsha", {})
    return {
        "per_second": done / seconds,
        "redis_cpu_per_lease": cpu / done,
        "evalsha_usec": float(evalsha.get("usec_per_call", 0.0)),
        "evalsha_calls_per_lease": float(evalsha.get("calls", 0)) / done,
    }


async def bench_redis_py(url: str, n: int) -> dict[str, float]:
    """The floor under us: redis-py's asyncio client, one PING / one EVALSHA of a trivial
    script per await, no limiter."""
    from redis.asyncio import Redis

    client = Redis.from_url(url)
    script = client.register_script("return 1")
    try:
        await client.ping()
        await script()
        result = {}
        for name, call in (("ping", client.ping), ("evalsha", script)):
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(n):
                await call()
            result[f"{name}_wall"] = (time.perf_counter() - wall) / n
            result[f"{name}_cpu"] = (time.process_time() - cpu) / n
        return result
    finally:
        await client.aclose()


def bench_scripts(server: RedisServer, n: int) -> dict[str, float]:
    """Redis's own time per script call (``INFO commandstats``), sequential calls from a
    sync client: ACQUIRE (nobody waiting), RELEASE, and a ``return 1`` script for scale."""
    from httpx_bulkhead import _fleet_lua as lua

    client = server.client()
    leases, waiters, until, channel = lua.keys(f"bench-{uuid.uuid4().hex}")
    acquire = client.register_script(lua.ACQUIRE)
    release = client.register_script(lua.RELEASE)
    noop = client.register_script("return 1")
    calls: dict[str, Any] = {
        "noop": lambda i: noop(),
        "acquire": lambda i: acquire([leases, waiters, until], [n + 1, 30_000, i, "p", 2000, 0]),
        "release": lambda i: release([leases], [channel, i]),
    }
    result = {}
    for name, call in calls.items():
        call(-1)
        client.config_resetstat()
        for i in range(n):
            call(i)
        stats: Any = client.info("commandstats")
        result[name] = float(stats["cmdstat_evalsha"]["usec_per_call"])
    return result


async def bench_transport(
    redis_url: str, http_url: str, concurrency: int, requests: int, rounds: int
) -> dict[str, dict[str, float]]:
    """Per-request client CPU and wall, a compartment with and without a fleet limit,
    interleaved; medians over ``rounds`` batches of ``requests``."""
    fleet = RedisFleetLimit(redis_url, key=f"bench-{uuid.uuid4().hex}", limit=1000)
    drivers = [
        h.TransportDriver(
            name,
            BulkheadTransport(default=Policy(max_concurrency=concurrency, fleet=config)),
            [http_url],
        )
        for name, config in (("local", None), ("fleet", fleet))
    ]
    try:
        samples = await h.interleave(
            drivers,
            rounds=rounds,
            requests=requests,
            concurrency=concurrency,
            warmup=max(200, requests // 4),
        )
    finally:
        for driver in drivers:
            await driver.aclose()
    out: dict[str, dict[str, float]] = {}
    for name, runs in samples.items():
        out[name] = {
            "cpu_us": statistics.median(s.cpu_us for s in runs),
            "wall_us": statistics.median(1e6 * s.wall / s.requests for s in runs),
        }
    local, fleet_runs = samples["local"], samples["fleet"]
    out["ratio"] = {
        "cpu": statistics.median(
            f.cpu_us / b.cpu_us for f, b in zip(fleet_runs, local, strict=True)
        ),
        "wall": statistics.median(f.wall / b.wall for f, b in zip(fleet_runs, local, strict=True)),
    }
    return out


def _redis_cpu(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=8, help="interleaved transport rounds")
    args = parser.parse_args()
    local_wall, local_cpu = bench_local(max(100_000, args.requests * 20))
    with RedisServer() as server:
        floor = asyncio.run(bench_redis_py(server.url, args.requests))
        seq = asyncio.run(bench_sequential(server.url, args.requests))
        contended = asyncio.run(bench_contended(server.url, 100, max(1, args.requests // 100)))
        ceilings = {p: bench_ceiling(server, p, args.seconds) for p in (1, 2)}
        scripts = bench_scripts(server, args.requests)
        with h.NodeServer(1) as node, h.pin():
            through = {
                c: asyncio.run(bench_transport(server.url, node.url(0), c, n, args.rounds))
                for c, n in ((1, 400), (16, 2000))
            }
    us = 1e6
    print("| case | figure |\n| --- | --- |")
    print(f"| local Limiter try_acquire+release | {local_wall * us:.2f} µs wall, "
          f"{local_cpu * us:.2f} µs CPU |")  # fmt: skip
    for name in ("ping", "evalsha"):
        print(f"| redis-py alone: await {name} | {floor[name + '_wall'] * us:.0f} µs wall, "
              f"{floor[name + '_cpu'] * us:.0f} µs CPU |")  # fmt: skip
    print(f"| fleet, sequential: await acquire | {seq['acquire_wall'] * us:.0f} µs wall |")
    print(f"| fleet, sequential: acquire+release | {seq['wall'] * us:.0f} µs wall, "
          f"{seq['cpu'] * us:.0f} µs CPU (client, incl. background release) |")  # fmt: skip
    print(f"| fleet, sequential: round trips per request | {seq['trips_per_request']:.2f} "
          "(1 acquire + batched release) |")  # fmt: skip
    print(f"| fleet, contended (100 tasks, limit 10) | {contended['per_second']:.0f} leases/s, "
          f"{contended['trips_per_grant']:.2f} round trips per grant |")  # fmt: skip
    per_lease = scripts["acquire"] + scripts["release"]
    print(f"| Redis time per script call | ACQUIRE {scripts['acquire']:.1f} µs, RELEASE "
          f"{scripts['release']:.1f} µs (a `return 1` script: {scripts['noop']:.1f} µs): "
          f"one Redis core serves ~{1e6 / per_lease:.0f} acquire+release/s |")  # fmt: skip
    for processes, ceiling in ceilings.items():
        print(
            f"| ceiling, {processes} client process(es) x 64 tasks | "
            f"{ceiling['per_second']:.0f} acquire+release/s; Redis CPU "
            f"{ceiling['redis_cpu_per_lease'] * us:.1f} µs per lease "
            f"(~{1 / ceiling['redis_cpu_per_lease']:.0f}/s per Redis core); EVALSHA "
            f"{ceiling['evalsha_usec']:.1f} µs, {ceiling['evalsha_calls_per_lease']:.2f} "
            "per lease |"
        )
    for c, figures in through.items():
        local, fleet, ratio = figures["local"], figures["fleet"], figures["ratio"]
        print(
            f"| through the transport, {c} concurrent | local-only {local['cpu_us']:.0f} µs CPU,"
            f" {local['wall_us']:.0f} µs wall per request; with fleet {fleet['cpu_us']:.0f} µs"
            f" CPU, {fleet['wall_us']:.0f} µs wall (fleet/local: CPU x{ratio['cpu']:.2f},"
            f" wall x{ratio['wall']:.2f}) |"
        )


if __name__ == "__main__":
    main()
