"""One compartment's connections: which one serves next, when one has expired, who waits.

Theory of operation
-------------------
Pure bookkeeping: no I/O, no clock (``now`` is an argument), no awaits.  The async shell
dials, closes and reads; this module only decides.

* ``total`` counts every connection the compartment holds open *or is dialing*; it never
  exceeds ``max_connections``.  A dial is reserved (``total += 1``) before it starts, so
  concurrent requests never open more connections than allowed.
* Idle connections are kept per origin in an ``OrderedDict`` used as a stack: checkout takes
  the most recently used one (LIFO), so a burst's surplus connections stay unused and expire.
  A second ``OrderedDict`` across origins is ordered by time of release (LRU first): expired
  connections are pruned from its front, each once, so the work per checkout is amortized
  O(1) and never a scan over all connections.
* A connection is never expired mid-request: idle and lifetime limits are checked when it is
  released and when it is picked from the idle stack.
* When a request holds a bulkhead slot but no connection can be had (``max_connections``
  reached, none idle for its origin), it waits in a FIFO here.  Whatever frees capacity is
  handed straight to the head waiter: a released connection of its origin, or else the right
  to dial (the freed or evicted connection's place in ``total``).  Nobody barges.
"""

from __future__ import annotations

import enum
import math
import random
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeAlias

__all__ = [
    "DIAL",
    "Discard",
    "Grant",
    "Origin",
    "Pool",
    "PoolEntry",
    "PoolWaiter",
    "keep_alive_deadline",
]

Origin: TypeAlias = tuple[str, str, int]


class Discard(enum.Enum):
    """Why a connection was closed; each has a counter in the statistics."""

    IDLE_EXPIRED = "idle_expired"
    LIFETIME_EXPIRED = "lifetime_expired"
    UNKNOWN_STATE = "unknown_state"  # exchange cut by timeout/cancel/early close
    PEER_CLOSED = "peer_closed"  # the server closed it (seen idle, or on reuse)
    ERROR = "error"  # network or protocol error
    NOT_REUSABLE = "not_reusable"  # the protocol says close (Connection: close, HTTP/1.0)
    SURPLUS = "surplus"  # more idle connections than max_idle_connections
    CLOSED = "closed"  # the transport was closed


class PoolEntry:
    """What the pool knows of a connection.  Connection classes inherit from it."""

    __slots__ = ("expires_at", "idle_deadline", "in_pool", "origin", "reused")

    def __init__(self, origin: Origin) -> None:
        self.origin = origin
        self.expires_at = math.inf  # end of its (jittered) lifetime
        self.idle_deadline = math.inf  # while idle: when it must be closed
        self.in_pool = True  # counted in ``total``; False once discarded
        self.reused = False  # has served a request before the current one


class _Dial:
    def __repr__(self) -> str:
        return "DIAL"


#: ``checkout`` result: the caller may open a new connection (its place is reserved).
DIAL = _Dial()

Grant: TypeAlias = PoolEntry | _Dial


class PoolWaiter:
    """A request waiting for a connection.  ``wake`` is called once, with ``grant`` set."""

    __slots__ = ("grant", "origin", "wake")

    def __init__(self, origin: Origin, wake: Callable[[], None]) -> None:
        self.origin = origin
        self.wake = wake
        self.grant: Grant | None = None


def keep_alive_deadline(idle_timeout: float | None, hint: float | None) -> float:
    """Seconds an idle connection may be kept, given our limit and the server's
    ``Keep-Alive: timeout=N`` hint.  We close a margin before the server would (the larger
    of 1 s and a quarter of N, at most half of N), so our reuse never races its close."""
    limit = math.inf if idle_timeout is None else idle_timeout
    if hint is not None:
        limit = min(limit, max(0.0, hint - min(max(1.0, hint / 4), hint / 2)))
    return limit


class Pool:
    """Connections of one compartment.

    Args:
        max_connections: open (or dialing) connections allowed.
        max_idle: idle connections kept; more are closed on release.
        idle_timeout: seconds idle before expiry; ``None`` never.
        max_lifetime: seconds; ``None`` means unlimited.
        lifetime_jitter: fraction of ``max_lifetime`` randomly taken off each connection's.
        rng: source of the jitter (tests pass a seeded one).
    """

    def __init__(
        self,
        *,
        max_connections: int,
        max_idle: int,
        idle_timeout: float | None,
        max_lifetime: float | None,
        lifetime_jitter: float,
        rng: random.Random | None = None,
    ) -> None:
        self.max_connections = max_connections
        self.max_idle = max_idle
        self.idle_timeout = idle_timeout
        self.max_lifetime = max_lifetime
        self.lifetime_jitter = lifetime_jitter
        self._rng = rng or random.Random()
        self.total = 0
        self._idle: dict[Origin, OrderedDict[PoolEntry, None]] = {}
        self._lru: OrderedDict[PoolEntry, None] = OrderedDict()
        self._waiters: OrderedDict[PoolWaiter, None] = OrderedDict()
        self.created = 0
        self.discards = dict.fromkeys(Discard, 0)

    # -- views -------------------------------------------------------------------------
    @property
    def idle(self) -> int:
        return len(self._lru)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    # -- checkout ----------------------------------------------------------------------
    def checkout(
        self, origin: Origin, now: float, *, fresh: bool = False
    ) -> tuple[Grant | None, list[PoolEntry]]:
        """Pick a connection for a request to ``origin`` (a new one if ``fresh``).

        Returns ``(grant, to_close)``: ``grant`` is an idle connection (now in use), ``DIAL``
        (open one; its place is reserved) or ``None`` (call ``wait``).  ``to_close`` are
        expired connections the caller must close; they are already out of the pool.
        """
        to_close = self._prune(now)
        if self._waiters:  # no barging past connection waiters
            return None, to_close
        stack = None if fresh else self._idle.get(origin)
        while stack:
            entry, _ = stack.popitem(last=True)
            del self._lru[entry]
            reason = self._expired(entry, now)
            if reason is None:
                entry.reused = True
                return entry, to_close
            self._drop(entry, reason)
            to_close.append(entry)
        if self.total < self.max_connections:
            self.total += 1
            return DIAL, to_close
        if self._lru:  # full, but idle connections to other origins: evict the oldest
            victim, _ = self._lru.popitem(last=False)
            del self._idle[victim.origin][victim]
            self._drop(victim, Discard.SURPLUS)
            to_close.append(victim)
            self.total += 1
            return DIAL, to_close
        return None, to_close

    def wait(self, waiter: PoolWaiter) -> None:
        """Queue a request that got ``None`` from ``checkout``."""
        self._waiters[waiter] = None

    def cancel(self, waiter: PoolWaiter) -> list[PoolEntry]:
        """The waiter gave up.  A grant it had not used yet is passed on (or pooled).
        Returns connections to close."""
        if waiter.grant is None:
            self._waiters.pop(waiter, None)
            return []
        grant, waiter.grant = waiter.grant, None
        if grant is DIAL:
            self.dial_failed()
            return []
        assert isinstance(grant, PoolEntry)
        return self._offer(grant)

    # -- dialing -----------------------------------------------------------------------
    def dialed(self, entry: PoolEntry, now: float) -> None:
        """A reserved dial succeeded: ``entry`` is open and in use."""
        self.created += 1
        if self.max_lifetime is not None:
            jitter = self.lifetime_jitter * self._rng.random()
            entry.expires_at = now + self.max_lifetime * (1.0 - jitter)

    def dial_failed(self) -> None:
        """A reserved dial failed: free its place (or hand it to the head waiter)."""
        if self._waiters:
            self._grant_head(DIAL)
        else:
            self.total -= 1

    # -- release -----------------------------------------------------------------------
    def checkin(
        self, entry: PoolEntry, now: float, *, reusable: bool, keep_alive: float | None = None
    ) -> list[PoolEntry]:
        """A request finished with ``entry``.  Returns connections to close (maybe ``entry``).

        Args:
            reusable: the protocol state allows another request (else it is discarded).
            keep_alive: the server's ``Keep-Alive: timeout=`` in seconds, if it sent one.
        """
        if not entry.in_pool:
            return []
        if not reusable:
            return self.discard(entry, Discard.NOT_REUSABLE)
        if entry.expires_at <= now:
            return self.discard(entry, Discard.LIFETIME_EXPIRED)
        idle_for = keep_alive_deadline(self.idle_timeout, keep_alive)
        entry.idle_deadline = now + idle_for
        if idle_for <= 0 and not self._waiters:
            return self.discard(entry, Discard.IDLE_EXPIRED)
        return self._offer(entry)

    def discard(self, entry: PoolEntry, reason: Discard) -> list[PoolEntry]:
        """Close ``entry`` (in use or idle) for ``reason``; its place goes to a waiter."""
        if not entry.in_pool:
            return [entry]
        if entry in self._lru:
            del self._lru[entry]
            del self._idle[entry.origin][entry]
        self._drop(entry, reason)
        if self._waiters:
            self.total += 1
            self._grant_head(DIAL)
        return [entry]

    def drain_waiters(self) -> list[PoolWaiter]:
        """Remove every connection waiter (with no grant) for the caller to wake."""
        waiters = list(self._waiters)
        self._waiters.clear()
        return waiters

    def close(self) -> list[PoolEntry]:
        """Forget every idle connection (returned for closing).  Waiters are the caller's
        to wake: their slots were already refused by the limiter's close."""
        closing = list(self._lru)
        for entry in closing:
            self._drop(entry, Discard.CLOSED)
        self._lru.clear()
        self._idle.clear()
        return closing

    # -- internals ---------------------------------------------------------------------
    def _offer(self, entry: PoolEntry) -> list[PoolEntry]:
        """Give a free connection to the head waiter, or keep it idle."""
        if self._waiters:
            head = next(iter(self._waiters))
            if head.origin == entry.origin:
                entry.reused = True
                self._grant_head(entry)
                return []
            # The head wants another origin: this connection's place becomes its dial.
            self._drop(entry, Discard.SURPLUS)
            self.total += 1
            self._grant_head(DIAL)
            return [entry]
        if len(self._lru) >= self.max_idle:
            return self.discard(entry, Discard.SURPLUS)
        self._lru[entry] = None
        self._idle.setdefault(entry.origin, OrderedDict())[entry] = None
        return []

    def _grant_head(self, grant: Grant) -> None:
        waiter, _ = self._waiters.popitem(last=False)
        waiter.grant = grant
        waiter.wake()

    def _expired(self, entry: PoolEntry, now: float) -> Discard | None:
        if entry.expires_at <= now:
            return Discard.LIFETIME_EXPIRED
        if entry.idle_deadline <= now:
            return Discard.IDLE_EXPIRED
        return None

    def _prune(self, now: float) -> list[PoolEntry]:
        pruned: list[PoolEntry] = []
        while self._lru:
            oldest = next(iter(self._lru))
            reason = self._expired(oldest, now)
            if reason is None:
                break
            del self._lru[oldest]
            del self._idle[oldest.origin][oldest]
            self._drop(oldest, reason)
            pruned.append(oldest)
        return pruned

    def _drop(self, entry: PoolEntry, reason: Discard) -> None:
        entry.in_pool = False
        self.total -= 1
        self.discards[reason] += 1
