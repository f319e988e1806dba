"""Prometheus: a collector that exposes the bulkheads' statistics at scrape time.

Needs ``pip install 'httpx-bulkhead[prometheus]'`` (``prometheus_client``)::

    from prometheus_client import REGISTRY
    from httpx_bulkhead.prometheus import BulkheadCollector

    REGISTRY.register(BulkheadCollector(transport))

Each scrape takes one ``transport.statistics()`` snapshot; nothing runs per request.  The
figures are those of the OpenTelemetry exporter (``_metrics.FIGURES``), named in
Prometheus's conventions: ``httpx_bulkhead_`` prefix, snake_case, counters ending in
``_total``, times in seconds (``_seconds``).  Every sample has a ``compartment`` label
(bounded: the transport bounds its compartments and folds evicted ones into
``"(evicted)"``, which has counters only); discards have ``reason``, connections
``state``, waiting requests ``waiting_for``, finished requests ``outcome``.

The acquire wait (slot and connection) is ``httpx_bulkhead_acquire_wait_seconds``, a
*summary of quantiles only*: ``quantile="0.5"``, ``"0.95"``, ``"0.99"`` (and ``"1"``, the
maximum) over the last 1024 acquire attempts of the compartment, exactly the
``wait_p50``/``wait_p95``/``wait_p99``/``wait_max`` of ``statistics()``.  It has no
``_sum``/``_count``: the transport keeps the recent window, not totals, so rates of the
wait cannot be computed from it (alert on the quantiles themselves).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from ._metrics import FIGURES, Figure, Kind
from ._stats import EVICTED, CompartmentStats
from ._sync_transport import BulkheadHTTPTransport
from ._transport import BulkheadTransport

__all__ = ["BulkheadCollector"]


class BulkheadCollector(Collector):
    """A ``prometheus_client`` collector for one ``BulkheadTransport`` (or
    ``BulkheadHTTPTransport``).

    One collector per registry: its metric names are fixed, so a registry refuses a
    second one (``ValueError``).  The collector holds the transport until it is
    unregistered (``registry.unregister(collector)``).

    Args:
        transport: the transport whose compartments are exposed.

    Raises:
        TypeError: ``transport`` is not a ``BulkheadTransport``.
    """

    def __init__(self, transport: BulkheadTransport | BulkheadHTTPTransport) -> None:
        if not isinstance(transport, BulkheadTransport | BulkheadHTTPTransport):
            raise TypeError(
                f"transport must be a BulkheadTransport, got {type(transport).__name__}"
            )
        self._transport = transport

    def describe(self) -> Iterator[Metric]:
        """The families without samples: a registry checks names without a snapshot."""
        for figure in FIGURES:
            yield self._family(figure)

    def collect(self) -> Iterator[Metric]:
        """Every family, from one ``statistics()`` snapshot."""
        snapshot = self._transport.statistics()
        for figure in FIGURES:
            family = self._family(figure)
            for name, stats in snapshot.items():
                if name == EVICTED and figure.kind is not Kind.COUNTER:
                    continue  # the evicted entry holds no gauges
                self._add(family, figure, name, stats)
            yield family

    def _family(self, figure: Figure) -> Metric:
        names = ["compartment"]
        if figure.kind is Kind.COUNTER:
            if figure.label is not None:
                names.append(figure.label)
            return CounterMetricFamily(figure.prometheus, figure.description, labels=names)
        if figure.kind is Kind.QUANTILES:
            return SummaryMetricFamily(figure.prometheus, figure.description, labels=names)
        if figure.label is not None:
            names.append(figure.label)
        return GaugeMetricFamily(figure.prometheus, figure.description, labels=names)

    def _add(self, family: Metric, figure: Figure, name: str, stats: CompartmentStats) -> None:
        base = {"compartment": name}
        for label, value in figure.read(stats):
            if figure.kind is Kind.QUANTILES:
                # quantiles only: SummaryMetricFamily.add_metric insists on count and sum
                family.add_sample(figure.prometheus, {**base, "quantile": str(label)}, value)
            elif figure.kind is Kind.COUNTER:
                labels = base if label is None else {**base, str(figure.label): label}
                family.add_sample(figure.prometheus + "_total", labels, value)
            else:
                labels = base if label is None else {**base, str(figure.label): label}
                family.add_sample(figure.prometheus, labels, value)
