"""The metrics catalogue: every figure the exporters publish, read from ``statistics()``.

One table, two renderings: ``otel.py`` turns each ``Figure`` into an observable
OpenTelemetry instrument, ``prometheus.py`` into a metric family.  Both read the same
``CompartmentStats`` snapshot, taken when the metrics are collected (pull): nothing here
runs on the request path, and nothing here imports either library.

Theory of operation:

* A figure is a name (one per system), a kind, a unit, a description, and ``read``: a
  function of one compartment's snapshot returning ``(label value, number)`` pairs.  A
  figure without a label returns one pair whose label value is ``None``; a labelled one
  (discards by ``reason``, connections by ``state``) returns one pair per value, always
  the same values, so a series never disappears.
* Counters (``Kind.COUNTER``) only grow: they are the counters of ``CompartmentStats``,
  which count since the transport was made and survive eviction (the ``"(evicted)"``
  entry keeps the sum of evicted compartments' counters).  Gauges and quantiles describe
  the moment; the ``"(evicted)"`` entry has none (an evicted compartment holds nothing,
  and its wait window cannot be merged), so only counters are read from it.
* The fleet figures (``Policy.fleet``) have no series in a compartment without a fleet
  limit; the ``"(evicted)"`` entry has a fleet counter once an evicted compartment counted
  anything there.
* Label cardinality is bounded by the number of compartments: one label value per
  compartment (its name), which the transport bounds (``max_default_compartments``), plus
  ``"(evicted)"``; every other label takes values from a fixed list.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from ._config import parse_route_key
from ._stats import EVICTED, CompartmentStats

__all__ = [
    "CONNECTION_DURATION",
    "DISCARD_REASONS",
    "FIGURES",
    "HISTOGRAMS",
    "QUANTILES",
    "QUEUE_TIME",
    "Figure",
    "Histogram",
    "Kind",
    "protocol_version",
    "server_attributes",
]


class Kind(enum.Enum):
    #: Only grows (since the transport was made).  OTel: observable counter; Prometheus:
    #: counter (``_total``).
    COUNTER = "counter"
    #: A level that goes up and down.  OTel: observable up-down counter; Prometheus: gauge.
    LEVEL = "level"
    #: Quantiles of the acquire wait over the recent window (label ``quantile``).  OTel:
    #: observable gauge; Prometheus: summary (quantiles only).
    QUANTILES = "quantiles"


Values = tuple[tuple[str | None, float], ...]


@dataclass(frozen=True, slots=True)
class Figure:
    """One published figure."""

    #: OpenTelemetry instrument name.
    otel: str
    #: Prometheus metric family name (counters: without ``_total``, which is added).
    prometheus: str
    kind: Kind
    #: UCUM unit (OTel); ``"s"`` figures end in ``_seconds`` in Prometheus.
    unit: str
    description: str
    #: Name of the figure's own label, if any (``reason``, ``state``, ...).
    label: str | None
    read: Callable[[CompartmentStats], Values]
    #: An HTTP semantic-conventions metric: also carries ``server.*``/``url.scheme``.
    semconv: bool = False

    def otel_label(self) -> str | None:
        """The OTel attribute name of ``label``."""
        if self.label is None:
            return None
        if self.label == "state":
            return "http.connection.state"
        return f"httpx_bulkhead.{self.label}"


#: Connections closed, by reason: ``reason`` label value -> ``CompartmentStats`` field, in
#: the order ``statistics()`` lists them.
DISCARD_REASONS = (
    ("idle_expired", "idle_expired"),
    ("lifetime_expired", "lifetime_expired"),
    ("unknown_state", "unknown_state"),
    ("peer_closed", "peer_closed"),
    ("error", "error"),
    ("not_reusable", "not_reusable"),
    ("surplus", "surplus"),
    ("closed", "closed"),
    ("ping_timeout", "ping_timeouts"),
    ("loop_changed", "loop_changed"),
)

#: The acquire-wait quantiles of ``statistics()``: label value -> field.  ``"1"`` is the
#: maximum of the window.
QUANTILES = (("0.5", "wait_p50"), ("0.95", "wait_p95"), ("0.99", "wait_p99"), ("1", "wait_max"))


def _one(field: str) -> Callable[[CompartmentStats], Values]:
    return lambda s: ((None, getattr(s, field)),)


def _discards(s: CompartmentStats) -> Values:
    return tuple((reason, getattr(s, field)) for reason, field in DISCARD_REASONS)


def _wait_quantiles(s: CompartmentStats) -> Values:
    return tuple((q, getattr(s, field)) for q, field in QUANTILES)


def _no_load(s: CompartmentStats) -> Values:
    return () if s.no_load_latency is None else ((None, s.no_load_latency),)


def _pending_limit(s: CompartmentStats) -> Values:
    return () if s.max_pending is None else ((None, s.max_pending),)


def _fleet(field: str) -> Callable[[CompartmentStats], Values]:
    """A fleet figure: nothing without a fleet limit (an evicted entry's counter shows
    once it is not zero)."""

    def read(s: CompartmentStats) -> Values:
        value = getattr(s, field)
        if s.fleet_limit is None and not value:
            return ()
        return ((None, int(value)),)

    return read


def _fleet_leases(s: CompartmentStats) -> Values:
    if s.fleet_limit is None:
        return ()
    return (("fleet", s.fleet_leases_held), ("local", s.fleet_leases_local))


def _fleet_counter(name: str, unit: str, description: str) -> Figure:
    return Figure(
        f"httpx_bulkhead.fleet.{name}",
        f"httpx_bulkhead_fleet_{name}",
        Kind.COUNTER,
        unit,
        description,
        None,
        _fleet(f"fleet_{name}"),
    )


FIGURES: tuple[Figure, ...] = (
    # -- the HTTP semantic conventions' client metrics (as .NET's System.Net.Http has them)
    Figure(
        "http.client.open_connections",
        "httpx_bulkhead_open_connections",
        Kind.LEVEL,
        "{connection}",
        "Number of outbound HTTP connections that are currently active or idle on the client.",
        "state",
        lambda s: (("active", s.in_use_connections), ("idle", s.idle_connections)),
        semconv=True,
    ),
    Figure(
        "http.client.active_requests",
        "httpx_bulkhead_active_requests",
        Kind.LEVEL,
        "{request}",
        "Number of active HTTP requests: holding a bulkhead slot or queued for one.",
        None,
        lambda s: ((None, s.running + s.waiting),),
        semconv=True,
    ),
    # -- the bulkhead's own
    Figure(
        "httpx_bulkhead.requests.running",
        "httpx_bulkhead_running_requests",
        Kind.LEVEL,
        "{request}",
        "Requests holding a slot of the compartment (from acquire to response closed).",
        None,
        _one("running"),
    ),
    Figure(
        "httpx_bulkhead.requests.waiting",
        "httpx_bulkhead_waiting_requests",
        Kind.LEVEL,
        "{request}",
        "Requests queued: for a slot, or holding one and waiting for a connection.",
        "waiting_for",
        lambda s: (("slot", s.waiting), ("connection", s.waiting_for_connection)),
    ),
    Figure(
        "httpx_bulkhead.requests.limit",
        "httpx_bulkhead_concurrency_limit",
        Kind.LEVEL,
        "{request}",
        "The compartment's concurrency limit (slots): max_concurrency, or the adaptive"
        " limit's current value.",
        None,
        _one("limit"),
    ),
    Figure(
        "httpx_bulkhead.adaptive.no_load_latency",
        "httpx_bulkhead_no_load_latency_seconds",
        Kind.LEVEL,
        "s",
        "Adaptive limit: the dependency's estimated no-load latency (request sent to response"
        " head); absent for a static limit or before it is measured.",
        None,
        _no_load,
    ),
    Figure(
        "httpx_bulkhead.requests.pending_limit",
        "httpx_bulkhead_pending_limit",
        Kind.LEVEL,
        "{request}",
        "The compartment's configured max_pending (queue places); absent when unbounded.",
        None,
        _pending_limit,
    ),
    Figure(
        "httpx_bulkhead.acquire.wait",
        "httpx_bulkhead_acquire_wait_seconds",
        Kind.QUANTILES,
        "s",
        "Time waited for a slot and a connection: quantiles over the last 1024 acquire"
        " attempts (quantile 1 is their maximum).",
        "quantile",
        _wait_quantiles,
    ),
    Figure(
        "httpx_bulkhead.requests.rejected",
        "httpx_bulkhead_rejected",
        Kind.COUNTER,
        "{request}",
        "Requests rejected at once with BulkheadFull (the wait queue was full).",
        None,
        _one("rejected"),
    ),
    Figure(
        "httpx_bulkhead.requests.acquire_timeouts",
        "httpx_bulkhead_acquire_timeouts",
        Kind.COUNTER,
        "{request}",
        "Requests that failed with AcquireTimeout (no slot or connection in time).",
        None,
        _one("acquire_timeouts"),
    ),
    Figure(
        "httpx_bulkhead.requests.finished",
        "httpx_bulkhead_requests",
        Kind.COUNTER,
        "{request}",
        "Requests that held a slot, by outcome; cancelled_waiting were cancelled in the queue.",
        "outcome",
        lambda s: (
            ("completed", s.completed),
            ("failed", s.failed),
            ("cancelled", s.cancelled),
            ("cancelled_waiting", s.cancelled_waiting),
        ),
    ),
    Figure(
        "httpx_bulkhead.requests.stale_retries",
        "httpx_bulkhead_stale_retries",
        Kind.COUNTER,
        "{request}",
        "Requests sent again after a reused keep-alive connection turned out closed.",
        None,
        _one("stale_retries"),
    ),
    Figure(
        "httpx_bulkhead.responses.leaked",
        "httpx_bulkhead_leaked_responses",
        Kind.COUNTER,
        "{response}",
        "Responses garbage-collected without being closed (their slot was given back).",
        None,
        _one("leaked_responses"),
    ),
    Figure(
        "httpx_bulkhead.slots.leaked",
        "httpx_bulkhead_slot_leaks",
        Kind.COUNTER,
        "{request}",
        "Slots held longer than the compartment's leak_threshold (each counted once).",
        None,
        _one("slot_leaks"),
    ),
    Figure(
        "httpx_bulkhead.connections.created",
        "httpx_bulkhead_connections_created",
        Kind.COUNTER,
        "{connection}",
        "Connections opened.",
        None,
        _one("connections_created"),
    ),
    Figure(
        "httpx_bulkhead.connections.discarded",
        "httpx_bulkhead_connections_discarded",
        Kind.COUNTER,
        "{connection}",
        "Connections closed, by reason.",
        "reason",
        _discards,
    ),
    Figure(
        "httpx_bulkhead.http2.connections",
        "httpx_bulkhead_http2_connections",
        Kind.LEVEL,
        "{connection}",
        "Open HTTP/2 connections.",
        None,
        _one("http2_connections"),
    ),
    Figure(
        "httpx_bulkhead.http2.streams",
        "httpx_bulkhead_http2_open_streams",
        Kind.LEVEL,
        "{stream}",
        "HTTP/2 streams open (in use) on the compartment's connections.",
        None,
        _one("open_streams"),
    ),
    Figure(
        "httpx_bulkhead.http2.streams.limit",
        "httpx_bulkhead_http2_stream_limit",
        Kind.LEVEL,
        "{stream}",
        "Sum of the HTTP/2 connections' stream caps: streams the open connections can carry.",
        None,
        lambda s: ((None, sum(s.stream_caps)),),
    ),
    Figure(
        "httpx_bulkhead.http2.goaways",
        "httpx_bulkhead_http2_goaways",
        Kind.COUNTER,
        "{goaway}",
        "HTTP/2 GOAWAY frames received.",
        None,
        _one("goaways"),
    ),
    Figure(
        "httpx_bulkhead.http2.streams.reset",
        "httpx_bulkhead_http2_streams_reset",
        Kind.COUNTER,
        "{stream}",
        "HTTP/2 streams reset by us (their request was cancelled or timed out).",
        None,
        _one("streams_reset"),
    ),
    Figure(
        "httpx_bulkhead.http2.replays",
        "httpx_bulkhead_http2_replays",
        Kind.COUNTER,
        "{request}",
        "Requests sent again because HTTP/2 refused them unprocessed (GOAWAY, REFUSED_STREAM).",
        None,
        _one("replays"),
    ),
    # -- the fleet limit (Policy.fleet), as this process sees it
    Figure(
        "httpx_bulkhead.fleet.limit",
        "httpx_bulkhead_fleet_limit",
        Kind.LEVEL,
        "{lease}",
        "The fleet-wide limit (RedisFleetLimit.limit): leases held across the fleet at most.",
        None,
        _fleet("fleet_limit"),
    ),
    Figure(
        "httpx_bulkhead.fleet.leases",
        "httpx_bulkhead_fleet_leases",
        Kind.LEVEL,
        "{lease}",
        "Leases this compartment holds: in Redis (fleet), or running without one there"
        " (local: admitted while Redis was unavailable, or lost).",
        "kind",
        _fleet_leases,
    ),
    Figure(
        "httpx_bulkhead.fleet.waiting",
        "httpx_bulkhead_fleet_waiting_requests",
        Kind.LEVEL,
        "{request}",
        "Requests holding a slot and waiting for a fleet lease.",
        None,
        _fleet("fleet_waiting"),
    ),
    Figure(
        "httpx_bulkhead.fleet.in_use",
        "httpx_bulkhead_fleet_in_use",
        Kind.LEVEL,
        "{lease}",
        "Leases held across the fleet, as Redis last reported.",
        None,
        lambda s: () if s.fleet_in_use is None else ((None, s.fleet_in_use),),
    ),
    Figure(
        "httpx_bulkhead.fleet.unavailable",
        "httpx_bulkhead_fleet_unavailable",
        Kind.LEVEL,
        "1",
        "1 while the fleet limit's Redis is unavailable (on_unavailable applies), else 0.",
        None,
        lambda s: () if s.fleet_unavailable is None else ((None, int(s.fleet_unavailable)),),
    ),
    _fleet_counter("acquired", "{lease}", "Fleet leases granted by Redis."),
    _fleet_counter("round_trips", "{call}", "Redis calls made (acquire, release, renewal)."),
    _fleet_counter(
        "fallbacks", "{request}", "Requests admitted on the local limit alone: Redis unavailable."
    ),
    _fleet_counter("outages", "{outage}", "Times the fleet limit's Redis became unavailable."),
    _fleet_counter(
        "rejected", "{request}", "Requests refused with FleetUnavailable (Redis unavailable)."
    ),
    _fleet_counter("timeouts", "{request}", "Requests that got no fleet lease in time."),
    _fleet_counter("renewals", "{lease}", "Fleet leases renewed."),
    _fleet_counter(
        "lost", "{lease}", "Fleet leases found gone at renewal (their requests went on)."
    ),
)


@dataclass(frozen=True, slots=True)
class Histogram:
    """A per-event figure (fed by ``_events.py``, not read from ``statistics()``)."""

    #: OpenTelemetry instrument name.
    otel: str
    #: Prometheus histogram family name (``_bucket``, ``_sum``, ``_count``).
    prometheus: str
    unit: str
    description: str
    #: Upper bounds of the buckets (``le``), ascending; ``+Inf`` is implied.
    buckets: tuple[float, ...]


#: The time a request waited for a slot and a connection, recorded for every acquire that
#: got a response or timed out (the acquires of the ``wait_*`` quantiles), 0.0 included:
#: the ``0`` bucket counts the acquires that did not wait.
QUEUE_TIME = Histogram(
    "http.client.request.time_in_queue",
    "httpx_bulkhead_request_time_in_queue_seconds",
    "s",
    "Time a request waited for a bulkhead slot and a connection (0 when none was needed).",
    (0.0, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
#: How long each connection was open, recorded when it closes (.NET's buckets).
CONNECTION_DURATION = Histogram(
    "http.client.connection.duration",
    "httpx_bulkhead_connection_duration_seconds",
    "s",
    "The duration of successfully established outbound HTTP connections.",
    (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
)
HISTOGRAMS = (QUEUE_TIME, CONNECTION_DURATION)


def server_attributes(name: str) -> dict[str, str | int]:
    """``server.address``, ``server.port`` and ``url.scheme`` of a compartment, as far as its
    name (a route key, or ``scheme://host:port`` for an unlisted origin) tells them.

    A key naming only a host (``"api.example.com"``, any scheme and port) gives
    ``server.address`` alone; ``"host:port"`` adds ``server.port``; a scheme adds
    ``url.scheme``.  A path prefix changes nothing (the compartment attribute tells it
    apart).  ``"(evicted)"`` gives nothing: it stands for many origins.
    """
    if name == EVICTED:
        return {}
    try:
        key = parse_route_key(name)
    except ValueError:  # pragma: no cover - every compartment name is a valid key
        return {}
    attributes: dict[str, str | int] = {"server.address": key.host}
    if key.port is not None:
        attributes["server.port"] = key.port
    if key.scheme is not None:
        attributes["url.scheme"] = key.scheme
    return attributes


def protocol_version(s: CompartmentStats) -> str | None:
    """``network.protocol.version`` of every connection of the compartment, when one
    version holds for all: ``"2"`` when all are HTTP/2, ``"1.1"`` when none is; ``None``
    for a mix or no connection (a snapshot counts HTTP/2 connections, not which of them
    are idle)."""
    if s.connections == 0:
        return None
    if s.http2_connections == s.connections:
        return "2"
    if s.http2_connections == 0:
        return "1.1"
    return None
