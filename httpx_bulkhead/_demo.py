"""``python -m httpx_bulkhead demo``: a slow dependency beside a fast one, with and without
bulkheads.

The scenario
------------
Two HTTP/1.1 keep-alive servers run in this process on 127.0.0.1: a *slow* one (every
response takes ``--slow-seconds``) and a *fast* one (answers at once).  The same traffic is
sent twice, through two transports with the same total connection budget ``N`` and the
same httpx pool timeout:

1. httpx's default ``AsyncHTTPTransport(limits=Limits(max_connections=N))``: one pool
   shared by both hosts;
2. ``BulkheadTransport(default=Policy(max_concurrency=N // 2))``: a compartment per host.

In each run, ``--slow-calls`` workers (3N by default) call the slow host in a loop, and
once the slow host is saturated (as many requests in flight at the slow server as the
transport allows it) the fast host is called at a steady rate, every ``--fast-interval``
seconds for ``--duration`` seconds, each call on its own task (an open-loop client: a
stuck call does not slow the rate down).  With one shared pool, the slow calls hold every
connection and queue ahead of the fast calls, which fail with ``PoolTimeout``; with
bulkheads they only fill their own compartment and the fast host never notices.

A live view shows each compartment while it runs (an ANSI redraw on a terminal, plain
lines otherwise), then a side-by-side summary.  The exit status is 0 only if the bulkhead
run served every fast call and its fast p99 stayed far below the slow latency
(``FAR_BELOW`` of it).

The load-generation pieces (``steady_calls``, ``saturate``, ``CallRecord``, ``percentile``)
are reused by ``benchmarks/``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import h11
import httpx

from ._config import Policy
from ._stats import CompartmentStats, quantile
from ._transport import BulkheadTransport

__all__ = [
    "FAR_BELOW",
    "CallRecord",
    "DemoConfig",
    "DemoServer",
    "main",
    "percentile",
    "saturate",
    "steady_calls",
]

#: The bulkhead run passes if its fast-host p99 is below this fraction of the slow latency.
FAR_BELOW = 0.1
#: How long to wait for the slow host to be saturated before giving up.
SATURATION_TIMEOUT = 10.0
#: A live line per this many seconds when stdout is not a terminal.
PLAIN_PERIOD = 1.0
#: Idle keep-alive connections are closed by the demo servers after this many seconds.
SERVER_IDLE_TIMEOUT = 30.0
#: Printed before the bulkhead run: what its compartment rows mean.
LEGEND = (
    "[compartment] rows: running/limit = slots in use, waiting = queued for a slot,"
    " acquire timeouts = gave up waiting,\n  discards = connections closed instead of"
    " reused (expired, cut mid-exchange, or broken)"
)


# -- configuration -----------------------------------------------------------------------
@dataclass(frozen=True)
class DemoConfig:
    """The knobs of the demo (see ``--help``)."""

    slow_seconds: float = 2.0
    duration: float = 8.0
    connections: int = 10
    slow_calls: int | None = None  # None: 3 * connections
    fast_interval: float = 0.05
    pool_timeout: float = 0.5
    refresh: float = 0.25
    plain: bool = False

    @property
    def slow_workers(self) -> int:
        return 3 * self.connections if self.slow_calls is None else self.slow_calls

    @property
    def timeout(self) -> httpx.Timeout:
        return httpx.Timeout(10.0, pool=self.pool_timeout)


# -- measurements ------------------------------------------------------------------------
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
        await _cancel(pending)


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
    cancels them, e.g. with ``_cancel``).  A refusal that comes back at once
    (``BulkheadFull``) is followed by a short pause so a worker never spins."""

    async def worker() -> None:
        while True:
            record = await timed_get(client, url, host, t0, extensions)
            records.append(record)
            if record.error == "BulkheadFull":
                await asyncio.sleep(0.05)  # back off: load generation, not synchronisation

    return [asyncio.create_task(worker()) for _ in range(workers)]


async def _cancel(tasks: Iterable[asyncio.Task[None]]) -> None:
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# -- the servers ---------------------------------------------------------------------------
class DemoServer:
    """An HTTP/1.1 keep-alive server on 127.0.0.1 (h11 over asyncio streams) answering every
    request with ``200 ok`` after ``delay`` seconds.  Counts requests in flight so a caller
    can wait until a given load has arrived (``until_in_flight``)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.in_flight = 0
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._watchers: list[tuple[int, asyncio.Future[None]]] = []

    async def start(self) -> DemoServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/"

    async def until_in_flight(self, count: int) -> None:
        """Return once ``count`` requests are being served at the same time."""
        if self.in_flight >= count:
            return
        future = asyncio.get_running_loop().create_future()
        self._watchers.append((count, future))
        await future

    async def drop_connections(self) -> None:
        """End every connection (and the requests still being served on them), so the next
        run starts from nothing: its counters do not show the previous run's connections."""
        await _cancel(self._handlers)

    async def aclose(self) -> None:
        """Stop listening, end every connection and wait for the handlers to finish."""
        if self._server is not None:
            self._server.close()
            await _cancel(self._handlers)
            await self._server.wait_closed()
        for _, future in self._watchers:
            future.cancel()

    def _enter(self) -> None:
        self.in_flight += 1
        ready = [w for w in self._watchers if w[0] <= self.in_flight]
        for watcher in ready:
            self._watchers.remove(watcher)
            if not watcher[1].done():
                watcher[1].set_result(None)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self.connections += 1
        conn = h11.Connection(h11.SERVER)
        try:
            while await self._serve_one(conn, reader, writer):
                conn.start_next_cycle()
        except (ConnectionError, h11.ProtocolError, asyncio.TimeoutError):
            pass  # the client went away or broke the protocol, or the connection idled out
        except asyncio.CancelledError:
            # ``aclose`` cancels us.  End normally: CPython 3.11's start_server callback calls
            # ``task.exception()``, which raises on a cancelled task.
            pass
        finally:
            self.connections -= 1
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _serve_one(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Serve one request; whether the connection may serve another."""
        event = await _next_event(conn, reader)
        if not isinstance(event, h11.Request):
            return False  # ConnectionClosed: a clean end between requests
        while not isinstance(await _next_event(conn, reader), h11.EndOfMessage):
            pass  # a request body: read and dropped
        self._enter()
        try:
            if self.delay > 0:
                await asyncio.sleep(self.delay)  # the simulated slow dependency
        finally:
            self.in_flight -= 1
        headers = [("content-type", "text/plain"), ("content-length", "2")]
        writer.write(conn.send(h11.Response(status_code=200, headers=headers)) or b"")
        writer.write(conn.send(h11.Data(data=b"ok")) or b"")
        writer.write(conn.send(h11.EndOfMessage()) or b"")
        await writer.drain()
        return conn.our_state is h11.DONE and conn.their_state is h11.DONE


async def _next_event(conn: h11.Connection, reader: asyncio.StreamReader) -> object:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        data = await asyncio.wait_for(reader.read(65536), SERVER_IDLE_TIMEOUT)
        conn.receive_data(data)


# -- one run ---------------------------------------------------------------------------------
@dataclass
class RunResult:
    """What one run produced: every call, timed from ``t0``."""

    title: str
    t0: float = field(default_factory=time.perf_counter)
    records: list[CallRecord] = field(default_factory=list)

    def of(self, host: str) -> list[CallRecord]:
        return [r for r in self.records if r.host == host]


async def run_once(
    title: str,
    transport: httpx.AsyncBaseTransport,
    slow: DemoServer,
    fast: DemoServer,
    config: DemoConfig,
    expected_slow_in_flight: int,
    view: LiveView,
) -> RunResult:
    """Saturate the slow host, then call the fast one at a steady rate (see the module doc)."""
    result = RunResult(title)
    t0 = result.t0
    async with httpx.AsyncClient(transport=transport, timeout=config.timeout) as client:
        workers = await saturate(
            client,
            slow.url,
            host="slow",
            workers=config.slow_workers,
            records=result.records,
            t0=t0,
        )
        painter = asyncio.create_task(
            _paint(view, title, transport, slow, fast, result, config.refresh)
        )
        try:
            try:
                await asyncio.wait_for(
                    slow.until_in_flight(expected_slow_in_flight), SATURATION_TIMEOUT
                )
            except asyncio.TimeoutError:
                view.note(
                    f"(the slow host did not reach {expected_slow_in_flight} requests in"
                    f" flight within {SATURATION_TIMEOUT:g} s; going on)"
                )
            await steady_calls(
                client,
                lambda _: fast.url,
                host="fast",
                interval=config.fast_interval,
                duration=config.duration,
                records=result.records,
                t0=t0,
            )
        finally:
            await _cancel([painter])
            view.draw(_live_lines(title, transport, slow, fast, result), final=True)
            await _cancel(workers)
    return result


async def _paint(
    view: LiveView,
    title: str,
    transport: httpx.AsyncBaseTransport,
    slow: DemoServer,
    fast: DemoServer,
    result: RunResult,
    every: float,
) -> None:
    while True:
        view.draw(_live_lines(title, transport, slow, fast, result))
        await asyncio.sleep(every)  # the refresh rate of the display


# -- the live view ---------------------------------------------------------------------------
class LiveView:
    """Redraws a block of lines in place on a terminal (ANSI); on anything else prints one
    line at most every ``PLAIN_PERIOD`` seconds."""

    def __init__(self, out: TextIO, *, tty: bool) -> None:
        self._out = out
        self._tty = tty
        self._drawn = 0
        self._last_plain = -math.inf

    def draw(self, lines: list[str], *, final: bool = False) -> None:
        if self._tty:
            self._redraw(lines)
            if final:
                self._drawn = 0  # leave the last frame on screen
            return
        now = time.monotonic()
        if final or now - self._last_plain >= PLAIN_PERIOD:
            self._last_plain = now
            self._out.write(" | ".join(" ".join(line.split()) for line in lines) + "\n")
            self._out.flush()

    def note(self, text: str) -> None:
        """A line printed above the live block (which is redrawn below it)."""
        if self._tty and self._drawn:
            self._out.write(f"\x1b[{self._drawn}F\x1b[J")
            self._drawn = 0
        self._out.write(text + "\n")
        self._out.flush()

    def _redraw(self, lines: list[str]) -> None:
        parts = [f"\x1b[{self._drawn}F"] if self._drawn else []
        parts += [f"\x1b[2K{line}\n" for line in lines]
        extra = self._drawn - len(lines)
        if extra > 0:  # the frame got shorter: blank the leftover lines
            parts += ["\x1b[2K\n"] * extra + [f"\x1b[{extra}F"]
        self._out.write("".join(parts))
        self._out.flush()
        self._drawn = len(lines)


def _counts(records: Iterable[CallRecord], host: str) -> str:
    ok = failed = 0
    for record in records:
        if record.host == host:
            if record.ok:
                ok += 1
            else:
                failed += 1
    return f"{ok} ok, {failed} failed"


def _live_lines(
    title: str,
    transport: httpx.AsyncBaseTransport,
    slow: DemoServer,
    fast: DemoServer,
    result: RunResult,
) -> list[str]:
    records = list(result.records)
    lines = [
        f"{title} [{time.perf_counter() - result.t0:5.1f} s]",
        f"  fast host: {_counts(records, 'fast')}   slow host: {_counts(records, 'slow')}",
        f"  servers: slow {slow.in_flight} in flight on {slow.connections} connections,"
        f" fast {fast.connections} connections",
    ]
    if isinstance(transport, BulkheadTransport):
        stats = transport.statistics()
        labels = {slow.url.rstrip("/"): "slow", fast.url.rstrip("/"): "fast"}
        # Slow first, then fast, then anything else by name: never the order of the
        # (random) port numbers, so the rows do not swap places from one run to the next.
        order = {"slow": 0, "fast": 1}
        rows = sorted(stats, key=lambda name: (order.get(labels.get(name, ""), 2), name))
        lines += [_compartment_line(labels.get(name, name), stats[name]) for name in rows]
    return lines


def _compartment_line(label: str, s: CompartmentStats) -> str:
    discards = (
        s.idle_expired
        + s.lifetime_expired
        + s.unknown_state
        + s.peer_closed
        + s.error
        + s.not_reusable
        + s.surplus
        + s.closed
    )
    return (
        f"  [{label:>4}] running {s.running:>3}/{s.limit:<3} waiting {s.waiting:>4}"
        f"  wait p99 {s.wait_p99 * 1000:7.1f} ms  rejected {s.rejected:>4}"
        f"  acquire timeouts {s.acquire_timeouts:>4}  discards {discards:>3}"
    )


# -- the summary -----------------------------------------------------------------------------
def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.1f} ms"


def _failures(records: Sequence[CallRecord]) -> str:
    by_type = Counter(r.error for r in records if r.error is not None)
    return ", ".join(f"{name} {n}" for name, n in by_type.most_common()) or "none"


def summary_rows(result: RunResult) -> list[tuple[str, str]]:
    """``(label, value)`` rows describing one run."""
    fast, slow = result.of("fast"), result.of("slow")
    ok = [r.latency for r in fast if r.ok]
    rate = 100.0 * len(ok) / len(fast) if fast else math.nan
    return [
        ("fast host success", f"{len(ok)}/{len(fast)} ({rate:.1f}%)"),
        ("fast p50 (successes)", _ms(percentile(ok, 0.5))),
        ("fast p99 (successes)", _ms(percentile(ok, 0.99))),
        ("fast max (all calls)", _ms(max((r.latency for r in fast), default=math.nan))),
        ("fast failures", _failures(fast)),
        ("slow host", _counts(slow, "slow")),
        ("slow failures", _failures(slow)),
    ]


def render_summary(results: Sequence[RunResult]) -> str:
    columns = [summary_rows(r) for r in results]
    labels = [label for label, _ in columns[0]]
    headers = ["", *(r.title for r in results)]
    table = [headers] + [
        [label, *(column[i][1] for column in columns)] for i, label in enumerate(labels)
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in table
    )


def slow_host_note(default: RunResult, bulkhead: RunResult, config: DemoConfig) -> str:
    """Why the slow host serves fewer calls under bulkheads (when it does): its share of
    the connections is smaller, which is the point."""
    shared = sum(r.ok for r in default.of("slow"))
    walled = sum(r.ok for r in bulkhead.of("slow"))
    if walled >= shared:
        return ""
    n = config.connections
    text = (
        f"The slow host served fewer calls under bulkheads ({walled} against {shared}): its"
        f" compartment has {max(1, n // 2)} connections, not all {n}, because the others"
        " belong to the fast host. That is the point: a slow dependency gets its own share,"
        " never everyone's."
    )
    return textwrap.fill(text, width=92) + "\n\n"


def verdict(bulkhead: RunResult, config: DemoConfig) -> str | None:
    """``None`` if the bulkhead run isolated the fast host, else the reason it did not."""
    fast = bulkhead.of("fast")
    if not fast:
        return "the bulkhead run made no fast call"
    failed = [r for r in fast if not r.ok]
    if failed:
        return f"{len(failed)} of {len(fast)} fast calls failed under bulkheads ({_failures(fast)})"
    p99 = percentile([r.latency for r in fast], 0.99)
    limit = FAR_BELOW * config.slow_seconds
    if not p99 < limit:
        return (
            f"fast p99 under bulkheads was {_ms(p99)}, not far below the slow latency"
            f" (must be < {_ms(limit)}, {FAR_BELOW:.0%} of {config.slow_seconds:g} s)"
        )
    return None


# -- entry point -----------------------------------------------------------------------------
def make_transports(config: DemoConfig) -> tuple[httpx.AsyncHTTPTransport, BulkheadTransport]:
    """The two contestants, same connection budget: one shared pool of N, and N//2 per host.
    (Built before the event loop starts: loading the CA bundle takes a while.)"""
    n = config.connections
    shared = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=n))
    bulkheads = BulkheadTransport(default=Policy(max_concurrency=max(1, n // 2)))
    return shared, bulkheads


async def run_demo(
    config: DemoConfig,
    shared: httpx.AsyncHTTPTransport,
    bulkheads: BulkheadTransport,
    out: TextIO,
) -> int:
    """Both runs, the summary and the verdict; returns the exit status."""
    tty = out.isatty() and not config.plain
    view = LiveView(out, tty=tty)
    slow = await DemoServer(config.slow_seconds).start()
    fast = await DemoServer(0.0).start()
    try:
        n = config.connections
        out.write(
            f"slow host {slow.url} ({config.slow_seconds:g} s per response),"
            f" fast host {fast.url}\n{config.slow_workers} slow workers, a fast call every"
            f" {config.fast_interval * 1000:g} ms for {config.duration:g} s;"
            f" {n} connections in all, pool timeout {config.pool_timeout:g} s\n\n"
        )
        default_run = await run_once(
            "httpx default (one shared pool)", shared, slow, fast, config, n, view
        )
        # The slow host still serves the first run's requests: end them, so the second
        # run's first frame shows its own connections only.
        await slow.drop_connections()
        await fast.drop_connections()
        out.write("\n" + LEGEND + "\n")
        half = max(1, n // 2)
        bulkhead_run = await run_once(
            f"BulkheadTransport ({half} per host)", bulkheads, slow, fast, config, half, view
        )
    finally:
        await slow.aclose()
        await fast.aclose()
    out.write("\n" + render_summary([default_run, bulkhead_run]) + "\n\n")
    out.write(slow_host_note(default_run, bulkhead_run, config))
    reason = verdict(bulkhead_run, config)
    if reason is not None:
        out.write(f"FAIL: {reason}\n")
        return 1
    out.write(
        "PASS: every fast call succeeded under bulkheads, p99"
        f" {_ms(percentile([r.latency for r in bulkhead_run.of('fast')], 0.99))}"
        f" (slow host: {config.slow_seconds:g} s per response)\n"
    )
    return 0


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's options (also used by ``python -m httpx_bulkhead demo --help``)."""
    d = DemoConfig()
    add = parser.add_argument
    add("--slow-seconds", type=_positive, default=d.slow_seconds, metavar="S",
        help="seconds each slow-host response takes (default %(default)s)")  # fmt: skip
    add("--duration", type=_positive, default=d.duration, metavar="S",
        help="seconds the fast host is called for, per run (default %(default)s)")  # fmt: skip
    add("--connections", type=_count, default=d.connections, metavar="N",
        help="total connection budget: the shared pool's max_connections; each bulkhead"
        " compartment gets N//2 (default %(default)s)")  # fmt: skip
    add("--slow-calls", type=_count, default=None, metavar="K",
        help="concurrent slow-host workers, calling back to back (default 3*N)")  # fmt: skip
    add("--fast-interval", type=_positive, default=d.fast_interval, metavar="S",
        help="seconds between fast-host calls (default %(default)s)")  # fmt: skip
    add("--pool-timeout", type=_positive, default=d.pool_timeout, metavar="S",
        help="httpx pool timeout, same in both runs: httpx.Timeout(10, pool=S)"
        " (default %(default)s)")  # fmt: skip
    add("--refresh", type=_positive, default=d.refresh, metavar="S",
        help="seconds between live-view redraws on a terminal (default %(default)s)")  # fmt: skip
    add("--plain", action="store_true",
        help="plain periodic lines even on a terminal (the default when not a TTY)")  # fmt: skip


def config_from(args: argparse.Namespace) -> DemoConfig:
    return DemoConfig(
        slow_seconds=args.slow_seconds,
        duration=args.duration,
        connections=args.connections,
        slow_calls=args.slow_calls,
        fast_interval=args.fast_interval,
        pool_timeout=args.pool_timeout,
        refresh=args.refresh,
        plain=args.plain,
    )


def main(args: argparse.Namespace) -> int:
    """Run the demo with parsed arguments; returns the exit status."""
    config = config_from(args)
    shared, bulkheads = make_transports(config)
    return asyncio.run(run_demo(config, shared, bulkheads, sys.stdout))
