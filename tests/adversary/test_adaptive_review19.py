"""A nineteenth review's attack on da0bc3f (``TOP_TOLERANCE``) and 5b0022e (review 18's three
mends: the exposed exchanges only when their median is above 0, a chain's fall judged at
``REPROBE_FALL``, a chain's probe that measured nothing back to the estimate before it).

A strict xfail is a defect (its reason says what is wrong); a plain test is an attack that
held.  The pure algorithm is fed by ``window`` / ``quiet_windows``
(``tests/unit/test_adaptive.py``), by review 18's ``fall_to_a_probe``, or by saturated rounds
against a FIFO queue; "before" is 5b0022e^ (the package with that commit's parent's
``_adaptive.py``) in the same feed.

What did not hold:

- The guard's band is two tolerances taken within 1.1-1.5, up to 2.25: past the fall that
  starts a probe (``FALL_TO_PROBE``: half the peak, a factor of 2) for any tolerance from
  sqrt(2) up.  So at 1.5, 2.0 and 3.0 a fall from 36 to 16 in two cuts (45% of the peak)
  starts the fall's probe ("the limit fell to half its peak of 36 or less": a fall by the
  algorithm's own account) and yet keeps 36 as the ceiling (the top): the climb back goes a
  slot a window from 16, at 36 again 22 windows later, against 11 for the same fall to 15
  (which marks 20).  Review 16's case at 3.0 (a fall to a quarter) is mended; a fall to
  between 1/2.25 and 1/2 is not.  A band under 2 (``TOP_TOLERANCE = (1.1, 1.4)``, sketched,
  not landed) turns the xfail into a pass, every other test here passing, and keeps
  ``tests/unit/test_adaptive.py`` and reviews 16-18 as they are (102 passed, review 16's open
  xfail still xfails); it changes nothing at a tolerance up to 1.4 (the lab's 1.1 included),
  so the model's figures stand by construction.  The cost is in the climb past the capacity
  to the old ceiling: in saturated rounds against a FIFO queue (24 workers falling to 11 or
  12 and back every 120 rounds, +-10%, seeds 1-8, 720 rounds) the limit is back at the
  capacity in 4-5 rounds either way and the goodput differs by 0.0004 at most (0.8934
  against 0.8930 at tolerance 1.5), since a limit past the capacity is queue there; it shows
  against a dependency whose capacity came back above the old ceiling.  Mended after the
  review as sketched (``TOP_TOLERANCE = (1.1, 1.4)``): the test below is a plain one now.

What held (plain tests below, figures where measured):

- Cuts in a row at the sawtooth's top keep the highest at tolerances 1.3, 1.5, 2.0 and 3.0
  (21 -> 19 -> 18, the climb a slot a window past 21), and at 1.2-1.4 a fall from 36 to 16
  marks its last cut (band 1.44-1.96, under the fall's 2).  Exactly two tolerances (25 x
  1.44 = 36 at 1.2; 16 x 2.25 = 36 at 1.5, the xfail's) read as the top, as ``>=`` says; at
  1.4, ``1.4**2`` is 1.9599999999999997 in floats, so 25 under a ceiling of 49 reads as a fall
  by one ulp (no test: a slot's worth of boundary).
- (c) when the chain's first reading was right: a dependency 4x slower for good (no queue at
  the probe's slots), the chain's second probe refused throughout.  The estimate goes back
  to 0.1 s, as the mend says; the windows then read 4x and cut 16 -> 8 -> 4, which starts
  the fall's probe at one slot (8 exchanges, 8 rounds), which reads 0.4 s; the limit is back
  at the capacity within 30 rounds.  Goodput over the next 100 rounds (FIFO, service 0.4
  s), of the capacity's: 0.830 at 16 workers from a limit of 64 (1.000 when the second probe
  is answered; before 5b0022e the first reading stood, as answered), 0.939 from 128; at 32
  workers 0.789 (0.950) and 0.885 (1.000).  A bounded cost, once, against review 18's queue
  that stood to the next periodic probe; probing once more at the same slots instead might
  cost less (not tried).
- (b) ``REPROBE_FALL`` does not run a chain on noise: a dependency 3x slower for good under
  a wide spread (lognormal sigma 0.5 and 1, the spread learned first, seeds 1-60, 400
  rounds): 60 probes again in 60 seeds, the estimate that stands 0.82x the truth at the
  lowest (median 0.99), every figure the same with the fall judged at the threshold as
  before (``REPROBE_FALL`` set to 100).
- (a) and no_load 0 elsewhere: hostile feeds (latencies of 0 in windows and probes, a clock
  of 15.6 ms ticks, drops, refusals, windows of drops or refusals only, ``min_limit`` 1-5,
  tolerances 1.01-3, timed or not; 6000 seeds of 300 rounds) raise nothing and never set
  ``no_load`` to 0 nor the limit out of its bounds; before 5b0022e the same feeds set it to
  0, first at seeds 35, 122, 136 and 171.  A chain's probe of latencies of 0 brings back the
  estimate before the chain, at ``min_limit`` 2 too.
"""

from __future__ import annotations

import math
import random

import pytest

from httpx_bulkhead import AdaptiveLimit
from httpx_bulkhead._adaptive import Gradient
from tests.unit.test_adaptive import at_after_probe as after_probe
from tests.unit.test_adaptive import quiet_windows, window

from .test_adaptive_review18 import fall_to_a_probe, queue_of_2


def two_cuts(tolerance: float, start: int, first: float, second: float) -> tuple[Gradient, float]:
    """From ``start`` slots (one quiet window first: the peak), two windows that cut to about
    ``first`` and ``second`` slots (the aimed cut, ``tolerance * 1.02 / ratio``), then the
    probe that may follow, reading the truth."""
    algorithm, now = after_probe(start, tolerance)
    now = window(algorithm, now, [0.1] * start)
    for before, after in ((start, first), (int(first), second)):
        ratio = before * tolerance * 1.02 / after
        now = window(algorithm, now, [0.1 * ratio] * max(8, algorithm.applied))
    while algorithm._probing:
        now = window(algorithm, now, [0.1] * max(8, 4 * algorithm.applied))
    return algorithm, now


def windows_to(algorithm: Gradient, now: float, limit: int) -> int:
    """Quiet windows until the limit is back at ``limit`` (40 at most)."""
    limits = quiet_windows(algorithm, now, 40)
    return next(i + 1 for i, at in enumerate(limits) if at >= limit)


# -- the guard (da0bc3f) --


@pytest.mark.parametrize("tolerance", [1.5, 2.0, 3.0])
def test_a_fall_that_starts_a_probe_marks_its_last_cut(tolerance: float) -> None:
    algorithm, now = two_cuts(tolerance, 36, 20.5, 16.5)
    probes = [why for _, reason, why in algorithm.moves if reason == "probe"]
    assert probes[-1] == "the limit fell to half its peak of 36 or less"
    assert algorithm.applied == 16
    assert windows_to(algorithm, now, 36) <= 11


@pytest.mark.parametrize("tolerance", [1.5, 2.0, 3.0])
def test_a_fall_to_fifteen_marks_its_last_cut(tolerance: float) -> None:
    """The partner: 36 -> 20 -> 15 (under 36 / 2.25): the ceiling is 20, 36 after 11."""
    algorithm, now = two_cuts(tolerance, 36, 20.5, 15.5)
    assert algorithm.applied == 15 and algorithm._ceiling == 20
    assert windows_to(algorithm, now, 36) == 11


@pytest.mark.parametrize("tolerance", [1.2, 1.3, 1.4])
def test_below_the_clamp_a_fall_to_under_half_marks_its_last_cut(tolerance: float) -> None:
    """At 1.2-1.4 the band (1.44-1.96) is under the fall's 2: 36 -> 20 -> 16 marks 20."""
    algorithm, now = two_cuts(tolerance, 36, 20.5, 16.5)
    assert algorithm.applied == 16 and algorithm._ceiling == 20
    assert windows_to(algorithm, now, 36) <= 11


@pytest.mark.parametrize("tolerance", [1.3, 1.5, 2.0, 3.0])
def test_cuts_in_a_row_at_the_top_keep_the_highest(tolerance: float) -> None:
    """21 -> 19 -> 18 just over the tolerance (the sawtooth's top, as the unit test's at
    1.1): the ceiling stays 21 and the climb goes a slot a window past it."""
    algorithm, now = after_probe(21, tolerance)
    for before, after in ((21, 19.5), (19, 18.5)):
        ratio = before * tolerance * 1.02 / after
        assert ratio > tolerance
        now = window(algorithm, now, [0.1 * ratio] * before)
    assert algorithm.applied == 18 and algorithm._ceiling == 21
    assert quiet_windows(algorithm, now, 7) == [18, 18, 19, 20, 21, 22, 23]


def test_exactly_two_tolerances_is_the_top() -> None:
    """36 -> 30 -> 25 at 1.2: 25 x 1.2**2 == 36, within two tolerances (``>=``), the top."""
    algorithm, _ = two_cuts(1.2, 36, 30.5, 25.5)
    assert algorithm.applied == 25 and 25 * 1.2**2 == 36
    assert algorithm._ceiling == 36


# -- the chain's probe that measured nothing (5b0022e, c) --


def slowed_then_refused(
    workers: int, limit: int, refused: bool, rounds: int = 100
) -> tuple[Gradient, float, list[int]]:
    """A dependency 4x slower for good (0.4 s, FIFO of ``workers``) after a fall from
    ``limit`` slots: the first probe reads 0.4 s (no queue at its slots), the chain's second
    is refused throughout (``refused``) or answered; then ``rounds`` saturated rounds.
    Returns the gradient, the goodput of those rounds (of the capacity's) and their limits."""
    algorithm, now = fall_to_a_probe(limit, 0.4)
    probe = 0
    while algorithm._probing:
        at = algorithm.applied
        probe += 1
        latency = 0.4 * max(1.0, at / workers)
        for _ in range(max(8, 4 * at)):
            if refused and probe == 2:
                algorithm.unfed_end(now + 0.001, at, refused=now)
            else:
                algorithm.update(now + latency, now, latency, False, at)
        now += latency * 1.1
    assert probe == 2
    assert algorithm.no_load == pytest.approx(0.1 if refused else 0.4)
    answered = capacity = 0.0
    limits = []
    for _ in range(rounds):
        at = algorithm.applied
        limits.append(at)
        latency = 0.4 * max(1.0, at / workers)
        for _ in range(at):
            algorithm.update(now + latency, now, latency, False, at)
        now += latency
        answered += at
        capacity += workers * latency / 0.4
    return algorithm, answered / capacity, limits


@pytest.mark.parametrize(
    ("workers", "limit", "floor"), [(16, 64, 0.8), (16, 128, 0.9), (32, 128, 0.85)]
)
def test_a_right_first_reading_whose_second_probe_is_refused_costs_one_fall(
    workers: int, limit: int, floor: float
) -> None:
    """Restored to 0.1 s, the windows read 4x and the fall's probe re-reads 0.4 s: back at
    the capacity within 30 rounds, the goodput of 100 rounds 0.79-0.94 (1.0 answered)."""
    algorithm, goodput, limits = slowed_then_refused(workers, limit, refused=True)
    assert algorithm.no_load == pytest.approx(0.4)
    assert min(limits) >= 1 and max(limits[30:]) >= workers
    assert goodput >= floor
    _, answered, _ = slowed_then_refused(workers, limit, refused=False)
    assert answered >= 0.95 and goodput < answered


@pytest.mark.parametrize("min_limit", [1, 2])
def test_a_chain_s_probe_of_latencies_of_0_restores_the_estimate_before(min_limit: int) -> None:
    """A clock too coarse for the chain's second probe (every latency 0): the estimate before
    the chain (0.1 s) comes back, and windows after it divide by nothing of 0."""
    algorithm, now = fall_to_a_probe(80, 0.15, min_limit=min_limit)
    at = algorithm.applied
    now = window(algorithm, now, [queue_of_2(at)] * max(8, 4 * at))
    assert algorithm._probing and algorithm.applied == at // 2
    now = window(algorithm, now, [0.0] * max(8, 4 * algorithm.applied))
    assert not algorithm._probing and algorithm.no_load == pytest.approx(0.1)
    assert algorithm.moves[-1][2] == "no latency measured (the clock is too coarse)"
    for _ in range(20):
        now = window(algorithm, now, [queue_of_2(algorithm.applied)] * max(8, algorithm.applied))
    assert algorithm.no_load is not None and algorithm.no_load > 0


# -- REPROBE_FALL under a wide spread (5b0022e, b) --


@pytest.mark.parametrize("seed", range(1, 5))
def test_a_wide_spread_does_not_run_a_chain_for_a_dependency_that_slowed(seed: int) -> None:
    """3x slower for good at lognormal sigma 1 (the spread learned first): one probe again
    per fall, and the estimate that stands within 20% of the truth."""
    rng = random.Random(seed)
    spec = AdaptiveLimit(initial_limit=32, probe_interval=None)
    algorithm = Gradient(spec, random.Random(seed))
    now = 0.0

    def saturated(service: float) -> None:
        nonlocal now
        at = algorithm.applied
        latencies = sorted(service * rng.lognormvariate(0, 1.0) for _ in range(at))
        for latency in latencies:
            algorithm.update(now + latency, now, latency, False, at)
        now += latencies[-1]

    for _ in range(60):
        saturated(0.1)
    assert algorithm._wide
    algorithm.moves.clear()
    for _ in range(400):
        saturated(0.3)
    again = [why for _, reason, why in algorithm.moves if reason == "probe" and "read" in why]
    assert len(again) == 1
    assert algorithm.no_load is not None and 0.8 <= algorithm.no_load / 0.3 <= 1.25


# -- no_load 0 or out of bounds under hostile feeds (5b0022e, a) --


def hostile(seed: int) -> None:
    """300 rounds of a hostile feed: latencies of 0, a clock of 15.6 ms ticks, drops,
    refusals, ``min_limit`` 1-5, tolerances 1.01-3, timed or not."""
    rng = random.Random(seed)
    low = rng.choice([1, 1, 2, 3, 5])
    high = rng.choice([low, low + 3, 40, 200])
    tolerance = rng.choice([1.01, 1.1, 1.2, 1.5, 2.0, 3.0, rng.uniform(1.001, 3)])
    spec = AdaptiveLimit(
        min_limit=low,
        max_limit=high,
        initial_limit=rng.randint(low, high),
        tolerance=tolerance,
        probe_interval=rng.choice([None, 1.0, 5.0]),
    )
    algorithm = Gradient(spec, random.Random(seed), timed=rng.random() < 0.5)
    service = rng.choice([0.0, 0.001, 0.0156, 0.1])
    now = 0.0
    for _ in range(300):
        at = algorithm.applied
        mean = rng.choice([service, 0.0, 0.1, 0.4, 0.0156])
        zeros, drops, refusals = rng.random(), rng.random() * 0.3, rng.random() * 0.5
        ends: list[tuple[float, str, float]] = []
        for _ in range(at):
            u = rng.random()
            if u < refusals:
                ends.append((now + 0.001, "refused", 0.0))
            elif u < refusals + drops:
                ends.append((now + mean, "dropped", mean))
            else:
                sigma = rng.choice([0.05, 0.5, 1.0])
                latency = 0.0 if rng.random() < zeros / 2 else mean * rng.lognormvariate(0, sigma)
                if service == 0.0156:  # (Windows' ticks before Python 3.13)
                    latency = math.floor(latency / 0.0156) * 0.0156
                ends.append((now + latency, "answered", latency))
        ends.sort(key=lambda end: end[0])
        for end, kind, latency in ends:
            if algorithm.open_at is not None and algorithm.open_at <= end:
                algorithm.open_test(algorithm.open_at, at)
            if kind == "refused":
                algorithm.unfed_end(end, at, refused=now)
            else:
                algorithm.update(end, now, latency, kind == "dropped", at)
        now = max(now + 0.002, ends[-1][0] if ends else now + 0.01)
        no_load = algorithm.no_load
        assert no_load is None or (0 < no_load < math.inf), (seed, no_load)
        assert low <= algorithm.base <= high


def test_hostile_feeds_never_set_no_load_to_0() -> None:
    """Seeds 0-199 (before 5b0022e: no_load 0 at seeds 35, 122, 136 and 171)."""
    for seed in range(200):
        hostile(seed)


def test_the_chain_s_figures_are_the_docstring_s() -> None:
    """(Measured.)  The goodput after a right first reading whose second probe is refused,
    to two places, at 16 workers from 64 slots: 0.83 (1.00 answered)."""
    _, refused, _ = slowed_then_refused(16, 64, refused=True)
    _, answered, _ = slowed_then_refused(16, 64, refused=False)
    assert (round(refused, 2), round(answered, 2)) == (0.83, 1.0)
