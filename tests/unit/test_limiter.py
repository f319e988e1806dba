"""The limiter's rules, without an event loop."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings
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


def test_give_back_grants_the_head_without_waking_it() -> None:
    """``give_back`` is ``release`` with the wake left to the caller (who records first
    that the slot is no longer its own: see ``_response.py``)."""
    woken: list[Waiter] = []
    limiter = Limiter(1, max_pending=None)
    assert limiter.try_acquire()
    first, second = make_waiter(woken), make_waiter(woken)
    limiter.enqueue(first)
    limiter.enqueue(second)
    assert limiter.give_back() is first
    assert first.state is WaiterState.GRANTED and woken == []
    assert (limiter.running, limiter.waiting, limiter.acquired) == (1, 1, 2)
    limiter.cancel(second)
    assert limiter.give_back() is None
    assert (limiter.running, limiter.waiting) == (0, 0)
    with pytest.raises(RuntimeError):
        limiter.give_back()


def test_give_back_over_a_lowered_limit_frees_without_granting() -> None:
    woken: list[Waiter] = []
    limiter = Limiter(2, max_pending=None)
    assert limiter.try_acquire() and limiter.try_acquire()
    waiter = make_waiter(woken)
    limiter.enqueue(waiter)
    limiter.set_limit(1)
    assert limiter.give_back() is None  # 1 running, at the limit: the waiter still waits
    assert (limiter.running, limiter.waiting) == (1, 1)
    assert limiter.give_back() is waiter and woken == []


def test_no_barging_while_someone_waits() -> None:
    limiter = Limiter(1, max_pending=None)
    assert limiter.try_acquire()
    waiter = make_waiter([])
    limiter.enqueue(waiter)
    limiter.release()  # handed to the waiter, not freed
    assert not limiter.try_acquire()
    assert limiter.running == 1


def test_full_queue_refuses_new_waiters() -> None:
    """The path the compartment takes: ``can_enqueue`` says no, the request is rejected
    (``BulkheadFull``, counted by the compartment) and never queued."""
    limiter = Limiter(1, max_pending=2)
    assert limiter.try_acquire()
    assert limiter.can_enqueue()
    limiter.enqueue(make_waiter([]))
    assert limiter.can_enqueue()
    limiter.enqueue(make_waiter([]))
    assert not limiter.can_enqueue() and limiter.waiting == 2
    assert not Limiter(1, max_pending=0).can_enqueue()
    assert Limiter(1, max_pending=None).can_enqueue()


def test_enqueue_past_the_bound_raises() -> None:
    """``enqueue``'s own guard (the compartment checks ``can_enqueue`` first and never
    reaches it; kept until the structure issue removes the duplicate)."""
    limiter = Limiter(1, max_pending=1)
    assert limiter.try_acquire()
    limiter.enqueue(make_waiter([]))
    with pytest.raises(OverflowError):
        limiter.enqueue(make_waiter([]))
    assert limiter.rejected == 1 and limiter.waiting == 1
    limiter.close()
    with pytest.raises(RuntimeError):
        limiter.enqueue(make_waiter([]))


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
    assert limiter.try_acquire() and limiter.acquired == 1
    granted, nxt = make_waiter(woken), make_waiter(woken)
    limiter.enqueue(granted)
    limiter.enqueue(nxt)
    limiter.release()
    assert granted.state is WaiterState.GRANTED and limiter.acquired == 2
    limiter.cancel(granted)
    assert str(granted.state) == str(WaiterState.CANCELLED)  # (mypy narrowed it to GRANTED)
    assert nxt.state is WaiterState.GRANTED and limiter.running == 1
    # The first acquire and nxt's: the cancelled one never ran.
    assert (limiter.acquired, limiter.cancelled_waiting, limiter.waiting) == (2, 1, 0)
    limiter.cancel(granted)  # a second cancel (the task's finally) changes nothing
    assert (limiter.running, limiter.acquired, limiter.cancelled_waiting) == (1, 2, 1)
    limiter.release()  # nxt finishes: nobody waits, the slot is free
    assert limiter.running == 0 and limiter.try_acquire() and limiter.acquired == 3


def test_cancel_after_grant_with_nobody_waiting_frees_the_slot() -> None:
    limiter = Limiter(1, max_pending=None)
    assert limiter.try_acquire()
    waiter = make_waiter([])
    limiter.enqueue(waiter)
    limiter.release()
    limiter.cancel(waiter)
    assert (limiter.running, limiter.acquired, limiter.cancelled_waiting) == (0, 1, 1)
    limiter.cancel(waiter)
    assert (limiter.running, limiter.acquired, limiter.cancelled_waiting) == (0, 1, 1)


def test_lowering_the_limit_lets_holders_finish_raising_wakes_the_difference() -> None:
    """``set_limit`` (not called by the compartment today: a policy's limit is fixed)."""
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
    assert woken == [] and limiter.running == 1 and limiter.acquired == 3
    limiter.set_limit(3)  # wakes limit - running = 2, not new - old
    assert woken == waiters[:2] and limiter.running == 3 and limiter.acquired == 5
    assert [w.state for w in waiters] == [WaiterState.GRANTED] * 2 + [WaiterState.WAITING]
    with pytest.raises(ValueError, match="limit"):
        limiter.set_limit(0)


def test_close_wakes_waiters_in_order_and_refuses_new() -> None:
    woken: list[Waiter] = []
    limiter = Limiter(1, max_pending=None)
    assert limiter.try_acquire()
    waiters = [make_waiter(woken) for _ in range(3)]
    for waiter in waiters:
        limiter.enqueue(waiter)
    limiter.close()
    assert woken == waiters and all(w.state is WaiterState.CLOSED for w in waiters)
    assert limiter.waiting == 0 and limiter.closed
    limiter.cancel(waiters[0])  # the woken task's cleanup: nothing to undo
    assert limiter.cancelled_waiting == 0 and limiter.running == 1
    limiter.release()
    assert not limiter.try_acquire() and limiter.running == 0 and limiter.acquired == 1


def test_abandon_drops_the_waiters_unwoken_and_keeps_the_holders() -> None:
    """The transport moved to another event loop: the old loop's waiters leave the queue
    without being woken (counted as cancelled), slots held there stay held, and a slot
    freed afterwards goes to the new loop's waiters, never to an abandoned one."""
    woken: list[Waiter] = []
    limiter = Limiter(1, max_pending=None)
    assert limiter.try_acquire()  # held by a request of the old loop
    old = [make_waiter(woken), make_waiter(woken)]
    for waiter in old:
        limiter.enqueue(waiter)
    limiter.abandon()
    assert woken == [] and limiter.waiting == 0 and limiter.running == 1
    assert all(w.state is WaiterState.CANCELLED for w in old)
    assert limiter.cancelled_waiting == 2 and limiter.acquired == 1
    new = make_waiter(woken)
    limiter.enqueue(new)
    limiter.cancel(old[0], timed_out=True)  # the old loop ran again: its wait timed out
    limiter.release()  # the old request ends
    assert woken == [new] and limiter.running == 1 and limiter.cancelled_waiting == 2


def test_release_without_slot_is_a_bug() -> None:
    with pytest.raises(RuntimeError):
        Limiter(1, None).release()


class LimiterMachine(RuleBasedStateMachine):
    """The limiter as the compartment drives it (a fixed limit), against a model that
    keeps every counter: requests arrive (slot at once, queued, or rejected when the queue
    is full), holders release, granted waiters resume, waiters time out (a grant that
    arrived in the same instant is kept) or are cancelled (before or after their grant),
    and the transport closes."""

    def __init__(self) -> None:
        super().__init__()
        self.limiter = Limiter(LIMIT, max_pending=MAX_PENDING)
        self.holders = 0  # tasks that resumed with a slot
        self.queue: list[Waiter] = []  # the model FIFO
        self.granted: list[Waiter] = []  # granted, not resumed yet
        self.woken: list[Waiter] = []  # wake() calls, in order
        self.expected: list[Waiter] = []  # the wake() calls the model expects
        self.closed = False
        self.acquired = self.rejected = self.cancelled_waiting = 0

    def _waiter(self) -> Waiter:
        waiter = Waiter(lambda: self.woken.append(waiter))
        return waiter

    def _expect_handoff(self) -> None:
        """A slot freed while someone waits goes to the head waiter, in the same call."""
        head = self.queue.pop(0)
        self.granted.append(head)
        self.expected.append(head)
        self.acquired += 1

    def _check_woken(self) -> None:
        """Every wake() matches the model: the head waiter, granted, exactly once."""
        assert self.woken == self.expected
        assert all(w.state is WaiterState.GRANTED for w in self.woken)
        self.woken.clear()
        self.expected.clear()

    @rule()
    def arrive(self) -> None:
        limiter = self.limiter
        free = limiter.running < LIMIT and not self.queue and not self.closed
        assert limiter.try_acquire() is free  # no barging past a waiter
        if free:
            self.holders += 1
            self.acquired += 1
        elif self.closed:
            pass  # TransportClosed
        elif not limiter.can_enqueue():
            assert len(self.queue) == MAX_PENDING
            limiter.rejected += 1  # as the compartment does, with BulkheadFull
            self.rejected += 1
        else:
            assert len(self.queue) < MAX_PENDING
            waiter = self._waiter()
            limiter.enqueue(waiter)
            self.queue.append(waiter)
        assert self.woken == []

    @precondition(lambda self: self.holders > 0)
    @rule()
    def release(self) -> None:
        self.limiter.release()
        self.holders -= 1
        if self.queue:
            self._expect_handoff()
        self._check_woken()

    @precondition(lambda self: bool(self.granted))
    @rule()
    def granted_resumes(self) -> None:
        self.granted.pop(0)
        self.holders += 1

    @precondition(lambda self: bool(self.queue) or bool(self.granted))
    @rule(index=st.integers(0, 10), cancelled=st.booleans())
    def give_up(self, index: int, cancelled: bool) -> None:
        """The waiting task gives up: cancelled (any means), or its acquire timeout fired,
        in which case a grant that arrived in the same instant is kept."""
        waiters = self.queue + self.granted
        waiter = waiters[index % len(waiters)]
        if not cancelled and waiter.state is WaiterState.GRANTED:
            self.granted.remove(waiter)  # the timeout lost the race: it runs
            self.holders += 1
            return
        self.limiter.cancel(waiter)
        assert waiter.state is WaiterState.CANCELLED
        self.cancelled_waiting += 1
        if waiter in self.queue:
            self.queue.remove(waiter)
        else:  # granted, never ran: the slot is passed on (or freed)
            self.granted.remove(waiter)
            self.acquired -= 1
            if self.queue:
                self._expect_handoff()
        self._check_woken()
        self.limiter.cancel(waiter)  # cancelling again is a no-op
        assert self.woken == []

    @rule()
    def close(self) -> None:
        queued = list(self.queue)
        self.limiter.close()
        self.closed = True
        assert self.woken == queued  # every waiter woken, in order
        assert all(w.state is WaiterState.CLOSED for w in queued)
        self.woken.clear()
        self.queue.clear()

    @invariant()
    def matches_the_model(self) -> None:
        limiter = self.limiter
        assert limiter.running == self.holders + len(self.granted)
        assert 0 <= limiter.running <= LIMIT
        assert limiter.waiting == len(self.queue) <= MAX_PENDING
        assert (limiter.acquired, limiter.rejected, limiter.cancelled_waiting) == (
            self.acquired,
            self.rejected,
            self.cancelled_waiting,
        )
        # Nobody waits while a slot is free (no lost wake-up).
        assert limiter.running == LIMIT or not self.queue
        assert all(w.state is WaiterState.WAITING for w in self.queue)
        assert limiter.closed is self.closed


LIMIT = 2
MAX_PENDING = 3
TestLimiterMachine = LimiterMachine.TestCase
TestLimiterMachine.settings = settings(
    max_examples=int(os.environ.get("BULKHEAD_MACHINE_EXAMPLES") or 200),
    stateful_step_count=60,
    deadline=None,
)
