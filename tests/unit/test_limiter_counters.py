"""A wait given up by timeout is not counted as a cancelled wait (the compartment counts
it as an acquire timeout), whether the waiter was still queued or already granted."""

from __future__ import annotations

from httpx_bulkhead._limiter import Limiter, Waiter, WaiterState


def queued(limiter: Limiter) -> Waiter:
    waiter = Waiter(lambda: None)
    limiter.enqueue(waiter)
    return waiter


def test_a_timed_out_waiter_leaves_without_counting_a_cancellation() -> None:
    limiter = Limiter(1, None)
    assert limiter.try_acquire()
    timed_out, cancelled = queued(limiter), queued(limiter)
    limiter.cancel(timed_out, timed_out=True)
    limiter.cancel(cancelled)
    assert (timed_out.state, cancelled.state) == (WaiterState.CANCELLED, WaiterState.CANCELLED)
    assert (limiter.waiting, limiter.cancelled_waiting, limiter.acquired) == (0, 1, 1)


def test_a_granted_waiter_that_timed_out_passes_its_slot_on_uncounted() -> None:
    limiter = Limiter(1, None)
    assert limiter.try_acquire()
    first, second = queued(limiter), queued(limiter)
    limiter.release()  # granted to ``first``, which has not run yet
    assert first.state is WaiterState.GRANTED
    limiter.cancel(first, timed_out=True)
    assert second.state is WaiterState.GRANTED
    assert (limiter.running, limiter.acquired, limiter.cancelled_waiting) == (1, 2, 0)
