"""Per-request CPU with both exporters attached and scraped once a second, vs without.

    python -m benchmarks.exporters                 # 24 rounds of 2000 requests
    python -m benchmarks.exporters --rounds 48 --json benchmarks/exporters.json

Five ``BulkheadTransport``s in one process, each driven at the transport level
(``handle_async_request``, body read, response closed) against the Node.js server
(``server.js``, pinned to the other core) on four origins (four compartments each):

* ``bare``: nothing attached (and ``control``, a second one: the A/A ratio
  ``control / bare`` shows the noise of the run);
* ``exported``: ``httpx_bulkhead.otel.instrument`` on an SDK ``MeterProvider`` with an
  ``InMemoryMetricReader``, and a ``prometheus_client`` registry holding a
  ``BulkheadCollector``, both with their per-event histograms (the default): every
  request records its queue time in both, every closed connection its duration;
* ``pulled``: the same exporters with ``histograms=False`` (observable instruments and
  the collector only: nothing on the request path), so ``exported / pulled`` is the cost
  of the histograms alone;
* ``defaults``: each exporter as a user gets it without arguments
  (``otel.instrument(transport, provider)``: no histograms, the SDK's ``record`` costs
  10-30 us; ``BulkheadCollector(transport)``: its histograms on): the promise of issue 14,
  within 5% of ``bare``.

While an exported batch runs, a scraper thread collects its exporters (the OTel reader
and ``generate_latest``) once a second of its running time, as a Prometheus server and an
OTel periodic reader would, from another thread.

Batches rotate (ABCD, BCDA, ...) and the result is the median over rounds of the paired
ratio ``x / bare`` of client CPU per request (``time.process_time``, the whole process, so
the scraper thread's CPU is counted against the exported transports).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry, generate_latest

from benchmarks import harness as h
from httpx_bulkhead import BulkheadTransport, otel
from httpx_bulkhead.prometheus import BulkheadCollector

ORIGINS = 4
CONCURRENCY = 16


class Scraper:
    """A thread that calls ``scrape`` once per ``period`` seconds of *active* time: it runs
    only between ``resume()`` and ``pause()`` and carries the time left over a pause."""

    def __init__(self, scrape: Callable[[], None], period: float = 1.0) -> None:
        self._scrape = scrape
        self._period = period
        self._left = period
        self._active = threading.Event()
        self._paused = threading.Event()
        self._paused.set()
        self._closed = False
        self.scrapes = 0
        self.cpu = 0.0  # thread CPU seconds spent scraping
        self._thread = threading.Thread(target=self._run, name="scraper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self._active.wait()
            if self._closed:
                return
            started = time.monotonic()
            if self._paused.wait(self._left):
                self._left = max(0.0, self._left - (time.monotonic() - started))
                continue
            cpu0 = time.thread_time()
            self._scrape()
            self.cpu += time.thread_time() - cpu0
            self.scrapes += 1
            self._left = self._period

    def resume(self) -> None:
        self._paused.clear()
        self._active.set()

    def pause(self) -> None:
        self._active.clear()
        self._paused.set()

    def close(self) -> None:
        self._closed = True
        self._paused.set()
        self._active.set()
        self._thread.join()


class Exported:
    """A transport with both exporters attached, and how to scrape them."""

    def __init__(
        self, name: str, urls: list[str], histograms: bool, otel_histograms: bool | None = None
    ) -> None:
        self.transport: BulkheadTransport = h.bulkhead_transport(CONCURRENCY)
        self.driver = h.TransportDriver(name, self.transport, urls)
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[self.reader])
        if otel_histograms is None:
            otel_histograms = histograms
        self.instrumentation = otel.instrument(
            self.transport, self.provider, histograms=otel_histograms
        )
        self.registry = CollectorRegistry()
        self.collector = BulkheadCollector(self.transport, histograms=histograms)
        self.registry.register(self.collector)
        self.histograms = histograms

    def scrape(self) -> None:
        data = self.reader.get_metrics_data()
        text = generate_latest(self.registry)
        assert data is not None and b"httpx_bulkhead_requests_total" in text
        assert (b"time_in_queue_seconds_bucket" in text) == self.histograms

    def close(self) -> None:
        self.collector.close()
        self.instrumentation.uninstrument()
        self.provider.shutdown()


async def run(rounds: int, requests: int, warmup: int) -> dict[str, Any]:
    with h.NodeServer(ORIGINS) as server, h.pin():
        urls = [server.url(i) for i in range(ORIGINS)]
        bare = h.TransportDriver("bare", h.bulkhead_transport(CONCURRENCY), urls)
        control = h.TransportDriver("control", h.bulkhead_transport(CONCURRENCY), urls)
        exported = Exported("exported", urls, histograms=True)
        pulled = Exported("pulled", urls, histograms=False)
        defaults = Exported("defaults", urls, histograms=True, otel_histograms=False)
        scraping: list[Exported] = []  # the exporters the scraper collects now

        scraper = Scraper(lambda: scraping[0].scrape() if scraping else None)
        try:
            drivers = [bare, control, exported.driver, pulled.driver, defaults.driver]
            attached = {exported.driver: exported, pulled.driver: pulled, defaults.driver: defaults}
            for driver in drivers:
                await h.run_batch(driver, warmup, CONCURRENCY)
            samples: dict[str, list[h.Sample]] = {d.name: [] for d in drivers}
            for r in range(rounds):
                k = r % len(drivers)
                for driver in [*drivers[k:], *drivers[:k]]:
                    target = attached.get(driver)
                    if target is not None:
                        scraping[:] = [target]
                        scraper.resume()
                    try:
                        sample = await h.run_batch(driver, requests, CONCURRENCY)
                    finally:
                        scraper.pause()
                        scraping.clear()
                    samples[driver.name].append(sample)
        finally:
            scraper.close()
            exported.close()
            pulled.close()
            defaults.close()
            await bare.aclose()
            await control.aclose()
            await exported.driver.aclose()
            await pulled.driver.aclose()
            await defaults.driver.aclose()

    def ratios(name: str, against: str = "bare") -> list[float]:
        pairs = zip(samples[name], samples[against], strict=True)
        return [s.cpu_us / b.cpu_us for s, b in pairs]

    exported_seconds = sum(
        s.wall for s in samples["exported"] + samples["pulled"] + samples["defaults"]
    )
    return {
        "rounds": rounds,
        "requests_per_batch": requests,
        "concurrency": CONCURRENCY,
        "compartments": ORIGINS,
        "bare_cpu_us": statistics.median(s.cpu_us for s in samples["bare"]),
        "exported_cpu_us": statistics.median(s.cpu_us for s in samples["exported"]),
        "pulled_cpu_us": statistics.median(s.cpu_us for s in samples["pulled"]),
        "cpu_ratio": statistics.median(ratios("exported")),
        "cpu_ratio_range": [min(ratios("exported")), max(ratios("exported"))],
        "pulled_ratio": statistics.median(ratios("pulled")),
        "defaults_ratio": statistics.median(ratios("defaults")),
        "defaults_ratio_range": [min(ratios("defaults")), max(ratios("defaults"))],
        "histograms_ratio": statistics.median(ratios("exported", "pulled")),
        "control_ratio": statistics.median(ratios("control")),
        "control_ratio_range": [min(ratios("control")), max(ratios("control"))],
        "scrapes": scraper.scrapes,
        "exported_seconds": exported_seconds,
        "scrape_cpu_ms": 1e3 * scraper.cpu / scraper.scrapes if scraper.scrapes else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--requests", type=int, default=2000, help="requests per batch")
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args()
    result = asyncio.run(run(args.rounds, args.requests, args.warmup))
    text = json.dumps(result, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
