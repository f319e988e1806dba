"""An adversarial review of the pooled, trimmed no-load estimate (a21af09).

What landed: at a probe's end ``no_load`` is the ``_centre`` (the geometric mean of the
values less ``TRIM`` at each end, clamped to ``CENTRE_BOUND`` of their median) of a pool:
the probe's exchanges and, while the probe's own ``_centre`` agrees with ``no_load`` within
``POOL_AGREE``, the last probes' (``POOL_SAMPLES`` in all); a latency of 0 gives the median
and empties the pool, and so does a ``no_load`` moved down (``DESCENT``).

A strict xfail is a defect (its reason says what is wrong); a plain test is an attack that
held.  Its two defects (a stall beyond the trim moved the clamped estimate twice as far as
the median; a probe the fall started was pooled with the obsolete estimate's exchanges)
are mended, and their tests, plain now, say how.  Pure: ``Gradient`` fed directly (``feed``
of the unit tests: every slot in use, a
dependency without a queue), and ``_centre`` over seeded draws.  The model's figures in
the commit (seeds 1-480, 1-160) and review 4's climb (2.94-3.19 s) reproduce exactly.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable

import pytest

import httpx_bulkhead._adaptive as adaptive
from httpx_bulkhead import AdaptiveLimit
from httpx_bulkhead._adaptive import (
    CENTRE_BOUND,
    MEDIAN_SE,
    POOL_SAMPLES,
    PROBE_ROUNDS,
    Gradient,
    _centre,
    _median,
)
from tests.unit.test_adaptive_no_load import feed


def lab(rng: random.Random) -> float:
    """A latency of the lab's dependency: 100 ms +-10%."""
    return 0.1 * rng.uniform(0.9, 1.1)


def probe(gradient: Gradient, now: float, latency: Callable[[float], float]) -> float:
    """Windows of ``latency(now)`` until a probe has started and ended; returns the time."""
    while not gradient._probing:
        now = feed(gradient, now, [latency(now) for _ in range(gradient.applied)])
    while gradient._probing:
        now = feed(gradient, now, [latency(now) for _ in range(gradient.applied)])
    return now


def drifting(rng: random.Random) -> Callable[[float], float]:
    """The lab's latency, 1% slower each second."""
    return lambda now: 1.01**now * lab(rng)


@pytest.mark.parametrize(("max_limit", "bound"), [(8, 0.025), (200, 0.015)])
def test_a_slow_drift_holds_no_load_back_by_about_a_probes_step_not_for_ever(
    max_limit: int, bound: float
) -> None:
    """The dependency 1% slower a second, a probe 1-1.1 s after the last, 60 probes (an hour
    at the default interval): each agrees with a pool that lags, so ``no_load`` trails the
    truth at a probe's end by about a step with probes of 8 (the pool spans three: 1.2-1.5%
    over seeds 1-10, the median 0.3-0.6%), less with probes of 16 (0.8%, the median 0.5%),
    and no further as the hour goes on.  Behind is low: a queue reads larger, not smaller.
    The lag is counted in steps (the drift since the last probe's end, which grows as the
    probes of a slower dependency take longer): under one on average, early and late in the
    hour (seeds 1-4, since a median replaces an estimate far from it: 0.53 and 0.74 steps
    with probes of 8, 0.68 and 0.81 with probes of 16)."""
    early, late, steps_early, steps_late = [], [], [], []
    for seed in range(1, 5):
        rng = random.Random(seed)
        spec = AdaptiveLimit(initial_limit=max_limit, max_limit=max_limit, probe_interval=1.0)
        gradient = Gradient(spec, random.Random(seed))
        lags, steps, now = [], [], 0.0
        for _ in range(60):
            before, now = now, probe(gradient, now, drifting(rng))
            assert gradient.no_load is not None
            lags.append(0.1 * 1.01**now / gradient.no_load - 1)
            steps.append(lags[-1] / (1.01 ** (now - before) - 1))
        early.append(statistics.fmean(lags[10:35]))
        late.append(statistics.fmean(lags[35:]))
        steps_early.append(statistics.fmean(steps[10:35]))
        steps_late.append(statistics.fmean(steps[35:]))
    assert 0 < statistics.fmean(late) < bound, late
    assert statistics.fmean(steps_early) < 1 and statistics.fmean(steps_late) < 1, steps_late


@pytest.mark.parametrize("n", [8, 16])
@pytest.mark.parametrize("sigma", [0.25, 0.5, 1.0])
def test_under_a_wide_spread_the_pool_is_as_precise_as_probe_n_says(n: int, sigma: float) -> None:
    """Lognormal latencies, probes of ``n``: ``_margin`` takes ``no_load``'s standard error
    for ``MEDIAN_SE * sigma / sqrt(_probe_n)``, and ``_probe_n`` now counts the pool.  Over
    4000 probes, those pooled (a quarter at sigma 0.5, n 16: off by 0.107 in log, where
    0.128 is said) are no further off than said, nor is ``no_load`` biased: a larger pool
    does not shrink the margin below the noise (no noise reads as a queue)."""
    rng = random.Random(5)
    gradient = Gradient(AdaptiveLimit(probe_interval=None), random.Random(1))
    errors, pooled, said = [], [], []
    for _ in range(4000):
        samples = [math.exp(rng.gauss(0, sigma)) for _ in range(n)]
        gradient._estimate(samples, _median(samples))
        assert gradient.no_load is not None
        errors.append(math.log(gradient.no_load))
        if gradient._probe_n > n:
            pooled.append(errors[-1])
            said.append(MEDIAN_SE * sigma / math.sqrt(gradient._probe_n))
    assert abs(statistics.fmean(errors)) < 0.015
    assert len(pooled) > 100 and statistics.pstdev(pooled) <= statistics.fmean(said)


def test_a_cache_like_mixture_reads_at_most_centre_bound_off_its_median() -> None:
    """70% of the exchanges a cache's hits (10 ms), 30% its misses (100 ms): the windows'
    medians are the hits'; the geometric mean of the middle takes in misses.  Clamped to
    ``CENTRE_BOUND``, ``no_load`` was the median's and 2.3% more on average (at the bound in
    84% of probes of 16): a queue of 3% more read as none, where the median read it.  Since
    an estimate beyond the bound is the median, it is the median in nearly every probe, and
    never further from it than the bound."""
    rng = random.Random(3)
    ratios = []
    for _ in range(3000):
        values = [
            (0.01 if rng.random() < 0.7 else 0.1) * rng.uniform(0.95, 1.05) for _ in range(16)
        ]
        ratios.append(_centre(values) / _median(values))
    assert all(abs(ratio - 1) <= CENTRE_BOUND + 1e-12 for ratio in ratios)
    assert abs(statistics.fmean(ratios) - 1) < 0.005


@pytest.mark.parametrize(("n", "stalls"), [(8, 2), (16, 3), (16, 4)])
def test_stalls_beyond_the_trim_move_the_estimate_no_more_than_the_median(
    n: int, stalls: int
) -> None:
    """``_centre``'s docstring: a stall of our own over more than ``TRIM`` of the values
    moves the estimate by ``CENTRE_BOUND`` at most (the median's by nothing), keeping the
    median's robustness: on average, it moves no more than the median does.  (The median
    itself moves up to 14% here: the stalls take the place of low values.)  Was a strict
    xfail: clamped to the bound around the stalled values' median, the estimate moved by
    that median's shift and the bound more (+6.1% for 2 of 8, the median +2.9%; +5.3% for 3
    of 16, +2.2%; +6.3% for 4 of 16, +3.1%).  Mended: beyond the bound, the median."""
    rng = random.Random(3)
    moved, median_moved = [], []
    for _ in range(2000):
        values = [lab(rng) for _ in range(n)]
        hit = set(rng.sample(range(n), stalls))
        stalled = [value * 10 if i in hit else value for i, value in enumerate(values)]
        moved.append(_centre(stalled) / _centre(values) - 1)
        median_moved.append(_median(stalled) / _median(values) - 1)
    assert statistics.fmean(moved) <= statistics.fmean(median_moved) + 0.005


def test_a_probe_started_by_the_fall_moves_no_load_to_the_slower_dependency() -> None:
    """At tolerance 1.05, a dependency 5.8% slower, limit 8: the probe the fall starts
    measures the slower dependency.  Was a strict xfail: within ``POOL_AGREE`` of the
    obsolete ``no_load``, its 8 exchanges were pooled with the first probe's 8, ``no_load``
    read 102.9 ms, not 105.8, the windows 1.029x, not quiet, and the limit stayed at 4 until
    the next periodic probe (never here; by default 60 s).  Mended: a probe is pooled only
    if the part of the change the pool keeps (two thirds at most) leaves a window quiet,
    within 0.75 of the tolerance's excess (emptying the pool at every fall or min_limit
    probe instead cost the model: 357/89 runs meeting every target, against 376/100; half
    the excess, 5% at the default tolerance, 367/99)."""
    spec = AdaptiveLimit(initial_limit=8, max_limit=8, tolerance=1.05, probe_interval=None)
    gradient = Gradient(spec, random.Random(2))
    now = feed(gradient, 0.0, [0.1] * 8)
    for _ in range(20):
        now = feed(gradient, now, [0.1] * gradient.applied)
    gradient.moves.clear()
    for _ in range(60):
        now = feed(gradient, now, [0.1058] * gradient.applied)
    assert [words for _, reason, words in gradient.moves if reason == "probe"] == [
        "the limit fell to half its peak of 8 or less"
    ]
    assert gradient.no_load == pytest.approx(0.1058, rel=0.01)
    assert gradient.base == 8


@pytest.mark.parametrize(
    "values",
    [
        [1e-300, 2e-300, 3e-300, 5e-300],
        [5e-324, 5e-324, 1e-323, 1.5e-323, 1e-323, 5e-324, 2e-323, 5e-324],  # subnormals
        [1e-300, 1e300, 1.0, 0.1, 2.0, 1e-6, 3.0, 1e200],
        [1e300, 2e300, 3e300],
        [0.1],
        [0.1, math.inf, 0.1, 0.1, 0.1, 0.1, 0.1, 0.2],  # (a clock's jump, left out)
        [0.1, math.inf, math.inf, 0.1, 0.1, 0.1, 0.2, 0.1],
    ],
)
def test_the_estimate_is_finite_and_above_0_at_any_scale(values: list[float]) -> None:
    """Tiny, subnormal, huge, mixed, single, infinite latencies: never 0, nan or inf, and
    within the values.  (Two near ``sys.float_info.max`` overflow ``_median``'s sum, as they
    did before the commit: 1e308 s is no latency.)"""
    estimate = _centre(values)
    assert 0 < estimate < math.inf
    assert min(values) <= estimate <= max(values)


def test_a_latency_of_0_gives_the_median_and_empties_the_pool() -> None:
    """A probe with a 0 among positive latencies after a pooled one: the probe's median
    (above 0), the pool emptied; the next probe starts it anew."""
    gradient = Gradient(AdaptiveLimit(probe_interval=None), random.Random(1))
    gradient._estimate([0.1] * 8, 0.1)
    gradient._estimate([0.1] * 8, 0.1)
    assert len(gradient._pool) == 16
    mixed = [0.0, 0.1, 0.1, 0.0, 0.1, 0.1, 0.1, 0.0]
    gradient._estimate(mixed, _median(mixed))
    assert gradient.no_load == 0.1 and not gradient._pool and gradient._probe_n == 8
    gradient._estimate([0.1] * 8, 0.1)
    assert gradient.no_load == 0.1 and len(gradient._pool) == 8


def test_the_pool_is_bounded_and_estimated_at_probe_ends_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """100 probes at a steady dependency: the pool never holds more than ``POOL_SAMPLES``,
    and ``_centre`` runs twice per probe (its own, the pool's), never per sample, over a
    probe window's samples at most (a probe at a large limit is estimated whole: the
    window is ``PROBE_ROUNDS`` rounds of its limit; the main engineer's change, not the
    review's)."""
    sizes: list[int] = []
    real = adaptive._centre

    def counted(values: list[float]) -> float:
        sizes.append(len(values))
        return real(values)

    monkeypatch.setattr(adaptive, "_centre", counted)
    rng = random.Random(4)
    gradient = Gradient(AdaptiveLimit(initial_limit=64, probe_interval=0.5), random.Random(3))
    now, probes = 0.0, 0
    while probes < 100:
        now = probe(gradient, now, lambda now: lab(rng))
        probes += 1
        assert len(gradient._pool) <= POOL_SAMPLES
    window = max(POOL_SAMPLES, PROBE_ROUNDS * gradient.spec.max_limit)
    assert len(sizes) <= 2 * probes and max(sizes) <= window


@pytest.mark.parametrize(("max_limit", "first"), [(8, 1.034), (64, 1.0)])
def test_a_faster_dependency_under_descent_is_followed_within_two_probes(
    max_limit: int, first: float
) -> None:
    """4.5% faster (windows under ``DESCENT``, so the pool is kept): the first probe after
    agrees and is pooled with the older exchanges, ``no_load`` 3.4% high with probes of 8
    (1.3% with 16: a queue that much larger reads as none for a probe interval), the
    median's was exact; within two more probes it is exact too.  (A probe at 16 slots, of
    64 exchanges since ``PROBE_ROUNDS``, counts alone: exact at once.)"""
    spec = AdaptiveLimit(initial_limit=max_limit, max_limit=max_limit, probe_interval=1.0)
    gradient = Gradient(spec, random.Random(2))
    now = probe(gradient, probe(gradient, 0.0, lambda now: 0.1), lambda now: 0.1)
    errors = []
    for _ in range(3):
        now = probe(gradient, now, lambda now: 0.0955)
        assert gradient.no_load is not None
        errors.append(gradient.no_load / 0.0955)
    assert errors[0] == pytest.approx(first, abs=0.001) and errors[-1] == pytest.approx(1.0)
