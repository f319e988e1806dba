"""The sync transport against httpx's default sync transport (``httpx.HTTPTransport``).

    python benchmarks/sync.py [--quick]     # writes benchmarks/sync_results.{json,md}

Two measurements, against the Node.js server of ``harness.py`` (pinned to one core, the
client to the other, as for the async benchmarks):

* **CPU per request**: ``httpx.Client.get`` on HTTP/1.1 keep-alive, 1 thread and 64
  threads; client CPU time (``time.process_time()``, all threads) per request, the median
  over interleaved rounds, and the median of the same-round ratios (with their range).
  Contestants: ``HTTPTransport(limits=max_connections=N)``, ``BulkheadHTTPTransport``
  (``max_concurrency=N``; h11) and the same with ``http1_parser="httptools"``.
* **Isolation** (as the async table, ``report.py``): 30 threads call a host that answers
  in 2 s; one thread calls a fast host every 50 ms with a pool timeout of 0.5 s.  10
  connections in all: httpx's one shared pool of 10, or 5 per compartment.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness as h
from httpx_bulkhead import BulkheadHTTPTransport, Policy

HERE = Path(__file__).resolve().parent
SLOW_MS = 2000
SLOW_THREADS = 30
BUDGET = 10  # connections in all
POOL_TIMEOUT = 0.5
INTERVAL = 0.05

Make = Callable[[int], httpx.BaseTransport]
CONTESTANTS: dict[str, Make] = {
    "httpx default": lambda n: httpx.HTTPTransport(
        limits=httpx.Limits(max_connections=n, max_keepalive_connections=n)
    ),
    "bulkhead": lambda n: BulkheadHTTPTransport(
        default=Policy(max_concurrency=n), http1_parser="h11"
    ),
    "bulkhead+httptools": lambda n: BulkheadHTTPTransport(
        default=Policy(max_concurrency=n), http1_parser="httptools"
    ),
}


# -- CPU per request ---------------------------------------------------------------------------
def _round(client: httpx.Client, url: str, threads: int, per_thread: int) -> float:
    """CPU seconds per request of one round."""
    barrier = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def work() -> None:
        barrier.wait()
        try:
            for _ in range(per_thread):
                client.get(url).raise_for_status()
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    started = time.process_time()
    barrier.wait()
    for worker in workers:
        worker.join()
    used = time.process_time() - started
    if errors:
        raise errors[0]
    return used / (threads * per_thread)


def cpu(server: h.NodeServer, rounds: int, requests: int) -> list[dict[str, Any]]:
    rows = []
    url = server.url(0)
    for threads in (1, 64):
        clients = {
            name: httpx.Client(transport=make(threads)) for name, make in CONTESTANTS.items()
        }
        per_thread = max(1, requests // threads)
        for client in clients.values():  # warm up: the pool filled, the code paths hot
            _round(client, url, threads, max(1, 50 // threads))
        samples: dict[str, list[float]] = {name: [] for name in clients}
        for _ in range(rounds):
            for name, client in clients.items():
                samples[name].append(_round(client, url, threads, per_thread))
        for client in clients.values():
            client.close()
        base = samples["httpx default"]
        row: dict[str, Any] = {
            "threads": threads,
            "rounds": rounds,
            "requests": per_thread * threads,
        }
        for name, values in samples.items():
            ratios = [v / b for v, b in zip(values, base, strict=True)]
            row[name] = {
                "us_per_request": statistics.median(values) * 1e6,
                "ratio": statistics.median(ratios),
                "ratio_range": [min(ratios), max(ratios)],
            }
        rows.append(row)
        h_log(f"cpu: {threads} threads done")
    return rows


# -- isolation -------------------------------------------------------------------------------
def _isolation_run(
    transport: httpx.BaseTransport, fast: str, slow: str | None, duration: float
) -> dict[str, Any]:
    stop = threading.Event()
    timeout = httpx.Timeout(30, pool=POOL_TIMEOUT)
    with httpx.Client(transport=transport, timeout=timeout) as client:

        def hammer() -> None:
            while not stop.is_set():
                with contextlib.suppress(httpx.TransportError):
                    client.get(slow or fast)

        workers = [threading.Thread(target=hammer) for _ in range(SLOW_THREADS if slow else 0)]
        for worker in workers:
            worker.start()
        time.sleep(0.5 if slow else 0)  # the slow calls take every connection they can
        latencies: list[float] = []
        failures: Counter[str] = Counter()
        calls = 0
        end = time.monotonic() + duration
        while time.monotonic() < end:
            calls += 1
            started = time.monotonic()
            try:
                client.get(fast).raise_for_status()
                latencies.append((time.monotonic() - started) * 1000)
            except httpx.HTTPError as exc:
                failures[type(exc).__name__] += 1
            time.sleep(max(0.0, INTERVAL - (time.monotonic() - started)))
        stop.set()
        for worker in workers:
            worker.join()
    latencies.sort()

    def q(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] if latencies else 0.0

    return {
        "calls": calls,
        "success_rate": len(latencies) / calls,
        "p50_ms": q(0.5),
        "p99_ms": q(0.99),
        "max_ms": latencies[-1] if latencies else 0.0,
        "failures": dict(failures),
    }


def isolation(server: h.NodeServer, runs: int, duration: float) -> dict[str, list[dict[str, Any]]]:
    fast = server.url(0)
    slow = server.url(1, f"/slow?ms={SLOW_MS}")
    makers: dict[str, Callable[[], httpx.BaseTransport]] = {
        "httpx default": lambda: httpx.HTTPTransport(
            limits=httpx.Limits(max_connections=BUDGET, max_keepalive_connections=BUDGET)
        ),
        "bulkhead": lambda: BulkheadHTTPTransport(default=Policy(max_concurrency=BUDGET // 2)),
    }
    results: dict[str, list[dict[str, Any]]] = {}
    for n in range(runs):
        for load in ("no load", "under load"):
            for name, make in makers.items():
                label = f"{load}, {name}"
                h_log(f"isolation run {n + 1}: {label}")
                run = _isolation_run(make(), fast, slow if load == "under load" else None, duration)
                results.setdefault(label, []).append(run)
    return results


# -- report ------------------------------------------------------------------------------------
def h_log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _spread(values: list[float], digits: int) -> str:
    med = statistics.median(values)
    return f"{med:,.{digits}f} ({min(values):,.{digits}f}-{max(values):,.{digits}f})"


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "## Sync transport: CPU per request (httpx.Client, HTTP/1.1 keep-alive, one origin)",
        "",
        f"Machine: {data['machine']}. Client CPU time (all threads) per request, median over"
        " interleaved rounds; ratios are medians of same-round ratios to httpx's default sync"
        " transport (range over rounds).",
        "",
        "| threads | httpx default µs/req | bulkhead µs/req | bulkhead / default (range)"
        " | bulkhead+httptools µs/req | +httptools / default (range) | samples |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in data["cpu"]:
        d, b, t = row["httpx default"], row["bulkhead"], row["bulkhead+httptools"]
        lines.append(
            f"| {row['threads']} | {d['us_per_request']:,.0f} | {b['us_per_request']:,.0f}"
            f" | {b['ratio']:.2f}x ({b['ratio_range'][0]:.2f}-{b['ratio_range'][1]:.2f})"
            f" | {t['us_per_request']:,.0f}"
            f" | {t['ratio']:.2f}x ({t['ratio_range'][0]:.2f}-{t['ratio_range'][1]:.2f})"
            f" | {row['rounds']} x {row['requests']:,} |"
        )
    runs = data["isolation"]
    count = len(next(iter(runs.values())))
    lines += [
        "",
        f"## Sync transport: isolation (slow host {SLOW_MS} ms per response, {SLOW_THREADS}"
        f" threads; {BUDGET} connections in all; pool timeout {POOL_TIMEOUT} s)",
        "",
        f"{count} runs; median of the runs (range). httpx default: one pool of {BUDGET};"
        f" bulkhead: {BUDGET // 2} per compartment.",
        "",
        "| fast host, called every 50 ms | samples | success % | p50 ms | p99 ms | max ms"
        " | failures |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for label, label_runs in runs.items():
        failures: Counter[str] = Counter()
        for run in label_runs:
            failures.update(run["failures"])
        failed = ", ".join(f"{k} {v}" for k, v in sorted(failures.items())) or "-"
        calls = sorted(run["calls"] for run in label_runs)
        lines.append(
            f"| {label} | {len(label_runs)} x {calls[0]}-{calls[-1]}"
            f" | {_spread([100 * r['success_rate'] for r in label_runs], 1)}"
            f" | {_spread([r['p50_ms'] for r in label_runs], 1)}"
            f" | {_spread([r['p99_ms'] for r in label_runs], 1)}"
            f" | {_spread([r['max_ms'] for r in label_runs], 1)}"
            f" | {failed} (all runs) |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, shorter runs")
    args = parser.parse_args()
    rounds, requests, runs, duration = (2, 400, 1, 4.0) if args.quick else (6, 2000, 3, 8.0)
    machine = h.machine_info()
    with h.NodeServer(ports=2) as server, h.pin() as pinned:
        data: dict[str, Any] = {
            "machine": f"{machine['nproc']} cores, {machine['cpu_model']}, Python"
            f" {machine['python']}, httpx {machine['httpx']}, h11 {machine['h11']},"
            f" client pinned to one core, server to another: {pinned and server.pinned}",
            "library": h.library_info(),
            "cpu": cpu(server, rounds, requests),
            "isolation": isolation(server, runs, duration),
        }
    (HERE / "sync_results.json").write_text(json.dumps(data, indent=1) + "\n")
    text = markdown(data)
    (HERE / "sync_results.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
