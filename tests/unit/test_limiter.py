"""The limiter's rules, without an event loop."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from httpx_bulkhead._limiter import Limiter, Waiter, WaiterState


def make_waiter(log: list[Waiter]) -> Waiter:
    waiter = Waiter(lambda: log.append(waiter))
    return waiter


def test_try_acquire_up_to_limit_then_queue_fifo() -> None:
    woken: list[Waiter] = []
    limiter = Limiter(2, max_pending=None)
    assert limiter.try_acquire() and limiter.try_acquire()
    assert not limiter.try_acquire()
    first, second = make_waiter(woken), make_waiter(woken)
    limiter.enqueue(first)
    limiter.enqueue(second)
    limiter.release()
    assert woken == [first] and first.state is WaiterState.GRANTED
    assert limiter.running == 2 and limiter.waiting == 1
    limiter.release()
    assert woken == [first, second]


def test_no_barging_while_someone_waits() -> None:
    limiter = Limiter(1, max_pending=None)
    assert limiter.try_acquire()
    waiter = make_waiter([])
    limiter.enqueue(waiter)
    limiter.release()  # handed to the waiter, not freed
    assert not limiter.try_acquire()
    assert limiter.running == 1


def test_full_queue_rejects_and_counts() -> None:
    limiter = Limiter(1, max_pending=1)
    assert limiter.try_acquire()
    limiter.enqueue(make_waiter([]))
    assert not limiter.can_enqueue()
    with pytest.raises(OverflowError):
        limiter.enqueue(make_waiter([]))
    assert limiter.rejected == 1 and limiter.waiting == 1


def test_cancel_waiting_leaves_queue_and_never_runs() -> None:
    woken: list[Waiter] = []
    limiter = Limiter(1, max_pending=None)
    assert limiter.try_acquire()
    cancelled, kept = make_waiter(woken), make_waiter(woken)
    limiter.enqueue(cancelled)
    limiter.enqueue(kept)
    limiter.cancel(cancelled)
    assert limiter.waiting == 1 and cancelled.state is WaiterState.CANCELLED
    limiter.release()
    assert woken == [kept]


def test_cancel_after_grant_passes_the_slot_on() -> None:
    woken: list[Waiter] = []
    limiter = Limiter(1, max_pending=None)
    assert limiter.try_acquire()
    granted, nxt = make_waiter(woken), make_waiter(woken)
    limiter.enqueue(granted)
    limiter.enqueue(nxt)
    limiter.release()
    assert granted.state is WaiterState.GRANTED
    limiter.cancel(granted)
    assert nxt.state is WaiterState.GRANTED and limiter.running == 1
    assert limiter.acquired == 2  # the first acquire and nxt's; the cancelled one never ran
    assert limiter.cancelled_waiting == 1


def test_lowering_the_limit_lets_holders_finish_raising_wakes_the_difference() -> None:
    woken: list[Waiter] = []
    limiter = Limiter(3, max_pending=None)
    for _ in range(3):
        assert limiter.try_acquire()
    waiters = [make_waiter(woken) for _ in range(3)]
    for w in waiters:
        limiter.enqueue(w)
    limiter.set_limit(1)
    limiter.release()
    limiter.release()
    assert woken == [] and limiter.running == 1
    limiter.set_limit(3)  # wakes limit - running = 2, not new - old
    assert woken == waiters[:2] and limiter.running == 3


def test_close_wakes_waiters_and_refuses_new() -> None:
    woken: list[Waiter] = []
    limiter = Limiter(1, max_pending=None)
    assert limiter.try_acquire()
    waiter = make_waiter(woken)
    limiter.enqueue(waiter)
    limiter.close()
    assert woken == [waiter] and waiter.state is WaiterState.CLOSED
    limiter.release()
    assert not limiter.try_acquire() and limiter.running == 0


def test_release_without_slot_is_a_bug() -> None:
    with pytest.raises(RuntimeError):
        Limiter(1, None).release()


class LimiterMachine(RuleBasedStateMachine):
    """Random acquire/release/cancel/grant-then-cancel/limit/close sequences."""

    def __init__(self) -> None:
        super().__init__()
        self.limiter = Limiter(2, max_pending=3)
        self.holders = 0  # tasks that own a slot (incl. granted, not yet resumed)
        self.queue: list[Waiter] = []  # our model of the FIFO
        self.granted: list[Waiter] = []
        self.woken: list[Waiter] = []
        self.last_running = 0

    def _waiter(self) -> Waiter:
        waiter = Waiter(lambda: self.woken.append(waiter))
        return waiter

    def _sync_grants(self) -> None:
        while self.woken:
            w = self.woken.pop(0)
            if w.state is WaiterState.GRANTED:
                # A grant never takes running over the limit (even a lowered one).
                assert self.limiter.running <= self.limiter.limit
                # FIFO: the woken one must be the head of our model queue.
                assert self.queue[0] is w
                self.queue.pop(0)
                self.granted.append(w)
            else:
                assert w.state is WaiterState.CLOSED
                self.queue.remove(w)

    @rule()
    def acquire(self) -> None:
        if self.limiter.try_acquire():
            assert not self.queue
            self.holders += 1
        elif not self.limiter.closed and self.limiter.can_enqueue():
            w = self._waiter()
            self.limiter.enqueue(w)
            self.queue.append(w)

    @precondition(lambda self: self.holders > 0)
    @rule()
    def release(self) -> None:
        self.limiter.release()
        self.holders -= 1
        self._sync_grants()

    @precondition(lambda self: bool(self.granted))
    @rule()
    def granted_resumes(self) -> None:
        self.granted.pop(0)
        self.holders += 1

    @precondition(lambda self: bool(self.queue))
    @rule(index=st.integers(min_value=0, max_value=10))
    def cancel_waiting(self, index: int) -> None:
        w = self.queue.pop(index % len(self.queue))
        self.limiter.cancel(w)
        assert w.state is WaiterState.CANCELLED

    @precondition(lambda self: bool(self.granted))
    @rule()
    def cancel_after_grant(self) -> None:
        w = self.granted.pop(0)
        self.limiter.cancel(w)
        self._sync_grants()

    @rule(limit=st.integers(min_value=1, max_value=4))
    def set_limit(self, limit: int) -> None:
        self.limiter.set_limit(limit)
        self._sync_grants()

    @rule()
    def close(self) -> None:
        self.limiter.close()
        self._sync_grants()

    @invariant()
    def limiter_invariants(self) -> None:
        limiter = self.limiter
        assert limiter.running == self.holders + len(self.granted)
        assert limiter.running >= 0
        assert limiter.waiting == len(self.queue)
        assert limiter.max_pending is None or limiter.waiting <= limiter.max_pending
        # A slot is never left free while someone waits under the limit (no lost wakeups).
        if limiter.running < limiter.limit:
            assert limiter.waiting == 0
        # 0 <= running <= limit, except just after the limit was lowered: then running
        # never grows until it is back under the limit.
        assert limiter.running <= limiter.limit or limiter.running <= self.last_running
        self.last_running = limiter.running
        for w in self.queue:
            assert w.state is WaiterState.WAITING


TestLimiterMachine = LimiterMachine.TestCase
