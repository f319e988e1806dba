"""An adversarial review of 8f94404: at one slot, a window within the tolerance is pooled.

What landed: a window closed at base 1 (not a probe), without a drop, whose median is within
``tolerance`` (and the spread's margin) of ``no_load``, with no latency of 0, joins the pool
(``POOL_SAMPLES``); ``no_load`` is then the pool's ``_centre``, ``_probe_n`` its size, and the
window counts as none at ``min_limit`` (no probe follows it).

A strict xfail is a defect (its reason says what is wrong); a plain test is an attack that
held.  Pure: ``Gradient`` fed directly (``serial``: one exchange after another, at one slot;
``max_limit=1`` where the estimate alone is under test), and the unit tests' ``Rotation``
for a headroom test at one slot.  The commit's model figures reproduce (sigma 0.5, seeds
1-160: 11/6 phases of 480 under half the best static goodput from 5 s in, 14/8 before; the
lab's spread: 319 of 320 runs the same, loaded seed 39's phase 2 0.58 -> 0.73).  Its xfails
all pass with one mend (not landed here): pool a window only without DESCENT in it, within
the tolerance on both sides, with every latency in (0, inf), and leave ``_probe_n`` at the
probe's count; in the model (sigma 0.5) 11/3 phases under half.
"""

from __future__ import annotations

import math
import random
import statistics

import pytest

from httpx_bulkhead import AdaptiveLimit
from httpx_bulkhead._adaptive import (
    FIRST_PROBE_SAMPLES,
    MEDIAN_SE,
    MIN_LIMIT_WINDOWS,
    WINDOW_SAMPLES,
    Gradient,
    _centre,
    _median,
)
from tests.unit.test_adaptive_headroom import SERVICE, Rotation
from tests.unit.test_adaptive_no_load import at_one, serial


def fixed_at_one(seed: int) -> Gradient:
    """A gradient held at one slot (``max_limit=1``): every window is at ``min_limit``."""
    spec = AdaptiveLimit(initial_limit=1, max_limit=1, probe_interval=None)
    return Gradient(spec, random.Random(seed))


def lognormal(rng: random.Random, sigma: float, n: int = WINDOW_SAMPLES) -> list[float]:
    """``n`` latencies of median 100 ms, a lognormal spread of ``sigma``."""
    return [0.1 * rng.lognormvariate(0, sigma) for _ in range(n)]


def errors_at_one(sigma: float, seeds: int = 16, windows: int = 150) -> list[float]:
    """``log(no_load / median)`` after each of the later two thirds of ``windows`` windows at
    one slot, of a dependency that does not change, over ``seeds`` seeds."""
    errors = []
    for seed in range(seeds):
        rng = random.Random(seed)
        gradient, now = fixed_at_one(seed), 0.0
        for window in range(windows):
            now = serial(gradient, now, lognormal(rng, sigma))
            if window >= windows // 3:
                assert gradient.no_load is not None
                errors.append(math.log(gradient.no_load / 0.1))
    return errors


def windows_to_within(
    gradient: Gradient, now: float, rng: random.Random, sigma: float, factor: float, most: int
) -> int:
    """Windows of ``lognormal(rng, sigma)`` times ``factor`` at one slot until ``no_load`` is
    within 10% of their median (``most + 1``: not within ``most``)."""
    for count in range(1, most + 1):
        now = serial(gradient, now, [factor * x for x in lognormal(rng, sigma)])
        assert gradient.no_load is not None
        if abs(math.log(gradient.no_load / (0.1 * factor))) < 0.1:
            return count
    return most + 1


# -- defects ------------------------------------------------------------------------------


# Mended (was a strict xfail): at one slot the second window well below no_load is pooled after
# DESCENT emptied the pool, so no_load becomes that window's own centre (the lower of the two,
# 0.088), not halfway to the higher (0.094): the rule that keeps the estimate from sinking to
# the lowest of many medians is bypassed there
def test_two_low_windows_at_one_slot_move_no_load_halfway_not_to_the_lower() -> None:
    gradient, now = at_one(0.1)
    now = serial(gradient, now, [0.092] * WINDOW_SAMPLES)  # 8% low: pooled, and remembered
    first = gradient.no_load
    assert first is not None and 0.092 < first < 0.1 and gradient._below == 0.092
    serial(gradient, now, [0.088] * WINDOW_SAMPLES)  # the second in a row: DESCENT
    assert gradient.no_load == pytest.approx((first + 0.092) / 2), gradient.no_load


# Mended (was a strict xfail): only windows whose median is at most the tolerance above no_load
# are pooled, and every window below it is: the pool is the low part of the windows and reads
# the median low (sigma 0.5: -3.7%, sigma 1: -11.9% in log, where the probes before read -0.5%
# and +0.2%); pooled only within the tolerance on both sides: -1.3% and -2.5%
@pytest.mark.parametrize(("sigma", "bound"), [(0.5, 0.02), (1.0, 0.05)])
def test_windows_pooled_at_one_slot_read_the_median_not_below_it(
    sigma: float, bound: float
) -> None:
    bias = statistics.mean(errors_at_one(sigma))
    assert bias >= -bound, bias


# Mended (was a strict xfail): 'min(samples) > 0' lets a NaN through where it is not first
# (min() skips it), so a NaN latency joins the pool, and the pool's median can be NaN: no_load
# NaN, every ratio NaN, nothing cut, until the probe five windows on (before this commit a
# window never fed the pool); all(0 < x < inf) would keep it out
def test_a_nan_latency_at_one_slot_does_not_reach_no_load() -> None:
    rng = random.Random(18)  # (a seed whose NaN lands in the pool's middle)
    gradient = Gradient(AdaptiveLimit(initial_limit=1, probe_interval=None), random.Random(3))
    now = serial(gradient, 0.0, [0.1 * rng.uniform(0.98, 1.02) for _ in range(8)])
    window = [0.1 * rng.uniform(0.98, 1.02) for _ in range(8)]
    window[rng.randrange(1, 8)] = math.nan
    for latency in window:  # (each seen 100 ms after it started, whatever it says)
        gradient.update(now + 0.1, now, latency, False, 1)
        now += 0.1
    for _ in range(2):  # (1.07x, not quiet: the limit stays at one slot)
        now = serial(gradient, now, [0.107 * rng.uniform(0.99, 1.01) for _ in range(8)])
        assert gradient.no_load is not None and math.isfinite(gradient.no_load), gradient.no_load


# Mended (was a strict xfail): a pooled window sets _probe_n to the pool's 24, which narrows the
# margin as if 24 unselected samples stood behind no_load, while the pool reads low (above):
# windows of 8 without a queue read as one 4.9% of the time at sigma 0.5 and 9.4% at 1, against
# 3.0% and 5.3% with the probes before; pooled within the tolerance on both sides 3.8% and 7.5%,
# and with _probe_n left at the probe's count too, 1.9% and 4.5%
@pytest.mark.parametrize(("sigma", "before"), [(0.5, 0.030), (1.0, 0.053)])
def test_noise_reads_as_a_queue_no_more_often_once_windows_are_pooled(
    sigma: float, before: float
) -> None:
    over = []
    for seed in range(40):
        rng = random.Random(seed)
        gradient = fixed_at_one(seed)
        now = serial(gradient, 0.0, lognormal(rng, sigma, FIRST_PROBE_SAMPLES))
        for window in range(30):
            now = serial(gradient, now, lognormal(rng, sigma))
            if window >= 10:  # then judge 20 windows of 8 without a queue as the gradient does
                assert gradient.no_load is not None
                tolerance = gradient.spec.tolerance + gradient._margin(WINDOW_SAMPLES)
                for _ in range(20):
                    ratio = _median(lognormal(rng, sigma)) / gradient.no_load
                    over.append(ratio > tolerance)
    assert statistics.mean(over) <= before * 1.2, statistics.mean(over)


# -- attacks that held --------------------------------------------------------------------


@pytest.mark.parametrize("sigma", [0.5, 1.0])
def test_the_pooled_estimate_is_about_as_precise_as_probe_n_says(sigma: float) -> None:
    """The margin takes ``_probe_n`` (24 once windows are pooled) as the estimate's sample
    count.  Its RMS log error at one slot (bias included): 0.136 at sigma 0.5, 0.293 at 1,
    against 0.128 and 0.255 that 24 samples claim (6% and 15% over; the probes before:
    0.203 and 0.413)."""
    errors = errors_at_one(sigma)
    rms = math.sqrt(statistics.mean(error * error for error in errors))
    assert rms <= 1.2 * MEDIAN_SE * sigma / math.sqrt(24), rms


def test_a_probe_read_30_percent_low_under_a_wide_spread_is_corrected_by_windows() -> None:
    """The commit's case: at sigma 0.5 a probe of 8 read 30% low.  Windows at one slot bring
    ``no_load`` within 10% of the median in 4 windows (median; 90th percentile 10, at most
    14, seeds 0-39); before, the probes every five windows: 15, and 5 seeds not in 40."""
    taken = []
    for seed in range(40):
        rng = random.Random(seed)
        gradient = fixed_at_one(seed)
        probe = lognormal(rng, 0.5, FIRST_PROBE_SAMPLES)
        now = serial(gradient, 0.0, [0.07 * x / _centre(probe) for x in probe])
        assert gradient.no_load == pytest.approx(0.07)
        taken.append(windows_to_within(gradient, now, rng, 0.5, 1.0, 40))
    assert statistics.median(taken) <= 5 and max(taken) <= 16, sorted(taken)


@pytest.mark.parametrize("step", [1.01, 1.05, 1.09])
def test_a_slow_ramp_is_followed_without_a_ratchet_and_left_at_once(step: float) -> None:
    """Others' load makes the dependency slower by ``step`` a window for 60 windows (up to
    1.8x, 19x, 176x), windows just within the tolerance one after another, then goes at once:
    ``no_load`` is never more than 7.4% above the latency of the moment (the probes before:
    5.4%), and is back within 5% of it after 2-3 windows (before: 6, the min_limit probe).
    Since review 9's mends (windows pooled within the tolerance on both sides), a drop far
    below is left to the descent and the min_limit probe again: back within 7 windows, as
    before the commit."""
    for seed in range(6):
        rng = random.Random(seed)
        gradient, level = fixed_at_one(seed), 1.0
        now = serial(gradient, 0.0, [0.1 * rng.uniform(0.9, 1.1) for _ in range(8)])
        for _ in range(60):
            level *= step
            now = serial(gradient, now, [0.1 * level * rng.uniform(0.9, 1.1) for _ in range(8)])
            assert gradient.no_load is not None and gradient.no_load <= 0.1 * level * 1.08
        for _ in range(MIN_LIMIT_WINDOWS + 2):  # (the windows, then the probe's)
            now = serial(gradient, now, [0.1 * rng.uniform(0.9, 1.1) for _ in range(8)])
        assert gradient.no_load == pytest.approx(0.1, rel=0.05)


@pytest.mark.parametrize(("slower", "sigma", "within"), [(1.09, 0.05, 6), (1.5, 0.5, 20)])
def test_a_dependency_slower_for_good_is_followed(slower: float, sigma: float, within: int) -> None:
    """1.09x (within the tolerance): pooled, within 10% after one window in 38 seeds of 40
    (before: 35), after the min_limit probe in one (seed 18: its pool read 2.6% low, the
    windows 1.12x, not pooled).  1.5x under a wide spread: the windows that read within the
    tolerance by chance are pooled and restart the count towards the min_limit probe, yet
    pull ``no_load`` up: within 10% after 7 windows (median; p90 13, at most 18), before
    12 (p90 30, at most 42)."""
    for seed in range(40):
        rng = random.Random(seed)
        gradient = fixed_at_one(seed)
        now = serial(gradient, 0.0, lognormal(rng, sigma, FIRST_PROBE_SAMPLES))
        for _ in range(30):  # the probe's pool, and the spread measured
            now = serial(gradient, now, lognormal(rng, sigma))
        taken = windows_to_within(gradient, now, rng, sigma, slower, within)
        assert taken <= within, (seed, gradient.no_load)


def test_a_headroom_tests_exchange_pooled_at_one_slot_barely_moves_no_load() -> None:
    """At base 1 a timed test opens a second slot: with one worker its exchange waits (1.5x
    the service time at most) and the window, at base 1, is pooled with it; the trim leaves
    it out: ``no_load`` averages 1.006x the service time over seeds 1-10 (the probes before:
    0.998x)."""
    for seed in range(1, 4):
        rotation = Rotation(AdaptiveLimit(initial_limit=1, probe_interval=None), lambda _: 1, seed)
        estimates, until = [], 5.0
        while until < 40.0:
            rotation.run(until)
            assert rotation.algorithm.no_load is not None
            estimates.append(rotation.algorithm.no_load / SERVICE)
            until += 1.0
        tested = [lat for start, lat, limit in rotation.done if limit == 2 and start > 5.0]
        assert len(tested) >= 10 and max(tested) > 1.3 * SERVICE, tested
        assert 0.99 <= statistics.mean(estimates) <= 1.015, statistics.mean(estimates)


@pytest.mark.parametrize("value", [math.inf, 1e300, 5e-324])
def test_an_extreme_latency_at_one_slot_leaves_no_load_finite(value: float) -> None:
    for position in (0, 3, 7):
        gradient, now = at_one(0.1)
        window = [0.1 * (1 + 0.01 * i) for i in range(WINDOW_SAMPLES)]
        window[position] = value
        for latency in window:
            gradient.update(now + 0.1, now, latency, False, 1)
            now += 0.1
        serial(gradient, now, [0.1] * WINDOW_SAMPLES)
        assert gradient.no_load is not None and 0.09 < gradient.no_load < 0.11, gradient.no_load
