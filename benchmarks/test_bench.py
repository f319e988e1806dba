"""pytest-benchmark entries for the overhead cases: ``pytest benchmarks --benchmark-only``.

Each round is one batch of ``BATCH`` requests on a warm keep-alive pool, timed with
``time.process_time`` (client CPU, the main metric), so ``Mean`` divided by ``BATCH`` is the
CPU per request (also in ``extra_info["cpu_us_per_request"]``).  Groups put the
contestants of one case side by side: HTTP/1.1 (httpx's default, BulkheadTransport with its
h11 and its httptools codec, the h11 floor) and HTTP/2 with prior knowledge (httpx's default
and BulkheadTransport, ``http1=False, http2=True``, against ``server.js --http2``; the TCP
connections the server accepted are in ``extra_info["tcp_connections"]``).
pytest-benchmark runs one test after another; for ratios measured with the contestants
interleaved (the noisy-machine way), run ``python -m benchmarks.report`` instead.

Not collected by a plain ``python -m pytest`` (``testpaths = ["tests"]``).
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import time
from collections.abc import Iterator

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from benchmarks import harness as h

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")

BATCH = 200
ROUNDS = 10


@pytest.fixture(scope="module")
def server() -> Iterator[h.NodeServer]:
    with h.NodeServer(1) as srv, h.pin():
        yield srv


@pytest.fixture(scope="module")
def h2_server() -> Iterator[h.NodeServer]:
    with h.NodeServer(1, http2=True) as srv, h.pin():
        yield srv


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def _bench(
    benchmark: BenchmarkFixture,
    loop: asyncio.AbstractEventLoop,
    server: h.NodeServer,
    contestant: str,
    level: h.Level,
    concurrency: int,
    *,
    group: str = "",
) -> None:
    server.reset()
    driver = loop.run_until_complete(h.make_driver(contestant, level, [server.url(0)], concurrency))
    samples: list[h.Sample] = []

    def one_batch() -> None:
        samples.append(loop.run_until_complete(h.run_batch(driver, BATCH, concurrency)))

    try:
        loop.run_until_complete(h.run_batch(driver, max(BATCH, 2 * concurrency), concurrency))
        benchmark.group = f"{group}{level} level, concurrency {concurrency}"
        benchmark.extra_info["requests_per_round"] = BATCH
        benchmark.pedantic(  # type: ignore[no-untyped-call]
            one_batch, rounds=ROUNDS, iterations=1, warmup_rounds=1
        )
        benchmark.extra_info["cpu_us_per_request"] = statistics.median(s.cpu_us for s in samples)
        benchmark.extra_info["requests_per_second"] = statistics.median(s.rps for s in samples)
    finally:
        loop.run_until_complete(driver.aclose())
    benchmark.extra_info["tcp_connections"] = server.stats()[0]["connections"]


@pytest.mark.benchmark(timer=time.process_time)
@pytest.mark.parametrize("concurrency", [1, 64])
@pytest.mark.parametrize("level", ["client", "transport"])
@pytest.mark.parametrize("contestant", [h.DEFAULT, h.BULKHEAD, h.HTTPTOOLS])
def test_overhead(
    benchmark: BenchmarkFixture,
    loop: asyncio.AbstractEventLoop,
    server: h.NodeServer,
    contestant: str,
    level: h.Level,
    concurrency: int,
) -> None:
    """A batch through ``httpx.AsyncClient`` (client) or ``handle_async_request`` (transport)."""
    _bench(benchmark, loop, server, contestant, level, concurrency)


@pytest.mark.benchmark(timer=time.process_time)
@pytest.mark.parametrize("concurrency", [1, 64])
@pytest.mark.parametrize("level", ["client", "transport"])
def test_h11_floor(
    benchmark: BenchmarkFixture,
    loop: asyncio.AbstractEventLoop,
    server: h.NodeServer,
    level: h.Level,
    concurrency: int,
) -> None:
    """The floor, in each group for comparison: h11 on a bare asyncio Protocol."""
    _bench(benchmark, loop, server, h.FLOOR, level, concurrency)


@pytest.mark.benchmark(timer=time.process_time)
@pytest.mark.parametrize("concurrency", [1, 64])
@pytest.mark.parametrize("level", ["client", "transport"])
@pytest.mark.parametrize("contestant", h.H2_CONTESTANTS)
def test_http2(
    benchmark: BenchmarkFixture,
    loop: asyncio.AbstractEventLoop,
    h2_server: h.NodeServer,
    contestant: str,
    level: h.Level,
    concurrency: int,
) -> None:
    """The same over HTTP/2 (h2c, prior knowledge): one connection, up to 100 streams."""
    _bench(benchmark, loop, h2_server, contestant, level, concurrency, group="HTTP/2, ")
