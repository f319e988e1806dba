"""A fourth review's attack on the headroom tests' verdict (aa98889).

What landed: a test's exchanges are judged against ``no_load + TEST_VERDICT * (due_at -
started)``, ``due_at = min(_test_due, _test_closed)`` (the end that closed the test's slot,
if it came before the instant named), and ``_judge`` reads informativeness from the same
``due_at``; ``TEST_INFORMATIVE`` 0.15 (was 0.22), ``TEST_GAP`` 2 (was 4), ``GROWTH`` 1.35
(was 1.5).

A strict xfail is a defect (its reason says what is wrong); a plain test is an attack that
held.  ``Rotation`` (``tests/unit/test_adaptive_headroom.py``: a FIFO dependency in virtual
time, each exchange served in ``SERVICE`` x U[0.9, 1.1], a client that always has a request
ready) drives the algorithm; ``Draws`` fixes the draw of one exchange's service time.

The model (``benchmarks/adaptive_sim.py``, seeds 1-160, quiet/loaded) reproduces the commit's
figures: 120/34 runs meet phases 1 and 3's targets; phase 3's goodput 0.913/0.894, p99 above
1.5x in 0/33; phase 2's p99 from 5 s in 1.42x/1.49x (above 1.5x in 5/33), phase 1's in 7/76.

Mended after the review (three of its defects, which now hold: a failed test's wait must be
``TEST_FAIL_INFORMATIVE``, ``_fail_base`` keeps the highest failed base, the fallback growth
counts ``TEST_FALLBACK`` windows): 120/33, 0/36, 1.415x/1.49x (above 1.5x in 3/34).  Left
open: our own stall over the closing end (as before the commit), and the slower climb from
4 slots to 64 workers (``GROWTH`` 1.35, the price of phase 3's p99).
"""

from __future__ import annotations

import heapq
import math
import random

import pytest

import httpx_bulkhead._adaptive as adaptive
from httpx_bulkhead import AdaptiveLimit
from httpx_bulkhead._adaptive import AIMD, TEST_AIM, TEST_VERDICT
from tests.unit.test_adaptive_headroom import SERVICE, Draws, Rotation, step_until


class Stalled(Rotation):
    """A rotation whose process stalls over ``stall`` (``[from, to)``): an exchange that
    ends in it frees its worker then (the dependency takes its next request at once), but
    our side sees the end, feeds it and releases its slot at ``to``."""

    stall = (math.inf, math.inf)

    def seen_at(self, end: float) -> float:
        return self.stall[1] if self.stall[0] <= end < self.stall[1] else end


def opened(capacity: list[int], seed: int = 1) -> tuple[Stalled, float, float, float]:
    """Settled at ``capacity[0]`` (4) workers; a test's slot opened at the instant named,
    its request admitted at once (waiting, if no worker is free): the rotation, the
    instant, the instant named for the first end, ``no_load``.  One test succeeded before
    (``_wins`` 1), and no informative failure bounds a doubling (``_fail_base`` 0)."""
    spec = AdaptiveLimit(initial_limit=capacity[0], probe_interval=None)
    rotation = Stalled(spec, lambda now: capacity[0], seed)
    rotation.run(3.0)
    algorithm = rotation.algorithm
    step_until(rotation, lambda: algorithm.open_at is not None)
    open_at, no_load = algorithm.open_at, algorithm.no_load
    assert open_at is not None and no_load is not None
    assert no_load == pytest.approx(SERVICE, rel=0.05)
    assert open_at < rotation.ends[0][0]
    rotation.now = open_at
    assert algorithm.open_test(open_at, 4)
    algorithm._wins, algorithm._fail_base = 1, 0
    due = algorithm._test_due
    assert rotation.ends[0][0] == pytest.approx(due, abs=0.012)  # the one named
    return rotation, open_at, due, no_load


def end_first_at(rotation: Rotation, when: float) -> None:
    """The exchange in flight due first ends at ``when`` instead (its own spread)."""
    _, seq, start = heapq.heappop(rotation.ends)
    heapq.heappush(rotation.ends, (when, seq, start))
    assert rotation.ends[0] == (when, seq, start)


def judged(rotation: Rotation, open_at: float) -> None:
    """Run until the test's request (started at ``open_at``) has ended."""
    step_until(rotation, lambda: any(begun == open_at for begun, _, _ in rotation.done))
    assert rotation.algorithm._test_closed is None  # (its verdict is in)


# --- defects ------------------------------------------------------------------------


def test_a_request_that_found_a_worker_free_is_not_failed_by_its_own_spread() -> None:
    """4 slots, 64 workers from the instant the slot opens (the capacity rose): the test's
    request is served at once, in 1.095x the service time (within the spread).  The first
    end due comes 0.152 ``no_load`` after the slot opened (0.18 early, within the spread):
    ``due_at`` is that end, the request is allowed 1.076x ``no_load`` and fails, with the
    wait taken as informative.
    Over seeds 1-40 of 4 -> 64 workers at 10 s, the tests until the limit passed 8 fail
    informatively 9 times in 95 (0 in 82 before the commit).
    Mended: a failed test tells only with a wait of ``TEST_FAIL_INFORMATIVE`` (0.22)
    ``no_load`` at least."""
    capacity = [4]
    rotation, open_at, _, no_load = opened(capacity)
    capacity[0] = 64
    end_first_at(rotation, open_at + 0.152 * no_load)
    served = 1.095  # (of SERVICE, within the spread)
    assert served * SERVICE > no_load * (1 + TEST_VERDICT * 0.152)
    rotation.rng = Draws(served, seed=1)
    rotation.run(open_at)
    assert rotation.running == 5 and rotation.busy == 5  # served at once: no wait
    judged(rotation, open_at)
    algorithm = rotation.algorithm
    # A success (the second in a row doubles), or at worst a test that told nothing.
    assert algorithm.base == 8 or (algorithm._wins == 1 and algorithm._fail_base == 0)


@pytest.mark.xfail(
    strict=True,
    reason="our own stall over the end that closed the slot: _test_closed is when we saw "
    "it, not when the worker came free, so due_at falls back to the instant named and a "
    "wait the dependency's spread cut short passes as a free worker (the defect the commit "
    "mends, back whenever a stall of 20 ms covers that end: ~1% of tests in the loaded "
    "noise's stalls)",
)
def test_a_stall_of_our_own_over_the_closing_end_does_not_hide_a_short_wait() -> None:
    """The commit's own case (4 workers, none free; the first end due comes 18 ms early, the
    test's request waits 15 ms and is served in 0.95x: 0.110 s), with our process stalled
    from 2 ms before that end to 2 ms after the instant named: the end is seen late, the
    request is judged by the wait predicted (33 ms), passes, and a second success in a row
    doubles the limit to 8 at a capacity of 4."""
    capacity = [4]
    rotation, open_at, due, no_load = opened(capacity)
    early = due - 0.018
    end_first_at(rotation, early)
    rotation.stall = (early - 0.002, due + 0.002)
    rotation.rng = Draws(0.95, seed=1)
    rotation.run(open_at)
    assert rotation.running == 5 and rotation.busy == 4  # it waits for a worker
    judged(rotation, open_at)
    latency = next(lat for begun, lat, _ in rotation.done if begun == open_at)
    assert latency < no_load + TEST_VERDICT * (due - open_at)  # passes as predicted
    assert rotation.algorithm.base == 4


@pytest.mark.parametrize("seed", [7, 8])
def test_at_an_unchanged_capacity_of_4_the_limit_is_not_doubled(seed: int) -> None:
    """4 workers for a minute (seeds 7 and 8 of 1-10): from 5 s on, the limit the windows
    judge never goes above 5.  Before the commit: never above 4 in seeds 1-10; after it,
    seeds 7 and 8 reach 6 (a cut to 3, an informative failure at 3 that makes it the last
    failure's base, two successes at 3).  The price of the tests' frequency, also: 3.3
    responses a minute above 1.5x the service time (0.8 before), 136 tests' requests (72).
    Mended: ``_fail_base`` keeps the highest base that failed."""
    spec = AdaptiveLimit(initial_limit=4, probe_interval=None)
    rotation = Rotation(spec, lambda now: 4, seed)
    rotation.run(5.0)
    highest = 0
    while rotation.now < 50.0:
        rotation.run(rotation.now + 0.05)
        highest = max(highest, rotation.algorithm.base)
    assert highest <= 5


def test_a_climb_from_4_slots_to_64_workers_is_in_band_within_5_s() -> None:
    """``initial_limit=4`` at a dependency of 64 workers (seeds 1-10): the limit reaches 48
    (the issue's band, N +- 25%) within 5 s.  Was a strict xfail for seed 8: a test whose
    request found a worker free failed (an early end cut its wait to 0.294 no_load, and
    ``no_load``, the median of the first probe's 8 exchanges, read 5% low: the allowance
    1.147x of it under 1.1x the service time), delaying the doubling by 0.4 s; in band
    after 5.17 s, over seeds 1-10 3.30 s on average.  Since ``no_load`` is the geometric
    mean of the middle of the probe (``_centre``): 2.94-3.19 s, 3.04 s on average."""
    for seed in range(1, 11):
        spec = AdaptiveLimit(initial_limit=4, probe_interval=None)
        rotation = Rotation(spec, lambda now: 64, seed=seed)
        while rotation.algorithm.base < 48 and rotation.now < 5.0:
            rotation.run(rotation.now + 0.01)
        assert rotation.algorithm.base >= 48, (seed, rotation.now)


class Lulls(Rotation):
    """A client with a request always ready for 2 s, then for 1 s only 3 at a time."""

    def _admit(self) -> None:
        applied = self.algorithm.applied
        ready = applied if self.now % 3.0 < 2.0 else min(3, applied)
        while self.running < ready:
            self.running += 1
            self.admitted_under[self.now] = applied
            self.queue.append(self.now)
        self._serve()


def test_traffic_that_lulls_at_a_capacity_of_4_keeps_the_p99_under_1_5x() -> None:
    """4 workers, a client that lulls (``Lulls``), seeds 1-3 for a minute: the p99 from
    5 s on, pooled, within the issue's 1.5x of the service time.
    Mended: the fallback after ``TEST_FALLBACK`` (6) windows, whatever ``TEST_GAP``."""
    latencies: list[float] = []
    for seed in (1, 2, 3):
        spec = AdaptiveLimit(initial_limit=4, probe_interval=None)
        rotation = Lulls(spec, lambda now: 4, seed)
        rotation.run(60.0)
        latencies += rotation.latencies(since=5.0)
    latencies.sort()
    assert latencies[int(0.99 * len(latencies))] <= 1.5 * SERVICE


# --- what holds ---------------------------------------------------------------------


@pytest.mark.parametrize("after", [0.02, 0.18])
@pytest.mark.parametrize("refusal", [False, True])
def test_a_slot_closed_by_an_end_that_freed_no_worker_is_no_success(
    after: float, refusal: bool
) -> None:
    """4 workers, none free; ``after`` x ``no_load`` after the slot opened, a caller
    cancels an exchange in flight (HTTP/1.1: the dependency's worker goes on with it), or
    the dependency refuses one (``unfed_end`` with its start): the slot closes though no
    worker came free, and the test's request waits for the first end due (about 1.33x).
    Judged by that early close, the allowance is smaller still: at 0.02 the test tells
    nothing (a wait under ``TEST_INFORMATIVE``), at 0.18 it fails; never a success."""
    capacity = [4]
    rotation, open_at, _, no_load = opened(capacity)
    rotation.run(open_at)
    assert rotation.running == 5 and rotation.busy == 4
    algorithm = rotation.algorithm
    closed = open_at + after * no_load
    assert closed < rotation.ends[0][0]
    last = max(rotation.ends)
    rotation.ends.remove(last)  # (its worker stays busy: the dependency never sees it end)
    heapq.heapify(rotation.ends)
    algorithm.unfed_end(closed, rotation.running, last[2] if refusal else None)
    rotation.running -= 1
    assert algorithm.applied == 4 and algorithm._test_closed == closed
    judged(rotation, open_at)
    latency = next(lat for begun, lat, _ in rotation.done if begun == open_at)
    assert latency > no_load * (1 + TEST_AIM) - 0.012  # it waited for the end due
    assert algorithm.base == 4 and algorithm._wins <= 1  # (no success: 1 before it)


class Lognormal(random.Random):
    """``uniform`` draws a lognormal factor of median 1 (a spread of ``sigma``) instead."""

    def __init__(self, sigma: float, seed: int) -> None:
        super().__init__(seed)
        self.sigma = sigma

    def uniform(self, a: float, b: float) -> float:
        return self.lognormvariate(0.0, self.sigma)


def test_a_wide_spread_still_turns_the_tests_off() -> None:
    """4 workers serving with a spread of 0.5 (``_wide``): no test's slot opens once the
    spread is measured, for 30 s (the commit does not touch that path)."""
    spec = AdaptiveLimit(initial_limit=4, probe_interval=None)
    rotation = Rotation(spec, lambda now: 4, seed=2)
    rotation.rng = Lognormal(0.5, seed=2)
    algorithm = rotation.algorithm
    step_until(rotation, lambda: algorithm._wide)
    while rotation.now < 30.0:
        rotation.run(rotation.now + 0.005)
        assert algorithm._wide
        assert algorithm.applied == algorithm.base and algorithm._test_closed is None


def test_aimd_does_not_follow_growth(monkeypatch: pytest.MonkeyPatch) -> None:
    """AIMD's additive increase and its backoff read nothing the commit changed: the same
    drops give the same limits with ``GROWTH`` at 1.5 and at 1.35."""

    def limits(growth: float) -> list[int]:
        monkeypatch.setattr(adaptive, "GROWTH", growth)
        algorithm = AIMD(AdaptiveLimit(algorithm="aimd", initial_limit=4))
        out, now = [], 0.0
        for i in range(400):
            now += 0.01
            algorithm.update(now, now - 0.1, 0.1, i % 97 == 96, algorithm.applied)
            out.append(algorithm.applied)
        return out

    assert limits(1.5) == limits(1.35)
