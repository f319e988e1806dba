"""Run every benchmark interleaved, write ``results.json``, print markdown tables, plot.

    python -m benchmarks.report            # the full run, about 3-5 minutes
    python -m benchmarks.report --quick    # about a minute
    python benchmarks/report.py --suites overhead,isolation

Suites (all against httpx's default ``AsyncHTTPTransport`` in the same run, on a Node.js
server on 127.0.0.1; see ``harness.py`` for how things are measured):

overhead   client CPU per request, HTTP/1.1 keep-alive, concurrency 1 and 64, through
           ``httpx.AsyncClient`` and at the transport level, beside a raw h11 floor.
scaling    CPU per request with 1/10/100/1,000 origins (ports), and with 10 vs 1,000
           pooled connections to one origin, at concurrency 10 (transport level).  httpx's
           default pool does O(connections^2) work per request, so its warm-up is bounded
           and the pool size it reached is shown beside its numbers.
isolation  a slow host (2 s per response) saturated by 30 workers while a fast host is
           called every 50 ms: fast-host success and latency with no load, with
           bulkheads (5 per host) and with one shared pool (10), same pool timeout.
recovery   the slow host hangs (every response held ``hang`` s) until ``incident`` s, then
           answers at once; the slow compartment with and without ``request_timeout``:
           how soon its own queued calls succeed again.
profile    cProfile of each transport (transport level): exclusive CPU by package.

Writes ``benchmarks/results.json`` (every sample), ``benchmarks/results.md`` (the tables),
and, if matplotlib is installed, ``benchmarks/isolation.png`` and ``benchmarks/recovery.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from benchmarks import harness as h
from httpx_bulkhead import BulkheadTransport, Policy

OUT = Path(__file__).resolve().parent
SUITES = ("overhead", "scaling", "isolation", "recovery", "profile")


@dataclass(frozen=True)
class Plan:
    """Sizes of one report run (``--quick`` shrinks them)."""

    rounds: int
    batch_c1: int
    batch_c64: int
    batch_seconds: float
    scaling_rounds: int
    scaling_batch: int
    scaling_batch_seconds: float
    scaling_warm_seconds: float
    default_fill_cap: int
    isolation_seconds: float
    recovery_seconds: float
    recovery_incident: float
    recovery_hang: float

    @classmethod
    def full(cls) -> Plan:
        return cls(6, 500, 2000, 1.0, 4, 1000, 1.5, 10.0, 400, 8.0, 10.0, 3.0, 8.0)

    @classmethod
    def quick(cls) -> Plan:
        return cls(3, 250, 800, 0.4, 2, 300, 0.6, 3.0, 200, 3.0, 4.0, 1.0, 3.0)


ORIGINS = (1, 10, 100, 1000)
POOLED = (10, 1000)
SCALING_CONCURRENCY = 10
ISOLATION_BUDGET = 10  # total connections: one shared pool of 10, or 5 per compartment
POOL_TIMEOUT = 0.5
SLOW_MS = 2000
SLOW_WORKERS = 3 * ISOLATION_BUDGET
REQUEST_TIMEOUT = 0.5


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def summaries_json(samples: dict[str, list[h.Sample]]) -> dict[str, Any]:
    return {
        "summary": {k: v.to_json() for k, v in h.summarize(samples).items()},
        "samples": {
            k: [{"requests": s.requests, "cpu": s.cpu, "wall": s.wall} for s in v]
            for k, v in samples.items()
        },
    }


# -- suites ---------------------------------------------------------------------------------
async def overhead(server: h.NodeServer, plan: Plan) -> list[dict[str, Any]]:
    rows = []
    for level in ("client", "transport"):
        for concurrency in (1, 64):
            batch = plan.batch_c1 if concurrency == 1 else plan.batch_c64
            log(f"overhead: {level} level, concurrency {concurrency}")
            drivers = [
                await h.make_driver(name, level, [server.url(0)], concurrency)
                for name in h.CONTESTANTS
            ]
            try:
                samples = await h.interleave(
                    drivers,
                    rounds=plan.rounds,
                    requests=batch,
                    concurrency=concurrency,
                    warmup=max(200, 2 * concurrency),
                    max_seconds=plan.batch_seconds,
                )
            finally:
                for driver in drivers:
                    await driver.aclose()
            rows.append({"level": level, "concurrency": concurrency, **summaries_json(samples)})
    return rows


async def profile(server: h.NodeServer, plan: Plan) -> list[dict[str, Any]]:
    rows = []
    for contestant in (h.BULKHEAD, h.DEFAULT):
        for concurrency in (1, 64):
            log(f"profile: {contestant}, transport level, concurrency {concurrency}")
            driver = await h.make_driver(contestant, "transport", [server.url(0)], concurrency)
            try:
                await h.run_batch(driver, 2 * concurrency, concurrency)
                # httpx's default at concurrency 64 is ~30x slower: fewer requests suffice
                requests = plan.batch_c1
                if contestant == h.DEFAULT:
                    requests //= 2 if concurrency == 1 else 8
                shares, sample = await h.profile_breakdown(driver, requests, concurrency)
            finally:
                await driver.aclose()
            rows.append(
                {
                    "contestant": contestant,
                    "concurrency": concurrency,
                    "shares": shares,
                    "cpu_us_profiled": sample.cpu_us,
                }
            )
    return rows


async def _scaling_case(
    name: str,
    urls: Sequence[str],
    plan: Plan,
    *,
    fill: int | None = None,
) -> dict[str, Any]:
    """Both transports warm (bulkhead first, see below), then interleaved rounds.

    The default transport's pool work per request grows with the square of its connections
    (filling it with n, with the cube), so its warm-up over many origins is cut at
    ``plan.scaling_warm_seconds``, its pool is filled with at most ``plan.default_fill_cap``
    connections, and the pool size it reached is recorded beside the numbers.
    BulkheadTransport is warmed first so its sockets get descriptors below 1024: its
    stale-connection check uses ``select()``, which fails above that (a bug, reported).
    """
    concurrency = SCALING_CONCURRENCY
    drivers: list[h.TransportDriver] = []
    for contestant in (h.BULKHEAD, h.DEFAULT):
        transport: httpx.AsyncBaseTransport
        if contestant == h.DEFAULT:  # one origin: a pool of ``fill``; else unlimited
            transport = h.default_transport(fill)
        else:  # a compartment per origin, ``fill`` or ``concurrency`` connections each
            transport = h.bulkhead_transport(fill or concurrency)
        drivers.append(h.TransportDriver(contestant, transport, urls))
    row: dict[str, Any] = {
        "case": name,
        "origins": len(urls),
        "concurrency": concurrency,
        "open_fds_at_start": h.open_fds(),
    }
    try:
        row["warmup_seconds"] = warm = {}
        for driver in drivers:
            if fill is not None:
                size = fill if driver.name == h.BULKHEAD else min(fill, plan.default_fill_cap)
                warm[driver.name] = await h.fill_pool(driver, urls[0], size)
            else:
                warm[driver.name] = await h.warm_origins(
                    driver, urls, concurrency, max_seconds=plan.scaling_warm_seconds
                )
        row["pooled_before"] = {d.name: h.pool_size(d.transport) for d in drivers}
        samples = await h.interleave(
            drivers,
            rounds=plan.scaling_rounds,
            requests=plan.scaling_batch,
            concurrency=concurrency,
            warmup=min(100, plan.scaling_batch),
            max_seconds=plan.scaling_batch_seconds,
        )
        row["pooled_after"] = {d.name: h.pool_size(d.transport) for d in drivers}
        row.update(summaries_json(samples))
    except Exception as exc:  # record it: one failing case must not lose the others
        row["error"] = f"{type(exc).__name__}: {exc}"
        log(f"  {name}: {row['error']}")
    finally:
        for driver in drivers:
            await driver.aclose()
    return row


async def scaling(server: h.NodeServer, plan: Plan) -> list[dict[str, Any]]:
    rows = []
    for n in ORIGINS:
        log(f"scaling: {n} origins")
        urls = [server.url(i) for i in range(n)]
        rows.append(await _scaling_case(f"{n} origins", urls, plan))
    for pooled in POOLED:
        log(f"scaling: one origin, {pooled} pooled connections")
        rows.append(await _scaling_case(f"{pooled} pooled", [server.url(0)], plan, fill=pooled))
    return rows


def _isolation_transports() -> dict[str, Callable[[], httpx.AsyncBaseTransport]]:
    budget = ISOLATION_BUDGET
    return {
        "httpx-default": lambda: h.default_transport(budget, max_keepalive=budget),
        "bulkhead": lambda: BulkheadTransport(default=Policy(max_concurrency=budget // 2)),
    }


async def isolation(server: h.NodeServer, plan: Plan) -> dict[str, Any]:
    fast_url = server.url(0)
    slow = server.url(1, f"/slow?ms={SLOW_MS}")
    runs: list[h.LoadRun] = []
    for name, make in _isolation_transports().items():
        log(f"isolation: no load, {name}")
        runs.append(
            await h.load_run(
                f"no load, {name}",
                make(),
                fast_url=fast_url,
                slow_url=None,
                duration=plan.isolation_seconds,
                pool_timeout=POOL_TIMEOUT,
            )
        )
    for name, make in _isolation_transports().items():
        log(f"isolation: slow host saturated, {name}")
        runs.append(
            await h.load_run(
                f"under load, {name}",
                make(),
                fast_url=fast_url,
                slow_url=lambda _: slow,
                slow_workers=SLOW_WORKERS,
                saturation=ISOLATION_BUDGET if name == h.DEFAULT else ISOLATION_BUDGET // 2,
                duration=plan.isolation_seconds,
                pool_timeout=POOL_TIMEOUT,
            )
        )
    return {
        "slow_ms": SLOW_MS,
        "slow_workers": SLOW_WORKERS,
        "budget": ISOLATION_BUDGET,
        "pool_timeout": POOL_TIMEOUT,
        "interval": 0.05,
        "duration": plan.isolation_seconds,
        "runs": [
            {
                "label": run.label,
                "saturated_after": run.saturated_after,
                "fast": run.fast_summary(),
                "slow": h.host_summary(run.of("slow")),
                "records": h.records_json(run.records),
            }
            for run in runs
        ],
    }


async def recovery(server: h.NodeServer, plan: Plan) -> dict[str, Any]:
    fast_url = server.url(0)
    slow_port = server.ports[1]
    hang = f"/slow?ms={int(plan.recovery_hang * 1000)}"

    def slow_url(t: float) -> str:
        return server.url(1, hang if t < plan.recovery_incident else "/")

    out: dict[str, Any] = {
        "incident": plan.recovery_incident,
        "hang": plan.recovery_hang,
        "duration": plan.recovery_seconds,
        "request_timeout": REQUEST_TIMEOUT,
        "pool_timeout": POOL_TIMEOUT,
        "interval": 0.05,
        "runs": [],
    }
    for request_timeout in (None, REQUEST_TIMEOUT):
        label = f"request_timeout={request_timeout}"
        log(f"recovery: {label}")
        slow_policy = Policy(max_concurrency=ISOLATION_BUDGET // 2, request_timeout=request_timeout)
        transport = BulkheadTransport(
            default=Policy(max_concurrency=ISOLATION_BUDGET // 2),
            hosts={f"127.0.0.1:{slow_port}": slow_policy},
        )
        run = await h.load_run(
            label,
            transport,
            fast_url=fast_url,
            slow_url=slow_url,
            slow_rate=0.05,
            duration=plan.recovery_seconds,
            pool_timeout=POOL_TIMEOUT,
        )
        slow_records = run.of("slow")
        after = [
            r.sent_at + r.latency
            for r in slow_records
            if r.ok and r.sent_at >= plan.recovery_incident
        ]
        out["runs"].append(
            {
                "label": label,
                "fast": run.fast_summary(),
                "slow": h.host_summary(slow_records),
                "first_success_after_incident": (
                    min(after) - plan.recovery_incident if after else None
                ),
                "slow_ok_after_incident": len(after),
                "slow_calls_after_incident": sum(
                    r.sent_at >= plan.recovery_incident for r in slow_records
                ),
                "timeline": h.success_timeline(
                    slow_records, bucket=0.5, until=plan.recovery_seconds
                ),
                "records": h.records_json(run.records),
            }
        )
    return out


# -- rendering -------------------------------------------------------------------------------
def _f(value: float | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def _ratio(value: float | None, spread: Sequence[float] | None = None) -> str:
    if value is None:
        return "-"
    digits = 2 if value >= 0.1 else 3 if value >= 0.01 else 4
    text = f"{value:.{digits}f}x"
    if spread:
        text += f" ({spread[0]:.{digits}f}-{spread[1]:.{digits}f})"
    return text


def overhead_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| level | conc. | httpx default µs/req | bulkhead µs/req | bulkhead / default "
        "(range) | h11 floor µs/req | bulkhead / floor | default req/s | bulkhead req/s |"
        " floor req/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        s = row["summary"]
        d, b, f = s[h.DEFAULT], s[h.BULKHEAD], s[h.FLOOR]
        lines.append(
            f"| {row['level']} | {row['concurrency']} | {_f(d['cpu_us'])} | {_f(b['cpu_us'])}"
            f" | {_ratio(b['cpu_ratio'], b['cpu_ratio_range'])} | {_f(f['cpu_us'])}"
            f" | {_ratio(b['cpu_us'] / f['cpu_us'])} | {_f(d['rps'])} | {_f(b['rps'])}"
            f" | {_f(f['rps'])} |"
        )
    return "\n".join(lines)


def scaling_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| case (concurrency 10) | httpx default µs/req | bulkhead µs/req | bulkhead / default"
        " (range) | default req/s | bulkhead req/s | pooled conns, default / bulkhead |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['case']} | error: {row['error']} | | | | | |")
            continue
        s = row["summary"]
        d, b = s[h.DEFAULT], s[h.BULKHEAD]
        pooled = row["pooled_after"]
        lines.append(
            f"| {row['case']} | {_f(d['cpu_us'])} | {_f(b['cpu_us'])}"
            f" | {_ratio(b['cpu_ratio'], b['cpu_ratio_range'])} | {_f(d['rps'])}"
            f" | {_f(b['rps'])} | {pooled.get(h.DEFAULT)} / {pooled.get(h.BULKHEAD)} |"
        )
    return "\n".join(lines)


def _failures(failures: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(failures.items(), key=lambda kv: -kv[1])) or "-"


def isolation_table(data: dict[str, Any]) -> str:
    lines = [
        "| fast host, called every 50 ms | success | p50 ms | p99 ms | max ms | failures |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for run in data["runs"]:
        f = run["fast"]
        lines.append(
            f"| {run['label']} | {f['ok']}/{f['calls']} ({100 * f['success_rate']:.1f}%)"
            f" | {_f(f['p50_ms'], 1)} | {_f(f['p99_ms'], 1)} | {_f(f['max_ms'], 1)}"
            f" | {_failures(f['failures'])} |"
        )
    return "\n".join(lines)


def recovery_table(data: dict[str, Any]) -> str:
    lines = [
        "| slow compartment | slow ok / calls sent after the incident | first slow success"
        " after the incident | slow failures | fast success |",
        "|---|---:|---:|---|---:|",
    ]
    for run in data["runs"]:
        first = run["first_success_after_incident"]
        fast = run["fast"]
        lines.append(
            f"| {run['label']} | {run['slow_ok_after_incident']}/"
            f"{run['slow_calls_after_incident']} | {_f(first, 2)} s"
            f" | {_failures(run['slow']['failures'])}"
            f" | {fast['ok']}/{fast['calls']} |"
        )
    lines.append("")
    lines.append("Slow-host successes per 0.5 s (by completion time):")
    lines.append("")
    for run in data["runs"]:
        counts = " ".join(f"{b['ok']:>2}" for b in run["timeline"])
        lines.append(f"    {run['label']:<22} {counts}")
    return "\n".join(lines)


def profile_table(rows: list[dict[str, Any]]) -> str:
    packages: list[str] = []
    for row in rows:
        packages += [p for p in row["shares"] if p not in packages]
    header = " | ".join(f"{r['contestant']} c={r['concurrency']}" for r in rows)
    lines = [f"| exclusive CPU share (cProfile) | {header} |", "|---" + "|---:" * len(rows) + "|"]
    for package in packages:
        cells = " | ".join(f"{100 * r['shares'].get(package, 0.0):.0f}%" for r in rows)
        lines.append(f"| {package} | {cells} |")
    return "\n".join(lines)


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lib = results["library"]
    parts = [
        "# httpx-bulkhead benchmarks",
        "",
        f"Machine: {m['nproc']} cores, {m['cpu_model']}; Python {m['python']}; Node"
        f" {m['node']}; httpx {m['httpx']}, h11 {m['h11']}. Client pinned to one core,"
        f" server to another: {results['pinned']}. Library: git {lib.get('git_head')}"
        f"{' (modified)' if lib.get('library_dirty') else ''}, source {lib['source_sha256']}."
        f" Plan: {results['plan_name']}.",
        "",
        "CPU µs/req is client CPU time (`time.process_time()`) per request, the median over"
        " rounds; ratios are medians of same-round ratios (range over rounds).",
    ]
    if "overhead" in results:
        parts += ["", "## Overhead (HTTP/1.1 keep-alive, one origin)", ""]
        parts.append(overhead_table(results["overhead"]))
    if "scaling" in results:
        parts += ["", "## Scaling (transport level)", "", scaling_table(results["scaling"])]
    if "isolation" in results:
        d = results["isolation"]
        parts += [
            "",
            f"## Isolation (slow host {d['slow_ms']} ms per response, {d['slow_workers']}"
            f" workers; {d['budget']} connections in all; pool timeout {d['pool_timeout']} s)",
            "",
            isolation_table(d),
        ]
    if "recovery" in results:
        d = results["recovery"]
        parts += [
            "",
            f"## Recovery (slow host hangs {d['hang']} s per call until t={d['incident']} s,"
            f" then answers at once; a slow call every 50 ms; 5 slots;"
            f" request_timeout {d['request_timeout']} s)",
            "",
            recovery_table(d),
        ]
    if "profile" in results:
        parts += [
            "",
            "## Where the CPU goes (transport level, cProfile: shares, not timings)",
            "",
            profile_table(results["profile"]),
        ]
    return "\n".join(parts) + "\n"


# -- plots (optional: matplotlib) -------------------------------------------------------------
def plot(results: dict[str, Any], out: Path) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: no plots (pip install matplotlib)")
        return []
    written = []
    if "isolation" in results:
        data = results["isolation"]
        fig, ax = plt.subplots(figsize=(10, 5))
        colors = {
            "no load, httpx-default": "#999999",  # one no-load baseline is enough
            "under load, httpx-default": "#d62728",
            "under load, bulkhead": "#1f77b4",
        }
        for run in data["runs"]:
            color = colors.get(run["label"])
            if color is None:
                continue
            fast = [r for r in run["records"] if r[0] == "fast"]
            ok = [r for r in fast if r[3] is None]
            bad = [r for r in fast if r[3] is not None]
            if ok:
                xs, ys = [r[1] for r in ok], [1000 * r[2] for r in ok]
                ax.scatter(xs, ys, s=10, color=color, label=run["label"])
            if bad:
                ax.scatter(
                    [r[1] for r in bad],
                    [1000 * r[2] for r in bad],
                    s=22,
                    marker="x",
                    color=color,
                    label=f"{run['label']}: failed",
                )
        ax.axhline(1000 * data["pool_timeout"], color="k", lw=0.6, ls="--")
        ax.set_yscale("log")
        ax.set_xlabel("seconds since the run started (call sent)")
        ax.set_ylabel("fast-host latency, ms (log)")
        ax.set_title(
            f"Fast host beside a slow one ({data['slow_ms']} ms, {data['slow_workers']} workers);"
            f" {data['budget']} connections; pool timeout {data['pool_timeout']} s (dashed)"
        )
        ax.legend(fontsize=8, loc="center right")
        fig.tight_layout()
        path = out / "isolation.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    if "recovery" in results:
        data = results["recovery"]
        fig, ax = plt.subplots(figsize=(10, 4))
        for run, color in zip(data["runs"], ["#d62728", "#1f77b4"], strict=False):
            t = [b["t"] for b in run["timeline"]]
            ax.step(t, [b["ok"] for b in run["timeline"]], where="post", color=color,
                    label=f"{run['label']}: slow-host successes")  # fmt: skip
        ax.axvline(data["incident"], color="k", lw=0.6, ls="--")
        ax.set_xlabel("seconds since the run started (call completed)")
        ax.set_ylabel("successes per 0.5 s")
        ax.set_title(f"Slow host hangs until t={data['incident']} s (dashed), then recovers")
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / "recovery.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


# -- main ---------------------------------------------------------------------------------------
async def run(suites: Sequence[str], plan: Plan, server: h.NodeServer) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for suite in suites:
        started = time.perf_counter()
        if suite == "overhead":
            results[suite] = await overhead(server, plan)
        elif suite == "scaling":
            results[suite] = await scaling(server, plan)
        elif suite == "isolation":
            results[suite] = await isolation(server, plan)
        elif suite == "recovery":
            results[suite] = await recovery(server, plan)
        elif suite == "profile":
            results[suite] = await profile(server, plan)
        log(f"  {suite}: {time.perf_counter() - started:.0f} s")
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="smaller run, about a minute")
    parser.add_argument(
        "--suites", default=",".join(SUITES), help=f"comma-separated subset of {','.join(SUITES)}"
    )
    parser.add_argument("--out", type=Path, default=OUT, help="directory for the outputs")
    parser.add_argument(
        "--render",
        type=Path,
        metavar="RESULTS_JSON",
        help="measure nothing: print the tables and redraw the plots of a results.json",
    )
    args = parser.parse_args(argv)
    if args.render is not None:
        rendered: dict[str, Any] = json.loads(args.render.read_text())
        print(markdown(rendered))
        for path in plot(rendered, args.out):
            log(f"wrote {path}")
        return 0
    suites = [s.strip() for s in args.suites.split(",") if s.strip()]
    unknown = set(suites) - set(SUITES)
    if unknown:
        parser.error(f"unknown suites: {', '.join(sorted(unknown))}")
    plan = Plan.quick() if args.quick else Plan.full()
    started = time.perf_counter()
    with h.NodeServer(max(ORIGINS)) as server, h.pin() as pinned:
        results: dict[str, Any] = {
            "machine": h.machine_info(),
            "library": h.library_info(),
            "python": h.python_flags(),
            "pinned": pinned and server.pinned,
            "plan_name": "quick" if args.quick else "full",
            "plan": dataclasses.asdict(plan),
        }
        results.update(asyncio.run(run(suites, plan, server)))
    results["seconds"] = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    text = markdown(results)
    (args.out / "results.md").write_text(text)
    print(text)
    for path in plot(results, args.out):
        log(f"wrote {path}")
    log(f"done in {results['seconds']:.0f} s; wrote {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
