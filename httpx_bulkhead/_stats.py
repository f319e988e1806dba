"""Statistics: a bounded window of acquire waits and the frozen per-compartment snapshot."""

from __future__ import annotations

import dataclasses
import enum
import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._connections import Connections
    from ._slots import Slots

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

    Gauges describe the moment of the call; counters count since the transport was made.
    Times are in seconds.  This is debugging and monitoring information: read it, do not
    drive control flow from it.
    """

    name: str
    #: Requests holding a slot (from acquire to response closed); ``<= limit``.
    running: int
    #: Requests queued for a slot.
    waiting: int
    limit: int
    max_pending: int | None
    #: Open (or being opened) connections, idle and in use.
    connections: int
    idle_connections: int
    in_use_connections: int
    #: Requests holding a slot but waiting for a connection (``max_connections`` reached).
    waiting_for_connection: int
    # counters
    acquired: int
    completed: int
    failed: int
    cancelled: int
    rejected: int
    acquire_timeouts: int
    cancelled_waiting: int
    connections_created: int
    stale_retries: int
    #: Responses garbage-collected without being closed (a ResourceWarning is issued and
    #: their slot returned): a bug in the caller, which would otherwise exhaust the pool.
    leaked_responses: int
    # discards, by reason
    idle_expired: int
    lifetime_expired: int
    unknown_state: int
    peer_closed: int
    error: int
    not_reusable: int
    surplus: int
    closed: int
    ping_timeouts: int
    # HTTP/2
    #: Open HTTP/2 connections, and the streams open on them.
    http2_connections: int
    open_streams: int
    #: Each HTTP/2 connection's current stream cap (ascending).
    stream_caps: tuple[int, ...]
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
    # acquire wait (slot and connection), over the last ``WAIT_WINDOW`` attempts, including
    # those that ended in ``AcquireTimeout`` (rejections by ``BulkheadFull`` do not wait)
    wait_p50: float
    wait_p95: float
    wait_p99: float
    wait_max: float


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


def compartment_stats(
    name: str, slots: Slots, connections: Connections, **counters: Any
) -> CompartmentStats:
    """The snapshot of one compartment, from its slots, its connections and the
    ``counters`` the compartment keeps itself (``stale_retries``, ``replays``,
    ``leaked_responses``)."""
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
        "http2_connections",
        "open_streams",
        "stream_caps",
        "wait_p50",
        "wait_p95",
        "wait_p99",
        "wait_max",
    }
)
_COUNTERS = tuple(f.name for f in dataclasses.fields(CompartmentStats) if f.name not in _GAUGES)


def fold_evicted(total: CompartmentStats | None, evicted: CompartmentStats) -> CompartmentStats:
    """The ``EVICTED`` entry after ``evicted`` (a snapshot taken at eviction) joined it:
    counters summed, so totals over ``statistics()`` never go back; gauges zero (an evicted
    compartment holds nothing); wait quantiles cannot be merged and are dropped."""
    counts = {
        name: getattr(evicted, name) + (0 if total is None else getattr(total, name))
        for name in _COUNTERS
    }
    gauges = dict.fromkeys(_GAUGES - {"name", "max_pending", "stream_caps"}, 0)
    return CompartmentStats(name=EVICTED, max_pending=None, stream_caps=(), **gauges, **counts)
