"""pytest-benchmark entries for the core decisions, without I/O: ``pytest benchmarks/test_core.py``.

Each entry times one operation of the pure core (or of the slot shell on an event loop) in a
loop of ``N`` so per-call timer overhead does not dominate; ``Mean / N`` is the cost of one
operation.  They exist to catch a regression as a *ratio against a saved baseline*::

    python -m pytest benchmarks/test_core.py --benchmark-only --benchmark-save=core
    # ... change the code ...
    python -m pytest benchmarks/test_core.py --benchmark-only \\
        --benchmark-compare --benchmark-compare-fail=median:15%

No entry asserts a time: the comparison is pytest-benchmark's, against the saved run, on the
same machine.  What each measures:

- ``limiter``: a free slot taken and given back; and the contended cycle (a full
  compartment: a waiter queued, a release handing it the slot).
- ``slots``: the same through the async shell on an asyncio loop (the fast path takes no
  await; the contended one wakes a task).
- ``pool``: a warm connection checked out and released, with 1 and with 1,000 origins in
  the compartment (the pool is O(1) in origins).
- ``codec``: one keep-alive exchange through each HTTP/1.1 codec (h11, httptools): the
  request encoded, a one-piece response parsed, reuse decided (``N / 10`` per round).
- ``router``: a cached origin routed (by host, and by path prefix), and a new origin
  routed when the compartment table is full (eviction of one at rest).
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from httpx_bulkhead import Policy
from httpx_bulkhead._codec import END, Head, make_codec
from httpx_bulkhead._limiter import Limiter, Waiter
from httpx_bulkhead._pool import DIAL, Pool, PoolEntry
from httpx_bulkhead._routing import Router
from httpx_bulkhead._slots import Slots
from httpx_bulkhead._stats import COMPLETED

N = 10_000


def _noop() -> None:
    pass


def _run(benchmark: BenchmarkFixture, group: str, body: object) -> None:
    benchmark.group = group
    benchmark.extra_info["operations_per_round"] = N
    benchmark.pedantic(body, rounds=20, iterations=1, warmup_rounds=2)  # type: ignore[no-untyped-call]


def test_limiter_free(benchmark: BenchmarkFixture) -> None:
    limiter = Limiter(100, 1024)

    def body() -> None:
        for _ in range(N):
            limiter.try_acquire()
            limiter.release()

    _run(benchmark, "limiter", body)
    assert limiter.running == 0 and limiter.acquired > 0 and limiter.acquired % N == 0


def test_limiter_contended(benchmark: BenchmarkFixture) -> None:
    limiter = Limiter(1, 1024)
    assert limiter.try_acquire()
    waiters = [Waiter(_noop) for _ in range(N)]

    def body() -> None:
        for waiter in waiters:
            limiter.enqueue(waiter)
            limiter.release()  # hands the slot to the waiter

    _run(benchmark, "limiter", body)
    assert limiter.running == 1 and limiter.waiting == 0


@pytest.mark.parametrize("contended", [False, True], ids=["free", "contended"])
def test_slots(benchmark: BenchmarkFixture, contended: bool) -> None:
    loop = asyncio.new_event_loop()
    slots = Slots("bench", Policy(max_concurrency=1), loop.time)
    request = httpx.Request("GET", "http://bench.invalid/")

    async def free() -> None:
        for _ in range(N):
            await slots.acquire(None, request)
            slots.release(COMPLETED)

    async def handover() -> None:
        # Two tasks take turns: each waits for the slot the other one releases.
        async def worker() -> None:
            for _ in range(N // 2):
                await slots.acquire(None, request)
                await asyncio.sleep(0)
                slots.release(COMPLETED)

        await asyncio.gather(worker(), worker())

    body = handover if contended else free
    try:
        _run(benchmark, "slots (asyncio)", lambda: loop.run_until_complete(body()))
    finally:
        loop.close()
    assert slots.limiter.running == 0 and slots.limiter.waiting == 0


def _warm_pool(origins: int) -> tuple[Pool[object], list[tuple[str, str, int]]]:
    pool: Pool[object] = Pool(
        max_connections=origins,
        max_idle=origins,
        idle_timeout=None,
        max_lifetime=None,
        lifetime_jitter=0.0,
    )
    names = [("http", f"h{i}.bench.invalid", 80) for i in range(origins)]
    for origin in names:
        grant, _ = pool.checkout(origin, 0.0)
        assert grant is DIAL
        entry: PoolEntry[object] = PoolEntry(origin, object())
        pool.dialed(entry, 0.0)
        pool.release(entry, 0.0, reusable=True)
    return pool, names


@pytest.mark.parametrize("origins", [1, 1000])
def test_pool_checkout_release(benchmark: BenchmarkFixture, origins: int) -> None:
    pool, names = _warm_pool(origins)
    origin = names[origins // 2]

    def body() -> None:
        for i in range(N):
            entry, _ = pool.checkout(origin, float(i))
            assert isinstance(entry, PoolEntry)
            pool.release(entry, float(i), reusable=True)

    _run(benchmark, "pool", body)
    assert pool.idle == origins and pool.total == origins and pool.created == origins


def test_router_cached(benchmark: BenchmarkFixture) -> None:
    router: Router[str] = Router(
        {"api.bench.invalid": Policy(), "https://llm.bench.invalid/v1/chat": Policy()},
        Policy(),
        lambda name, policy: name,
    )
    host = ("http", "api.bench.invalid", 80)
    prefixed = ("https", "llm.bench.invalid", 443)

    def body() -> None:
        for _ in range(N // 2):
            router.route(host, "/users/1")
            router.route(prefixed, "/v1/chat/completions")

    _run(benchmark, "router", body)
    assert router.route(prefixed, "/v1/chat/x") == "https://llm.bench.invalid/v1/chat"


def test_router_new_origins(benchmark: BenchmarkFixture) -> None:
    """Every call routes an origin never seen, with the table full: one is evicted each time."""
    router: Router[str] = Router({}, Policy(), lambda name, policy: name, max_default=1024)
    counter = iter(range(10**9))

    def body() -> None:
        for _ in range(N):
            router.route(("http", f"n{next(counter)}.bench.invalid", 80), "/")

    _run(benchmark, "router", body)
    assert len(router.compartments) == 1024


#: A keep-alive response as Node's ``http`` sends it (what the overhead suite's server answers).
_RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nDate: Tue, 01 Dec 2026 06:00:00 GMT\r\n"
    b"Connection: keep-alive\r\nKeep-Alive: timeout=60\r\nContent-Length: 2\r\n\r\nok"
)
_HEADERS = [(b"Host", b"127.0.0.1:8000"), (b"Accept", b"*/*"), (b"User-Agent", b"bench")]


@pytest.mark.parametrize("parser", ["h11", "httptools"])
def test_codec_exchange(benchmark: BenchmarkFixture, parser: str) -> None:
    """One keep-alive exchange through a codec, as ``HTTP11Connection`` drives it: the
    request encoded, the response fed in one piece, its events drained, reuse decided."""
    if parser == "httptools":
        pytest.importorskip("httptools")
    codec = make_codec(parser, 65536)
    events: list[object] = []

    def body() -> None:
        for _ in range(N // 10):
            codec.request(b"GET", b"/", _HEADERS)
            codec.end()
            codec.feed(_RESPONSE)
            events.clear()
            while True:
                event = codec.next_event()
                events.append(event)
                if event is END:
                    break
            if not codec.reuse():
                raise AssertionError("the connection must stay reusable")

    benchmark.extra_info["operations_per_round"] = N // 10
    benchmark.group = "codec"
    benchmark.pedantic(body, rounds=20, iterations=1, warmup_rounds=2)  # type: ignore[no-untyped-call]
    assert type(events[0]) is Head and events[-2:] == [b"ok", END]
