"""A sixteenth review's attack on two changes to the gradient (20e5bd2, 1f3a821).

1f3a821 was reverted after this review (0b4bfd5) for the last finding below: its test is now a
plain one that the reverted code passes, so that a later mend of the same loop (a slot of
queue read as a wide spread) cannot learn the spread this late without failing it.

What landed: after cuts in a row at the sawtooth's top the *ceiling* (the last queue, which
decides when growth is past it, ``ESCAPE``, and steps x``GROWTH``) is the highest of them,
unless the limit is more than two tolerances below it (a fall); a probe clears the run
(20e5bd2).  A window that read a queue (its judged ratio over the tolerance) adds nothing to
the latency spread (``_measure_spread``); probe windows still do (1f3a821).

A strict xfail is a defect (its reason says what is wrong); a plain test is an attack that
held.  The windows are fed as ``tests/unit/test_adaptive.py`` feeds them (``window``,
``quiet_windows``: every slot in use, all at one latency).

What held: at a steady 16 workers in the lab's model (``run(seed, QUIET, sigma=...,
phases=(16,), phase_seconds=30)``, seeds 1-12), sigma 0.5 and 1 give the adaptive limit
1.050/0.991 of a static 16's goodput from 5 s in (1.045/0.995 before 1f3a821; loaded,
seeds 1-24: 1.073/0.993, the worst run 0.96/0.72, against 1.070/0.983, 0.89/0.41): with no
refusals the first probe's window measures the spread (wide by its end in every seed), and
windows without a queue keep it up to date.  At a share of fast refusals it does not (the
last xfail): the probe's window and windows at small limits hold fewer than
``WINDOW_SAMPLES`` latencies and measure nothing, and the windows that read over the
unwidened tolerance are now left out too (at 10% refused, sigma 1, seeds 1-24: wide by round
48 at the latest, 11 before 1f3a821; one run at 4 slots or fewer for 21% of its rounds, 7%).

Measured, not a defect: keeping the highest cut costs the climb after a small fall that
does not last.  In a saturated rotation (capacity 20, 40 or 80; a fall to 0.9, 0.85 or 0.8
of it for 1 s, then 1.5x it; seeds 1-12, 108 runs), the limit reached the new capacity
1.786 s after the rise on average at 20e5bd2, 1.736 s before it.  A mend of the first xfail
(the run of cuts kept over a window over the tolerance that moved nothing, reset by a
window within it or a probe) gave the same model summaries as main (15 s phases, seeds
1-160: 132 and 40 runs meeting every target of phases 1 and 3, quiet and loaded, every
figure the same) but 2.054 s there (80 -> 66 -> 120: 3.8 s against 2.7 s), so it is left
to the authors to weigh, not landed.

Mended after the review: the second and third xfails (the guard's two tolerances are the
user's taken within ``TOP_TOLERANCE``, 1.1-1.4, so at 1.01 cuts in a row at the top keep
the highest and at 3.0 a fall to a quarter marks its last cut).  The first stays open.
"""

from __future__ import annotations

import random

import pytest

from httpx_bulkhead import AdaptiveLimit
from httpx_bulkhead._adaptive import Gradient
from tests.unit.test_adaptive import at_after_probe as after_probe
from tests.unit.test_adaptive import quiet_windows, window

from .rounds import saturated_round


def windows(algorithm: Gradient, now: float, latencies: list[float]) -> float:
    """One window at each latency, every slot in use (8 exchanges at least)."""
    for latency in latencies:
        now = window(algorithm, now, [latency] * max(8, algorithm.applied))
    return now


@pytest.mark.xfail(
    strict=True,
    reason="the run of cuts is cuts in consecutive windows: a window over the tolerance whose "
    "cut rounds to nothing (1.12x after a cut aimed at 1.122x) breaks it, the last cut marks "
    "the queue at 19 and the climb back steps x1.35 at 21 into the queue 21 showed",
)
def test_a_window_over_the_tolerance_that_moved_nothing_keeps_the_run_of_cuts() -> None:
    """21 -> 19 (1.2x), then 1.12x at 19 (over the tolerance; the cut aims at 1.122x and
    rounds to 19), then 1.12x again (the second window over: a slot, 18).  That is the
    sawtooth's top as much as 21 -> 19 -> 18 in consecutive windows: the cut aims above the
    tolerance, so the window after an exact cut reads over it and moves nothing.  The
    climb back should go a slot a window past 21, as in
    ``test_cuts_in_a_row_at_the_top_keep_the_highest_as_the_last_queue``; it grows x1.35
    at 21 to 28 (a limit 1.5x the one that read 1.2x)."""
    algorithm, now = after_probe(21)
    now = windows(algorithm, now, [0.12, 0.112])
    assert algorithm.applied == 19
    now = windows(algorithm, now, [0.112])
    assert algorithm.applied == 18
    assert quiet_windows(algorithm, now, 7) == [18, 18, 19, 20, 21, 22, 23]


def test_at_a_tolerance_of_1_01_cuts_in_a_row_at_the_top_keep_the_highest() -> None:
    """The same windows as at 1.1 (1.1x at 21, 1.05x at 19: a queue of two slots, then of
    one), at a tolerance of 1.01: 21 -> 19 -> 18, a fall of 14% in the limit.  At 1.1 the
    ceiling stays 21; at 1.01 it was 19, and quiet windows grew 21 to 28.  Mended after the
    review (was a strict xfail): the tolerance of the guard is taken within
    ``TOP_TOLERANCE`` (1.1-1.4)."""
    algorithm, now = after_probe(21, tolerance=1.01)
    now = windows(algorithm, now, [0.11, 0.105])
    assert algorithm.applied == 18
    assert max(quiet_windows(algorithm, now, 7)) <= 23


def test_at_a_tolerance_of_1_1_the_same_cuts_keep_the_highest() -> None:
    """(The attack above at the default tolerance, scaled: it holds.)"""
    algorithm, now = after_probe(21)
    now = windows(algorithm, now, [0.11 * 1.1 / 1.01, 0.105 * 1.1 / 1.01])
    assert algorithm.applied == 18
    assert quiet_windows(algorithm, now, 7) == [18, 18, 19, 20, 21, 22, 23]


def test_at_a_tolerance_of_3_a_fall_marks_the_last_cut() -> None:
    """Latency 20x then 10x the no-load one: 40 -> 20 -> 10 (each cut at most half), the
    limit at a quarter of its peak, which starts a probe: a fall by the algorithm's own
    account.  Before 20e5bd2 the climb back (quiet windows) passed 22 x1.35 and was back at
    40 after 17 windows; with the ceiling kept at 40 it was at 24 then.  Mended after the
    review (was a strict xfail): the guard's tolerance is at most 1.4, two of them 1.96."""
    algorithm, now = after_probe(40, tolerance=3.0)
    now = windows(algorithm, now, [2.0, 1.0])
    assert algorithm.base == 1  # (the fall's probe)
    assert max(quiet_windows(algorithm, now, 17)) >= 40


def refused_rotation(
    seed: int, sigma: float, refused: float, rounds: int = 400
) -> list[tuple[int, bool]]:
    """A dependency of 16 workers (a FIFO queue, 100 ms) whose latencies spread as a
    lognormal of ``sigma`` and which refuses ``refused`` of the requests at once (a buggy
    endpoint's 5xx, a share that does not grow with the load): saturated rounds, each
    exchange fed as it ends.  Returns the limit after each round, and whether the spread
    read wide then."""
    rng = random.Random(seed)
    algorithm = Gradient(AdaptiveLimit(initial_limit=16, probe_interval=None), rng)
    trace: list[tuple[int, bool]] = []
    now = 0.0
    for _ in range(rounds):
        queue = max(1.0, algorithm.applied / 16)
        saturated_round(
            algorithm, rng, now, 0.1, lambda r: r.lognormvariate(0, sigma), queue, refused
        )
        now += 0.1 * queue
        trace.append((algorithm.applied, algorithm._wide))
    return trace


def learned_and_low(seed: int, sigma: float, refused: float) -> tuple[int, float]:
    """The first round at which the spread read wide (``len`` if never) and the share of
    rounds, from the first quarter on, at 4 slots or fewer."""
    trace = refused_rotation(seed, sigma, refused)
    wide = next((i for i, (_, is_wide) in enumerate(trace) if is_wide), len(trace))
    settled = [limit for limit, _ in trace[len(trace) // 4 :]]
    return wide, sum(limit <= 4 for limit in settled) / len(settled)


def test_without_refusals_the_first_probe_learns_a_wide_spread() -> None:
    """(Held.)  No refusals: the probe's window (8 exchanges at one slot) measures the
    spread, whatever the windows after it read."""
    for seed in range(1, 13):
        wide, _ = learned_and_low(seed, 0.5, 0.0)
        assert wide <= 10, seed


@pytest.mark.parametrize(("sigma", "refused"), [(1.0, 0.2), (0.5, 0.3)])
def test_with_a_share_of_refusals_a_wide_spread_is_still_learned(
    sigma: float, refused: float
) -> None:
    """16 workers, a lognormal spread, 20-30% of the requests refused at once (a share that
    does not grow with the load, which the module docstring says leaves the growth alone).
    Seeds 1-12: the spread reads wide within 40 rounds, and no run sits at 4 slots or fewer
    for more than 15% of its rounds (without 1f3a821: within 23 rounds, at most 7.3%; with
    it, round 91 and 176, 66% and 48%: it was reverted, 0b4bfd5, and this guards the next
    attempt)."""
    for seed in range(1, 13):
        wide, low = learned_and_low(seed, sigma, refused)
        assert wide <= 40, (seed, wide)
        assert low <= 0.15, (seed, low)


def climb_after_a_short_fall(seed: int, capacity: int, fall: float) -> float:
    """A saturated rotation (100 ms, +-10%) at ``capacity`` workers for 10 s, at ``fall`` of
    them for 1 s, then at 1.5x them: the seconds from the rise until the limit reaches the
    new capacity."""
    rng = random.Random(seed)
    spec = AdaptiveLimit(initial_limit=capacity, probe_interval=None, max_limit=400)
    algorithm = Gradient(spec, rng)
    rise, high = 11.0, int(capacity * 1.5)
    now = 0.0
    while True:
        workers = capacity if now < 10.0 else int(capacity * fall) if now < rise else high
        limit = algorithm.applied
        queue = max(1.0, limit / workers)
        latencies = sorted(0.1 * queue * rng.uniform(0.9, 1.1) for _ in range(limit))
        for latency in latencies:
            algorithm.update(now + latency, now, latency, False, limit)
        now += 0.1 * queue
        if now >= rise and algorithm.applied >= high:
            return now - rise


def test_the_climb_after_a_short_small_fall_is_about_as_quick_as_before() -> None:
    """(Held: the cost of 20e5bd2 measured in the module docstring.)  Falls to 0.9, 0.85 and
    0.8 of 20, 40 and 80 workers for 1 s read as the sawtooth's top (within two tolerances),
    so the ceiling stays where it was before the fall and the climb after the rise goes a
    slot a window for longer: 1.786 s on average, 1.736 s before 20e5bd2 (2.054 s with the
    run of cuts kept over windows that moved nothing).  At most 1.9 s."""
    climbs = [
        climb_after_a_short_fall(seed, capacity, fall)
        for capacity in (20, 40, 80)
        for fall in (0.9, 0.85, 0.8)
        for seed in range(1, 13)
    ]
    assert sum(climbs) / len(climbs) <= 1.9
