"""One compartment's connections: which one serves next, when one has expired, who waits.

Theory of operation
-------------------
Pure bookkeeping: no I/O, no clock (``now`` is an argument), no awaits.  The async shell
dials, closes and reads; this module only decides.  The pool is generic over an opaque
connection type ``C``: a ``PoolEntry[C]`` *holds* its connection (``entry.conn``) beside what
the pool knows of it, and the pool never looks inside.  The one thing it tells a
connection is that it drains (``on_drain``), so the protocol refuses new streams on it.

Connections carry requests: an HTTP/1.1 connection one at a time (``cap == 1``), an HTTP/2
connection up to ``cap`` concurrent streams, where ``cap`` follows the peer's
SETTINGS_MAX_CONCURRENT_STREAMS (RFC 9113 §5.1.2) and may change at any time.  ``active``
counts what a connection carries now; it has *spare* capacity while ``active < cap`` and it
is not draining (GOAWAY received, or past its lifetime).

Invariants:

* ``total`` counts every connection held open *or being dialed*; ``total <= max_connections``.
  A dial is reserved (``total += 1``) before it starts.
* ``_available[origin]`` holds exactly the connections with spare capacity, most recently
  used last: checkout takes from the end (LIFO), so surplus connections stay unused and
  expire.  ``_lru`` holds exactly the connections with ``active == 0``, oldest first:
  expired ones are pruned from its front, each once (amortized O(1), never a scan).
* A connection is never expired mid-request: idle and lifetime limits are checked when it
  is picked or released.  A multiplexed connection past its lifetime drains: no new
  streams, closed when its last stream ends.
* Idle connections also expire with no traffic at all: ``next_due`` is never later than the
  earliest idle deadline or lifetime end of an idle connection (it may be earlier, when that
  connection has been taken since), and ``sweep`` closes every expired idle connection and
  makes ``next_due`` exact again.  The shell runs ``sweep`` at ``next_due``: a scan of the
  idle connections at most once per deadline, never per request.
* Waiting is FIFO and nobody barges.  A request that cannot be served waits in one of two
  queues: for *streams* of its origin, when a multiplexed connection being dialed (or
  already open) is expected to carry it (this coalesces dials: a burst of requests to an
  HTTP/2 origin opens one connection, not one each); or for a connection *place* (the right
  to dial).  Whatever frees capacity is handed straight to the head waiter that can use it.
* Every operation is O(1) amortized: queues are ``OrderedDict``s indexed by origin.
* The pool serves one event loop at a time (its connections, dials and waiters all belong
  to it).  When the transport moves to another loop, ``abandon`` forgets them all at once:
  every open connection is discarded (``LOOP_CHANGED``) and handed back to be closed
  without the old loop, the places reserved by dials in flight are freed, and the waiters
  leave the queues without a grant.  ``epoch`` counts these hand-overs: a dial or a waiter
  of an earlier epoch that comes back later (its loop ran again) changes nothing here, and
  its new connection is handed back to be closed.  Nothing per request: the check is made
  by whoever holds a grant, when the grant is used.
"""

from __future__ import annotations

import enum
import math
import random
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeAlias, TypeVar

from ._config import Origin

__all__ = [
    "DIAL",
    "Discard",
    "Grant",
    "Pool",
    "PoolEntry",
    "PoolWaiter",
    "keep_alive_deadline",
]

#: Streams assumed for a multiplexed origin before its first SETTINGS frame: effectively
#: "as many as wait", so a burst coalesces onto the first dial until the peer's cap is known.
_UNKNOWN_CAP = 1 << 30

#: The connection type a pool holds (opaque to it).
C = TypeVar("C")


class Discard(enum.Enum):
    """Why a connection was closed; each has a counter in the statistics."""

    IDLE_EXPIRED = "idle_expired"
    LIFETIME_EXPIRED = "lifetime_expired"
    UNKNOWN_STATE = "unknown_state"  # exchange cut by timeout/cancel/early close
    PEER_CLOSED = "peer_closed"  # the server closed it (seen idle, or on reuse)
    ERROR = "error"  # network or protocol error
    NOT_REUSABLE = "not_reusable"  # the protocol says close (Connection: close, GOAWAY)
    SURPLUS = "surplus"  # more idle connections than max_idle_connections
    PING_TIMEOUT = "ping_timeout"  # an HTTP/2 health-check PING was not answered
    CLOSED = "closed"  # the transport was closed
    LOOP_CHANGED = "loop_changed"  # opened on an event loop the transport no longer runs on


class PoolEntry(Generic[C]):
    """What the pool knows of a connection, and the connection it holds (``conn``)."""

    __slots__ = (
        "active",
        "cap",
        "conn",
        "draining",
        "expires_at",
        "idle_deadline",
        "in_pool",
        "multiplexed",
        "opened_at",
        "origin",
        "reason",
        "served",
        "settled",
    )

    def __init__(self, origin: Origin, conn: C) -> None:
        self.origin = origin
        self.conn = conn
        self.active = 0  # requests (streams) in flight on it
        self.cap = 1  # concurrent requests it may carry
        self.multiplexed = False  # HTTP/2
        self.draining = False  # takes no new request; closed when idle
        self.expires_at = math.inf  # end of its (jittered) lifetime
        self.idle_deadline = math.inf  # while idle: when it must be closed
        self.in_pool = True  # counted in ``total``; False once discarded
        self.served = 0  # requests it has been given
        self.settled = True  # its cap is known (an HTTP/2 connection: SETTINGS received)
        self.opened_at = math.nan  # when the dial succeeded (the caller's clock)
        self.reason: Discard | None = None  # why the pool dropped it, once it has

    @property
    def spare(self) -> int:
        return 0 if self.draining else max(0, self.cap - self.active)


class _Dial:
    def __repr__(self) -> str:
        return "DIAL"


#: A grant: the caller may open a new connection (its place is reserved).
DIAL = _Dial()

Grant: TypeAlias = "PoolEntry[Any] | _Dial"


class PoolWaiter:
    """A request waiting for a connection.  ``wake`` is called once, with ``grant`` set
    (or left ``None`` when the pool is closed), or never, when the pool is abandoned."""

    __slots__ = ("epoch", "for_streams", "grant", "origin", "wake")

    def __init__(self, origin: Origin, wake: Callable[[], None]) -> None:
        self.origin = origin
        self.wake = wake
        self.grant: Grant | None = None
        self.for_streams = False  # queued for streams of its origin, not for a place
        self.epoch = 0  # the pool's ``epoch`` when it was queued (and so granted)


def keep_alive_deadline(idle_timeout: float | None, hint: float | None) -> float:
    """Seconds an idle connection may be kept, given our limit and the server's
    ``Keep-Alive: timeout=N`` hint.  We close a margin before the server would (the larger
    of 1 s and a quarter of N, at most half of N), so our reuse never races its close."""
    limit = math.inf if idle_timeout is None else idle_timeout
    if hint is not None:
        limit = min(limit, max(0.0, hint - min(max(1.0, hint / 4), hint / 2)))
    return limit


class _Queue:
    """A FIFO of waiters, also indexed by origin (both ``OrderedDict``: O(1) everything)."""

    __slots__ = ("all", "by_origin")

    def __init__(self) -> None:
        self.all: OrderedDict[PoolWaiter, None] = OrderedDict()
        self.by_origin: dict[Origin, OrderedDict[PoolWaiter, None]] = {}

    def __len__(self) -> int:
        return len(self.all)

    def count(self, origin: Origin) -> int:
        queue = self.by_origin.get(origin)
        return len(queue) if queue else 0

    def push(self, waiter: PoolWaiter) -> None:
        self.all[waiter] = None
        self.by_origin.setdefault(waiter.origin, OrderedDict())[waiter] = None

    def remove(self, waiter: PoolWaiter) -> bool:
        if waiter not in self.all:
            return False
        del self.all[waiter]
        del self.by_origin[waiter.origin][waiter]
        return True

    def head(self, origin: Origin | None = None) -> PoolWaiter | None:
        queue = self.all if origin is None else self.by_origin.get(origin)
        return next(iter(queue)) if queue else None

    def tail(self, origin: Origin) -> PoolWaiter | None:
        queue = self.by_origin.get(origin)
        return next(reversed(queue)) if queue else None

    def drain(self) -> list[PoolWaiter]:
        waiters = list(self.all)
        self.all.clear()
        self.by_origin.clear()
        return waiters


class Pool(Generic[C]):
    """Connections of one compartment.

    Args:
        max_connections: open (or dialing) connections allowed.
        max_idle: idle connections kept; more are closed on release.
        idle_timeout: seconds idle before expiry; ``None`` never.
        max_lifetime: seconds; ``None`` means unlimited.
        lifetime_jitter: fraction of ``max_lifetime`` randomly taken off each connection's.
        may_multiplex: whether a new connection to an origin may turn out to be HTTP/2
            (then concurrent requests wait for its first dial instead of dialing each).
        rng: source of the jitter (tests pass a seeded one).
        on_drain: told when a connection starts draining (takes no new request).
    """

    def __init__(
        self,
        *,
        max_connections: int,
        max_idle: int,
        idle_timeout: float | None,
        max_lifetime: float | None,
        lifetime_jitter: float,
        may_multiplex: Callable[[Origin], bool] = lambda origin: False,
        rng: random.Random | None = None,
        on_drain: Callable[[C], None] = lambda conn: None,
    ) -> None:
        self.max_connections = max_connections
        self.max_idle = max_idle
        self.idle_timeout = idle_timeout
        self.max_lifetime = max_lifetime
        self.lifetime_jitter = lifetime_jitter
        self._may_multiplex = may_multiplex
        self._rng = rng or random.Random()
        self._on_drain = on_drain
        self.total = 0
        #: Times the pool was abandoned (``abandon``): grants of an earlier epoch are void.
        self.epoch = 0
        self._now = -math.inf  # the latest time a caller told us: expiry checks in callbacks
        self._available: dict[Origin, OrderedDict[PoolEntry[C], None]] = {}
        self._lru: OrderedDict[PoolEntry[C], None] = OrderedDict()
        self._streams = _Queue()  # waiting for streams of their origin
        self._places = _Queue()  # waiting for a connection place
        self._dialing: dict[Origin, int] = {}
        self._cap: dict[Origin, int] = {}  # last stream cap seen per multiplexed origin
        self._multiplexed: dict[Origin, bool] = {}  # learned from the first connection
        self._unsettled: dict[Origin, int] = {}  # multiplexed connections before SETTINGS
        self._open: dict[Origin, int] = {}  # connections open per origin
        #: No idle connection expires before this instant (see the module docstring).
        self.next_due = math.inf
        self.created = 0
        self.discards = dict.fromkeys(Discard, 0)
        #: Dials made because every multiplexed connection of the origin was at its cap.
        self.scale_outs = 0
        #: Requests that waited and were then served by an open connection (HTTP/1.1: one
        #: released by another request; HTTP/2: a stream that became free).
        self.stream_waits = 0

    # -- views -------------------------------------------------------------------------
    @property
    def idle(self) -> int:
        return len(self._lru)

    @property
    def waiting(self) -> int:
        return len(self._streams) + len(self._places)

    # -- checkout ----------------------------------------------------------------------
    def checkout(
        self, origin: Origin, now: float, *, fresh: bool = False
    ) -> tuple[Grant | None, list[PoolEntry[C]]]:
        """Pick a connection for a request to ``origin`` (a new one if ``fresh``).

        Returns ``(grant, to_close)``: ``grant`` is a connection (its ``active`` already
        counts this request), ``DIAL`` (open one; its place is reserved) or ``None`` (call
        ``wait``).  ``to_close`` are expired connections the caller must close; they are
        already out of the pool.
        """
        self._now = now
        to_close = self._prune(now)
        if (self._streams.all or self._places.all) and (
            self._streams.count(origin) or self._places.count(origin)
        ):
            return None, to_close  # no barging past this origin's waiters
        if not fresh:
            entry = self._pick(origin, now, to_close)
            if entry is not None:
                return entry, to_close
        if not fresh and self._expects_streams(origin, 1):
            return None, to_close
        if not self._places and self._reserve_place(origin, to_close):  # places go FIFO
            return DIAL, to_close
        if fresh:  # no room for a new connection: an existing one will do
            return self._pick(origin, now, to_close), to_close
        return None, to_close

    def wait(self, waiter: PoolWaiter) -> list[PoolEntry[C]]:
        """Queue a request that got ``None`` from ``checkout``.  It may be granted at once;
        returns connections to close (idle ones evicted to make room)."""
        to_close: list[PoolEntry[C]] = []
        waiter.epoch = self.epoch
        if self._expects_streams(waiter.origin, self._streams.count(waiter.origin) + 1):
            waiter.for_streams = True
            self._streams.push(waiter)
        else:
            self._places.push(waiter)
            self._rebalance(waiter.origin, to_close)  # there may be room it can have at once
        return to_close

    def cancel(self, waiter: PoolWaiter) -> list[PoolEntry[C]]:
        """The waiter gave up.  A grant it had not used yet is passed on.  Returns
        connections to close."""
        if waiter.grant is None:
            queue = self._streams if waiter.for_streams else self._places
            to_close: list[PoolEntry[C]] = []
            if queue.remove(waiter):
                self._rebalance(waiter.origin, to_close)
            return to_close
        grant, waiter.grant = waiter.grant, None
        if grant is DIAL:
            return self.dial_failed(waiter.origin, epoch=waiter.epoch)
        assert isinstance(grant, PoolEntry)
        return self.release(grant, math.nan, reusable=True)

    # -- dialing -----------------------------------------------------------------------
    def dialed(
        self,
        entry: PoolEntry[C],
        now: float,
        *,
        multiplexed: bool = False,
        epoch: int | None = None,
    ) -> list[PoolEntry[C]]:
        """A reserved dial succeeded: ``entry`` is open and carries the dialer's request.
        Returns connections to close: ``[entry]`` itself (discarded, ``LOOP_CHANGED``)
        when the dial was granted in an earlier ``epoch`` (``None``: the current one).

        A multiplexed connection starts with a cap of one stream until the peer's
        SETTINGS arrive (``set_cap``)."""
        self._now = now
        entry.opened_at = now
        self.created += 1
        if epoch is not None and epoch != self.epoch:  # its place was freed by ``abandon``
            entry.in_pool = False
            entry.reason = Discard.LOOP_CHANGED
            self.discards[Discard.LOOP_CHANGED] += 1
            return [entry]
        origin = entry.origin
        self._dialing[origin] -= 1
        self._open[origin] = self._open.get(origin, 0) + 1
        entry.active, entry.served, entry.cap = 1, 1, 1
        entry.multiplexed = multiplexed
        self._multiplexed[origin] = multiplexed
        if multiplexed:
            entry.settled = False
            self._unsettled[origin] = self._unsettled.get(origin, 0) + 1
        if self.max_lifetime is not None:
            jitter = self.lifetime_jitter * self._rng.random()
            entry.expires_at = now + self.max_lifetime * (1.0 - jitter)
        self._index(entry)
        to_close: list[PoolEntry[C]] = []
        self._rebalance(origin, to_close)
        return to_close

    def dial_failed(self, origin: Origin, *, epoch: int | None = None) -> list[PoolEntry[C]]:
        """A reserved dial failed: free its place (or hand it to the head waiter).
        Returns connections to close.  A dial granted in an earlier ``epoch`` (``None``:
        the current one) has no place any more: nothing changes."""
        if epoch is not None and epoch != self.epoch:
            return []
        self._dialing[origin] -= 1
        self.total -= 1
        to_close: list[PoolEntry[C]] = []
        self._rebalance(origin, to_close)
        return to_close

    def set_cap(self, entry: PoolEntry[C], cap: int) -> list[PoolEntry[C]]:
        """The peer changed how many concurrent streams ``entry`` may carry.  Lowering lets
        streams in flight finish; raising hands the new room to waiters at once."""
        entry.cap = cap
        if not entry.in_pool:
            return []
        self._cap[entry.origin] = cap
        self._settle(entry)
        self._index(entry)
        to_close: list[PoolEntry[C]] = []
        self._rebalance(entry.origin, to_close)
        return to_close

    def drain(self, entry: PoolEntry[C]) -> list[PoolEntry[C]]:
        """No new request on ``entry`` (GOAWAY): closed once idle.  Returns it if idle."""
        if not entry.in_pool or entry.draining:
            return []
        self._drain(entry)
        if entry.active == 0:
            return self.discard(entry, Discard.NOT_REUSABLE)
        self._index(entry)
        to_close: list[PoolEntry[C]] = []
        self._rebalance(entry.origin, to_close)
        return to_close

    # -- release -----------------------------------------------------------------------
    def release(
        self,
        entry: PoolEntry[C],
        now: float,
        *,
        reusable: bool,
        keep_alive: float | None = None,
    ) -> list[PoolEntry[C]]:
        """A request finished with ``entry``.  Returns connections to close (maybe it).

        Args:
            now: the clock; ``nan`` for a grant returned unused (deadlines unchanged).
            reusable: the protocol state allows another request (else it is discarded).
            keep_alive: the server's ``Keep-Alive: timeout=`` in seconds, if it sent one.
        """
        if not entry.in_pool:
            return []
        if not math.isnan(now):
            self._now = now
        entry.active -= 1
        if not reusable:
            return self.discard(entry, Discard.NOT_REUSABLE)
        if entry.expires_at <= now and not entry.draining:  # past its lifetime: no new request
            self._drain(entry)
        if entry.active == 0:
            if entry.draining:
                reason = Discard.LIFETIME_EXPIRED if entry.expires_at <= now else None
                return self.discard(entry, reason or Discard.NOT_REUSABLE)
            if not math.isnan(now):
                idle_for = keep_alive_deadline(self.idle_timeout, keep_alive)
                entry.idle_deadline = now + idle_for
        self._index(entry)
        to_close: list[PoolEntry[C]] = []
        self._rebalance(entry.origin, to_close)
        expired = entry.idle_deadline <= now
        if entry.in_pool and entry.active == 0 and (expired or len(self._lru) > self.max_idle):
            reason = Discard.IDLE_EXPIRED if expired else Discard.SURPLUS
            to_close.extend(self.discard(entry, reason))
        return to_close

    def discard(self, entry: PoolEntry[C], reason: Discard) -> list[PoolEntry[C]]:
        """Close ``entry`` (in use or idle) for ``reason``; its place goes to a waiter."""
        if not entry.in_pool:
            return [entry]
        self._unindex(entry)
        self._drop(entry, reason)
        to_close = [entry]
        self._rebalance(entry.origin, to_close)
        return to_close

    def sweep(self, now: float) -> list[PoolEntry[C]]:
        """Take every idle connection past its idle deadline or lifetime out of the pool
        (returned, to be closed) and make ``next_due`` exact.  O(idle connections)."""
        self._now = now
        to_close: list[PoolEntry[C]] = []
        due = math.inf
        for entry in list(self._lru):
            reason = self._expired(entry, now)
            if reason is None:
                due = min(due, entry.idle_deadline, entry.expires_at)
            else:
                self._unindex(entry)
                self._drop(entry, reason)
                to_close.append(entry)
        self.next_due = due
        if to_close:
            for origin in {entry.origin for entry in to_close}:
                self._rebalance(origin, to_close)  # freed places go to waiters
        return to_close

    def close(self) -> tuple[list[PoolEntry[C]], list[PoolWaiter]]:
        """Forget every idle connection and waiter: returns the connections to close and
        the waiters to wake (with no grant).  No dial is allowed afterwards."""
        self.max_connections = 0
        closing = list(self._lru)
        for entry in closing:
            self._unindex(entry)
            self._drop(entry, Discard.CLOSED)
        return closing, self._streams.drain() + self._places.drain()

    def abandon(
        self, entries: Iterable[PoolEntry[C]]
    ) -> tuple[list[PoolEntry[C]], list[PoolWaiter]]:
        """The event loop of everything here is no longer the transport's: discard
        ``entries`` (every open connection, idle or in use: the pool does not index those
        in use) for ``LOOP_CHANGED``, free the places of dials in flight and empty the
        queues.  Returns the connections to close and the waiters that left (not woken:
        their loop may be closed).  Starts a new ``epoch``; the pool stays open."""
        self.epoch += 1
        to_close: list[PoolEntry[C]] = []
        for entry in entries:
            if entry.in_pool:
                self._unindex(entry)
                self._drop(entry, Discard.LOOP_CHANGED)
                to_close.append(entry)
        for dialing in self._dialing.values():
            self.total -= dialing
        self._dialing.clear()
        self.next_due = math.inf  # nothing is idle any more
        return to_close, self._streams.drain() + self._places.drain()

    # -- internals ---------------------------------------------------------------------
    def _pick(
        self, origin: Origin, now: float, to_close: list[PoolEntry[C]]
    ) -> PoolEntry[C] | None:
        available = self._available.get(origin)
        while available:
            entry = next(reversed(available))
            if entry.active == 0:
                reason = self._expired(entry, now)
                if reason is not None:
                    self._unindex(entry)
                    self._drop(entry, reason)
                    to_close.append(entry)
                    continue
            elif entry.expires_at <= now:  # multiplexed, past its lifetime: drain it
                self._drain(entry)
                self._index(entry)
                continue
            self._take(entry)
            return entry
        return None

    def _take(self, entry: PoolEntry[C]) -> None:
        entry.active += 1
        entry.served += 1
        self._index(entry)

    def _index(self, entry: PoolEntry[C]) -> None:
        """Put ``entry`` in exactly the structures its state calls for."""
        available = self._available.get(entry.origin)
        if available is None:  # (not ``setdefault``: no new OrderedDict on every call)
            available = self._available[entry.origin] = OrderedDict()
        if not entry.draining and entry.active < entry.cap:  # ``entry.spare > 0``, inlined
            available[entry] = None
            available.move_to_end(entry)
        else:
            available.pop(entry, None)
        if entry.active == 0:
            if entry not in self._lru:
                self._lru[entry] = None
            due = (
                entry.idle_deadline if entry.idle_deadline < entry.expires_at else entry.expires_at
            )
            if due < self.next_due:
                self.next_due = due
        else:
            self._lru.pop(entry, None)

    def _unindex(self, entry: PoolEntry[C]) -> None:
        available = self._available.get(entry.origin)
        if available is not None:
            available.pop(entry, None)
        self._lru.pop(entry, None)

    def _expects_streams(self, origin: Origin, waiting: int) -> bool:
        """Whether ``waiting`` requests can count on streams of this origin's multiplexed
        connections (open ones, and dials in flight) instead of dialing their own.  Each
        connection coming carries its dialer's request and ``cap - 1`` others."""
        multiplexed = self._multiplexed.get(origin)
        if multiplexed is None:
            multiplexed = self._may_multiplex(origin)
        if not multiplexed:
            return False
        coming = self._dialing.get(origin, 0) + self._unsettled.get(origin, 0)
        return waiting <= coming * (max(1, self._cap.get(origin, _UNKNOWN_CAP)) - 1)

    def _reserve_place(self, origin: Origin, to_close: list[PoolEntry[C]]) -> bool:
        if self.total >= self.max_connections:
            if not self._lru or self.max_connections == 0:
                return False
            victim = next(iter(self._lru))  # full: evict the oldest idle connection
            self._unindex(victim)
            self._drop(victim, Discard.SURPLUS)
            to_close.append(victim)
        self.total += 1
        self._dialing[origin] = self._dialing.get(origin, 0) + 1
        if self._multiplexed.get(origin) and self._open.get(origin):
            self.scale_outs += 1  # its multiplexed connections are all at their cap
        return True

    def _rebalance(self, origin: Origin, to_close: list[PoolEntry[C]]) -> None:
        """Hand whatever is free to the waiters that can use it, head first."""
        if not self._streams.all and not self._places.all:
            return  # nobody waits: the common case, on every release
        # 1. Spare capacity of this origin's connections: its waiters, streams first.
        while self._streams.count(origin) or self._places.count(origin):
            entry = self._pick(origin, self._now, to_close)
            if entry is None:
                break
            waiter = self._streams.head(origin) or self._places.head(origin)
            assert waiter is not None
            (self._streams if waiter.for_streams else self._places).remove(waiter)
            self.stream_waits += 1
            self._grant(waiter, entry)
        # 2. Stream waiters no longer covered by dials in flight need places of their own.
        count = self._streams.count(origin)
        if count and not self._expects_streams(origin, count):
            self._uncover(origin)
        # 3. Places, in FIFO order, while the pool has room (or idle ones to evict).
        while self._places:
            head = self._places.head()
            assert head is not None
            if not self._reserve_place(head.origin, to_close):
                break
            self._places.remove(head)
            self._grant(head, DIAL)
            # The new dial may cover the origin's remaining place waiters.
            self._cover(head.origin)

    def _uncover(self, origin: Origin) -> None:
        """Move the latest stream waiters that dials in flight no longer cover to the place
        queue, in their arrival order (the first of them gets the next place)."""
        uncovered: list[PoolWaiter] = []
        while self._streams.count(origin) and not self._expects_streams(
            origin, self._streams.count(origin)
        ):
            waiter = self._streams.tail(origin)
            assert waiter is not None
            self._streams.remove(waiter)
            waiter.for_streams = False
            uncovered.append(waiter)
        for waiter in reversed(uncovered):
            self._places.push(waiter)

    def _cover(self, origin: Origin) -> None:
        """Move place waiters that a dial in flight now covers to the stream queue."""
        while self._places.count(origin) and self._expects_streams(
            origin, self._streams.count(origin) + 1
        ):
            waiter = self._places.head(origin)
            assert waiter is not None
            self._places.remove(waiter)
            waiter.for_streams = True
            self._streams.push(waiter)

    def _drain(self, entry: PoolEntry[C]) -> None:
        entry.draining = True
        self._on_drain(entry.conn)

    def _grant(self, waiter: PoolWaiter, grant: Grant) -> None:
        waiter.grant = grant
        waiter.wake()

    def _expired(self, entry: PoolEntry[C], now: float) -> Discard | None:
        if entry.expires_at <= now:
            return Discard.LIFETIME_EXPIRED
        if entry.idle_deadline <= now:
            return Discard.IDLE_EXPIRED
        return None

    def _prune(self, now: float) -> list[PoolEntry[C]]:
        pruned: list[PoolEntry[C]] = []
        while self._lru:
            oldest = next(iter(self._lru))
            reason = self._expired(oldest, now)
            if reason is None:
                break
            self._unindex(oldest)
            self._drop(oldest, reason)
            pruned.append(oldest)
        return pruned

    def _settle(self, entry: PoolEntry[C]) -> None:
        if not entry.settled:
            entry.settled = True
            self._unsettled[entry.origin] -= 1

    def _drop(self, entry: PoolEntry[C], reason: Discard) -> None:
        self._settle(entry)
        entry.in_pool = False
        entry.reason = reason
        self.total -= 1
        self._open[entry.origin] -= 1
        self.discards[reason] += 1
