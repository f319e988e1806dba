"""Run every benchmark interleaved, write ``results.json``, print markdown tables, plot.

    python -m benchmarks.report            # the full run, about 3-5 minutes
    python -m benchmarks.report --quick    # about a minute
    python benchmarks/report.py --suites overhead,isolation
    python -m benchmarks.report --suites isolation,recovery --repeat 5

A run of some suites keeps the other suites' figures of the ``results.json`` it replaces
(each section says which run it comes from).  Isolation and recovery run ``--repeat``
times (3 by default): their tables give the median of the runs and the range (min-max).

Suites (all against httpx's default ``AsyncHTTPTransport`` in the same run, on a Node.js
server on 127.0.0.1; see ``harness.py`` for how things are measured):

overhead   client CPU per request, HTTP/1.1 keep-alive, concurrency 1 and 64, through
           ``httpx.AsyncClient`` and at the transport level: BulkheadTransport with
           ``http1_parser="h11"`` and with ``"httptools"`` (the default when installed),
           beside a raw h11 floor;
           each contestant on a port of its own, so the server counts its connections;
           beside them the httptools floor, httpx + httpx-aiohttp and aiohttp alone
           (``contestants.py``; a row is left out when its package is missing), and
           issue 18's targets marked met or not (``targets.py``).
http2      the same over HTTP/2 (h2c, prior knowledge, server cap 100 streams): httpx's
           default ``AsyncHTTPTransport(http1=False, http2=True)`` vs
           ``BulkheadTransport(http1=False, http2=True)`` beside an h2 floor (h2 on a bare
           asyncio Protocol) and the same floor called as a transport is (``floor + models``:
           it takes the httpx.Request and gives an httpx.Response, so ``bulkhead h2 /
           (floor + models)`` is what our code adds), with BulkheadTransport over HTTP/1.1
           in the same rounds for reference, and the TCP connections each opened; issue
           18's targets marked.
scaling    CPU per request with 1/10/100/1,000 origins (ports), and with 10 vs 1,000
           pooled connections to one origin, at concurrency 10 (transport level), for both
           HTTP/1.1 codecs of BulkheadTransport.  httpx's default pool does
           O(connections^2) work per request, so its warm-up is bounded and the pool size it
           reached is shown beside its numbers.
isolation  a slow host (2 s per response) saturated by 30 workers while a fast host is
           called every 50 ms: fast-host success and latency with no load, with
           bulkheads (5 per host) and with one shared pool (10), same pool timeout.
recovery   the slow host hangs (every response held ``hang`` s) until ``incident`` s, then
           answers at once; the slow compartment with and without ``request_timeout``:
           how soon its own queued calls succeed again.
uvloop     the overhead suite again, under uvloop's event loop (``pip install uvloop``).
profile    cProfile of each transport (transport level, HTTP/1.1 and HTTP/2): exclusive
           CPU by package, and the hottest functions of BulkheadTransport's at concurrency 64.

Every CPU table says how many samples each cell rests on (rounds x requests per round, per
contestant); the isolation and recovery tables say how many runs and calls.

Writes ``benchmarks/results.json`` (every sample), ``benchmarks/results.md`` (the tables),
and, if matplotlib is installed, ``benchmarks/isolation.png`` and ``benchmarks/recovery.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import statistics
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
from benchmarks import models_floor as mf
from benchmarks import targets as tg
from benchmarks.contestants import available
from httpx_bulkhead import BulkheadTransport, Policy

OUT = Path(__file__).resolve().parent
SUITES = ("overhead", "http2", "scaling", "isolation", "recovery", "profile", "uvloop")


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
#: SETTINGS_MAX_CONCURRENT_STREAMS of the HTTP/2 server (and BulkheadTransport's own cap).
H2_MAX_STREAMS = 100
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


def paired_json(
    samples: dict[str, list[h.Sample]], pairs: Sequence[tuple[str, str]]
) -> dict[str, Any]:
    """Same-round CPU ratios ``"a/b": [median, min, max]`` for the pairs both in ``samples``."""
    return {
        f"{a}/{b}": list(h.paired_ratio(samples, a, b))
        for a, b in pairs
        if a in samples and b in samples
    }


@dataclass(frozen=True)
class Entry:
    """One contestant of an overhead case: its name and the server (and port) it uses."""

    name: str
    server: h.NodeServer
    port: int


async def _overhead_case(
    entries: Sequence[Entry], level: h.Level, concurrency: int, plan: Plan
) -> dict[str, Any]:
    """Interleaved rounds of every entry; each entry's server counts the connections and
    the most streams at once on one connection, from the drivers' making to their closing."""
    batch = plan.batch_c1 if concurrency == 1 else plan.batch_c64
    servers = list({id(e.server): e.server for e in entries}.values())
    for server in servers:
        server.reset()
    drivers = [
        await h.make_driver(e.name, level, [e.server.url(e.port)], concurrency) for e in entries
    ]
    client: dict[str, dict[str, int]] = {}
    try:
        samples = await h.interleave(
            drivers,
            rounds=plan.rounds,
            requests=batch,
            concurrency=concurrency,
            warmup=max(200, 2 * concurrency),
            max_seconds=plan.batch_seconds,
        )
        for driver in drivers:
            if isinstance(driver, h.ClientDriver | h.TransportDriver):
                client[driver.name] = h.client_connection_stats(driver.transport)
    finally:
        for driver in drivers:
            await driver.aclose()
    stats = {id(server): server.stats() for server in servers}
    # "open" is left out: the server may not have seen the last closes yet
    seen = {
        e.name: {k: v for k, v in stats[id(e.server)][e.port].items() if k != "open"}
        for e in entries
    }
    return {
        "level": level,
        "concurrency": concurrency,
        **summaries_json(samples),
        "paired": paired_json(
            samples,
            [
                (h.BULKHEAD, h.FLOOR),
                (h.HTTPTOOLS, h.FLOOR),
                (h.HTTPTOOLS, h.BULKHEAD),
                (h.H2_BULKHEAD, h.BULKHEAD),
                *tg.PAIRS,
                *mf.pairs(),
                (h.H2_BULKHEAD, h.H2_FLOOR),
                (h.H2_BULKHEAD, h.H2_FLOOR_MODELS),
                (h.H2_FLOOR_MODELS, h.H2_FLOOR),
            ],
        ),
        "server": seen,  # per contestant: port, connections, requests, max_streams
        "client_connections": client,
    }


# -- suites ---------------------------------------------------------------------------------
async def overhead(server: h.NodeServer, plan: Plan) -> list[dict[str, Any]]:
    names = [*h.CONTESTANTS, *(n for n in h.MORE_CONTESTANTS if available(n))]
    names += [n for n in mf.MODELS_FLOORS if mf.models_available(n)]
    entries = [Entry(name, server, i) for i, name in enumerate(names)]
    rows = []
    for level in ("client", "transport"):
        for concurrency in (1, 64):
            log(f"overhead: {level} level, concurrency {concurrency}")
            rows.append(await _overhead_case(entries, level, concurrency, plan))
    return rows


async def http2(server: h.NodeServer, h2server: h.NodeServer, plan: Plan) -> list[dict[str, Any]]:
    """HTTP/2 (h2c, prior knowledge) contestants on ``h2server``, each on a port of its own,
    and BulkheadTransport over HTTP/1.1 on ``server`` in the same rounds for reference."""
    entries = [
        *(Entry(name, h2server, i) for i, name in enumerate(h.H2_CONTESTANTS)),
        Entry(h.BULKHEAD, server, 0),
    ]
    rows = []
    for level in ("client", "transport"):
        for concurrency in (1, 64):
            log(f"http2: {level} level, concurrency {concurrency}")
            row = await _overhead_case(entries, level, concurrency, plan)
            row["max_concurrent_streams"] = h2server.max_concurrent_streams
            rows.append(row)
    return rows


PROFILED = (h.BULKHEAD, h.HTTPTOOLS, h.DEFAULT, h.H2_BULKHEAD, h.H2_DEFAULT)


async def profile(server: h.NodeServer, h2server: h.NodeServer, plan: Plan) -> list[dict[str, Any]]:
    rows = []
    for contestant in PROFILED:
        url = (h2server if contestant in h.H2_CONTESTANTS else server).url(0)
        for concurrency in (1, 64):
            log(f"profile: {contestant}, transport level, concurrency {concurrency}")
            driver = await h.make_driver(contestant, "transport", [url], concurrency)
            try:
                await h.run_batch(driver, 2 * concurrency, concurrency)
                # httpx's default at concurrency 64 is ~30x slower: fewer requests suffice
                requests = plan.batch_c1
                if contestant == h.DEFAULT:
                    requests //= 2 if concurrency == 1 else 8
                shares, sample, top = await h.profile_breakdown(driver, requests, concurrency)
            finally:
                await driver.aclose()
            rows.append(
                {
                    "contestant": contestant,
                    "concurrency": concurrency,
                    "shares": shares,
                    "cpu_us_profiled": sample.cpu_us,
                    "requests": sample.requests,
                    "top": top,
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
    """Every transport warm (BulkheadTransport's first), then interleaved rounds.

    The default transport's pool work per request grows with the square of its connections
    (filling it with n, with the cube), so its warm-up over many origins is cut at
    ``plan.scaling_warm_seconds``, its pool is filled with at most ``plan.default_fill_cap``
    connections, and the pool size it reached is recorded beside the numbers.
    BulkheadTransport was once warmed first so its sockets got descriptors below 1024 (its
    stale-connection check used ``select()``); it uses ``poll()`` now, and with both of its
    codecs at 1,000 origins the second one's descriptors are above 1024 anyway.
    """
    concurrency = SCALING_CONCURRENCY
    drivers: list[h.TransportDriver] = []
    for contestant in (h.BULKHEAD, h.HTTPTOOLS, h.DEFAULT):
        transport: httpx.AsyncBaseTransport
        if contestant == h.DEFAULT:  # one origin: a pool of ``fill``; else unlimited
            transport = h.default_transport(fill)
        else:  # a compartment per origin, ``fill`` or ``concurrency`` connections each
            parser = "httptools" if contestant == h.HTTPTOOLS else "h11"
            transport = h.bulkhead_transport(fill or concurrency, http1_parser=parser)
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
                size = fill if driver.name != h.DEFAULT else min(fill, plan.default_fill_cap)
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
        row["paired"] = paired_json(samples, [(h.HTTPTOOLS, h.BULKHEAD)])
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


async def isolation(server: h.NodeServer, plan: Plan, repeat: int = 1) -> dict[str, Any]:
    """The isolation runs ``repeat`` times over (``repeats``: one list of runs each)."""
    repeats = []
    for n in range(repeat):
        log(f"isolation: run {n + 1} of {repeat}")
        repeats.append(await _isolation_once(server, plan))
    return {
        "slow_ms": SLOW_MS,
        "slow_workers": SLOW_WORKERS,
        "budget": ISOLATION_BUDGET,
        "pool_timeout": POOL_TIMEOUT,
        "interval": 0.05,
        "duration": plan.isolation_seconds,
        "repeats": repeats,
    }


async def _isolation_once(server: h.NodeServer, plan: Plan) -> list[dict[str, Any]]:
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
    return [
        {
            "label": run.label,
            "saturated_after": run.saturated_after,
            "fast": run.fast_summary(),
            "slow": h.host_summary(run.of("slow")),
            "records": h.records_json(run.records),
        }
        for run in runs
    ]


async def recovery(server: h.NodeServer, plan: Plan, repeat: int = 1) -> dict[str, Any]:
    """The recovery runs ``repeat`` times over (``repeats``: one list of runs each)."""
    repeats = []
    for n in range(repeat):
        log(f"recovery: run {n + 1} of {repeat}")
        repeats.append(await _recovery_once(server, plan))
    return {
        "incident": plan.recovery_incident,
        "hang": plan.recovery_hang,
        "duration": plan.recovery_seconds,
        "request_timeout": REQUEST_TIMEOUT,
        "pool_timeout": POOL_TIMEOUT,
        "interval": 0.05,
        "repeats": repeats,
    }


async def _recovery_once(server: h.NodeServer, plan: Plan) -> list[dict[str, Any]]:
    fast_url = server.url(0)
    slow_port = server.ports[1]
    hang = f"/slow?ms={int(plan.recovery_hang * 1000)}"

    def slow_url(t: float) -> str:
        return server.url(1, hang if t < plan.recovery_incident else "/")

    runs: list[dict[str, Any]] = []
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
        runs.append(
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
    return runs


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


def _cpu(summary: dict[str, Any] | None) -> str:
    return "-" if summary is None else _f(summary["cpu_us"])


def _rps(summary: dict[str, Any] | None) -> str:
    return "-" if summary is None else _f(summary["rps"])


def _vs_default(summary: dict[str, Any] | None) -> str:
    if summary is None:
        return "-"
    return _ratio(summary["cpu_ratio"], summary["cpu_ratio_range"])


def _paired(row: dict[str, Any], a: str, b: str, *, spread: bool = False) -> str:
    ratio = row.get("paired", {}).get(f"{a}/{b}")
    if ratio is None:
        return "-"
    return _ratio(ratio[0], ratio[1:] if spread else None)


def _counts(row: dict[str, Any], name: str) -> str:
    """The samples a cell of ``name`` rests on: ``rounds x requests per round`` (a range
    when a batch was cut short by its time bound)."""
    batches = [s["requests"] for s in row.get("samples", {}).get(name, [])]
    if not batches:
        return "-"
    low, high = min(batches), max(batches)
    per_round = f"{low:,}" if low == high else f"{low:,}-{high:,}"
    return f"{len(batches)} x {per_round}"


def _all_counts(row: dict[str, Any], names: Sequence[str]) -> str:
    return " / ".join(_counts(row, n) for n in names)


def _conns(row: dict[str, Any], names: Sequence[str], key: str = "connections") -> str:
    seen = row.get("server", {})
    return " / ".join(str(seen[n][key]) if n in seen else "-" for n in names)


def overhead_table(rows: list[dict[str, Any]]) -> str:
    """CPU per request and ratios, then requests/s and the TCP connections each opened."""
    lines = [
        "| level | conc. | httpx default µs/req | bulkhead µs/req | bulkhead / default"
        " (range) | bulkhead+httptools µs/req | +httptools / default (range) | +httptools /"
        " bulkhead (range) | h11 floor µs/req | bulkhead / floor | +httptools / floor |"
        " samples: rounds x requests, default / bulkhead / +httptools / floor |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    names = (h.DEFAULT, h.BULKHEAD, h.HTTPTOOLS, h.FLOOR)
    for row in rows:
        s = row["summary"]
        d, b, t, f = (s.get(n) for n in (h.DEFAULT, h.BULKHEAD, h.HTTPTOOLS, h.FLOOR))
        codec = _paired(row, h.HTTPTOOLS, h.BULKHEAD, spread=True)
        lines.append(
            f"| {row['level']} | {row['concurrency']} | {_cpu(d)} | {_cpu(b)} | {_vs_default(b)}"
            f" | {_cpu(t)} | {_vs_default(t)} | {codec}"
            f" | {_cpu(f)} | {_paired(row, h.BULKHEAD, h.FLOOR)}"
            f" | {_paired(row, h.HTTPTOOLS, h.FLOOR)} | {_all_counts(row, names)} |"
        )
    lines += [
        "",
        "| level | conc. | default req/s | bulkhead req/s | +httptools req/s | floor req/s |"
        " TCP connections opened, default / bulkhead / +httptools / floor |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        s = row["summary"]
        cells = " | ".join(_rps(s.get(n)) for n in names)
        lines.append(f"| {row['level']} | {row['concurrency']} | {cells} | {_conns(row, names)} |")
    return "\n".join(lines)


#: Issue 18's HTTP/2 targets: transport level against the h2 floor, client level against
#: httpx's default transport (same-round CPU ratios, both concurrencies).
H2_TARGETS = {"transport": (h.H2_FLOOR, 1.5), "client": (h.H2_DEFAULT, 0.5)}


def _h2_target(row: dict[str, Any]) -> str:
    """``≤ 1.5x floor: met (1.32x)``: the level's target and whether the row meets it."""
    target = H2_TARGETS.get(row["level"])
    if target is None:
        return "-"
    base, limit = target
    ratio = row.get("paired", {}).get(f"{h.H2_BULKHEAD}/{base}")
    if ratio is None:
        summary = row["summary"].get(h.H2_BULKHEAD) if base == h.H2_DEFAULT else None
        ratio = None if summary is None else [summary["cpu_ratio"]]
    what = "floor" if base == h.H2_FLOOR else "default"
    if ratio is None:
        return f"≤ {limit}x {what}: -"
    verdict = "met" if ratio[0] <= limit else "not met"
    return f"≤ {limit}x {what}: {verdict} ({_ratio(ratio[0])})"


def http2_table(rows: list[dict[str, Any]]) -> str:
    """The HTTP/2 rows; ``bulkhead h2 / (floor + models)`` is what our code adds to the h2
    floor called as a transport is (``harness.H2FloorTransport``: the httpx request and
    response models every transport must take and give)."""
    names = (h.H2_DEFAULT, h.H2_BULKHEAD, h.H2_FLOOR, h.H2_FLOOR_MODELS)
    lines = [
        "| level | conc. | httpx default h2 µs/req | bulkhead h2 µs/req | bulkhead / default"
        " (range) | h2 floor µs/req | bulkhead h2 / floor (range) | target (issue 18) |"
        " h2 floor + models µs/req | bulkhead h2 / (floor + models) (range) |"
        " bulkhead HTTP/1.1 µs/req (same rounds) | bulkhead h2 / HTTP/1.1 |"
        " default req/s | bulkhead req/s | TCP connections opened, default / bulkhead / floor"
        " / floor + models | most streams at once on one connection, default / bulkhead /"
        " floor / floor + models | samples: rounds x requests, default h2 / bulkhead h2 /"
        " floor / floor + models / bulkhead HTTP/1.1 |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        s = row["summary"]
        d, b, f, fm, one = (s.get(n) for n in (*names, h.BULKHEAD))
        lines.append(
            f"| {row['level']} | {row['concurrency']} | {_cpu(d)} | {_cpu(b)} | {_vs_default(b)}"
            f" | {_cpu(f)} | {_paired(row, h.H2_BULKHEAD, h.H2_FLOOR, spread=True)}"
            f" | {_h2_target(row)}"
            f" | {_cpu(fm)} | {_paired(row, h.H2_BULKHEAD, h.H2_FLOOR_MODELS, spread=True)}"
            f" | {_cpu(one)} | {_paired(row, h.H2_BULKHEAD, h.BULKHEAD)} | {_rps(d)} | {_rps(b)}"
            f" | {_conns(row, names)} | {_conns(row, names, 'max_streams')}"
            f" | {_all_counts(row, (*names, h.BULKHEAD))} |"
        )
    return "\n".join(lines)


def scaling_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| case (concurrency 10) | httpx default µs/req | bulkhead µs/req | bulkhead / default"
        " (range) | bulkhead+httptools µs/req | +httptools / default (range) | default req/s"
        " | bulkhead req/s | +httptools req/s | pooled conns, default / bulkhead / +httptools |"
        " samples: rounds x requests, default / bulkhead / +httptools |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    names = (h.DEFAULT, h.BULKHEAD, h.HTTPTOOLS)
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['case']} | error: {row['error']} | | | | | | | | | |")
            continue
        s = row["summary"]
        d, b, t = (s.get(n) for n in (h.DEFAULT, h.BULKHEAD, h.HTTPTOOLS))
        pooled = row["pooled_after"]
        conns = " / ".join(str(pooled.get(n, "-")) for n in (h.DEFAULT, h.BULKHEAD, h.HTTPTOOLS))
        lines.append(
            f"| {row['case']} | {_cpu(d)} | {_cpu(b)} | {_vs_default(b)} | {_cpu(t)}"
            f" | {_vs_default(t)} | {_rps(d)} | {_rps(b)} | {_rps(t)} | {conns}"
            f" | {_all_counts(row, names)} |"
        )
    return "\n".join(lines)


def _failures(failures: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(failures.items(), key=lambda kv: -kv[1])) or "-"


def _repeats(data: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """The runs of each repetition (a results.json from before ``--repeat``: one)."""
    return data["repeats"] if "repeats" in data else [data["runs"]]


def _by_label(data: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Each label's run in every repetition, in the order of the first."""
    out: dict[str, list[dict[str, Any]]] = {}
    for runs in _repeats(data):
        for run in runs:
            out.setdefault(run["label"], []).append(run)
    return out


def _spread(values: Sequence[float | None], digits: int = 0, unit: str = "") -> str:
    """The median of the repetitions and, with more than one, their range (min-max)."""
    known = sorted(v for v in values if v is not None and not math.isnan(v))
    if not known:
        return "-"
    text = f"{_f(statistics.median(known), digits)}{unit}"
    if len(values) > 1:
        text += f" ({_f(known[0], digits)}-{_f(known[-1], digits)}{unit})"
        if len(known) < len(values):
            text += f" [{len(values) - len(known)} without a value]"
    return text


def _failures_spread(summaries: Sequence[dict[str, Any]]) -> str:
    kinds = sorted(
        {k for s in summaries for k in s["failures"]},
        key=lambda k: -sum(s["failures"].get(k, 0) for s in summaries),
    )
    return (
        ", ".join(f"{k} {_spread([s['failures'].get(k, 0) for s in summaries])}" for k in kinds)
        or "-"
    )


def _repeat_note(data: dict[str, Any], what: str) -> str:
    n = len(_repeats(data))
    if n == 1:
        return f"One run; {what}."
    return (
        f"{n} runs; each cell is the median of the runs and, in brackets, their range"
        f" (min-max); {what}."
    )


def isolation_table(data: dict[str, Any]) -> str:
    lines = [
        _repeat_note(data, "samples: runs x fast-host calls per run"),
        "",
        "| fast host, called every 50 ms | samples | success % | p50 ms | p99 ms | max ms"
        " | failures |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for label, runs in _by_label(data).items():
        fast = [run["fast"] for run in runs]
        calls = sorted({f["calls"] for f in fast})
        per_run = f"{calls[0]}" if len(calls) == 1 else f"{calls[0]}-{calls[-1]}"
        lines.append(
            f"| {label} | {len(runs)} x {per_run}"
            f" | {_spread([100 * f['success_rate'] for f in fast], 1)}"
            f" | {_spread([f['p50_ms'] for f in fast], 1)}"
            f" | {_spread([f['p99_ms'] for f in fast], 1)}"
            f" | {_spread([f['max_ms'] for f in fast], 1)}"
            f" | {_failures_spread(fast)} |"
        )
    return "\n".join(lines)


def recovery_table(data: dict[str, Any]) -> str:
    lines = [
        _repeat_note(data, "samples: runs x slow-host calls sent after the incident"),
        "",
        "| slow compartment | samples | slow ok after the incident | first slow success"
        " after the incident | slow failures | fast success |",
        "|---|---:|---:|---:|---|---:|",
    ]
    by_label = _by_label(data)
    for label, runs in by_label.items():
        sent = sorted({run["slow_calls_after_incident"] for run in runs})
        per_run = f"{sent[0]}" if len(sent) == 1 else f"{sent[0]}-{sent[-1]}"
        lines.append(
            f"| {label} | {len(runs)} x {per_run}"
            f" | {_spread([run['slow_ok_after_incident'] for run in runs])}"
            f" | {_spread([run['first_success_after_incident'] for run in runs], 2, ' s')}"
            f" | {_failures_spread([run['slow'] for run in runs])}"
            f" | {_spread([run['fast']['ok'] for run in runs])}"
            f"/{_spread([run['fast']['calls'] for run in runs])} |"
        )
    lines.append("")
    lines.append("Slow-host successes per 0.5 s (by completion time), one line per run:")
    lines.append("")
    for label, runs in by_label.items():
        for number, run in enumerate(runs, 1):
            counts = " ".join(f"{b['ok']:>2}" for b in run["timeline"])
            tag = f"{label} #{number}" if len(runs) > 1 else label
            lines.append(f"    {tag:<25} {counts}")
    return "\n".join(lines)


def profile_table(
    rows: list[dict[str, Any]], requests_of: Callable[[dict[str, Any]], int | None]
) -> str:
    packages: list[str] = []
    for row in rows:
        packages += [p for p in row["shares"] if p not in packages]
    header = " | ".join(f"{r['contestant']} c={r['concurrency']}" for r in rows)
    lines = [f"| exclusive CPU share (cProfile) | {header} |", "|---" + "|---:" * len(rows) + "|"]
    for package in packages:
        cells = " | ".join(f"{100 * r['shares'].get(package, 0.0):.0f}%" for r in rows)
        lines.append(f"| {package} | {cells} |")
    cells = " | ".join(_f(r.get("requests", requests_of(r))) for r in rows)
    lines.append(f"| *samples: requests profiled (one run)* | {cells} |")
    return "\n".join(lines)


def hotspots_table(row: dict[str, Any], top: int = 10) -> str:
    lines = [
        f"{row['contestant']}, concurrency {row['concurrency']}:",
        "",
        "| function (exclusive time) | share | incl. callees | calls/request |",
        "|---|---:|---:|---:|",
    ]
    for spot in row.get("top", [])[:top]:
        where = spot["where"].replace("|", "\\|")
        lines.append(
            f"| `{where}` | {100 * spot['share']:.1f}% | {100 * spot['cumulative_share']:.0f}%"
            f" | {spot['calls_per_request']:.1f} |"
        )
    return "\n".join(lines)


def run_uvloop(server: h.NodeServer, plan: Plan) -> list[dict[str, Any]] | None:
    """The overhead suite under uvloop's event loop (``None`` if uvloop is not installed)."""
    try:
        import uvloop
    except ImportError:
        log("uvloop is not installed: no uvloop rows (pip install uvloop)")
        return None
    log("uvloop: the overhead suite under uvloop")
    rows: list[dict[str, Any]] = uvloop.run(overhead(server, plan))
    return rows


def _load(results: dict[str, Any]) -> str:
    start, end = results.get("loadavg_start"), results.get("loadavg_end")
    if not start or not end:
        return ""
    return f" Load average (1 min) at start / end: {start[0]:.2f} / {end[0]:.2f}."


def _run_info(meta: dict[str, Any]) -> str:
    load = meta.get("loadavg_start"), meta.get("loadavg_end")
    text = f"git {meta.get('git_head')}, plan {meta.get('plan_name')}"
    if meta.get("date"):
        text += f", {meta['date']}"
    if load[0] and load[1]:
        text += f", load average (1 min) at start / end {load[0][0]:.2f} / {load[1][0]:.2f}"
    return text


def _earlier(results: dict[str, Any], suite: str) -> list[str]:
    """A line saying which run a suite's figures come from, if not this one."""
    meta = results.get("suite_runs", {}).get(suite)
    if meta is None or meta.get("run_id") == results.get("run_id"):
        return []
    return [f"*From an earlier run ({_run_info(meta)}), kept when other suites were rerun.*", ""]


def _requests_profiled(plan: dict[str, Any]) -> Callable[[dict[str, Any]], int | None]:
    """For a results.json from before profile rows recorded their requests: the plan's."""

    def of(row: dict[str, Any]) -> int | None:
        if "batch_c1" not in plan:
            return None
        requests = int(plan["batch_c1"])
        if row["contestant"] == h.DEFAULT:
            requests //= 2 if row["concurrency"] == 1 else 8
        return requests

    return of


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lib = results["library"]
    versions = ", ".join(
        f"{name} {m[name]}"
        for name in ("httpx", "httpcore", "h11", "httptools", "h2")
        if m.get(name)
    )
    parts = [
        "# httpx-bulkhead benchmarks",
        "",
        f"Machine: {m['nproc']} cores, {m['cpu_model']}; Python {m['python']}; Node"
        f" {m['node']}; {versions}. Client pinned to one core,"
        f" server to another: {results['pinned']}. Library: git {lib.get('git_head')}"
        f"{' (modified)' if lib.get('library_dirty') else ''}, source {lib['source_sha256']}."
        f" Plan: {results['plan_name']}.{_load(results)}",
        "",
        "CPU µs/req is client CPU time (`time.process_time()`) per request, the median over"
        " rounds; ratios are medians of same-round CPU ratios (range over rounds). `bulkhead`"
        ' is BulkheadTransport with `http1_parser="h11"` (the reference codec), `+httptools`'
        ' the same with `http1_parser="httptools"`: the default codec, httptools when it is'
        " installed (issue 18). TCP connections are counted by the server, from the"
        " transports' making to their closing (warm-up included).",
    ]
    if "overhead" in results:
        parts += ["", "## Overhead (HTTP/1.1 keep-alive, one origin)", ""]
        parts += _earlier(results, "overhead")
        parts.append(overhead_table(results["overhead"]))
        parts += [
            "",
            "The parsers' floors and the aiohttp clients, same rounds (`aiohttp` has no"
            " transport level: its rows are the whole session both times):",
            "",
            tg.contestants_table(results["overhead"]),
            "",
            "What is ours: the parsers' floors called as a transport is (`models_floor.py`:"
            " the floor's Protocol behind `handle_async_request`, taking the `httpx.Request`"
            " and returning an `httpx.Response`), same rounds. `transport / (floor+models)` is"
            " our share; the issue's targets stay against the bare floors:",
            "",
            mf.models_table(results["overhead"]),
        ]
    if "uvloop" in results:
        parts += ["", "## Overhead under uvloop (the same rows, uvloop's event loop)", ""]
        parts += _earlier(results, "uvloop")
        parts += [overhead_table(results["uvloop"]), "", tg.contestants_table(results["uvloop"])]
        parts += ["", mf.models_table(results["uvloop"])]
    if "overhead" in results or "uvloop" in results:
        loops = [(name, results[key]) for key, name in
                 (("overhead", "asyncio"), ("uvloop", "uvloop")) if key in results]  # fmt: skip
        parts += ["", "## Issue 18 targets (HTTP/1.1; same-round CPU ratios, medians)", ""]
        parts.append(tg.targets_table(loops))
    if "http2" in results:
        rows = results["http2"]
        cap = rows[0].get("max_concurrent_streams", "?") if rows else "?"
        parts += [
            "",
            "## Overhead, HTTP/2 (h2c with prior knowledge, one origin, server allows"
            f" {cap} concurrent streams)",
            "",
            "`AsyncHTTPTransport(http1=False, http2=True)` vs"
            " `BulkheadTransport(http1=False, http2=True)` (max_concurrency = concurrency),"
            " beside the h2 floor (h2 on a bare asyncio Protocol, one connection, streams"
            " multiplexed, no pool, no limits, the same h2 configuration as BulkheadTransport),"
            " and the same floor called as a transport is (floor + models: it takes the"
            " `httpx.Request` and returns an `httpx.Response` that is read and closed, so"
            " bulkhead h2 / (floor + models) is the cost of our code alone);"
            " BulkheadTransport over HTTP/1.1 (h11) ran in the same rounds for reference.",
            "",
            *_earlier(results, "http2"),
            http2_table(rows),
        ]
    if "scaling" in results:
        parts += ["", "## Scaling (transport level)", "", *_earlier(results, "scaling")]
        parts.append(scaling_table(results["scaling"]))
    if "isolation" in results:
        d = results["isolation"]
        parts += [
            "",
            f"## Isolation (slow host {d['slow_ms']} ms per response, {d['slow_workers']}"
            f" workers; {d['budget']} connections in all; pool timeout {d['pool_timeout']} s)",
            "",
            *_earlier(results, "isolation"),
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
            *_earlier(results, "recovery"),
            recovery_table(d),
        ]
    if "profile" in results:
        rows = results["profile"]
        h1 = [r for r in rows if r["contestant"] not in h.H2_CONTESTANTS]
        h2 = [r for r in rows if r["contestant"] in h.H2_CONTESTANTS]
        parts += ["", "## Where the CPU goes (transport level, cProfile: shares, not timings)"]
        earlier = _earlier(results, "profile")
        if earlier:
            parts += ["", *earlier[:-1]]
        requests_of = _requests_profiled(results.get("plan", {}))
        for title, group in (("HTTP/1.1", h1), ("HTTP/2", h2)):
            if group:
                parts += ["", f"{title}:", "", profile_table(group, requests_of)]
        spots = [
            r
            for r in rows
            if r.get("top")
            and r["concurrency"] == 64
            and r["contestant"] != h.DEFAULT
            and r["contestant"] != h.H2_DEFAULT
        ]
        if spots:
            parts += [
                "",
                "### Hottest functions of BulkheadTransport (exclusive time, cProfile)",
                "",
                "Shares of the profiled CPU time; calls/request counts each resumption of a"
                " coroutine as a call.",
            ]
            for row in spots:
                parts += ["", hotspots_table(row)]
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
        for run in _repeats(data)[0]:
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
        for run, color in zip(_repeats(data)[0], ["#d62728", "#1f77b4"], strict=False):
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
async def run(
    suites: Sequence[str],
    plan: Plan,
    server: h.NodeServer,
    h2server: h.NodeServer,
    repeat: int = 3,
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for suite in suites:
        started = time.perf_counter()
        if suite == "overhead":
            results[suite] = await overhead(server, plan)
        elif suite == "http2":
            results[suite] = await http2(server, h2server, plan)
        elif suite == "scaling":
            results[suite] = await scaling(server, plan)
        elif suite == "isolation":
            results[suite] = await isolation(server, plan, repeat)
        elif suite == "recovery":
            results[suite] = await recovery(server, plan, repeat)
        elif suite == "profile":
            results[suite] = await profile(server, h2server, plan)
        log(f"  {suite}: {time.perf_counter() - started:.0f} s")
    return results


def _keep_other_suites(results: dict[str, Any], previous: dict[str, Any]) -> None:
    """Copy into ``results`` the suites it lacks from ``previous``, with the run each came
    from (a results.json from before ``suite_runs``: its own header)."""
    for suite in SUITES:
        if suite in results or suite not in previous:
            continue
        results[suite] = previous[suite]
        meta = previous.get("suite_runs", {}).get(suite)
        if meta is None:
            meta = {
                "run_id": previous.get("run_id", "earlier"),
                "git_head": previous.get("library", {}).get("git_head"),
                "plan_name": previous.get("plan_name"),
                "date": previous.get("date"),
                "loadavg_start": previous.get("loadavg_start"),
                "loadavg_end": previous.get("loadavg_end"),
            }
        results["suite_runs"][suite] = meta
        if suite == "profile":  # rows from before they recorded their requests: the plan's
            requests_of = _requests_profiled(previous.get("plan", {}))
            for row in results[suite]:
                row.setdefault("requests", requests_of(row))


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
        "--repeat",
        type=int,
        default=3,
        help="how many times isolation and recovery run (their tables give the median and"
        " the range); default 3",
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="do not keep the other suites' figures of the results.json in --out",
    )
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
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    plan = Plan.quick() if args.quick else Plan.full()
    started = time.perf_counter()
    h2ports = len(h.H2_CONTESTANTS)
    with (
        h.NodeServer(max(ORIGINS)) as server,
        h.NodeServer(h2ports, http2=True, max_concurrent_streams=H2_MAX_STREAMS) as h2server,
        h.pin() as pinned,
    ):
        results: dict[str, Any] = {
            "machine": h.machine_info(),
            "library": h.library_info(),
            "python": h.python_flags(),
            "pinned": pinned and server.pinned and h2server.pinned,
            "plan_name": "quick" if args.quick else "full",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "run_id": f"{time.time():.6f}",
            "loadavg_start": list(os.getloadavg()),
            "plan": dataclasses.asdict(plan),
            "repeat": args.repeat,
        }
        on_asyncio = [s for s in suites if s != "uvloop"]
        results.update(asyncio.run(run(on_asyncio, plan, server, h2server, args.repeat)))
        if "uvloop" in suites:
            started_uvloop = time.perf_counter()
            rows = run_uvloop(server, plan)
            if rows is not None:
                results["uvloop"] = rows
            log(f"  uvloop: {time.perf_counter() - started_uvloop:.0f} s")
    results["seconds"] = time.perf_counter() - started
    results["loadavg_end"] = list(os.getloadavg())
    this_run = {
        "run_id": results["run_id"],
        "git_head": results["library"].get("git_head"),
        "plan_name": results["plan_name"],
        "date": results["date"],
        "loadavg_start": results["loadavg_start"],
        "loadavg_end": results["loadavg_end"],
    }
    results["suite_runs"] = {suite: this_run for suite in suites if suite in results}
    previous = args.out / "results.json"
    if not args.fresh and previous.exists():
        _keep_other_suites(results, json.loads(previous.read_text()))
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
