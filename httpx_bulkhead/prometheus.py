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

The acquire wait (slot and connection) is exposed twice:

* ``httpx_bulkhead_acquire_wait_seconds``, a *summary of quantiles only*:
  ``quantile="0.5"``, ``"0.95"``, ``"0.99"`` (and ``"1"``, the maximum) over the last 1024
  acquire attempts of the compartment, exactly the ``wait_p50``/``wait_p95``/
  ``wait_p99``/``wait_max`` of ``statistics()``;
* ``httpx_bulkhead_request_time_in_queue_seconds``, a *histogram* (``_bucket``, ``_sum``,
  ``_count``) of every acquire since the collector was made (``histograms=True``, the
  default), recorded per event (``_events.py``): the same acquires as the quantiles (those
  that got a response or timed out, 0 included: ``le="0"`` counts those that did not
  wait), for ``histogram_quantile()`` and rates.

``httpx_bulkhead_connection_duration_seconds`` is the histogram of how long connections
were open, recorded as they close.  Histograms of evicted compartments fold into
``compartment="(evicted)"``, as their counters do, so the series stay bounded.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ._metrics import CONNECTION_DURATION, FIGURES, HISTOGRAMS, QUEUE_TIME, Figure, Histogram, Kind
from ._stats import EVICTED, CompartmentStats
from ._sync_transport import BulkheadHTTPTransport
from ._transport import BulkheadTransport

__all__ = ["BulkheadCollector"]


class BulkheadCollector(Collector):
    """A ``prometheus_client`` collector for one ``BulkheadTransport`` (or
    ``BulkheadHTTPTransport``).

    One collector per registry: its metric names are fixed, so a registry refuses a
    second one (``ValueError``).  The collector holds the transport until it is
    unregistered (``registry.unregister(collector)``); with ``histograms``, the transport
    feeds the collector's histograms until ``close()``.

    Args:
        transport: the transport whose compartments are exposed.
        histograms: also record the queue-time and connection-duration histograms per
            event (default ``True``; ``False``: nothing on the request path).

    Raises:
        TypeError: ``transport`` is not a ``BulkheadTransport``.
    """

    def __init__(
        self, transport: BulkheadTransport | BulkheadHTTPTransport, *, histograms: bool = True
    ) -> None:
        if not isinstance(transport, BulkheadTransport | BulkheadHTTPTransport):
            raise TypeError(
                f"transport must be a BulkheadTransport, got {type(transport).__name__}"
            )
        self._transport = transport
        self._histograms: _Histograms | None = None
        if histograms:
            self._histograms = _Histograms()
            transport._listen(self._histograms)

    def close(self) -> None:
        """Stop recording the histograms (call after ``registry.unregister``); idempotent."""
        if self._histograms is not None:
            self._transport._listen(self._histograms, on=False)

    def describe(self) -> Iterator[Metric]:
        """The families without samples: a registry checks names without a snapshot."""
        for figure in FIGURES:
            yield self._family(figure)
        if self._histograms is not None:
            for histogram in HISTOGRAMS:
                yield HistogramMetricFamily(
                    histogram.prometheus, histogram.description, labels=["compartment"]
                )

    def collect(self) -> Iterator[Metric]:
        """Every family, from one ``statistics()`` snapshot (and the histograms)."""
        snapshot = self._transport.statistics()
        for figure in FIGURES:
            family = self._family(figure)
            for name, stats in snapshot.items():
                if name == EVICTED and figure.kind is not Kind.COUNTER:
                    continue  # the evicted entry holds no gauges
                self._add(family, figure, name, stats)
            yield family
        if self._histograms is not None:
            yield from self._histograms.families()

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


class _Series:
    """One histogram's buckets (not cumulative; the last is ``+Inf``) and sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def merge(self, other: _Series) -> None:
        for i, count in enumerate(other.counts):
            self.counts[i] += count
        self.sum += other.sum


class _Recorder:
    """One compartment's two histograms (an ``_events.Recorder``).  ``queue`` and
    ``duration`` point at the ``"(evicted)"`` series once the compartment is evicted."""

    __slots__ = ("_lock", "duration", "queue")

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self.queue = _Series(QUEUE_TIME.buckets)
        self.duration = _Series(CONNECTION_DURATION.buckets)

    def queue_time(self, seconds: float, protocol: str | None) -> None:
        series = self.queue
        i = bisect.bisect_left(series.bounds, seconds)  # the first bound >= seconds (le)
        with self._lock:  # a scrape from another thread sees whole observations
            series.counts[i] += 1
            series.sum += seconds

    def connection_closed(self, seconds: float, protocol: str, reason: str) -> None:
        series = self.duration
        i = bisect.bisect_left(series.bounds, seconds)
        with self._lock:
            series.counts[i] += 1
            series.sum += seconds


class _Histograms:
    """Every compartment's histograms (an ``_events.Listener``): live compartments by
    name, and the ``"(evicted)"`` sums."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[str, _Recorder] = {}
        self._evicted = _Recorder(self._lock)
        self._any_evicted = False

    def recorder(self, compartment: str) -> _Recorder:
        recorder = _Recorder(self._lock)
        with self._lock:
            old = self._live.get(compartment)
            if old is not None:  # (a compartment of that name made again: keep its sums)
                recorder.queue.merge(old.queue)
                recorder.duration.merge(old.duration)
            self._live[compartment] = recorder
        return recorder

    def retire(self, compartment: str) -> None:
        with self._lock:
            recorder = self._live.pop(compartment, None)
            if recorder is None:
                return
            evicted = self._evicted
            evicted.queue.merge(recorder.queue)
            evicted.duration.merge(recorder.duration)
            recorder.queue, recorder.duration = evicted.queue, evicted.duration
            self._any_evicted = True

    def families(self) -> Iterator[Metric]:
        with self._lock:  # a copy of every series, taken at once
            rows = [(name, r.queue, r.duration) for name, r in self._live.items()]
            if self._any_evicted:
                rows.append((EVICTED, self._evicted.queue, self._evicted.duration))
            copied = [
                (name, (list(q.counts), q.sum), (list(d.counts), d.sum)) for name, q, d in rows
            ]
        for index, spec in enumerate(HISTOGRAMS):
            family = HistogramMetricFamily(
                spec.prometheus, spec.description, labels=["compartment"]
            )
            for name, *series in copied:
                counts, total = series[index]
                family.add_metric([name], _cumulative(spec, counts), total)
            yield family


def _cumulative(spec: Histogram, counts: list[int]) -> list[tuple[str, float]]:
    buckets: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip((*map(floatToGoString, spec.buckets), "+Inf"), counts, strict=True):
        running += count
        buckets.append((bound, running))
    return buckets
