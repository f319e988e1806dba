"""The OpenTelemetry and Prometheus exporters, read back through the real libraries.

One scenario drives every figure against real servers on 127.0.0.1: a saturated HTTP/1.1
compartment (slots full, a waiter, a ``BulkheadFull`` rejection, then an
``AcquireTimeout``), connections discarded (``Connection: close``, eviction), HTTP/2
streams at the peer's cap over TLS (hypercorn, ALPN h2) with a request waiting for a
connection, and an evicted default compartment.  At two moments (saturated, then at rest)
the exporter's output is parsed (``InMemoryMetricReader``; ``generate_latest`` through
``text_string_to_metric_families``) and compared, sample by sample, with what
``statistics()`` says at that moment: the expected samples below are spelled out from
``CompartmentStats`` fields, not from the exporters' own catalogue.  A second test
checks the HTTP/2 figures against Node.js's nghttp2 (h2c, a scale-out at a cap of two).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest

from httpx_bulkhead import (
    AcquireTimeout,
    BulkheadFull,
    BulkheadHTTPTransport,
    BulkheadTransport,
    CompartmentStats,
    Policy,
)
from tests.conftest import until
from tests.servers import HypercornServer, NodeH2Server, TestApp, default_server_tls

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

pytestmark = pytest.mark.anyio

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
Check = Callable[[BulkheadTransport, bool], None]  # (transport, at rest)

EVICTED = "(evicted)"
DISCARDS = {
    "idle_expired": "idle_expired",
    "lifetime_expired": "lifetime_expired",
    "unknown_state": "unknown_state",
    "peer_closed": "peer_closed",
    "error": "error",
    "not_reusable": "not_reusable",
    "surplus": "surplus",
    "closed": "closed",
    "ping_timeout": "ping_timeouts",
    "loop_changed": "loop_changed",
}
#: The fleet limit's counters (``fleet_<name>`` fields), exposed only where there is one
#: (the evicted entry: once not zero).
FLEET_COUNTERS = {
    "acquired": "{lease}",
    "round_trips": "{call}",
    "fallbacks": "{request}",
    "outages": "{outage}",
    "rejected": "{request}",
    "timeouts": "{request}",
    "renewals": "{lease}",
    "lost": "{lease}",
}


def _key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return name, frozenset(labels.items())


def expected_prometheus(stats: dict[str, CompartmentStats]) -> Samples:
    """Every sample the collector should expose, from ``statistics()``."""
    out: Samples = {}
    for name, s in stats.items():
        c = {"compartment": name}

        def put(metric: str, value: float, c: dict[str, str] = c, **labels: str) -> None:
            out[_key(metric, **c, **labels)] = value

        put("httpx_bulkhead_rejected_total", s.rejected)
        put("httpx_bulkhead_acquire_timeouts_total", s.acquire_timeouts)
        for outcome in ("completed", "failed", "cancelled", "cancelled_waiting"):
            put("httpx_bulkhead_requests_total", getattr(s, outcome), outcome=outcome)
        put("httpx_bulkhead_stale_retries_total", s.stale_retries)
        put("httpx_bulkhead_leaked_responses_total", s.leaked_responses)
        put("httpx_bulkhead_slot_leaks_total", s.slot_leaks)
        put("httpx_bulkhead_connections_created_total", s.connections_created)
        for reason, field in DISCARDS.items():
            put("httpx_bulkhead_connections_discarded_total", getattr(s, field), reason=reason)
        put("httpx_bulkhead_http2_goaways_total", s.goaways)
        put("httpx_bulkhead_http2_streams_reset_total", s.streams_reset)
        put("httpx_bulkhead_http2_replays_total", s.replays)
        for field in FLEET_COUNTERS:
            value = getattr(s, f"fleet_{field}")
            if s.fleet_limit is not None or value:
                put(f"httpx_bulkhead_fleet_{field}_total", value)
        if name == EVICTED:
            continue  # counters only
        if s.fleet_limit is not None:
            put("httpx_bulkhead_fleet_limit", s.fleet_limit)
            put("httpx_bulkhead_fleet_leases", s.fleet_leases_held, kind="fleet")
            put("httpx_bulkhead_fleet_leases", s.fleet_leases_local, kind="local")
            put("httpx_bulkhead_fleet_waiting_requests", s.fleet_waiting)
            if s.fleet_in_use is not None:
                put("httpx_bulkhead_fleet_in_use", s.fleet_in_use)
            put("httpx_bulkhead_fleet_unavailable", int(bool(s.fleet_unavailable)))
        put("httpx_bulkhead_open_connections", s.in_use_connections, state="active")
        put("httpx_bulkhead_open_connections", s.idle_connections, state="idle")
        put("httpx_bulkhead_active_requests", s.running + s.waiting)
        put("httpx_bulkhead_running_requests", s.running)
        put("httpx_bulkhead_waiting_requests", s.waiting, waiting_for="slot")
        put("httpx_bulkhead_waiting_requests", s.waiting_for_connection, waiting_for="connection")
        put("httpx_bulkhead_concurrency_limit", s.limit)
        if s.max_pending is not None:
            put("httpx_bulkhead_pending_limit", s.max_pending)
        for q, value in (("0.5", s.wait_p50), ("0.95", s.wait_p95), ("0.99", s.wait_p99)):
            put("httpx_bulkhead_acquire_wait_seconds", value, quantile=q)
        put("httpx_bulkhead_acquire_wait_seconds", s.wait_max, quantile="1")
        put("httpx_bulkhead_http2_connections", s.http2_connections)
        put("httpx_bulkhead_http2_open_streams", s.open_streams)
        put("httpx_bulkhead_http2_stream_limit", sum(s.stream_caps))
    return out


#: Prometheus sample name -> (OTel instrument, unit, OTel attribute of the Prometheus label).
OTEL_NAMES = {
    "httpx_bulkhead_open_connections": ("http.client.open_connections", "{connection}"),
    "httpx_bulkhead_active_requests": ("http.client.active_requests", "{request}"),
    "httpx_bulkhead_running_requests": ("httpx_bulkhead.requests.running", "{request}"),
    "httpx_bulkhead_waiting_requests": ("httpx_bulkhead.requests.waiting", "{request}"),
    "httpx_bulkhead_concurrency_limit": ("httpx_bulkhead.requests.limit", "{request}"),
    "httpx_bulkhead_pending_limit": ("httpx_bulkhead.requests.pending_limit", "{request}"),
    "httpx_bulkhead_acquire_wait_seconds": ("httpx_bulkhead.acquire.wait", "s"),
    "httpx_bulkhead_rejected_total": ("httpx_bulkhead.requests.rejected", "{request}"),
    "httpx_bulkhead_acquire_timeouts_total": (
        "httpx_bulkhead.requests.acquire_timeouts",
        "{request}",
    ),
    "httpx_bulkhead_requests_total": ("httpx_bulkhead.requests.finished", "{request}"),
    "httpx_bulkhead_stale_retries_total": ("httpx_bulkhead.requests.stale_retries", "{request}"),
    "httpx_bulkhead_leaked_responses_total": ("httpx_bulkhead.responses.leaked", "{response}"),
    "httpx_bulkhead_slot_leaks_total": ("httpx_bulkhead.slots.leaked", "{request}"),
    "httpx_bulkhead_connections_created_total": (
        "httpx_bulkhead.connections.created",
        "{connection}",
    ),
    "httpx_bulkhead_connections_discarded_total": (
        "httpx_bulkhead.connections.discarded",
        "{connection}",
    ),
    "httpx_bulkhead_http2_goaways_total": ("httpx_bulkhead.http2.goaways", "{goaway}"),
    "httpx_bulkhead_http2_streams_reset_total": ("httpx_bulkhead.http2.streams.reset", "{stream}"),
    "httpx_bulkhead_http2_replays_total": ("httpx_bulkhead.http2.replays", "{request}"),
    "httpx_bulkhead_http2_connections": ("httpx_bulkhead.http2.connections", "{connection}"),
    "httpx_bulkhead_http2_open_streams": ("httpx_bulkhead.http2.streams", "{stream}"),
    "httpx_bulkhead_http2_stream_limit": ("httpx_bulkhead.http2.streams.limit", "{stream}"),
    "httpx_bulkhead_fleet_limit": ("httpx_bulkhead.fleet.limit", "{lease}"),
    "httpx_bulkhead_fleet_leases": ("httpx_bulkhead.fleet.leases", "{lease}"),
    "httpx_bulkhead_fleet_waiting_requests": ("httpx_bulkhead.fleet.waiting", "{request}"),
    "httpx_bulkhead_fleet_in_use": ("httpx_bulkhead.fleet.in_use", "{lease}"),
    "httpx_bulkhead_fleet_unavailable": ("httpx_bulkhead.fleet.unavailable", "1"),
    **{
        f"httpx_bulkhead_fleet_{field}_total": (f"httpx_bulkhead.fleet.{field}", unit)
        for field, unit in FLEET_COUNTERS.items()
    },
}


def expected_otel(stats: dict[str, CompartmentStats]) -> Samples:
    """The same figures under their OTel names and attributes."""
    out: Samples = {}
    for (metric, labels), value in expected_prometheus(stats).items():
        attributes = {}
        for label, text in labels:
            if label == "compartment":
                attributes["httpx_bulkhead.compartment"] = text
            elif label == "state":
                attributes["http.connection.state"] = text
            else:
                attributes[f"httpx_bulkhead.{label}"] = text
        otel_name = OTEL_NAMES[metric][0]
        if otel_name.startswith("http.client."):
            attributes.update(_server(dict(labels)["compartment"]))
            if otel_name == "http.client.open_connections":
                s = stats[dict(labels)["compartment"]]
                if s.connections and s.http2_connections in (0, s.connections):
                    attributes["network.protocol.version"] = "2" if s.http2_connections else "1.1"
        out[otel_name, frozenset(attributes.items())] = value
    return out


def _server(compartment: str) -> dict[str, str]:
    """``server.*`` and ``url.scheme`` of this test's compartment names (stringified)."""
    scheme, _, authority = compartment.rpartition("://")
    host, _, port = authority.partition(":")
    attributes = {"server.address": host, "server.port": port}
    if scheme:
        attributes["url.scheme"] = scheme
    return attributes


#: A histogram as read back: compartment -> (cumulative buckets [(upper bound, count)], sum,
#: count, max or None), per histogram name.
Histograms = dict[str, dict[str, tuple[list[tuple[float, int]], float, int, float | None]]]
QUEUE_TIME = ("http.client.request.time_in_queue", "httpx_bulkhead_request_time_in_queue_seconds")
DURATION = ("http.client.connection.duration", "httpx_bulkhead_connection_duration_seconds")


def read_otel(
    reader: InMemoryMetricReader,
    transport: BulkheadTransport | BulkheadHTTPTransport,
    histograms: Histograms | None = None,
) -> tuple[Samples, dict[str, CompartmentStats]]:
    """One collection of ``reader`` (instruments of ``otel.instrument``), checked for
    units, descriptions and instrument kinds, as samples; and ``statistics()`` after it.
    The histograms go to ``histograms`` (summed over protocol versions per compartment)."""
    data = reader.get_metrics_data()
    stats = transport.statistics()
    assert data is not None
    samples: Samples = {}
    kinds: dict[str, tuple[str, bool | None]] = {}
    units = dict(OTEL_NAMES.values())
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            assert sm.scope.name == "httpx_bulkhead"
            for metric in sm.metrics:
                if metric.name in (QUEUE_TIME[0], DURATION[0]):
                    assert metric.unit == "s" and type(metric.data).__name__ == "Histogram"
                    if histograms is not None:
                        histograms[metric.name] = _otel_histogram(metric.data.data_points)
                    continue
                assert metric.unit == units[metric.name] and metric.description
                kinds[metric.name] = (
                    type(metric.data).__name__,
                    getattr(metric.data, "is_monotonic", None),
                )
                for point in metric.data.data_points:
                    attributes = frozenset((k, str(v)) for k, v in (point.attributes or {}).items())
                    samples[metric.name, attributes] = point.value  # type: ignore[union-attr]
    assert kinds["http.client.open_connections"] == ("Sum", False)  # UpDownCounter
    assert kinds["http.client.active_requests"] == ("Sum", False)
    assert kinds["httpx_bulkhead.requests.rejected"] == ("Sum", True)  # Counter
    assert kinds["httpx_bulkhead.acquire.wait"] == ("Gauge", None)
    return samples, stats


def _otel_histogram(
    points: Any,
) -> dict[str, tuple[list[tuple[float, int]], float, int, float | None]]:
    """Data points by compartment, the protocol versions' points added up."""
    out: dict[str, tuple[list[tuple[float, int]], float, int, float | None]] = {}
    for point in points:
        name = str(point.attributes["httpx_bulkhead.compartment"])
        assert "network.protocol.version" not in point.attributes or point.attributes[
            "network.protocol.version"
        ] in ("1.1", "2")
        bounds = [*point.explicit_bounds, math.inf]
        counts = list(point.bucket_counts)
        assert sum(counts) == point.count
        cumulative = [sum(counts[: i + 1]) for i in range(len(counts))]
        old = out.get(name)
        if old is not None:
            cumulative = [a + b for a, (_, b) in zip(cumulative, old[0], strict=True)]
            out[name] = (
                list(zip(bounds, cumulative, strict=True)),
                old[1] + point.sum,
                old[2] + point.count,
                max(old[3] or 0.0, point.max),
            )
        else:
            out[name] = (
                list(zip(bounds, cumulative, strict=True)),
                point.sum,
                point.count,
                point.max,
            )
    return out


def prometheus_registry(transport: BulkheadTransport | BulkheadHTTPTransport) -> Any:
    from prometheus_client import CollectorRegistry

    from httpx_bulkhead.prometheus import BulkheadCollector

    registry = CollectorRegistry()
    registry.register(BulkheadCollector(transport))
    return registry


def read_prometheus(
    transport: BulkheadTransport | BulkheadHTTPTransport,
    registry: Any = None,
    histograms: Histograms | None = None,
) -> tuple[Samples, dict[str, CompartmentStats]]:
    """The collector's samples but the histograms' (which go to ``histograms``), and
    ``statistics()`` right after."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    if registry is None:
        registry = prometheus_registry(transport)
    # Synchronous, on the event loop's thread: no request moves between the two reads.
    text = generate_latest(registry).decode()
    stats = transport.statistics()
    samples: Samples = {}
    types = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        if family.type == "histogram":
            found = _prometheus_histogram(family.samples, family.name)
            if histograms is not None:
                histograms[family.name] = found
            continue
        for sample in family.samples:
            key = _key(sample.name, **sample.labels)
            assert key not in samples, f"duplicate sample {key}"
            samples[key] = sample.value
    assert types["httpx_bulkhead_acquire_wait_seconds"] == "summary"
    assert types["httpx_bulkhead_rejected"] == "counter"  # the parser strips _total
    assert types["httpx_bulkhead_open_connections"] == "gauge"
    assert types[QUEUE_TIME[1]] == types[DURATION[1]] == "histogram"
    return samples, stats


def _prometheus_histogram(
    samples: Any, family: str
) -> dict[str, tuple[list[tuple[float, int]], float, int, float | None]]:
    buckets: dict[str, list[tuple[float, int]]] = {}
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for sample in samples:
        name = sample.labels["compartment"]
        if sample.name == family + "_bucket":
            buckets.setdefault(name, []).append((float(sample.labels["le"]), int(sample.value)))
        elif sample.name == family + "_sum":
            sums[name] = sample.value
        else:
            assert sample.name == family + "_count"
            counts[name] = int(sample.value)
    assert set(buckets) == set(sums) == set(counts)
    for name, rows in buckets.items():
        assert rows == sorted(rows) and rows[-1] == (math.inf, counts[name])
        assert all(a[1] <= b[1] for a, b in itertools.pairwise(rows))  # cumulative
    return {name: (sorted(buckets[name]), sums[name], counts[name], None) for name in buckets}


def check_histograms(histograms: Histograms, stats: dict[str, CompartmentStats]) -> None:
    """At rest: the queue-time histogram counts the acquires of the wait quantiles (here
    every request that got a slot, and every acquire timeout: no request failed), its sum
    and buckets agree with the quantiles; the connection-duration histogram counts every
    connection closed (by any reason).  A compartment name that is no longer live counts
    towards ``"(evicted)"``."""
    for otel_name, prometheus_name in (QUEUE_TIME, DURATION):
        found = histograms.get(otel_name) or histograms[prometheus_name]
        by_entry: dict[str, tuple[int, float]] = {}
        for name, (_, total, count, _) in found.items():
            entry = name if name in stats else EVICTED
            old = by_entry.get(entry, (0, 0.0))
            by_entry[entry] = (old[0] + count, old[1] + total)
        for name, s in stats.items():
            count, total = by_entry.get(name, (0, 0.0))
            assert s.failed == s.cancelled == s.cancelled_waiting == 0, s
            if (otel_name, prometheus_name) == QUEUE_TIME:
                assert count == s.acquired + s.acquire_timeouts, (name, count, s)
                if name != EVICTED:
                    _agrees_with_quantiles(found[name], s)
            else:
                discarded = sum(getattr(s, field) for field in DISCARDS.values())
                assert count == discarded, (name, count, s)
            assert total >= 0 and (count > 0 or total == 0)


def _agrees_with_quantiles(
    histogram: tuple[list[tuple[float, int]], float, int, float | None], s: CompartmentStats
) -> None:
    """Every wait is in the window (fewer than 1024): the nearest-rank quantiles are
    observations, so each bucket bound splits the ranks where they say."""
    buckets, total, count, largest = histogram
    assert 0 < count <= 1024
    assert s.wait_max <= total <= count * s.wait_max + 1e-9
    if largest is not None:  # OpenTelemetry keeps the maximum
        assert largest == s.wait_max
    for q, value in ((0.5, s.wait_p50), (0.95, s.wait_p95), (0.99, s.wait_p99), (1, s.wait_max)):
        rank = max(1, math.ceil(q * count))
        for bound, cumulative in buckets:
            if bound >= value:
                assert cumulative >= rank, (q, value, bound, cumulative)
            else:
                assert cumulative < rank, (q, value, bound, cumulative)


def figure(transport: BulkheadTransport, compartment: str, field: str) -> object:
    stats = transport.statistics().get(compartment)
    return None if stats is None else getattr(stats, field)


async def reaches(
    transport: BulkheadTransport, compartment: str, field: str, value: int, timeout: float = 30
) -> None:
    """Wait until ``statistics()[compartment].field == value``; on timeout, fail with the
    compartment's snapshot (a shared 2-core machine can starve a TLS server for seconds)."""
    try:
        await until(lambda: figure(transport, compartment, field) == value, timeout)
    except TimeoutError:
        stats = transport.statistics().get(compartment)
        raise AssertionError(f"{compartment} {field} never reached {value}: {stats}") from None


#: Numbers the scenarios' gates: the app keeps a gate (opened) under its name for good.
_SCENARIOS = itertools.count()


async def scenario(
    app: TestApp,
    server: HypercornServer,
    check: Check,
    attach: Callable[[BulkheadTransport], None] = lambda transport: None,
) -> None:
    """Drive every figure; ``attach(transport)`` before the first request, then
    ``check(transport, at_rest)`` at the saturated moment and at rest."""
    tls = default_server_tls()
    gate = app.gate(f"exporters-{next(_SCENARIOS)}")  # (not id(check): ids are reused)
    h1 = f"127.0.0.1:{server.port}"
    with (
        HypercornServer(app, tls=tls, h2_max_concurrent_streams=3) as h2srv,
        HypercornServer(app) as other1,
        HypercornServer(app) as other2,
    ):
        transport = BulkheadTransport(
            default=Policy(max_concurrency=10, max_connections=1),
            hosts={h1: Policy(max_concurrency=2, max_pending=1, acquire_timeout=0.3)},
            http2=True,
            verify=tls.client_ssl_context(),
            max_default_compartments=1,
        )
        attach(transport)
        async with transport, httpx.AsyncClient(transport=transport, timeout=10) as client:
            # A discard: ``Connection: close`` (not_reusable); eviction closes more below.
            await client.get(f"{server.url}/close")

            errors: list[BaseException] = []

            async def call(url: str) -> None:
                try:
                    await client.get(url)
                except (AcquireTimeout, BulkheadFull) as exc:
                    errors.append(exc)

            async with anyio.create_task_group() as tg:
                for _ in range(2):
                    tg.start_soon(call, f"{server.url}/gate/{gate.name}")
                for _ in range(4):  # cap 3: three streams, one waits for a connection
                    tg.start_soon(call, f"{h2srv.url}/gate/{gate.name}")
                await reaches(transport, h2srv.url, "open_streams", 3)
                await reaches(transport, h1, "running", 2)
                await reaches(transport, h2srv.url, "waiting_for_connection", 1)
                tg.start_soon(call, f"{server.url}/")  # waits for a slot...
                await reaches(transport, h1, "waiting", 1)
                with pytest.raises(BulkheadFull):  # ...and the queue (1 place) is full
                    await client.get(f"{server.url}/")
                stats = transport.statistics()
                assert stats[h1].rejected == 1 and stats[h2srv.url].stream_caps == (3,)
                check(transport, False)  # saturated
                await until(lambda: len(errors) == 1)  # the waiter's AcquireTimeout
                gate.open()
            assert [type(e) for e in errors] == [AcquireTimeout]
            # New default origins evict the HTTP/2 compartment (bound 1, now at rest; the
            # first gives it a second chance, CLOCK-style, as it was used since last seen).
            await client.get(f"{other1.url}/")
            await client.get(f"{other2.url}/")
            stats = transport.statistics()
            assert EVICTED in stats and h2srv.url not in stats
            assert stats[EVICTED].connections_created == 1
            await until(lambda: figure(transport, h1, "running") == 0)
            stats = transport.statistics()
            assert stats[h1].acquire_timeouts == 1 and stats[h1].not_reusable == 1
            assert stats[h1].wait_max > 0
            check(transport, True)  # at rest


async def test_prometheus_collector_matches_statistics(
    app: TestApp, server: HypercornServer
) -> None:
    pytest.importorskip("prometheus_client")
    checked: list[int] = []
    registries: list[Any] = []

    def check(transport: BulkheadTransport, at_rest: bool) -> None:
        histograms: Histograms = {}
        samples, stats = read_prometheus(transport, registries[0], histograms)
        assert samples == expected_prometheus(stats)
        if at_rest:
            check_histograms(histograms, stats)
        checked.append(len(samples))

    await scenario(app, server, check, lambda t: registries.append(prometheus_registry(t)))
    assert len(checked) == 2


async def test_opentelemetry_instruments_match_statistics(
    app: TestApp, server: HypercornServer
) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from httpx_bulkhead import otel

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    checked: list[int] = []
    instrumentation: list[otel.Instrumentation] = []

    def check(transport: BulkheadTransport, at_rest: bool) -> None:
        histograms: Histograms = {}
        samples, stats = read_otel(reader, transport, histograms)
        assert samples == expected_otel(stats)
        if at_rest:
            check_histograms(histograms, stats)
        checked.append(len(samples))

    def attach(transport: BulkheadTransport) -> None:
        instrumentation.append(otel.instrument(transport, provider, histograms=True))

    await scenario(app, server, check, attach)
    assert len(checked) == 2
    instrumentation[0].uninstrument()
    after = reader.get_metrics_data()  # uninstrumented: the callbacks report nothing
    observable = {name for name, _ in OTEL_NAMES.values()}
    assert after is None or not any(
        metric.name in observable
        for rm in after.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
    )


async def test_both_exporters_report_http2_streams_against_node() -> None:
    """HTTP/2 figures against nghttp2 (Node.js, h2c): two connections at the peer's cap of
    two streams (a scale-out), one request waiting for a connection."""
    pytest.importorskip("prometheus_client")
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from httpx_bulkhead import otel

    with NodeH2Server(max_concurrent_streams=2) as node:
        transport = BulkheadTransport(
            default=Policy(max_concurrency=10, max_connections=2), http1=False, http2=True
        )
        reader = InMemoryMetricReader()
        provider = MeterProvider(metric_readers=[reader])
        instrumentation = otel.instrument(transport, provider)
        async with transport, httpx.AsyncClient(transport=transport, timeout=10) as client:
            async with anyio.create_task_group() as tg:
                for _ in range(5):
                    tg.start_soon(client.get, f"{node.url}/hold/exporters")
                await node.until_held("exporters", 4)
                await reaches(transport, node.url, "waiting_for_connection", 1)
                stats = transport.statistics()[node.url]
                assert stats.stream_caps == (2, 2) and stats.open_streams == 4
                assert stats.http2_connections == 2 and stats.scale_outs == 1
                samples, at = read_prometheus(transport)
                assert samples == expected_prometheus(at)
                samples, at = read_otel(reader, transport)
                assert samples == expected_otel(at)
                version = ("network.protocol.version", "2")
                assert all(
                    version in attributes
                    for name, attributes in samples
                    if name == "http.client.open_connections"
                )
                node.release("exporters")
        instrumentation.uninstrument()
        provider.shutdown()


def test_both_exporters_read_the_sync_transport(server: HypercornServer) -> None:
    """``BulkheadCollector`` and ``otel.instrument`` take ``BulkheadHTTPTransport`` too,
    and report what its ``statistics()`` says, while threads use it."""
    pytest.importorskip("prometheus_client")
    pytest.importorskip("opentelemetry.sdk")
    import threading

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from httpx_bulkhead import otel

    transport = BulkheadHTTPTransport(default=Policy(max_concurrency=4))
    reader = InMemoryMetricReader()
    instrumentation = otel.instrument(transport, MeterProvider(metric_readers=[reader]))
    with httpx.Client(transport=transport) as client:
        threads = [
            threading.Thread(target=lambda: [client.get(f"{server.url}/") for _ in range(5)])
            for _ in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        samples, stats = read_prometheus(transport)
        assert samples == expected_prometheus(stats)
        assert stats[server.url].completed == 40
        otel_samples, otel_stats = read_otel(reader, transport)
        assert otel_samples == expected_otel(otel_stats)
    instrumentation.uninstrument()
