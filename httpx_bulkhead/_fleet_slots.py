"""The slots of a compartment with a fleet limit: a local slot, then a fleet lease.

Theory of operation
-------------------
``FleetSlots`` is ``Slots`` (``_slots.py``) plus a ``FleetLimiter`` (``_fleet.py``).  The
compartment uses it instead of ``Slots`` when its policy has a ``fleet``, so a compartment
without one pays nothing per request for the feature: not even a test for it.

**Acquire** takes the local slot first (the local FIFO queue and ``max_pending``, exactly
as without a fleet), then a fleet lease, waiting at most what is left of the acquire
budget (the shorter of ``acquire_timeout`` and httpx's pool timeout, counted from the
start of ``acquire``); the connection checkout that follows has what is left after that.
Local first, so a request queued in this process never holds fleet capacity that another
process could use.  When taking the lease fails at any await (``AcquireTimeout``,
``FleetUnavailable``, a cancellation, the ``RuntimeError`` of a backend that is not asyncio)
the slot is given back here, before the exception leaves ``acquire``; the limiter leaves
nothing held when it raises.

**Release** is the one place where both are given back, together.  Every end of a request
(the response read to its end or closed, an error or cancellation in ``Compartment.handle``,
the ``request_timeout`` abandonment, the garbage collector's hand-off of an unclosed
response) already gives its slot back exactly once through ``Slots.release``; this
override gives a lease back in the same call, so no end can return one without the other.

**Leases are interchangeable.**  A lease is one unit of this process's share of the fleet
limit, all renewed by the limiter's one task: which request holds which one does not matter
to Redis.  So the compartment keeps its leases in a list (pushed by ``acquire``, popped by
``release``: O(1), no per-request bookkeeping on the response), and this invariant holds
between calls::

    len(leases) == requests that left acquire() with a slot and have not released it

``Lease.release`` is synchronous, idempotent and thread-safe, so a release from the
garbage collector's thread (when no loop runs any more) is safe too.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from ._config import Policy
from ._exceptions import AcquireTimeout
from ._fleet import FleetLimiter, Lease
from ._limiter import Waiter
from ._slots import Slots
from ._stats import CANCELLED, FAILED, Outcome
from ._timers import Timers

__all__ = ["FleetSlots"]


class FleetSlots(Slots):
    """A compartment's slots and its share of a fleet limit; see the module docstring."""

    __slots__ = ("fleet", "leases")

    def __init__(
        self, name: str, policy: Policy, clock: Callable[[], float], timers: Timers
    ) -> None:
        super().__init__(name, policy, clock)
        assert policy.fleet is not None
        self.fleet = FleetLimiter(policy.fleet, timers=timers, name=name)
        self.leases: list[Lease] = []

    async def acquire(self, budget: float | None, request: httpx.Request) -> float:
        """A slot, then a lease, within ``budget`` seconds in all; returns the seconds
        waited for both.

        Raises:
            BulkheadFull, AcquireTimeout, TransportClosed: as ``Slots.acquire``; and
            AcquireTimeout: no lease in time.  FleetUnavailable: Redis is unavailable
            and ``on_unavailable="reject"``.  RuntimeError: not running under asyncio.
        """
        clock = self._clock
        started = clock()
        await super().acquire(budget, request)
        try:
            left = None if budget is None else budget - (clock() - started)
            lease = await self.fleet.acquire(left, request)
        except BaseException as exc:
            if isinstance(exc, AcquireTimeout):
                self.timeouts += 1  # acquire_timeouts counts it; fleet_timeouts tells it apart
            super().release(FAILED if isinstance(exc, Exception) else CANCELLED)
            raise
        self.leases.append(lease)
        return clock() - started

    def release(self, outcome: Outcome) -> None:
        """Give back a lease and the slot (exactly once per successful ``acquire``)."""
        leases = self.leases
        if leases:
            leases.pop().release()
        super().release(outcome)

    def give_back(self, outcome: Outcome) -> Waiter | None:
        """Give back a lease and the slot (exactly once per successful ``acquire``); the
        waiter granted the slot is returned, to wake (``Slots.give_back``)."""
        leases = self.leases
        if leases:
            leases.pop().release()
        return super().give_back(outcome)
