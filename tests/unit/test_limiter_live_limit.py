"""The limiter with its limit changed live (as an adaptive compartment does), interleaved
with arrivals, releases, resumes, timeouts and cancellations, against a model.

The rules under test (``Limiter.set_limit``): lowering the limit below ``running`` lets
the holders finish and admits nobody until ``running < limit``; raising it admits head
waiters at once, ``limit - running`` of them, in FIFO order; the queue bound is unchanged.
"""

from __future__ import annotations

import os

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from httpx_bulkhead._limiter import Limiter, Waiter, WaiterState

MAX_PENDING = 4


class LiveLimitMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.limit = 2
        self.limiter = Limiter(self.limit, max_pending=MAX_PENDING)
        self.holders = 0
        self.queue: list[Waiter] = []  # the model FIFO
        self.granted: list[Waiter] = []  # granted, not resumed yet
        self.woken: list[Waiter] = []
        self.arrived = 0  # order of arrival, to check FIFO grants
        self.order: dict[Waiter, int] = {}
        self.grants: list[int] = []  # arrival numbers of the waiters granted, in order

    def _waiter(self) -> Waiter:
        def wake() -> None:
            self.woken.append(waiter)

        waiter = Waiter(wake)
        return waiter

    def _grant_expected(self, count: int) -> None:
        for _ in range(count):
            head = self.queue.pop(0)
            self.granted.append(head)
            self.grants.append(self.order[head])
        assert self.woken == self.granted[len(self.granted) - count :]
        assert all(w.state is WaiterState.GRANTED for w in self.woken)
        self.woken.clear()

    @property
    def running(self) -> int:
        return self.holders + len(self.granted)

    @rule()
    def arrive(self) -> None:
        free = self.running < self.limit and not self.queue
        assert self.limiter.try_acquire() is free
        if free:
            self.holders += 1
        elif self.limiter.can_enqueue():
            waiter = self._waiter()
            self.limiter.enqueue(waiter)
            self.order[waiter] = self.arrived
            self.queue.append(waiter)
        else:
            assert len(self.queue) == MAX_PENDING  # the bound holds whatever the limit
        self.arrived += 1
        assert self.woken == []

    @precondition(lambda self: self.holders > 0)
    @rule()
    def release(self) -> None:
        running = self.running
        self.limiter.release()
        self.holders -= 1
        # The freed slot goes to the head waiter only if running - 1 < limit.
        self._grant_expected(1 if self.queue and running <= self.limit else 0)

    @rule(limit=st.integers(1, 6))
    def set_limit(self, limit: int) -> None:
        self.limiter.set_limit(limit)
        self.limit = limit
        admitted = max(0, min(len(self.queue), limit - self.running))
        self._grant_expected(admitted)

    @precondition(lambda self: bool(self.granted))
    @rule()
    def granted_resumes(self) -> None:
        self.granted.pop(0)
        self.holders += 1

    @precondition(lambda self: bool(self.queue) or bool(self.granted))
    @rule(index=st.integers(0, 10), timed_out=st.booleans())
    def give_up(self, index: int, timed_out: bool) -> None:
        waiters = self.queue + self.granted
        waiter = waiters[index % len(waiters)]
        if timed_out and waiter.state is WaiterState.GRANTED:
            self.granted.remove(waiter)  # the grant won the race: it runs
            self.holders += 1
            return
        running = self.running
        self.limiter.cancel(waiter, timed_out=timed_out)
        if waiter in self.queue:
            self.queue.remove(waiter)
            assert self.woken == []
        else:  # granted but never ran: its slot is released, and passed on if allowed
            self.granted.remove(waiter)
            self.grants.remove(self.order[waiter])
            self._grant_expected(1 if self.queue and running <= self.limit else 0)

    @invariant()
    def matches_the_model(self) -> None:
        limiter = self.limiter
        assert limiter.limit == self.limit
        assert limiter.running == self.running
        assert limiter.waiting == len(self.queue) <= MAX_PENDING
        # Nobody waits while a slot is free, however the limit moved.
        assert limiter.running >= limiter.limit or not self.queue
        assert self.grants == sorted(self.grants)  # FIFO across every change


TestLiveLimitMachine = LiveLimitMachine.TestCase
TestLiveLimitMachine.settings = settings(
    max_examples=int(os.environ.get("BULKHEAD_MACHINE_EXAMPLES") or 150),
    stateful_step_count=60,
    deadline=None,
)
