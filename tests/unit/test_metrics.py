"""The metrics catalogue's pure parts: what a compartment's name tells of its server, and
which protocol version its connections speak."""

from __future__ import annotations

import dataclasses

import pytest

from httpx_bulkhead import CompartmentStats
from httpx_bulkhead._metrics import FIGURES, protocol_version, server_attributes


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("api.example.com", {"server.address": "api.example.com"}),
        ("api.example.com:8443", {"server.address": "api.example.com", "server.port": 8443}),
        (
            "https://api.example.com/v1/generate",
            {"server.address": "api.example.com", "server.port": 443, "url.scheme": "https"},
        ),
        (
            "http://[::1]:8080",
            {"server.address": "::1", "server.port": 8080, "url.scheme": "http"},
        ),
        ("(evicted)", {}),
    ],
)
def test_server_attributes_say_what_the_key_names(name: str, expected: dict[str, object]) -> None:
    assert server_attributes(name) == expected


def _stats(**fields: int) -> CompartmentStats:
    zero: dict[str, object] = {f.name: 0 for f in dataclasses.fields(CompartmentStats)}
    zero.update(name="c", max_pending=None, stream_caps=(), **fields)
    return CompartmentStats(**zero)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("connections", "http2", "expected"),
    [(0, 0, None), (3, 0, "1.1"), (3, 3, "2"), (3, 1, None)],
)
def test_protocol_version_only_when_one_holds_for_all(
    connections: int, http2: int, expected: str | None
) -> None:
    assert protocol_version(_stats(connections=connections, http2_connections=http2)) == expected


def test_names_follow_each_systems_conventions() -> None:
    otel = [f.otel for f in FIGURES]
    prometheus = [f.prometheus for f in FIGURES]
    assert len(set(otel)) == len(otel) and len(set(prometheus)) == len(prometheus)
    for figure in FIGURES:
        assert figure.prometheus.startswith("httpx_bulkhead_") and figure.prometheus.islower()
        assert not figure.prometheus.endswith("_total")  # added to counters when exposed
        assert figure.prometheus.endswith("_seconds") == (figure.unit == "s")
        assert figure.otel.startswith(("http.client.", "httpx_bulkhead."))
        assert figure.description.endswith(".")


def test_otel_instrument_lifecycle_on_one_meter_provider() -> None:
    """Instruments cannot be removed from a meter: uninstrument silences them, instrumenting
    again reuses them, and a second transport on the same provider is refused."""
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from httpx_bulkhead import BulkheadTransport, Policy, otel

    def points(reader: InMemoryMetricReader) -> int:
        data = reader.get_metrics_data()
        if data is None:
            return 0
        return sum(
            len(m.data.data_points)
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
        )

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    transport = BulkheadTransport(hosts={"api.example.com": Policy()})
    first = otel.instrument(transport, provider)
    assert points(reader) > 0
    with pytest.raises(ValueError, match="another BulkheadTransport"):
        otel.instrument(BulkheadTransport(), provider)
    first.uninstrument()
    first.uninstrument()  # idempotent
    assert points(reader) == 0
    again = otel.instrument(transport, provider)
    assert again.instruments == first.instruments and points(reader) > 0
    again.uninstrument()
    other = otel.instrument(BulkheadTransport(hosts={"b.example.com": Policy()}), provider)
    assert points(reader) > 0
    other.uninstrument()
    provider.shutdown()
    with pytest.raises(TypeError, match="BulkheadTransport"):
        otel.instrument(object(), provider)  # type: ignore[arg-type]
