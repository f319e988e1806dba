"""The gradient's timed headroom tests at small limits (``_adaptive.py``), without an event loop.

``Rotation`` is a dependency of ``workers`` workers and a FIFO queue in virtual time, called
by a client that always has a request ready (an open-loop load above the capacity): a slot
that frees is taken again at once, and the test's slot is opened exactly at ``open_at``
(the timer a transport would set).  Each exchange is served in ``service`` x U[0.9, 1.1].
"""

from __future__ import annotations

import asyncio
import heapq
import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from httpx_bulkhead import AdaptiveLimit
from httpx_bulkhead._adaptive import (
    TEST_AIM,
    TEST_BELOW,
    TEST_GAP,
    TEST_VERDICT,
    AdaptiveController,
    Gradient,
)
from tests.unit.test_adaptive import rounds

SERVICE = 0.1


class Timer:
    """A pending callback of ``Clocked.call_later``."""

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when, self.callback, self.cancelled = when, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class Rotation:
    """Virtual time: the dependency, the client's slots, and the algorithm, fed directly
    (``open_test`` called at ``open_at``) or through an ``AdaptiveController`` whose
    ``call_later`` timers fire in virtual time (``controlled``)."""

    def __init__(
        self,
        spec: AdaptiveLimit,
        workers: Callable[[float], int],
        seed: int,
        *,
        controlled: bool = False,
    ) -> None:
        self.workers = workers
        self.rng = random.Random(seed)
        self.now = 0.0
        self.busy = 0
        self.queue: list[float] = []  # starts of the exchanges waiting for a worker
        self.ends: list[tuple[float, int, float]] = []  # (end, seq, start) in service
        self.seq = 0
        self.running = 0
        #: (start, latency, applied limit at admission) of every exchange that ended.
        self.done: list[tuple[float, float, int]] = []
        self.admitted_under: dict[float, int] = {}
        self.timers: list[Timer] = []
        #: ``(time, limit)`` of each ``set_limit`` the controller made.
        self.set_limits: list[tuple[float, int]] = []
        self.controller: AdaptiveController | None = None
        if controlled:
            self.controller = AdaptiveController(
                spec,
                lambda limit: self.set_limits.append((self.now, limit)),
                lambda: self.running,
                lambda: self.now,
                random.Random(seed),
                self.call_later,
            )
            algorithm = self.controller.algorithm
        else:
            algorithm = Gradient(spec, random.Random(seed), timed=True)
        assert isinstance(algorithm, Gradient)
        self.algorithm = algorithm

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(self.now + delay, callback)
        self.timers.append(timer)
        return timer

    def live_timers(self) -> list[Timer]:
        return [timer for timer in self.timers if not timer.cancelled]

    def _admit(self) -> None:
        while self.running < self.algorithm.applied:
            self.running += 1
            self.admitted_under[self.now] = self.algorithm.applied
            self.queue.append(self.now)
        self._serve()

    def _serve(self) -> None:
        while self.queue and self.busy < self.workers(self.now):
            start = self.queue.pop(0)
            self.busy += 1
            self.seq += 1
            took = SERVICE * self.rng.uniform(0.9, 1.1)
            heapq.heappush(self.ends, (self.now + took, self.seq, start))

    def _next_opening(self) -> float | None:
        if self.controller is None:
            return self.algorithm.open_at
        live = self.live_timers()
        return min(timer.when for timer in live) if live else None

    def _open(self) -> None:
        if self.controller is None:
            self.algorithm.open_test(self.now, self.running)
            return
        for timer in self.live_timers():
            if timer.when <= self.now:
                timer.cancelled = True
                timer.callback()

    def run(self, until: float) -> None:
        self._admit()
        while self.now < until:
            opening = self._next_opening()
            if opening is not None and opening <= self.ends[0][0]:
                self.now = max(self.now, opening)
                self._open()
                self._admit()
                continue
            end, _, start = heapq.heappop(self.ends)
            self.now = end
            self.busy -= 1
            self._serve()  # the dependency's side, at the end
            self.now = self.seen_at(end)  # ours
            latency = self.now - start
            if self.controller is not None:
                self.controller.ended(start, latency, 200, None)
            else:
                self.algorithm.update(self.now, start, latency, False, self.running)
            self.done.append((start, latency, self.admitted_under.pop(start, 0)))
            self.running -= 1
            self._admit()

    def seen_at(self, end: float) -> float:
        """When our side sees an exchange that ended at ``end`` (at once here)."""
        return end

    def latencies(self, since: float) -> list[float]:
        return sorted(latency for start, latency, _ in self.done if start >= since)


def step_until(rotation: Rotation, condition: Callable[[], bool], within: float = 10.0) -> None:
    """Run the rotation a millisecond at a time until ``condition()`` (within ``within`` s)."""
    deadline = rotation.now + within
    while not condition():
        assert rotation.now < deadline, "never happened"
        rotation.run(rotation.now + 0.001)


def p99(values: list[float]) -> float:
    return values[min(len(values) - 1, int(0.99 * len(values)))]


def settled_at(workers: int, seed: int) -> Rotation:
    """A rotation whose first probe is over and whose limit came down to ``workers``."""
    spec = AdaptiveLimit(initial_limit=workers, probe_interval=None)
    rotation = Rotation(spec, lambda now: workers, seed)
    rotation.run(3.0)
    assert rotation.algorithm.no_load == pytest.approx(SERVICE, rel=0.05)
    return rotation


@pytest.mark.parametrize("seed", range(1, 7))
def test_at_an_unchanged_small_capacity_tests_cost_less_than_a_slot_of_queue(seed: int) -> None:
    """4 workers for a minute: the limit stays at 4 (5 only while a test's slot is open or
    after a rare false success), the tests' requests wait about a third of the service time,
    and the p99 stays under 1.5x the service time, where a window at 5 slots puts about one
    response in ten above it."""
    rotation = settled_at(4, seed)
    rotation.run(60.0)
    latencies = rotation.latencies(since=5.0)
    assert p99(latencies) <= 1.5 * SERVICE, p99(latencies)
    over = [lat for start, lat, limit in rotation.done if start >= 5.0 and limit > 5]
    assert len(over) <= 0.02 * len(latencies), len(over)
    tested = [lat for start, lat, limit in rotation.done if start >= 5.0 and limit == 5]
    assert tested, "no headroom test ran"
    assert len(tested) <= 0.15 * len(latencies), len(tested)
    assert max(tested) <= 1.55 * SERVICE, max(tested)
    assert rotation.algorithm.applied in (4, 5)


@pytest.mark.parametrize("seed", range(1, 7))
def test_when_the_capacity_grows_the_tests_find_it_quickly(seed: int) -> None:
    """4 workers, then 24 from 10 s: the tests succeed, the limit doubles and the windows
    grow it on, within 25% of 24 in under 2 s."""
    spec = AdaptiveLimit(initial_limit=4, probe_interval=None)
    rotation = Rotation(spec, lambda now: 4 if now < 10.0 else 24, seed)
    rotation.run(10.0)
    assert rotation.algorithm.applied <= 5
    reached = None
    while rotation.now < 14.0:
        rotation.run(rotation.now + 0.01)
        if reached is None and rotation.algorithm.applied >= 18:
            reached = rotation.now - 10.0
    assert reached is not None and reached < 2.0, reached


def test_a_test_opens_one_slot_until_the_next_end() -> None:
    rotation = settled_at(4, seed=1)
    algorithm = rotation.algorithm
    step_until(rotation, lambda: algorithm.open_at is not None)  # armed, named at an end
    open_at, no_load = algorithm.open_at, algorithm.no_load
    assert open_at is not None and no_load is not None
    # A third of no_load before the first of those in flight is due to end.
    due = min(end for end, _, _ in rotation.ends)
    assert open_at == pytest.approx(due - TEST_AIM * no_load, abs=0.02)
    assert algorithm.applied == 4
    rotation.now = open_at
    assert algorithm.open_test(open_at, 4)
    assert algorithm.applied == 5 and algorithm.open_at is None
    rotation.run(open_at)  # the client takes the slot at once
    assert rotation.running == 5
    ended = len(rotation.done)
    step_until(rotation, lambda: len(rotation.done) > ended)
    # The next end closed it: nobody took the ending exchange's slot.
    assert algorithm.applied == 4 and rotation.running == 4


def test_open_test_declines_when_nothing_is_pending_or_the_slot_freed_early() -> None:
    rotation = settled_at(4, seed=2)
    algorithm = rotation.algorithm
    step_until(rotation, lambda: algorithm.open_at is None and algorithm.applied == 4)
    assert not algorithm.open_test(rotation.now, 4)  # nothing named
    assert algorithm.applied == 4
    step_until(rotation, lambda: algorithm.open_at is not None)
    open_at = algorithm.open_at
    assert open_at is not None
    # Called late, when the slot due to free is (nearly) free already: no test.
    assert not algorithm.open_test(open_at + TEST_AIM * SERVICE, 4)
    assert algorithm.applied == 4 and algorithm.open_at is None
    step_until(rotation, lambda: algorithm.open_at is not None)
    open_at = algorithm.open_at
    assert open_at is not None
    # Not every slot in use at the instant (the traffic fell): no test either.
    assert not algorithm.open_test(open_at, 3)
    assert algorithm.applied == 4 and algorithm.open_at is None


class Draws(random.Random):
    """``uniform`` returns ``first`` once, then draws as usual."""

    def __init__(self, first: float, seed: int) -> None:
        super().__init__(seed)
        self.first: float | None = first

    def uniform(self, a: float, b: float) -> float:
        if self.first is not None:
            value, self.first = self.first, None
            return value
        return super().uniform(a, b)


def test_a_wait_the_dependencys_spread_cut_short_still_fails_the_test() -> None:
    """4 workers, none free: the test's request waits for the first exchange in flight to
    end, predicted ``TEST_AIM * no_load`` after the slot opens.  That exchange ends 18 ms
    early (its own spread), so the request waits 15 ms and is served quickly (0.95x): at
    0.113 s it is under ``no_load`` plus half the wait predicted, and was taken for a free
    worker; judged by the wait measured, at the end that closed the slot, it fails."""
    rotation = settled_at(4, seed=1)
    algorithm = rotation.algorithm
    step_until(rotation, lambda: algorithm.open_at is not None)
    open_at, no_load = algorithm.open_at, algorithm.no_load
    assert open_at is not None and no_load is not None
    assert open_at < rotation.ends[0][0]  # (nothing ends before the instant named)
    rotation.now = open_at
    assert algorithm.open_test(open_at, 4)
    due = algorithm._test_due
    first_end, seq, start = heapq.heappop(rotation.ends)
    assert first_end == pytest.approx(due, abs=0.012)  # the one the prediction named
    heapq.heappush(rotation.ends, (due - 0.018, seq, start))
    rotation.rng = Draws(0.95, seed=1)  # the test's request, when a worker takes it
    algorithm._gap, algorithm._skip, algorithm._wins = 1, 0, 0
    rotation.run(open_at)  # the client takes the slot at once: it waits for a worker
    assert rotation.running == 5
    step_until(rotation, lambda: any(begun == open_at for begun, _, _ in rotation.done))
    latency = next(lat for begun, lat, _ in rotation.done if begun == open_at)
    predicted = due - open_at
    assert latency < no_load + TEST_VERDICT * predicted  # a success, judged as predicted
    assert algorithm._wins == 0 and algorithm._gap == min(TEST_GAP, 2)  # a failure


def test_a_test_whose_request_waited_fails_and_the_next_waits_longer() -> None:
    """At 4 workers every test fails; the windows between tests double up to TEST_GAP."""
    rotation = settled_at(4, seed=3)
    rotation.run(30.0)
    algorithm = rotation.algorithm
    assert algorithm._gap == TEST_GAP  # (failed in a row: the widest spacing)
    assert algorithm.limit < 5


def test_batches_that_never_take_a_tests_slot_still_grow_the_limit() -> None:
    """A client sending a batch of ``limit`` requests at a time and waiting for all of them:
    every end but the batch's last cancels the instant named, and nobody would take a slot
    opened between two batches.  After two such misses the limit grows by windows, as
    without tests, to ``max_limit`` under a latency that does not rise."""
    spec = AdaptiveLimit(initial_limit=2, max_limit=TEST_BELOW + 4, probe_interval=None)
    algorithm = Gradient(spec, random.Random(5), timed=True)
    _, trace = rounds(algorithm, lambda now, limit: SERVICE, 60.0)
    assert trace[-1] == spec.max_limit, trace
    assert algorithm._misses >= 2


def test_the_controller_keeps_one_timer_applies_the_test_and_close_cancels_it() -> None:
    spec = AdaptiveLimit(initial_limit=4, probe_interval=None)
    rotation = Rotation(spec, lambda now: 4, seed=4, controlled=True)
    controller = rotation.controller
    assert controller is not None
    rotation.run(3.0)
    while rotation.now < 20.0:
        rotation.run(rotation.now + 0.001)
        assert len(rotation.live_timers()) <= 1  # each sample cancels the one before
    # The timers opened tests (a slot more for the limiter) and the slot closed again; the
    # history records the limit the algorithm settled on, not each test's slot.
    later = [limit for at, limit in rotation.set_limits if at >= 3.0]
    assert 5 in later, later
    assert later.count(4) >= later.count(5) - 1, later
    assert len([at for at, _ in controller.history if at >= 3.0]) < later.count(5) / 2
    p = p99(rotation.latencies(since=5.0))
    assert p <= 1.5 * SERVICE, p
    controller.close()
    assert rotation.live_timers() == []
    count = len(rotation.timers)
    rotation.run(rotation.now + 1.0)
    assert len(rotation.timers) == count  # none set after close


@settings(max_examples=60, deadline=None)
@given(
    feed=st.lists(
        st.tuples(
            st.floats(0.0, 0.2),  # time step
            st.floats(0.0, 0.5),  # how long ago it started
            st.floats(1e-4, 1.0),  # latency
            st.booleans(),  # dropped
            st.integers(0, 12),  # in flight
            st.booleans(),  # the timer fires before this sample
        ),
        max_size=400,
    ),
    low=st.integers(1, 4),
    high=st.integers(4, 12),
)
def test_tests_keep_the_limit_within_its_bounds_whatever_happens(
    feed: list[tuple[float, float, float, bool, int, bool]], low: int, high: int
) -> None:
    spec = AdaptiveLimit(min_limit=low, max_limit=high, initial_limit=low, probe_interval=None)
    algorithm = Gradient(spec, random.Random(0), timed=True)
    now = 0.0
    for step, ago, latency, dropped, inflight, fire in feed:
        now += step
        if fire and algorithm.open_at is not None:
            algorithm.open_test(max(now, algorithm.open_at), inflight)
            assert low <= algorithm.applied <= high
        limit = algorithm.update(now, now - ago, latency, dropped, inflight)
        assert low <= limit <= high
        assert limit - int(algorithm.limit) in (0, 1) or limit in (low, high)


def test_an_exchange_that_ends_unfed_closes_a_tests_slot_too() -> None:
    """A request cancelled before its head (or failed otherwise than by a timeout) gives
    no sample but frees a slot: it closes the test's slot as an end does, or the limiter
    would hand that slot on at one more than the base for as long as ends stay unfed."""
    spec = AdaptiveLimit(initial_limit=4, probe_interval=None)
    rotation = Rotation(spec, lambda now: 4, seed=6, controlled=True)
    controller, algorithm = rotation.controller, rotation.algorithm
    assert controller is not None
    rotation.run(3.0)
    step_until(rotation, lambda: bool(rotation.live_timers()))
    [timer] = rotation.live_timers()
    rotation.now = timer.when
    timer.cancelled = True  # (fired)
    timer.callback()
    assert algorithm.applied == 5
    # The next end is a cancellation: no sample, the slot closes (running still counts it).
    rotation.running += 1  # (the test's request, admitted)
    controller.failed(rotation.now - 0.01, asyncio.CancelledError())
    assert algorithm.applied == 4 and rotation.set_limits[-1][1] == 4
    assert rotation.live_timers() == []


def test_an_unfed_end_makes_a_named_instant_stale() -> None:
    rotation = settled_at(4, seed=7)
    algorithm = rotation.algorithm
    step_until(rotation, lambda: algorithm.open_at is not None and algorithm.applied == 4)
    algorithm.unfed_end(rotation.now, 4)
    assert algorithm.open_at is None and algorithm.applied == 4
