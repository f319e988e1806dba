"""The async shell of a compartment's ``Limiter``: waiting for a slot, giving it back.

``Limiter`` decides who holds a slot; this module sleeps on its verdicts, bounds the wait
and keeps the counters of how slots were used (acquire waits, outcomes, timeouts).

Slot accounting: a request that leaves ``acquire()`` owns one slot and must give it back
exactly once, through ``release()`` or ``give_back()``, whatever happens
(``Compartment.handle`` and the response stream do that in ``finally``/``except`` blocks;
``give_back`` is one step an interrupt lands before or after, never inside, so they can
tell whether it happened: see ``_response.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

import anyio
import httpx

from ._config import Policy
from ._exceptions import AcquireTimeout, BulkheadFull, TransportClosed
from ._limiter import Limiter, Waiter, WaiterState
from ._log import log_debug
from ._stats import Outcome, WaitWindow

__all__ = ["Slots", "acquire_timeout"]


class Slots:
    """One compartment's slots and wait queue (``Limiter``), awaited."""

    __slots__ = ("_clock", "_name", "_policy", "limiter", "outcomes", "timeouts", "waits")

    def __init__(self, name: str, policy: Policy, clock: Callable[[], float]) -> None:
        self._name = name
        self._policy = policy
        self._clock = clock
        self.limiter = Limiter(policy.initial_limit, policy.max_pending)
        self.waits = WaitWindow()  # acquire waits (slot and connection), for the quantiles
        self.outcomes = [0, 0, 0]  # exchanges that held a slot, by Outcome
        self.timeouts = 0  # waits for a slot that timed out

    async def acquire(self, budget: float | None, request: httpx.Request) -> float:
        """Wait for a slot, at most ``budget`` seconds (``None``: no limit); returns the
        seconds waited (0.0 when a slot was free).

        Raises:
            BulkheadFull: the queue is full.  AcquireTimeout: no slot in time.
            TransportClosed: the transport is (or was, while waiting) closed.
        """
        limiter = self.limiter
        if limiter.try_acquire():
            return 0.0
        if limiter.closed:
            raise TransportClosed("the transport is closed", request=request)
        if budget is not None and budget <= 0 and limiter.can_enqueue():
            self._timed_out(request)  # (a full queue is refused first, below)
        event = anyio.Event()
        waiter = Waiter(event.set)
        try:
            limiter.enqueue(waiter)  # counts a refusal
        except OverflowError:
            message = (
                f"compartment {self._name!r} is full: {limiter.running} running, "
                f"{limiter.waiting} waiting (max_pending={limiter.max_pending})"
            )
            log_debug("rejected", self._name, "rejected (BulkheadFull): %s", message, reason="full")
            # (no local holds the exception: a frame <-> traceback cycle would wait for the GC)
            raise BulkheadFull(message, request=request) from None
        started = self._clock()
        try:
            with anyio.fail_after(budget):
                await event.wait()
        except TimeoutError:
            if waiter.state is not WaiterState.GRANTED:  # granted in the same instant: keep it
                limiter.cancel(waiter, timed_out=True)
                self._timed_out(request)
        except BaseException:
            limiter.cancel(waiter)  # leaves the queue, or passes on a slot it never used
            raise
        if waiter.state is WaiterState.CLOSED:
            raise TransportClosed("the transport was closed", request=request)
        return self._clock() - started

    def release(self, outcome: Outcome) -> None:
        """Give the slot back (exactly once per successful ``acquire``)."""
        waiter = self.limiter.give_back()  # (not ``self.give_back``: a subclass adds to both)
        self.outcomes[outcome] += 1
        if waiter is not None:
            waiter.wake()

    def give_back(self, outcome: Outcome) -> Waiter | None:
        """``release`` without the wake (``Limiter.give_back``): returns the waiter granted
        the slot, for the caller to wake once it has recorded the slot as given back.  No
        call after the slot's return: an interrupt lands before it or after this returns."""
        waiter = self.limiter.give_back()
        self.outcomes[outcome] += 1
        return waiter

    def _timed_out(self, request: httpx.Request) -> NoReturn:
        self.timeouts += 1
        load = f"{self.limiter.running} running, {self.limiter.waiting} waiting"
        log_debug("acquire_timeout", self._name, "no slot in time (%s)", load, reason="slot")
        raise acquire_timeout(self._name, "slot", self._policy, request, load)


def acquire_timeout(
    name: str, what: str, policy: Policy, request: httpx.Request, load: str
) -> AcquireTimeout:
    """The ``AcquireTimeout`` for no ``what`` (slot, connection) in time, naming the
    configured value that bounded the wait (the shorter one) and the load."""
    pool = (request.extensions.get("timeout") or {}).get("pool")
    own = policy.acquire_timeout
    if own is not None and (pool is None or own <= pool):
        limit = f"acquire_timeout={own:g} s"
    else:
        limit = f"the client's pool timeout={pool:g} s"
    return AcquireTimeout(
        f"compartment {name!r}: no {what} within {limit} ({load})", request=request
    )
