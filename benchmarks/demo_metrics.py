"""The demo's bulkhead run as a dashboard sees it: a plot of the exported metrics.

    python -m benchmarks.demo_metrics                      # writes benchmarks/demo_metrics.png
    python -m benchmarks.demo_metrics --slow-seconds 2 --duration 8 --out /tmp/m.png

Runs the scenario of ``python -m httpx_bulkhead demo`` (its servers and load generators,
``httpx_bulkhead._demo``) through a ``BulkheadTransport`` with ``N // 2`` slots per host:
``3N`` workers call the slow host back to back, then the fast host is called every
``--fast-interval`` seconds.  Every 100 ms a sampler scrapes a ``prometheus_client``
registry holding a ``BulkheadCollector`` (``generate_latest``, parsed back with
``text_string_to_metric_families``, as Prometheus would read it) and the plot shows, per
compartment, slots in use against the limit, requests waiting, the acquire-wait p99 and
the rate of acquire timeouts.  The p99 is over the last 1024 acquire attempts, so it keeps
its value once the traffic stops.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import defaultdict
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from httpx_bulkhead import BulkheadTransport, Policy
from httpx_bulkhead._demo import DemoConfig, DemoServer
from httpx_bulkhead._load import CallRecord, cancel_all, saturate, steady_calls
from httpx_bulkhead.prometheus import BulkheadCollector

HERE = Path(__file__).resolve().parent
SAMPLE_EVERY = 0.1
RATE_WINDOW = 1.0

Series = dict[str, dict[str, list[float]]]  # figure -> compartment -> values


def scrape(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    """``(figure, compartment) -> value`` from one scrape."""
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            compartment = sample.labels.get("compartment", "")
            if sample.name == "httpx_bulkhead_acquire_wait_seconds":
                if sample.labels.get("quantile") == "0.99":
                    out["wait_p99", compartment] = sample.value
            elif sample.name == "httpx_bulkhead_waiting_requests":
                key = ("waiting", compartment)
                out[key] = out.get(key, 0.0) + sample.value
            elif sample.name == "httpx_bulkhead_running_requests":
                out["running", compartment] = sample.value
            elif sample.name == "httpx_bulkhead_concurrency_limit":
                out["limit", compartment] = sample.value
            elif sample.name == "httpx_bulkhead_acquire_timeouts_total":
                out["acquire_timeouts", compartment] = sample.value
    return out


async def run(config: DemoConfig) -> tuple[list[float], Series]:
    slow = await DemoServer(config.slow_seconds).start()
    fast = await DemoServer(0.0).start()
    transport = BulkheadTransport(
        default=Policy(max_concurrency=max(1, config.connections // 2)), trust_env=False
    )
    registry = CollectorRegistry()
    registry.register(BulkheadCollector(transport))
    names = {  # compartment (an unlisted origin: scheme://host:port) -> label
        f"http://{httpx.URL(server.url).netloc.decode()}": label
        for server, label in ((slow, "slow"), (fast, "fast"))
    }
    times: list[float] = []
    series: Series = defaultdict(lambda: defaultdict(list))
    sampling: asyncio.Task[None] | None = None
    records: list[CallRecord] = []
    t0 = time.perf_counter()

    async def sampler() -> None:
        while True:
            values = scrape(registry)
            times.append(time.perf_counter() - t0)
            for compartment, label in names.items():
                for figure in ("running", "waiting", "wait_p99", "limit", "acquire_timeouts"):
                    series[figure][label].append(values.get((figure, compartment), 0.0))
            await asyncio.sleep(SAMPLE_EVERY)  # the sampling rate itself

    try:
        async with httpx.AsyncClient(transport=transport, timeout=config.timeout) as client:
            sampling = asyncio.create_task(sampler())
            await asyncio.sleep(0.5)  # a quiet baseline on the plot
            workers = await saturate(
                client, slow.url, host="slow", workers=config.slow_workers, records=records, t0=t0
            )
            await steady_calls(
                client,
                lambda _: fast.url,
                host="fast",
                interval=config.fast_interval,
                duration=config.duration,
                records=records,
                t0=t0,
            )
            await cancel_all(workers)
            await asyncio.sleep(1.0)  # the drain on the plot
    finally:
        if sampling is not None:
            await cancel_all([sampling])
        await transport.aclose()
        await slow.aclose()
        await fast.aclose()
    return times, series


def _rate(times: list[float], total: list[float], i: int, window: float) -> float:
    """Per second over the last ``window`` seconds up to sample ``i`` (as PromQL's rate)."""
    j = i
    while j > 0 and times[i] - times[j - 1] <= window:
        j -= 1
    return (total[i] - total[j]) / (times[i] - times[j]) if i > j else 0.0


def plot(times: list[float], series: Series, config: DemoConfig, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"slow": "tab:red", "fast": "tab:blue"}
    fig, axes = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
    n = len(times)
    limit = max(series["limit"]["slow"][:n], default=0.0)
    axes[0].axhline(limit, color="gray", linestyle=":", label=f"limit ({limit:g} each)")
    for label, color in colors.items():
        axes[0].plot(times, series["running"][label][:n], color=color, label=label)
        axes[1].plot(times, series["waiting"][label][:n], color=color, label=label)
        axes[2].plot(
            times, [1e3 * v for v in series["wait_p99"][label][:n]], color=color, label=label
        )
        total = series["acquire_timeouts"][label][:n]
        rate = [_rate(times, total, i, RATE_WINDOW) for i in range(n)]
        axes[3].plot(times, rate, color=color, label=label)
    axes[0].set_ylabel("slots in use\nrunning_requests")
    axes[1].set_ylabel("waiting\nwaiting_requests")
    axes[2].set_ylabel("acquire wait p99 (ms)\nacquire_wait_seconds")
    axes[3].set_ylabel("acquire timeouts/s\nrate(..._total[1s])")
    axes[3].set_xlabel("seconds (metrics: httpx_bulkhead_*, per compartment)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=8)
    fig.suptitle(
        f"Demo, BulkheadTransport ({max(1, config.connections // 2)} slots per host):"
        f" {config.slow_workers} workers on the slow host ({config.slow_seconds:g} s per"
        f" response), a fast call every {config.fast_interval * 1e3:g} ms;"
        f" scraped every {SAMPLE_EVERY * 1e3:g} ms",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    d = DemoConfig()
    parser.add_argument("--slow-seconds", type=float, default=d.slow_seconds)
    parser.add_argument("--duration", type=float, default=d.duration)
    parser.add_argument("--connections", type=int, default=d.connections)
    parser.add_argument("--fast-interval", type=float, default=d.fast_interval)
    parser.add_argument("--pool-timeout", type=float, default=d.pool_timeout)
    parser.add_argument("--out", type=Path, default=HERE / "demo_metrics.png")
    args = parser.parse_args()
    config = DemoConfig(
        slow_seconds=args.slow_seconds,
        duration=args.duration,
        connections=args.connections,
        fast_interval=args.fast_interval,
        pool_timeout=args.pool_timeout,
    )
    times, series = asyncio.run(run(config))
    plot(times, series, config, args.out)
    print(f"wrote {args.out} ({len(times)} samples)")


if __name__ == "__main__":
    main()
