"""The per-event histograms under pressure: many origins, a scraping thread, a broken meter.

The exporters' agreement with ``statistics()`` on a realistic scenario is in
``test_exporters.py``; here the adversary's cases: origins far beyond
``max_default_compartments`` (the histograms' series and caches stay bounded like the
compartments, and nothing is lost: evicted ones fold into ``"(evicted)"``), a thread
scraping while requests record, a meter provider whose instruments raise, and
uninstrumenting (the request path is left with no sink).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import anyio
import httpx
import pytest

from httpx_bulkhead import BulkheadTransport, Policy
from httpx_bulkhead.testing import MockNetwork
from tests.integration.test_exporters import (
    DURATION,
    EVICTED,
    QUEUE_TIME,
    Histograms,
    check_histograms,
    prometheus_registry,
    read_otel,
    read_prometheus,
)
from tests.servers import HypercornServer

pytestmark = pytest.mark.anyio

#: Origins driven through a bound of ``BOUND`` default compartments.
ORIGINS = 60
BOUND = 3


def ok(request: httpx.Request) -> httpx.Response:
    # ``Connection: close`` on every other origin, so connections close during the run.
    close = int(request.url.host.split(".")[0].split("-")[1]) % 2 == 0
    return httpx.Response(200, text="ok", headers={"Connection": "close"} if close else {})


async def test_many_origins_keep_the_histograms_bounded_and_whole() -> None:
    """60 origins through 3 default compartments, a thread scraping Prometheus all along:
    the series stay bounded (live compartments plus ``"(evicted)"``), and the counts add
    up to ``statistics()`` over the live and evicted entries alike."""
    pytest.importorskip("prometheus_client")
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from httpx_bulkhead import otel

    transport = BulkheadTransport(
        default=Policy(max_concurrency=2), network=MockNetwork(ok), max_default_compartments=BOUND
    )
    registry = prometheus_registry(transport)
    reader = InMemoryMetricReader()
    instrumentation = otel.instrument(
        transport, MeterProvider(metric_readers=[reader]), histograms=True
    )
    stop = threading.Event()
    scrapes: list[int] = []
    errors: list[BaseException] = []

    def scrape() -> None:  # as a Prometheus server would, from its own thread
        from prometheus_client import generate_latest

        while not stop.is_set():
            try:
                text = generate_latest(registry)
            except BaseException as exc:  # reported below
                errors.append(exc)
                return
            scrapes.append(text.count(b"_count{"))

    thread = threading.Thread(target=scrape)
    thread.start()
    try:
        async with transport, httpx.AsyncClient(transport=transport) as client:
            for i in range(ORIGINS):
                for _ in range(2):
                    assert (await client.get(f"http://origin-{i}.test/")).text == "ok"
                await anyio.sleep(0)  # let the scraper in
            histograms: Histograms = {}
            _, stats = read_prometheus(transport, registry, histograms)
            check_histograms(histograms, stats)
            assert EVICTED in stats and len(stats) <= BOUND + 2
            for name in (QUEUE_TIME[1], DURATION[1]):  # live compartments and "(evicted)"
                assert set(histograms[name]) <= set(stats), histograms[name].keys()
            otel_histograms: Histograms = {}
            _, stats = read_otel(reader, transport, otel_histograms)
            check_histograms(otel_histograms, stats)
            # Our caches went with the evicted compartments (the SDK keeps its series).
            assert len(transport._events._recorders) <= BOUND + 1
    finally:
        stop.set()
        thread.join()
        instrumentation.uninstrument()
    assert not errors and scrapes
    # Each scrape had at most 2 histograms x (live compartments + "(evicted)") series.
    assert max(scrapes) <= 2 * (BOUND + 2)


class _Raising:
    """An instrument whose ``record`` raises, as a broken SDK or exporter might."""

    def record(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the meter is broken")


class _BrokenMeter:
    def __getattr__(self, name: str) -> Any:
        if name == "create_histogram":
            return lambda *args, **kwargs: _Raising()
        return lambda *args, **kwargs: object()  # the observable instruments


class _BrokenProvider:
    def get_meter(self, *args: Any, **kwargs: Any) -> _BrokenMeter:
        return _BrokenMeter()


async def test_a_meter_that_raises_never_fails_a_request(
    server: HypercornServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Every ``record`` raises: requests succeed, the failure is logged once (ERROR)."""
    from httpx_bulkhead import otel

    transport = BulkheadTransport(default=Policy(max_concurrency=2))
    instrumentation = otel.instrument(transport, _BrokenProvider(), histograms=True)  # type: ignore[arg-type]
    with caplog.at_level(logging.DEBUG, logger="httpx_bulkhead"):
        async with transport, httpx.AsyncClient(transport=transport) as client:
            for path in ("/", "/close", "/", "/close"):  # queue times and closed connections
                assert (await client.get(f"{server.url}{path}")).status_code == 200
    instrumentation.uninstrument()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "histogram" in errors[0].getMessage()
    assert errors[0].exc_info is not None and "the meter is broken" in str(errors[0].exc_info[1])
    stats = transport.statistics()[server.url]
    assert stats.completed == 4 and stats.failed == 0


async def test_uninstrumented_transport_records_nothing(server: HypercornServer) -> None:
    """After ``uninstrument()`` and ``close()`` no compartment has a sink (the request
    path is back to one attribute check), and the histograms stop counting."""
    pytest.importorskip("prometheus_client")
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from httpx_bulkhead import otel
    from httpx_bulkhead.prometheus import BulkheadCollector

    transport = BulkheadTransport()
    reader = InMemoryMetricReader()
    instrumentation = otel.instrument(
        transport, MeterProvider(metric_readers=[reader]), histograms=True
    )
    collector = BulkheadCollector(transport)
    async with transport, httpx.AsyncClient(transport=transport) as client:
        await client.get(f"{server.url}/")
        compartment = transport._router.compartments[server.url]
        assert compartment.sink is not None
        instrumentation.uninstrument()
        collector.close()
        assert compartment.sink is None and compartment.connections.sink is None
        await client.get(f"{server.url}/")
        before = {m.name for m in _metrics(reader)}
        assert QUEUE_TIME[0] in before  # recorded once, then no more
        points = next(m for m in _metrics(reader) if m.name == QUEUE_TIME[0]).data.data_points
        assert sum(p.count for p in points) == 1
    samples = {
        s.name: s.value
        for family in collector.collect()
        for s in family.samples
        if s.name == QUEUE_TIME[1] + "_count"
    }
    assert samples == {QUEUE_TIME[1] + "_count": 1.0}


def _metrics(reader: Any) -> list[Any]:
    data = reader.get_metrics_data()
    return [m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]
