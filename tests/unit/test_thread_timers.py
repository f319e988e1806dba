"""The sync transport's timer threads (``_threads.Timers``): ``close()`` joins every one
that may still run, whatever an interrupt cut short.

The interleavings are forced with trace functions and events, never by sleeping: an
exception raised by a trace function at the return of ``Thread.start()`` is what an
interrupt (``KeyboardInterrupt``, ``PyThreadState_SetAsyncExc``) landing in its wait for
the new thread does; a trace function that waits at the return of ``Timers._serve`` holds
a timer thread that has left for lack of work but not yet ended.  A thread that ``close()``
must join is held on a gate that only its ``join`` opens: a ``close()`` that does not
join it returns while it is provably alive.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from httpx_bulkhead._threads import Timers

#: Longest wait for an event a thread of the test sets (a stuck test fails, never hangs).
WAIT = 10.0

Tracer = Callable[[FrameType, str, Any], Any]


class Interrupt(Exception):
    """Stands for an exception raised in a thread from outside."""


def timer_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "httpx_bulkhead timers"}


def open_gate_on_join(
    thread: threading.Thread, gate: threading.Event
) -> Callable[[float | None], None]:
    """Make ``thread.join()`` open ``gate`` first; returns the original ``join``."""
    join = thread.join

    def joined(timeout: float | None = None) -> None:
        gate.set()
        join(timeout)

    thread.join = joined  # type: ignore[method-assign]
    return join


def test_a_timer_thread_whose_start_was_interrupted_is_joined_by_close() -> None:
    """The interrupt lands in ``Thread.start()`` after the new thread runs: its caller
    never learns of it, yet ``close()`` must join it (it was not, and returned while the
    thread ran: the flake "threads outlive close()" of ``test_sync_interrupts``)."""
    before = timer_threads()
    timers = Timers()
    running, gate = threading.Event(), threading.Event()

    def callback() -> None:  # runs in the timer thread, held until close() joins it
        running.set()
        gate.wait(WAIT)

    def interrupt_at_return(frame: FrameType, event: str, arg: Any) -> Tracer | None:
        if event == "return":
            raise Interrupt  # start() launched the thread and saw it start
        return interrupt_at_return

    def trace(frame: FrameType, event: str, arg: Any) -> Tracer | None:
        if event == "call" and frame.f_code is threading.Thread.start.__code__:
            return interrupt_at_return
        return None

    outcome: list[str] = []

    def starter() -> None:
        sys.settrace(trace)
        try:
            timers.call_later(0, callback)
            outcome.append("returned")
        except Interrupt:
            outcome.append("interrupted")
        finally:
            sys.settrace(None)

    caller = threading.Thread(target=starter)
    caller.start()
    caller.join(WAIT)
    assert outcome == ["interrupted"]
    assert running.wait(WAIT)  # the timer thread serves all the same
    [thread] = timer_threads() - before
    join = open_gate_on_join(thread, gate)
    try:
        timers.close()
        alive = thread.is_alive()
    finally:
        gate.set()
        join(WAIT)
    assert not alive, "close() returned while a timer thread ran"


def test_every_timer_thread_that_left_for_lack_of_work_is_joined_by_close() -> None:
    """A thread leaves for lack of work and is slow to end; work comes back, a second
    thread serves it and leaves too.  ``close()`` joins both (it knew only the last one
    that left, and returned while the first was alive)."""
    timers = Timers()
    first_left, second_left, gate = threading.Event(), threading.Event(), threading.Event()
    left: list[threading.Thread] = []

    def at_return(frame: FrameType, event: str, arg: Any) -> Tracer | None:
        if event == "return":
            left.append(threading.current_thread())
            if len(left) == 1:
                first_left.set()
                gate.wait(WAIT)  # left ``_serve``, not ended
            else:
                second_left.set()
        return at_return

    def trace(frame: FrameType, event: str, arg: Any) -> Tracer | None:
        if event == "call" and frame.f_code is Timers._serve.__code__:
            return at_return
        return None

    threading.settrace(trace)  # for the threads started from now on
    try:
        timers.call_later(0, lambda: None)
        assert first_left.wait(WAIT)
        timers.call_later(0, lambda: None)  # a second thread: the first has left
        assert second_left.wait(WAIT)
    finally:
        threading.settrace(None)
    first, second = left
    assert first is not second
    join = open_gate_on_join(first, gate)
    try:
        timers.close()
        alive = first.is_alive()
    finally:
        gate.set()
        join(WAIT)
        second.join(WAIT)
    assert not alive, "close() returned while a timer thread that had left was alive"
