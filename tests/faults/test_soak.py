"""A seeded, time-bounded randomized soak, and the memory bound of rejections.

Three compartments run at once, each against its own server:

* ``h1``: hypercorn (HTTP/1.1) serving ``TestApp`` with random server-side delays;
* ``raw``: a RawServer drawing a fault per request (answer, delay, close, RST mid-body,
  truncated body, garbage, never answer, trickle; ``handlers.random_faults``);
* ``h2``: the scripted HTTP/2 server (h2c) with a stream cap of 3, held streams released
  after random delays, RST_STREAM and REFUSED_STREAM paths and GOAWAY once 3 streams are
  held on a connection.

Workers send random requests with random pauses, under cancel scopes with random deadlines
(0 included, so every await point of a request gets cancelled sooner or later), and some
close streamed responses early.  Every server logs when each request was inside it.

Afterwards, for every compartment: ``acquired == completed + failed + cancelled``,
nothing running, queued or in use, every connection closed; the server never had more
requests of the compartment inside at once than its ``max_concurrency``; no warning (a
ResourceWarning above all); under asyncio no task left behind; and no descriptor left
open: ``/proc/self/fd`` (sockets among them) is compared from before the servers start to
after they stop (``tests/resources.py``).  So that the TLS layer is soaked too, one
compartment per backend runs over TLS (``TLS_COMPARTMENT``): ``h1`` under asyncio (hypercorn
with the session CA), ``raw`` under trio (the faults behind TLS, ``RawServer(tls=...)``).

How the server-side bound is counted: each server logs when every request was inside it
(``IntervalLog``), and ``peak_inside`` cuts each interval where the client let the request
go.  The servers' raw peaks (``TestApp.max_concurrent``, the raw server's, the h2 server's
``max_open_streams``) are printed but cannot be held to the limit: a server notices an
abandoned request late (the raw server's ``never`` fault sleeps a second; a stream reset on
one connection races a new stream on another), while the client has rightly given that
slot to the next request.  On each HTTP/2 connection the count is exact (the reset is
ordered before later streams), so the h2 server's per-connection peak and its cap
violations are checked as they are.

``BULKHEAD_SOAK_SECONDS`` sets the soak's length per backend (default 5 s);
``BULKHEAD_SOAK_SEED`` its seed (printed on failure).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import gc
import itertools
import math
import os
import random
import time
import tracemalloc
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

import anyio
import h2.errors
import httpx
import pytest

from httpx_bulkhead import BulkheadFull, BulkheadTransport, CompartmentStats, Policy
from tests.faults.handlers import IntervalLog, TimedApp, TimedH2Server, random_faults
from tests.resources import FdSnapshot, assert_no_fd_growth, settle_io
from tests.servers import (
    H2Reset,
    HypercornServer,
    RawServer,
    TestApp,
    default_server_tls,
    keepalive_ok,
)

pytestmark = pytest.mark.anyio

SOAK_SECONDS = float(os.environ.get("BULKHEAD_SOAK_SECONDS") or 5.0)
SEED = int(os.environ.get("BULKHEAD_SOAK_SEED") or 20_240_611)

H1 = Policy(max_concurrency=4, max_pending=4, acquire_timeout=0.2)
RAW = Policy(max_concurrency=3, max_pending=3, acquire_timeout=0.2, request_timeout=0.6)
H2 = Policy(
    max_concurrency=5, max_connections=2, max_pending=5, acquire_timeout=0.3, request_timeout=1.0
)
H2_SERVER_CAP = 3
CLIENT_TIMEOUT = httpx.Timeout(5.0, read=0.4)
#: The compartment that runs over TLS, per backend (the other one runs on plain TCP).
TLS_COMPARTMENT = {"asyncio": "h1", "trio": "raw"}


# ------------------------------------------------------------- client-side release times


class _TimedStream(httpx.AsyncByteStream):
    """Wraps a response body; calls ``done`` right after the transport let go of it (end
    of body, error, cancellation or close: the slot was released just before)."""

    def __init__(self, inner: httpx.AsyncByteStream, done: Callable[[], None]) -> None:
        self._inner = inner
        self._done = done
        self._iterator: AsyncIterator[bytes] | None = None

    def __aiter__(self) -> AsyncIterator[bytes]:
        self._iterator = self._inner.__aiter__()
        return self

    async def __anext__(self) -> bytes:
        assert self._iterator is not None
        try:
            return await self._iterator.__anext__()
        except BaseException:
            self._done()
            raise

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            self._done()


class ReleaseClock(httpx.AsyncBaseTransport):
    """Records, per ``x-req-id``, when the bulkhead gave the request's slot back.

    The slot is released in the same step (no await in between) as the exception or end of
    body this wrapper sees, so no other request can have taken the slot before the time
    recorded: a server-side interval cut at that time lies inside the slot's tenure.
    """

    def __init__(self, inner: BulkheadTransport) -> None:
        self.inner = inner
        self.released: dict[str, float] = {}

    def _done(self, key: str) -> None:
        self.released.setdefault(key, time.monotonic())

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        key = request.headers["x-req-id"]
        try:
            response = await self.inner.handle_async_request(request)
        except BaseException:
            self._done(key)
            raise
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _TimedStream(response.stream, lambda: self._done(key))
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def peak_inside(log: IntervalLog, released: dict[str, float]) -> int:
    """The most requests the server had inside at once, counting each client request once
    (retries and replays share its id) and cutting each interval where the client gave
    the request up: a server may notice an abandoned request late, but from that moment
    on its slot belongs to someone else."""
    events: list[tuple[float, int, str]] = []
    for key, start, end in log.snapshot():
        end = min(end, released.get(key, math.inf))
        if end > start:
            events += [(start, 1, key), (end, -1, key)]
    events.sort(key=lambda e: (e[0], e[1]))  # at a tie, leaving goes first
    inside: collections.Counter[str] = collections.Counter()
    peak = distinct = 0
    for _, step, key in events:
        before = inside[key]
        inside[key] += step
        distinct += (inside[key] > 0) - (before > 0)
        peak = max(peak, distinct)
    return peak


# ------------------------------------------------------------------------------- the soak


@dataclass
class Tally:
    ok: int = 0
    cancelled: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)


@dataclass
class Compartment:
    kind: str  # "h1", "raw" or "h2"
    name: str
    url: str
    policy: Policy
    client: httpx.AsyncClient
    clock: ReleaseClock
    log: IntervalLog
    workers: int
    release: Callable[[str], None] | None = None
    tally: Tally = field(default_factory=Tally)

    def stats(self) -> CompartmentStats:
        return self.clock.inner.statistics()[self.name]


_ids = itertools.count()


def h1_request(rng: random.Random) -> tuple[str, str, bytes | None]:
    return rng.choice(
        [
            ("GET", f"/slow/{rng.randint(0, 30)}", None),
            ("GET", "/", None),
            ("GET", f"/bytes/{rng.choice((10, 70_000, 300_000))}", None),
            ("GET", "/stream/40", None),
            ("POST", "/echo", b"e" * rng.choice((0, 10, 60_000))),
        ]
    )


def raw_request(rng: random.Random) -> tuple[str, str, bytes | None]:
    return rng.choice([("GET", "/", None), ("PUT", "/", b"p" * 100), ("POST", "/", b"post")])


def h2_request(rng: random.Random, key: str, backend: str) -> tuple[str, str, bytes | None]:
    choices: list[tuple[str, str, bytes | None]] = [
        ("GET", "/", None),
        ("GET", f"/hold/{key}", None),
        ("GET", f"/hold/{key}", None),
        ("GET", f"/bytes/{rng.choice((100, 100_000))}", None),
        ("GET", "/reset", None),
        ("GET", "/refuse", None),
    ]
    choices.append(("POST", "/echo", b"h" * rng.choice((10, 30_000))))
    return rng.choice(choices)


async def one_request(comp: Compartment, rng: random.Random, backend: str) -> None:
    key = f"{comp.kind}#{next(_ids)}"
    release = comp.release
    if comp.kind == "h1":
        method, path, body = h1_request(rng)
    elif comp.kind == "raw":
        method, path, body = raw_request(rng)
    else:
        method, path, body = h2_request(rng, key, backend)
    headers = {"x-req-id": key, "x-bucket": comp.kind}
    deadline = rng.choice([math.inf, math.inf, math.inf, 0.0, rng.uniform(0, 0.02), rng.random()])
    streamed = rng.random() < 0.3

    async def call() -> None:
        try:
            if streamed:  # read the body, or close the response at once (early)
                request = comp.client.build_request(
                    method, comp.url + path, content=body, headers=headers
                )
                response = await comp.client.send(request, stream=True)
                try:
                    if rng.random() < 0.5:
                        await response.aread()
                finally:
                    await response.aclose()
            else:
                await comp.client.request(method, comp.url + path, content=body, headers=headers)
        except httpx.TransportError as exc:
            comp.tally.errors[type(exc).__name__] += 1
        else:
            comp.tally.ok += 1

    with anyio.move_on_after(deadline) as scope:
        if release is not None and path.startswith("/hold/"):
            async with anyio.create_task_group() as tg:
                tg.start_soon(release_later, release, key, rng.uniform(0, 0.05))
                await call()
        else:
            await call()
    if scope.cancelled_caught:
        comp.tally.cancelled += 1


async def release_later(release: Callable[[str], None], name: str, delay: float) -> None:
    await anyio.sleep(delay)
    release(name)


async def worker(comp: Compartment, rng: random.Random, stop_at: float, backend: str) -> None:
    while time.monotonic() < stop_at:
        await one_request(comp, rng, backend)
        await anyio.sleep(rng.uniform(0, 0.005))


def check_compartment(comp: Compartment, *, closed: bool) -> None:
    stats = comp.stats()
    assert stats.acquired == stats.completed + stats.failed + stats.cancelled, stats
    assert (stats.running, stats.waiting, stats.in_use_connections) == (0, 0, 0), stats
    if closed:
        assert (stats.connections, stats.idle_connections) == (0, 0), stats
    peak = peak_inside(comp.log, comp.clock.released)
    assert peak <= comp.policy.initial_limit, (comp.name, peak, comp.policy)  # static


@dataclass
class Servers:
    h1: HypercornServer
    raw: RawServer
    h2: TimedH2Server
    app: TestApp
    logs: dict[str, IntervalLog]


@contextlib.contextmanager
def servers(seed: int, tls: str) -> Iterator[Servers]:
    """The three servers; the one of compartment ``tls`` ("h1" or "raw") over TLS."""
    logs = {"h1": IntervalLog(), "raw": IntervalLog(), "h2": IntervalLog()}
    server_tls = default_server_tls()
    app = TestApp()
    resets = {
        "/reset": H2Reset(),
        "/refuse": H2Reset(code=h2.errors.ErrorCodes.REFUSED_STREAM),
    }
    h2_options = {"max_streams": H2_SERVER_CAP, "goaway_after": 3, "goaway_keep": 2}
    with (
        HypercornServer(
            TimedApp(app, logs["h1"]),
            tls=server_tls if tls == "h1" else None,
            alpn=("http/1.1",),
        ) as h1_server,
        RawServer(
            random_faults(seed, logs["raw"]), tls=server_tls if tls == "raw" else None
        ) as raw_server,
        TimedH2Server(logs["h2"], resets=resets, **h2_options) as h2_server,
    ):
        yield Servers(h1_server, raw_server, h2_server, app, logs)


async def test_soak(anyio_backend: str) -> None:
    seed = SEED + (anyio_backend == "trio")
    try:
        await soak(seed, anyio_backend)
    except BaseException as exc:
        exc.add_note(f"soak: BULKHEAD_SOAK_SEED={SEED} (seed {seed} under {anyio_backend})")
        raise


async def soak(seed: int, backend: str) -> None:
    baseline = len(asyncio.all_tasks()) if backend == "asyncio" else 0
    fds = FdSnapshot.take()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with servers(seed, TLS_COMPARTMENT[backend]) as srv:
            h1_key, raw_key = f"127.0.0.1:{srv.h1.port}", f"127.0.0.1:{srv.raw.port}"
            verify = default_server_tls().client_ssl_context()
            http1 = BulkheadTransport(hosts={h1_key: H1, raw_key: RAW}, verify=verify)
            http2 = BulkheadTransport(default=H2, http1=False, http2=True)
            clock1, clock2 = ReleaseClock(http1), ReleaseClock(http2)
            async with (
                httpx.AsyncClient(transport=clock1, timeout=CLIENT_TIMEOUT) as client1,
                httpx.AsyncClient(transport=clock2, timeout=CLIENT_TIMEOUT) as client2,
            ):
                comps = [
                    Compartment("h1", h1_key, srv.h1.url, H1, client1, clock1, srv.logs["h1"], 10),
                    Compartment(
                        "raw", raw_key, srv.raw.url, RAW, client1, clock1, srv.logs["raw"], 6
                    ),
                    Compartment(
                        "h2",
                        srv.h2.url,
                        srv.h2.url,
                        H2,
                        client2,
                        clock2,
                        srv.logs["h2"],
                        11,
                        release=srv.h2.release,
                    ),
                ]
                stop_at = time.monotonic() + SOAK_SECONDS
                with anyio.fail_after(SOAK_SECONDS + 30):
                    async with anyio.create_task_group() as tg:
                        for comp in comps:
                            for i in range(comp.workers):
                                rng = random.Random(f"{seed}/{comp.kind}/{i}")
                                tg.start_soon(worker, comp, rng, stop_at, backend)
                for comp in comps:
                    check_compartment(comp, closed=False)
            for comp in comps:
                check_compartment(comp, closed=True)
            assert not srv.h2.violations and not srv.h2.protocol_errors
            assert srv.h2.max_open_streams_per_connection <= H2_SERVER_CAP
            report(comps, srv)
        await settle_io()
        assert_no_fd_growth(fds, f"soak under {backend}")  # before gc: see tests/resources.py
        await settle()
    assert not caught, collections.Counter(str(w.message)[:150] for w in caught)
    if backend == "asyncio":
        with anyio.fail_after(5):
            while len(asyncio.all_tasks()) > baseline:
                await anyio.sleep(0)


async def settle() -> None:
    """Let the event loop finish what the closed clients left scheduled, then collect
    garbage, so a leaked socket is reported here and not in a later test."""
    for _ in range(50):
        await anyio.sleep(0)
    gc.collect()


def report(comps: list[Compartment], srv: Servers) -> None:
    """One line per compartment (shown with ``-s``, or when the test fails)."""
    raw_peaks = {
        "h1": srv.app.max_concurrent("h1"),
        "raw": srv.logs["raw"].peak,
        "h2": srv.h2.max_open_streams,
    }
    for comp in comps:
        s = comp.stats()
        print(
            f"soak {comp.kind}: ok={comp.tally.ok} cancelled={comp.tally.cancelled} "
            f"errors={dict(comp.tally.errors)} acquired={s.acquired} "
            f"completed={s.completed} failed={s.failed} cancelled={s.cancelled} "
            f"rejected={s.rejected} acquire_timeouts={s.acquire_timeouts} "
            f"connections_created={s.connections_created} "
            f"peak_inside={peak_inside(comp.log, comp.clock.released)} "
            f"raw_server_peak={raw_peaks[comp.kind]} limit={comp.policy.max_concurrency}"
        )


# ------------------------------------------------------------------- memory of rejections

#: Allowed growth of traced memory between 10,000 and 100,000 rejections.
REJECTION_GROWTH_BOUND = 200 * 1024


def _growth(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot) -> tuple[int, list[str]]:
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]
    diff = after.filter_traces(ignore).compare_to(before.filter_traces(ignore), "lineno")
    return sum(d.size_diff for d in diff), [str(d) for d in diff[:5]]


async def test_rejections_do_not_grow_memory(
    server: HypercornServer, app: TestApp, unique: Callable[[str], str]
) -> None:
    """100,000 requests rejected by a full compartment (its one slot held by a gated
    request, no queue) cost no memory that stays: counters and windows are bounded."""
    gate = app.gate(unique("full"))
    transport = BulkheadTransport(default=Policy(max_concurrency=1, max_pending=0))
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:
        async with anyio.create_task_group() as tg:
            # The holder waits as long as the rejections take (tracemalloc makes them slow).
            hold = functools.partial(client.get, f"{server.url}/gate/{gate.name}", timeout=None)
            tg.start_soon(hold)
            await gate.until_entered(1)
            with pytest.raises(BulkheadFull):  # the path a caller takes...
                await client.get(f"{server.url}/")
            request = client.build_request("GET", f"{server.url}/")

            async def reject(n: int) -> None:  # ...and, faster, the transport's own
                for _ in range(n):
                    try:
                        await transport.handle_async_request(request)
                    except BulkheadFull:
                        pass
                    else:  # pragma: no cover
                        raise AssertionError("a request got through a full compartment")

            await reject(1_000)  # warm up (first-time allocations)
            started = time.monotonic()
            tracemalloc.start()
            try:
                await reject(9_000)
                at_10k = tracemalloc.take_snapshot()
                await reject(90_000)
                at_100k = tracemalloc.take_snapshot()
            finally:
                tracemalloc.stop()
            elapsed = time.monotonic() - started
            growth, top = _growth(at_10k, at_100k)
            gate.open()
        print(f"rejections: 99,000 in {elapsed:.2f}s (traced); growth 10k->100k {growth} bytes")
        assert growth < REJECTION_GROWTH_BOUND, top
        stats = transport.statistics()[server.url]
        assert stats.rejected == 100_001, stats
        assert (stats.running, stats.waiting, stats.in_use_connections) == (0, 0, 0), stats
        assert stats.acquired == stats.completed + stats.failed + stats.cancelled == 1, stats


# ----------------------------------------------------------------- cancelled dials


async def test_cancelled_dials_leave_no_socket_behind(anyio_backend: str) -> None:
    """Up to 2,000 requests, each needing a new connection (no idle one is kept), each
    cancelled after a random 0-1.5 ms, which lands in the middle of the TCP connect for
    a good share of them: no socket may be left for the garbage collector."""
    rng = random.Random(SEED)
    fds = FdSnapshot.take()
    with warnings.catch_warnings(record=True) as caught, RawServer(keepalive_ok()) as srv:
        warnings.simplefilter("always")
        transport = BulkheadTransport(default=Policy(max_idle_connections=0))
        async with transport:
            request = httpx.Request("GET", srv.url)
            for attempt in range(2_000):
                with anyio.move_on_after(rng.uniform(0, 0.0015)):
                    response = await transport.handle_async_request(request)
                    await response.aclose()
                if attempt % 100 == 99:
                    gc.collect()
                    if caught:
                        break
            stats = transport.statistics()[srv.url]
            assert (stats.running, stats.in_use_connections) == (0, 0), stats
            assert stats.acquired == stats.completed + stats.failed + stats.cancelled, stats
        await settle_io()
    assert_no_fd_growth(fds, "cancelled dials")
    await settle()
    assert not caught, collections.Counter(str(w.message)[:80] for w in caught)
