"""Leak detection for slots held too long (``Policy.leak_threshold``, after HikariCP's
``leakDetectionThreshold``).

Theory of operation
-------------------
A slot is held from acquire until its response is closed (or read to its end, or cut).  A
caller that keeps a response open and forgets it holds the slot for as long as the response
object lives; the garbage-collector detection (``_response.py``) catches the response
dropped unclosed, not the one kept referenced.  So, with a threshold set:

* when a request gets its slot, ``LeakDetector.watch`` notes the time and the acquiring
  stack (the caller's frames, as ``FrameSummary`` records: no frame is kept alive, source
  lines are read only if a warning is written) and arms one timer (``_timers.Timers``, or
  the sync shell's ``_threads.Timers``: no task per request) for ``leak_threshold`` seconds;
* the slot's release (``LeakWatch.release``, called exactly once, wherever the slot is
  given back: the request failed before its response, the response stream finished, its
  deadline passed, or it was garbage-collected) cancels the timer;
* if the timer fires first, the slot is reported once: a WARNING with the acquiring stack,
  and ``slot_leaks`` counted.  Its release, whenever it comes, writes a second WARNING with
  how long the slot was held.  A response held for ever has one warning, never more.

With no threshold (the default) the compartment has no detector: no stack is captured, no
timer armed, and the request path pays one ``is None`` check.

``watching`` counts the timers armed and not yet fired or cancelled: it returns to zero
whenever no slot is held, whatever cancelled a request and wherever.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from ._log import log_warning

__all__ = ["STACK_LIMIT", "LeakDetector", "LeakWatch"]

#: Frames of the acquiring stack kept (the innermost ones outside this package).
STACK_LIMIT = 32
_PACKAGE = str(Path(__file__).parent)


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Timers(Protocol):
    """What the detector needs of the transport's timers (the async ``_timers.Timers``
    and the sync shell's ``_threads.Timers`` both are)."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle: ...


class LeakDetector:
    """One compartment's leak detection (exists only when ``leak_threshold`` is set)."""

    __slots__ = ("_clock", "_name", "_timers", "detected", "threshold", "watching")

    def __init__(
        self, name: str, threshold: float, timers: Timers, clock: Callable[[], float]
    ) -> None:
        self._name = name
        self.threshold = threshold
        self._timers = timers
        self._clock = clock
        #: Slots reported as held past the threshold (``statistics().slot_leaks``).
        self.detected = 0
        #: Timers armed and not yet fired or cancelled.
        self.watching = 0

    def watch(self) -> LeakWatch:
        """A slot was just acquired by the caller's caller: watch it."""
        frames = traceback.walk_stack(sys._getframe(2))
        stack = traceback.StackSummary.extract(
            ((f, n) for f, n in frames if not f.f_code.co_filename.startswith(_PACKAGE)),
            limit=STACK_LIMIT,
            lookup_lines=False,
        )
        watch = LeakWatch(self, stack, self._clock())
        watch.timer = self._timers.call_later(self.threshold, watch.expired)
        self.watching += 1
        return watch

    def _report(self, watch: LeakWatch) -> None:
        self.detected += 1
        where = "".join(watch.stack.format()).rstrip()  # (walk_stack: innermost first)
        log_warning(
            "slot_leak",
            self._name,
            "a slot has been held for more than leak_threshold=%g s and is still held;"
            " it was acquired at (most recent call first):\n%s",
            self.threshold,
            where,
            reason="leak_threshold",
        )

    def _released(self, watch: LeakWatch) -> None:
        log_warning(
            "slot_leak_released",
            self._name,
            "the slot reported as held past leak_threshold=%g s was released after %.3f s",
            self.threshold,
            self._clock() - watch.acquired_at,
            reason="leak_threshold",
        )


class LeakWatch:
    """One held slot's leak timer."""

    __slots__ = ("_detector", "_state", "acquired_at", "stack", "timer")

    _ARMED, _REPORTED, _DONE = 0, 1, 2

    def __init__(
        self, detector: LeakDetector, stack: traceback.StackSummary, acquired_at: float
    ) -> None:
        self._detector = detector
        self.stack = stack
        self.acquired_at = acquired_at
        self.timer: TimerHandle | None = None
        self._state = self._ARMED

    def expired(self) -> None:
        """The timer fired: report the slot once (on the loop)."""
        self.timer = None
        if self._state == self._ARMED:
            self._detector.watching -= 1
            self._state = self._REPORTED
            self._detector._report(self)

    def release(self) -> None:
        """The slot was given back (idempotent): disarm, or say a reported one is back."""
        state, self._state = self._state, self._DONE
        if state == self._ARMED:
            self._detector.watching -= 1
            timer, self.timer = self.timer, None
            if timer is not None:
                timer.cancel()
        elif state == self._REPORTED:
            self._detector._released(self)
