"""Statistics: a bounded window of acquire waits and the frozen per-compartment snapshot."""

from __future__ import annotations

import dataclasses
import enum
import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing import TypeAlias

    from ._connections import Connections as AsyncConnections
    from ._fleet_config import FleetStats
    from ._slots import Slots as AsyncSlots
    from ._sync._connections import Connections as SyncConnections
    from ._sync._slots import Slots as SyncSlots

    Connections: TypeAlias = AsyncConnections | SyncConnections  # (the sync shell, generated)
    Slots: TypeAlias = AsyncSlots | SyncSlots

__all__ = [
    "CANCELLED",
    "COMPLETED",
    "EVICTED",
    "FAILED",
    "CompartmentStats",
    "ExchangeInfo",
    "Outcome",
    "WaitWindow",
    "compartment_stats",
    "fleet_fields",
    "fold_evicted",
    "quantile",
]

#: Name of the ``statistics()`` entry that keeps the counters of evicted compartments.
EVICTED = "(evicted)"


class Outcome(enum.IntEnum):
    """How an exchange that held a slot ended: its counter (``completed``, ``failed``,
    ``cancelled``).  An ``IntEnum`` so it indexes the counters directly."""

    COMPLETED = 0
    FAILED = 1
    CANCELLED = 2


# Reaching an Enum member as a class attribute costs about 0.2 µs on Python 3.11: the hot
# path uses these module-level aliases.
COMPLETED, FAILED, CANCELLED = Outcome.COMPLETED, Outcome.FAILED, Outcome.CANCELLED

#: Acquire waits remembered for the quantiles (the most recent ones).
WAIT_WINDOW = 1024


def quantile(ordered: list[float], q: float) -> float:
    """Nearest-rank quantile of an ascending list; 0.0 when it is empty."""
    if not ordered:
        return 0.0
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


class WaitWindow:
    """The last ``size`` acquire waits, in seconds.  O(1) to record; sorted only when a
    snapshot is taken."""

    __slots__ = ("_waits",)

    def __init__(self, size: int = WAIT_WINDOW) -> None:
        self._waits: deque[float] = deque(maxlen=size)

    def record(self, seconds: float) -> None:
        self._waits.append(seconds)

    def summary(self) -> tuple[float, float, float, float]:
        """``(p50, p95, p99, max)`` of the window."""
        ordered = sorted(self._waits)
        if not ordered:
            return (0.0, 0.0, 0.0, 0.0)
        return (
            quantile(ordered, 0.5),
            quantile(ordered, 0.95),
            quantile(ordered, 0.99),
            ordered[-1],
        )


@dataclass(frozen=True, slots=True)
class CompartmentStats:
    """A snapshot of one compartment, built when ``statistics()`` is called.

    Gauges describe the moment of the call; counters count since the transport was made
    (or, for ``"(evicted)"``, summed over evicted compartments).  Times are in seconds.
    ``str()`` gives a short grouped summary (zeros left out), ``as_dict()`` every field
    grouped the same way.  This is monitoring information: read it, do not drive control
    flow from it.

    How the request counters add up (each request is counted once among them):

    - a request that found a free slot or waited and got one: ``acquired``; when it
      ends, exactly one of ``completed``, ``failed`` or ``cancelled``, so
      ``acquired == running + completed + failed + cancelled``;
    - one that found the queue full: ``rejected`` (``BulkheadFull``, it never waited);
    - one that waited for a slot and gave up: ``acquire_timeouts`` (``AcquireTimeout``)
      or ``cancelled_waiting`` (its task was cancelled), never both;
    - one that held a slot and timed out waiting for a *connection*
      (``max_connections`` reached): ``acquire_timeouts`` and ``failed``, since it had
      been ``acquired``.
    """

    #: The compartment's name: its ``hosts`` key, its group's name, or
    #: ``scheme://host:port`` for an unlisted origin.
    name: str
    #: Requests holding a slot (from acquire to response closed); ``<= limit``.
    running: int
    #: Requests queued for a slot.
    waiting: int
    #: Slots: ``Policy.max_concurrency``, or an ``AdaptiveLimit``'s current limit.
    limit: int
    #: ``Policy.max_pending``: places in the queue (``None``: unbounded).
    max_pending: int | None
    #: Open (or being opened) connections, idle and in use.
    connections: int
    #: Open connections serving no request, kept for reuse.
    idle_connections: int
    #: Open connections serving at least one request (HTTP/2: at least one stream).
    in_use_connections: int
    #: Requests holding a slot but waiting for a connection (``max_connections`` reached).
    waiting_for_connection: int
    #: Slots handed out: at once, or after a wait.
    acquired: int
    #: Slots returned after a response was read to its end (whatever its status code).
    completed: int
    #: Slots returned after an error (network, protocol, timeout) or a response closed
    #: before its end.
    failed: int
    #: Slots returned because the request's task was cancelled.
    cancelled: int
    #: Requests refused at once with ``BulkheadFull``: the queue was full.
    rejected: int
    #: ``AcquireTimeout``s: no slot, or no connection, within the acquire timeout.
    acquire_timeouts: int
    #: Requests whose task was cancelled while queued for a slot.
    cancelled_waiting: int
    #: Connections opened (TCP, and TLS for https).
    connections_created: int
    #: Requests sent again because a kept-alive connection turned out closed by the
    #: server before any byte of the response (idempotent or unsent requests only).
    stale_retries: int
    #: Responses garbage-collected without being closed (a ResourceWarning is issued and
    #: their slot returned): a bug in the caller, which would otherwise exhaust the pool.
    leaked_responses: int
    #: Slots held longer than ``Policy.leak_threshold`` (each reported once, with a
    #: WARNING naming where it was acquired); always 0 without a threshold.
    slot_leaks: int
    #: Discarded connections, by reason.  Idle past ``idle_timeout`` (or the server's
    #: ``Keep-Alive: timeout``, less a margin).
    idle_expired: int
    #: Past ``max_lifetime`` (jittered): closed when it next became idle.
    lifetime_expired: int
    #: An exchange on it was cut (timeout, cancellation, response closed early): what the
    #: server will send next is unknown, so it is closed, never pooled.
    unknown_state: int
    #: The server closed it: seen while idle, or on reuse before any response byte.
    peer_closed: int
    #: A network or protocol error on it.
    error: int
    #: The protocol said not to reuse it (``Connection: close``, HTTP/1.0, GOAWAY).
    not_reusable: int
    #: Idle beyond ``max_idle_connections``, or evicted to make room for a connection to
    #: another origin when ``max_connections`` was reached.
    surplus: int
    #: Closed by ``aclose()``, or when the compartment was evicted.
    closed: int
    #: HTTP/2: a health-check PING (``ping_after``) was not answered within ``ping_timeout``.
    ping_timeouts: int
    #: Opened on an event loop the transport no longer runs on: closed when a request came
    #: from another loop (``asyncio.run`` twice, pytest's per-test loops, ``trio.run`` twice).
    loop_changed: int
    #: Open HTTP/2 connections, and the streams open on them.
    http2_connections: int
    open_streams: int
    #: Each HTTP/2 connection's current stream cap (ascending).
    stream_caps: tuple[int, ...]
    #: GOAWAY frames received.
    goaways: int
    #: Streams we reset (RST_STREAM) because their request was cancelled or timed out.
    streams_reset: int
    #: Requests sent again because HTTP/2 refused them unprocessed (GOAWAY, REFUSED_STREAM).
    replays: int
    #: New connections opened because every HTTP/2 connection was at its stream cap...
    scale_outs: int
    #: ...and requests that waited, then were served by an open connection's free capacity
    #: (HTTP/2: a stream; HTTP/1.1: a connection another request released).
    stream_waits: int
    #: Acquire wait (slot and connection) quantiles over the last ``WAIT_WINDOW`` (1024)
    #: attempts, including those that ended in ``AcquireTimeout`` (rejections by
    #: ``BulkheadFull`` do not wait).
    wait_p50: float
    wait_p95: float
    wait_p99: float
    wait_max: float
    #: Open connections that go through a proxy (tunnels, and connections to a proxy
    #: that forwards plain-HTTP requests); included in ``connections``.
    proxied_connections: int = 0
    #: The fleet limit (``Policy.fleet``), as this compartment sees it; ``None`` (and 0 for
    #: the counts) without one.  ``RedisFleetLimit.limit``: leases held fleet-wide at most.
    fleet_limit: int | None = None
    #: Leases this compartment holds in Redis now.
    fleet_leases_held: int = 0
    #: Requests running without a lease in Redis (admitted on the local limit while Redis
    #: was unavailable, or whose lease was lost); registered again once Redis answers.
    fleet_leases_local: int = 0
    #: Requests holding a slot and waiting for a lease.
    fleet_waiting: int = 0
    #: Leases held across the fleet, as Redis last reported (``None`` before it did).
    fleet_in_use: int | None = None
    #: Whether Redis failed the last time it was asked (then ``on_unavailable`` applies).
    fleet_unavailable: bool | None = None
    #: Leases granted by Redis.
    fleet_acquired: int = 0
    #: Redis calls made (acquire, release, renewal), answered or not.
    fleet_round_trips: int = 0
    #: Requests admitted on the local limit alone: Redis unavailable, ``"local"``.
    fleet_fallbacks: int = 0
    #: Times Redis went from available to unavailable.
    fleet_outages: int = 0
    #: Requests refused with ``FleetUnavailable`` (Redis unavailable, ``"reject"``).
    fleet_rejected: int = 0
    #: Requests that got no lease in time (counted in ``acquire_timeouts`` too).
    fleet_timeouts: int = 0
    #: Leases renewed (each lease of a renewal round once).
    fleet_renewals: int = 0
    #: Leases found gone at renewal (expired, or Redis lost its data): their requests
    #: went on, counted in ``fleet_leases_local`` until registered again.
    fleet_lost: int = 0
    #: Adaptive limit (``AdaptiveLimit``) only: the no-load latency the gradient algorithm
    #: measured (seconds from request sent to response head; ``None``: static limit, AIMD,
    #: or not measured yet).
    no_load_latency: float | None = None
    #: Adaptive limit only: ``(time, limit)`` at each change of the limit, oldest first, the
    #: last 256; ``time`` is the compartment's clock (``time.monotonic()``).  A headroom
    #: test's one-slot opening is not a change here (``limit`` shows it while it lasts).
    limit_history: tuple[tuple[float, int], ...] = ()

    def as_dict(self) -> dict[str, object]:
        """Every field, grouped as ``str()`` shows them, for logs and JSON::

            {"name": ..., "slots": {"running", "waiting", "limit", "max_pending",
                                    "no_load_latency", "limit_history" (a list of pairs)},
             "connections": {"open", "idle", "in_use", "waiting", "created", "proxied"},
             "requests": {"acquired", "completed", "failed", "cancelled", "rejected",
                          "acquire_timeouts", "cancelled_waiting", "stale_retries",
                          "leaked_responses", "slot_leaks"},
             "discards": {reason: count, ...},
             "http2": {"connections", "open_streams", "stream_caps" (a list), "goaways",
                       "streams_reset", "replays", "scale_outs", "stream_waits"},
             "wait": {"p50", "p95", "p99", "max"},
             "fleet": {"limit", "leases_held", "leases_local", "waiting", "in_use",
                       "unavailable", "acquired", "round_trips", "fallbacks", "outages",
                       "rejected", "timeouts", "renewals", "lost"}}

        The flat fields stay the attributes (``stats.running``).
        """
        out: dict[str, object] = {"name": self.name}
        for group, fields in GROUPS:
            out[group] = {
                label: _plain(value)
                for label, value in ((label, getattr(self, field)) for label, field in fields)
            }
        return out

    def __str__(self) -> str:
        limit = "" if self.max_pending is None else f" (max_pending {self.max_pending})"
        adaptive = ""
        if self.limit_history:
            adaptive = " (adaptive"
            if self.no_load_latency is not None:
                adaptive += f", no-load latency {self.no_load_latency * 1000:.1f} ms"
            adaptive += ")"
        lines = [
            f"{self.name}: {self.running}/{self.limit} running{adaptive},"
            f" {self.waiting} waiting{limit}"
        ]
        for group, fields in GROUPS[1:]:
            parts = [
                _part(label, getattr(self, field))
                for label, field in fields
                if getattr(self, field)
            ]
            if parts:
                lines.append(f"  {group}: " + ", ".join(parts))
        return "\n".join(lines)


def _plain(value: object) -> object:
    """``value`` with tuples as lists, at any depth (JSON's shape)."""
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value


def _part(label: str, value: object) -> str:
    label = label.replace("_", " ")
    if isinstance(value, tuple):
        return f"{label} {','.join(map(str, value))}"
    if isinstance(value, float):  # the wait quantiles, the only times
        return f"{label} {value * 1000:.1f} ms"
    return f"{label} {value}"


#: The groups of ``as_dict()`` and ``str()``: (group, ((label, field), ...)).  Every field
#: but ``name`` is in exactly one.
GROUPS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    (
        "slots",
        (
            ("running", "running"),
            ("waiting", "waiting"),
            ("limit", "limit"),
            ("max_pending", "max_pending"),
            ("no_load_latency", "no_load_latency"),
            ("limit_history", "limit_history"),
        ),
    ),
    (
        "connections",
        (
            ("open", "connections"),
            ("idle", "idle_connections"),
            ("in_use", "in_use_connections"),
            ("waiting", "waiting_for_connection"),
            ("created", "connections_created"),
            ("proxied", "proxied_connections"),
        ),
    ),
    (
        "requests",
        (
            ("acquired", "acquired"),
            ("completed", "completed"),
            ("failed", "failed"),
            ("cancelled", "cancelled"),
            ("rejected", "rejected"),
            ("acquire_timeouts", "acquire_timeouts"),
            ("cancelled_waiting", "cancelled_waiting"),
            ("stale_retries", "stale_retries"),
            ("leaked_responses", "leaked_responses"),
            ("slot_leaks", "slot_leaks"),
        ),
    ),
    (
        "discards",
        tuple(
            (reason, reason)
            for reason in (
                "idle_expired",
                "lifetime_expired",
                "unknown_state",
                "peer_closed",
                "error",
                "not_reusable",
                "surplus",
                "closed",
                "ping_timeouts",
                "loop_changed",
            )
        ),
    ),
    (
        "http2",
        (
            ("connections", "http2_connections"),
            ("open_streams", "open_streams"),
            ("stream_caps", "stream_caps"),
            ("goaways", "goaways"),
            ("streams_reset", "streams_reset"),
            ("replays", "replays"),
            ("scale_outs", "scale_outs"),
            ("stream_waits", "stream_waits"),
        ),
    ),
    ("wait", (("p50", "wait_p50"), ("p95", "wait_p95"), ("p99", "wait_p99"), ("max", "wait_max"))),
    (
        "fleet",
        tuple(
            (field.removeprefix("fleet_"), field)
            for field in (
                "fleet_limit",
                "fleet_leases_held",
                "fleet_leases_local",
                "fleet_waiting",
                "fleet_in_use",
                "fleet_unavailable",
                "fleet_acquired",
                "fleet_round_trips",
                "fleet_fallbacks",
                "fleet_outages",
                "fleet_rejected",
                "fleet_timeouts",
                "fleet_renewals",
                "fleet_lost",
            )
        ),
    ),
)


@dataclass(frozen=True, slots=True)
class ExchangeInfo:
    """What ``response.extensions["bulkhead"]`` holds for one request."""

    #: Name of the compartment that served the request.
    compartment: str
    #: Seconds spent waiting for a slot and a connection (0.0 when none was needed);
    #: separate from the request's own latency.
    queue_wait: float
    #: Whether the connection had served an earlier request.
    reused: bool
    #: Whether the request was sent again after a stale keep-alive connection failed it.
    retried: bool
    #: A number identifying the connection within this process (for logs).
    connection_id: int
    #: The proxy the request went through (its URL, never with credentials), or ``None``.
    proxy: str | None = None


def compartment_stats(
    name: str, slots: Slots, connections: Connections, **counters: Any
) -> CompartmentStats:
    """The snapshot of one compartment, from its slots, its connections and the
    ``counters`` the compartment keeps itself (``stale_retries``, ``replays``,
    ``leaked_responses``, ``slot_leaks``)."""
    counters.setdefault("slot_leaks", 0)  # (a compartment without leak detection)
    return CompartmentStats(
        name=name,
        **_slot_fields(slots),
        **_connection_fields(connections),
        **_http2_fields(connections),
        acquire_timeouts=slots.timeouts + connections.timeouts,
        **counters,
    )


def _slot_fields(slots: Slots) -> dict[str, Any]:
    limiter, outcomes = slots.limiter, slots.outcomes
    p50, p95, p99, worst = slots.waits.summary()
    return {
        "running": limiter.running,
        "waiting": limiter.waiting,
        "limit": limiter.limit,
        "max_pending": limiter.max_pending,
        "acquired": limiter.acquired,
        "completed": outcomes[Outcome.COMPLETED],
        "failed": outcomes[Outcome.FAILED],
        "cancelled": outcomes[Outcome.CANCELLED],
        "rejected": limiter.rejected,
        "cancelled_waiting": limiter.cancelled_waiting,
        "wait_p50": p50,
        "wait_p95": p95,
        "wait_p99": p99,
        "wait_max": worst,
    }


def _connection_fields(connections: Connections) -> dict[str, Any]:
    pool = connections.pool
    fields: dict[str, Any] = {
        "connections": pool.total,
        "idle_connections": pool.idle,
        "in_use_connections": pool.total - pool.idle,
        "waiting_for_connection": pool.waiting,
        "connections_created": pool.created,
        "proxied_connections": connections.proxied(),
        "scale_outs": pool.scale_outs,
        "stream_waits": pool.stream_waits,
    }
    # One counter per discard reason, named by the reason (``ping_timeout`` is plural).
    for reason, count in pool.discards.items():
        fields["ping_timeouts" if reason.value == "ping_timeout" else reason.value] = count
    return fields


def _http2_fields(connections: Connections) -> dict[str, Any]:
    h2 = connections.http2()
    return {
        "http2_connections": len(h2),
        "open_streams": sum(c.open_streams for c in h2),
        "stream_caps": tuple(sorted(c.cap for c in h2)),
        "goaways": connections.goaways,
        "streams_reset": connections.streams_reset,
    }


def fleet_fields(fleet: FleetStats | None) -> dict[str, Any]:
    """The ``fleet_*`` fields from the compartment's ``FleetLimiter`` snapshot; none (the
    defaults: ``None`` and 0) without a fleet limit."""
    if fleet is None:
        return {}
    return {
        "fleet_limit": fleet.limit,
        "fleet_leases_held": fleet.held,
        "fleet_leases_local": fleet.held_local,
        "fleet_waiting": fleet.waiting,
        "fleet_in_use": fleet.fleet_in_use,
        "fleet_unavailable": not fleet.available,
        "fleet_acquired": fleet.acquired,
        "fleet_round_trips": fleet.round_trips,
        "fleet_fallbacks": fleet.fallbacks,
        "fleet_outages": fleet.outages,
        "fleet_rejected": fleet.rejected,
        "fleet_timeouts": fleet.timeouts,
        "fleet_renewals": fleet.renewals,
        "fleet_lost": fleet.lost,
    }


#: The fleet's gauges that have no value in the ``"(evicted)"`` entry (``None``).
_FLEET_UNSET = frozenset({"fleet_limit", "fleet_in_use", "fleet_unavailable"})
#: Fields of ``CompartmentStats`` that describe the moment (not summed on eviction).
_GAUGES = frozenset(
    {
        "name",
        "running",
        "waiting",
        "limit",
        "max_pending",
        "connections",
        "idle_connections",
        "in_use_connections",
        "waiting_for_connection",
        "proxied_connections",
        "http2_connections",
        "open_streams",
        "stream_caps",
        "wait_p50",
        "wait_p95",
        "wait_p99",
        "wait_max",
        "fleet_leases_held",
        "fleet_leases_local",
        "fleet_waiting",
        *_FLEET_UNSET,
        "no_load_latency",
        "limit_history",
    }
)
#: Gauges with their own defaults (``None``, ``()``): an evicted compartment has none.
_ADAPTIVE = frozenset({"no_load_latency", "limit_history"})
_COUNTERS = tuple(f.name for f in dataclasses.fields(CompartmentStats) if f.name not in _GAUGES)


def fold_evicted(total: CompartmentStats | None, evicted: CompartmentStats) -> CompartmentStats:
    """The ``EVICTED`` entry after ``evicted`` (a snapshot taken at eviction) joined it:
    counters summed, so totals over ``statistics()`` never go back; gauges zero (an evicted
    compartment holds nothing); wait quantiles cannot be merged and are dropped."""
    counts = {
        name: getattr(evicted, name) + (0 if total is None else getattr(total, name))
        for name in _COUNTERS
    }
    gauges: dict[str, Any] = dict.fromkeys(
        _GAUGES - {"name", "max_pending", "stream_caps", *_ADAPTIVE} - _FLEET_UNSET, 0
    )
    return CompartmentStats(name=EVICTED, max_pending=None, stream_caps=(), **gauges, **counts)
