"""Slots and a bounded FIFO queue of waiters: the decision logic of one bulkhead.

Theory of operation
-------------------
A compartment admits at most ``limit`` requests at once.  This module decides who holds
a slot; it does no I/O, reads no clock and never awaits, so every rule below is checked by
plain unit tests and a Hypothesis state machine.  The async shell (``_compartment.py``)
turns a ``Waiter`` into something a task can sleep on.

Invariants, after every method returns:

1. ``0 <= running <= limit`` (``limit`` may be lowered below ``running``; then no slot is
   granted until holders have released enough to fall below it).
2. A waiter holds no slot.  A slot is taken only when a request leaves the queue: either
   at once in ``try_acquire`` (only when *nobody* is waiting, so there is no barging past
   the queue), or by ``release`` handing the freed slot straight to the head waiter
   (``running`` does not drop in between, so a task that was not queued cannot steal it).
3. FIFO: waiters are granted in arrival order.
4. ``waiting <= max_pending``; ``enqueue`` past it is refused (``BulkheadFull`` above).
5. A waiter leaves the queue exactly once: granted, cancelled or closed.  Cancelling a
   waiting waiter removes it in O(1); cancelling one that was granted but had not resumed
   yet gives its slot back, which passes it to the next waiter.  Waiters of an event loop
   the transport no longer runs on leave by ``abandon``, as cancelled and without being
   woken (their loop may be closed); slots held there stay held until given back.
6. Every operation is O(1): the queue is an ``OrderedDict`` (O(1) append, pop-left and
   removal from the middle).
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["Limiter", "Waiter", "WaiterState"]


class WaiterState(enum.Enum):
    WAITING = "waiting"
    GRANTED = "granted"  # holds a slot; the owning task may not have resumed yet
    CANCELLED = "cancelled"
    CLOSED = "closed"  # the limiter was closed while it waited


class Waiter:
    """A queued request.  ``wake`` is called exactly once when the state leaves WAITING."""

    __slots__ = ("state", "wake")

    def __init__(self, wake: Callable[[], None]) -> None:
        self.state = WaiterState.WAITING
        self.wake = wake


class Limiter:
    """Slots plus a bounded FIFO queue.  See the module docstring for the invariants.

    Args:
        limit: slots; at least 1.
        max_pending: waiters allowed; ``None`` means unbounded.
    """

    __slots__ = (
        "_queue",
        "acquired",
        "cancelled_waiting",
        "closed",
        "limit",
        "max_pending",
        "rejected",
        "running",
    )

    def __init__(self, limit: int, max_pending: int | None) -> None:
        self.limit = limit
        self.max_pending = max_pending
        self.running = 0
        self.closed = False
        self._queue: OrderedDict[Waiter, None] = OrderedDict()
        # Counters, for statistics: slots handed out, requests refused because the queue
        # was full, and waiters that left the queue by cancellation (not by timeout).
        self.acquired = 0
        self.rejected = 0
        self.cancelled_waiting = 0

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def try_acquire(self) -> bool:
        """Take a slot without waiting, if one is free and nobody is queued."""
        if self.running < self.limit and not self._queue and not self.closed:
            self.running += 1
            self.acquired += 1
            return True
        return False

    def can_enqueue(self) -> bool:
        """Whether ``enqueue`` would accept a waiter now (the queue is not full)."""
        return self.max_pending is None or len(self._queue) < self.max_pending

    def enqueue(self, waiter: Waiter) -> None:
        """Queue ``waiter``.  The caller checked ``try_acquire``, ``closed`` and
        ``can_enqueue`` first; a full queue counts as a rejection and raises ``OverflowError``."""
        if self.closed:
            raise RuntimeError("limiter is closed")
        if not self.can_enqueue():
            self.rejected += 1
            raise OverflowError("wait queue is full")
        self._queue[waiter] = None

    def release(self) -> None:
        """Return a slot: it goes to the head waiter, if any, else back to the pool."""
        waiter = self.give_back()
        if waiter is not None:
            waiter.wake()

    def give_back(self) -> Waiter | None:
        """``release`` without the wake: returns the waiter now granted the slot (if any),
        for the caller to wake once it has recorded that it no longer holds it.

        Straight-line code (no call, no loop): an exception raised in a thread from
        outside (``KeyboardInterrupt``) lands before this method starts or after it
        returned, never between the slot's return and the caller learning of it (see
        ``_response.py``).  A waiter granted more than one slot at a time does not exist:
        the queue holds only waiters still WAITING, and a raised limit fills itself
        (``set_limit``), so here the slot goes to the head waiter or back to the pool."""
        running = self.running
        if running <= 0:
            raise RuntimeError("release() without a slot held")
        queue = self._queue
        if queue and running <= self.limit:
            for waiter in queue:  # noqa: B007 - the head, without a call (see above)
                break
            del queue[waiter]
            waiter.state = WaiterState.GRANTED
            self.acquired += 1
            return waiter
        self.running = running - 1  # (nobody waits, or over a lowered limit: no grant)
        return None

    def cancel(self, waiter: Waiter, *, timed_out: bool = False) -> None:
        """The task owning ``waiter`` gave up: cancelled, or (``timed_out``) its acquire
        timeout passed, which the caller counts itself, so ``cancelled_waiting`` counts
        cancellations only.

        A waiting waiter leaves the queue; a granted one that never ran gives its slot back
        (so the next waiter gets it).  Cancelling a closed or cancelled waiter does nothing.
        """
        if waiter.state is WaiterState.WAITING:
            del self._queue[waiter]
            waiter.state = WaiterState.CANCELLED
            self.cancelled_waiting += not timed_out
        elif waiter.state is WaiterState.GRANTED:
            waiter.state = WaiterState.CANCELLED
            self.cancelled_waiting += not timed_out
            self.acquired -= 1  # it never ran: count it as a wait given up, not an acquire
            self.release()

    def set_limit(self, limit: int) -> None:
        """Change the number of slots.  Lowering lets holders finish; raising grants at once
        ``limit - running`` waiters (never ``new - old``)."""
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self.limit = limit
        self._grant_free()

    def close(self) -> None:
        """Refuse new requests and wake every waiter with state CLOSED.  Holders keep their
        slots until they release them."""
        self.closed = True
        while self._queue:
            waiter, _ = self._queue.popitem(last=False)
            waiter.state = WaiterState.CLOSED
            waiter.wake()

    def abandon(self) -> None:
        """Empty the queue without waking anyone: the waiters belong to an event loop the
        transport has left.  Each counts as cancelled while waiting; ``cancel`` on one of
        them later does nothing."""
        while self._queue:
            waiter, _ = self._queue.popitem(last=False)
            waiter.state = WaiterState.CANCELLED
            self.cancelled_waiting += 1

    def _grant_free(self) -> None:
        while self._queue and self.running < self.limit:
            waiter, _ = self._queue.popitem(last=False)
            self.running += 1
            self.acquired += 1
            waiter.state = WaiterState.GRANTED
            waiter.wake()
