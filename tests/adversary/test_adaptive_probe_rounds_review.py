"""An adversarial review of probes of four rounds estimated whole (b385d80, d872b55).

What landed: a probe's window is ``PROBE_ROUNDS`` rounds of its limit (no longer at most 16
exchanges), ``_estimate`` is over all of its samples (after the pool's last, up to
``POOL_SAMPLES`` in all; a probe of more counts alone), and under a wide spread over those
that started ``EXPOSURE`` medians or more before its end.

A strict xfail is a defect (its reason says what is wrong); a plain test is an attack that
held.  Defects: at sigma 2 the exposure cut still censors (-20%) and ``_probe_n`` claims
more precision than the probe has; no-queue windows after a probe cut at sigma 1 and 2
far more often than the margin allows (less than before); a large probe leaves in the
pool its slowest exchanges; under a heavy tail a probe lasts twice as long.  Held: sigma
0.25-1 as documented, the lab's spread, a 30% mix of slow requests, ties, drops, refusals
and a coarse clock, memory at 1000 slots.  Pure: ``Gradient`` fed by a steady rotation
(every slot in use, each end's slot taken again at once, no queue), one periodic probe
from a ``no_load`` known exactly and an empty pool (``probe_once``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
import statistics
from collections.abc import Callable

import pytest

from httpx_bulkhead import AdaptiveLimit
from httpx_bulkhead._adaptive import MEDIAN_SE, PROBE_ROUNDS, Gradient, _centre
from tests.unit.test_adaptive_no_load import closed_loop

Draw = Callable[[random.Random], float]


def lognormal(sigma: float) -> Draw:
    """A latency of median 100 ms spread as a lognormal of ``sigma``."""
    return lambda rng: 0.1 * math.exp(rng.gauss(0, sigma))


def bimodal(slow: float) -> Draw:
    """A mix of requests of 20 ms and 200 ms (+-10%), ``slow`` of them slow."""
    return lambda rng: (0.2 if rng.random() < slow else 0.02) * rng.uniform(0.9, 1.1)


def probe_once(limit: int, draw: Draw, seed: int, windows: int = 0) -> tuple[Gradient, float, int]:
    """A steady rotation at ``limit`` (``no_load`` 100 ms, the pool empty; a tolerance of
    3 so that no window cuts), then one periodic probe: the gradient after it, the seconds
    it lasted (from its start, with the drain of the limit before it), the samples fed.
    ``windows``: that many more windows after it, judged at the default tolerance (1.1),
    ``no_load`` left as the probe set it (its ``moves`` then: theirs alone)."""
    rng = random.Random(1000 + seed)
    spec = AdaptiveLimit(initial_limit=limit, max_limit=limit, probe_interval=None, tolerance=3.0)
    gradient = Gradient(spec, random.Random(seed))
    gradient._probing, gradient.limit, gradient.no_load = False, float(limit), 0.1
    begun, fed, seconds = -1.0, 0, 0.0
    for ends, (now, started, took, inflight) in enumerate(
        closed_loop(gradient, lambda: draw(rng)), 1
    ):
        if begun < 0 and ends >= 3 * limit + 8:  # (three rounds: the spread is measured)
            gradient._pool.clear()
            gradient._start_probe(now, "periodic")
            begun = now
        probing, gathered = gradient._probing, len(gradient._samples)
        gradient.update(now, started, took, False, inflight)
        fed += begun >= 0 and not seconds
        if begun >= 0 and probing and not gradient._probing:
            if not windows:
                return gradient, now - begun, fed
            seconds = now - begun
            gradient.spec = dataclasses.replace(spec, tolerance=1.1)
            gradient.moves.clear()
        elif seconds and len(gradient._samples) < gathered:  # (a window closed)
            windows -= 1
            if not windows:
                return gradient, seconds, fed
    raise AssertionError("unreachable: the loop is endless")


@functools.cache
def errors(limit: int, draw: Draw, trials: int = 150) -> tuple[list[float], list[float]]:
    """Over ``trials`` probes: the log error of each ``no_load``, and the standard error
    ``_margin`` takes it to have (``MEDIAN_SE * spread / sqrt(_probe_n)``)."""
    out = [probe_once(limit, draw, seed)[0] for seed in range(trials)]
    logs = [math.log((gradient.no_load or math.inf) / 0.1) for gradient in out]
    assumed = [MEDIAN_SE * (g._spread or math.inf) / math.sqrt(g._probe_n) for g in out]
    return logs, assumed


SIGMA = {s: lognormal(s) for s in (0.25, 0.5, 1.0, 2.0)}


def rms(values: list[float]) -> float:
    return math.sqrt(statistics.fmean(v * v for v in values))


@pytest.mark.parametrize(
    ("sigma", "bound"),
    [
        (0.25, 0.01),
        (0.5, 0.01),
        (1.0, 0.08),  # (documented: -8%)
        pytest.param(
            2.0,
            0.1,
            marks=pytest.mark.xfail(
                strict=True,
                reason="at sigma 2 a probe at 16 slots reads the no-load latency 20% low "
                "(mean log error -0.225 over 150 probes; before the change -0.45): the cut "
                "at EXPOSURE (3) medians leaves in flight the 29% of a lognormal of sigma 2 "
                "slower than that, so the exposed exchanges are censored as all were at 1",
            ),
        ),
    ],
)
def test_a_probe_at_sixteen_slots_reads_the_median(sigma: float, bound: float) -> None:
    """A periodic probe at a quarter of 64 slots, 150 of them: their mean log error within
    1% at sigma 0.25 and 0.5 (-0.3%, +0.1%), within the documented 8% at sigma 1 (-6.1%)."""
    logs, _ = errors(64, SIGMA[sigma])
    assert abs(statistics.fmean(logs)) < bound, statistics.fmean(logs)


@pytest.mark.parametrize(
    "sigma",
    [
        0.25,
        0.5,
        1.0,
        # Mended (was a strict xfail): at sigma 2 the probes' RMS log error is 0.40 where
        # _margin took them for 0.295 (1.35x) with _probe_n at 60: the censoring's bias
        # (-0.225) is no standard error; _probe_n is now at most POOL_SAMPLES.
        2.0,
    ],
)
def test_a_probe_is_as_precise_as_margin_assumes(sigma: float) -> None:
    """``_probe_n`` is now up to four rounds of the probe (64 exchanges at 16 slots), which
    narrows ``_margin``: the probes' RMS log error is at most 1.25x the standard error it
    assumes (sigma 0.25: 0.045 against 0.052; 0.5: 0.107 against 0.098, 1.10x; 1: 0.189
    against 0.163, 1.16x; the excess grows with the spread, the censoring's bias)."""
    logs, assumed = errors(64, SIGMA[sigma])
    assert rms(logs) <= 1.25 * statistics.fmean(assumed), (rms(logs), statistics.fmean(assumed))


# Mended (was a strict xfail): a probe of 24 exchanges or more left in the pool its last 24
# to end, the slowest of those it was estimated from (at sigma 0.5 their centre 11% above the
# median, at 1 18%), for the next probe that agrees, or a window at one slot, to be pooled
# with; it now leaves 24 of its quantiles.
def test_the_pool_a_large_probe_leaves_reads_the_median() -> None:
    """After a probe at 16 slots (sigma 0.5), the pool's centre within 3% of the median
    as the probe's own estimate is (+0.1%)."""
    pools = [
        math.log(_centre(list(probe_once(64, SIGMA[0.5], seed)[0]._pool)) / 0.1)
        for seed in range(100)
    ]
    assert abs(statistics.fmean(pools)) < 0.03, statistics.fmean(pools)


@pytest.mark.parametrize(
    "sigma",
    [
        0.5,
        # Mended (was a strict xfail): at sigma 1, in 21 of 150 steady rotations at 64
        # slots without a queue, a window of the three after the probe cut the limit (1 of
        # 150 with no_load exact; 45 before the change): the margin counted the probe's 50
        # censored exchanges as 50 independent ones; _probe_n at most 24 now.
        1.0,
        pytest.param(
            2.0,
            marks=pytest.mark.xfail(
                strict=True,
                reason="at sigma 2, 39 of 150 (4 with no_load exact; 49 before; 24 since "
                "_probe_n is at most 24): the probe reads 20% low (the first xfail above)",
            ),
        ),
    ],
)
def test_no_queue_reads_as_one_after_a_probe(sigma: float) -> None:
    """A steady rotation at 64 slots, no queue: the three windows after a probe cut the
    limit in at most 1 in 12 of 150 runs (``SPREAD_Z`` standard errors: about 2.3% a
    window, if the margin is right).  At sigma 0.5, 10 of 150 (before the change, 46)."""
    runs = [probe_once(64, SIGMA[sigma], seed, windows=3)[0] for seed in range(150)]
    cuts = sum(any(reason == "queue" for _, reason, _ in g.moves) for g in runs)
    assert cuts <= 12, cuts


def test_the_labs_spread_at_sixteen_slots_reads_within_the_precision_it_needs() -> None:
    """+-10% (no exposure filter: a narrow spread): 150 probes at 16 slots read -0.9% on
    average, RMS 1.2% (before: -2.8%; the filter forced: -1.6%, RMS 2.0%).  The module
    docstring needs 1% (2% loses the gain): "negligible" is about right."""
    logs, _ = errors(64, lambda rng: 0.1 * rng.uniform(0.9, 1.1))
    assert abs(statistics.fmean(logs)) < 0.012 and rms(logs) < 0.015, statistics.fmean(logs)


def test_a_mix_of_quick_and_slow_is_read_at_its_median_at_sixteen_slots() -> None:
    """Requests of 20 ms and 200 ms, 30% slow: the median is the quick mode, and of 100
    probes at 16 slots (60 exchanges behind each, on average) none reads above 40 ms (with
    45% slow, 3 of 100, where the median of 64 draws is the slow mode about 18% of the time;
    before, of 16 exchanges closing on the quickest, none)."""
    out = [probe_once(64, bimodal(0.3), seed)[0] for seed in range(100)]
    assert max(gradient.no_load or math.inf for gradient in out) < 0.04
    # (``_probe_n`` counts at most ``POOL_SAMPLES`` of them since review 10's mends)
    assert statistics.fmean(gradient._probe_n for gradient in out) > 20


def test_ties_drops_refusals_and_a_coarse_clock_keep_samples_and_starts_aligned() -> None:
    """A wide probe at 16 slots whose exchanges start in batches (starts that tie), with a
    drop in every seven and a refusal in every five, and a clock of 15.6 ms ticks (a
    two in five of the latencies read 0): the window closes on the count, the exposure filter
    zips samples with starts (``strict=True`` raises nothing) and ``no_load`` is a tick."""
    spec = AdaptiveLimit(initial_limit=64, max_limit=64, probe_interval=None, tolerance=3.0)
    gradient = Gradient(spec, random.Random(1))
    gradient._probing, gradient.limit, gradient.no_load = False, 64.0, 0.0156
    rng, now, k = random.Random(2), 0.0, 0
    gradient._spread, gradient._wide = 0.5, True
    gradient._start_probe(now, "periodic")
    while gradient._probing:
        batch = [math.floor(0.02 * math.exp(rng.gauss(0, 1)) / 0.0156) * 0.0156 for _ in "x" * 16]
        for latency in sorted(batch):
            k += 1
            if k % 5 == 0:
                gradient.unfed_end(now + latency, 16, refused=now)
            else:
                gradient.update(now + latency, now, latency, k % 7 == 0, 16)
        now += max(batch) + 0.0156
    assert gradient._wide and k >= PROBE_ROUNDS * 16, (gradient._spread, k)
    assert gradient.no_load == 0.0156


@pytest.mark.xfail(
    strict=True,
    reason="at sigma 2 a probe at 16 slots lasts 4.7 s of 100 ms exchanges (2.5 s before; "
    "sigma 1: 1.0 s, 0.48 s): four rounds counted in ends last four mean latencies, 7.4 "
    "medians each; in the model at 64 workers (seeds 1-8, from 5 s in) goodput 0.796 of a "
    "static 64's against 0.828 before, 6 of 8 seeds lower",
)
def test_a_probe_under_a_heavy_tail_lasts_about_as_long_as_before() -> None:
    """Sigma 2, a probe at a quarter of 64 slots: at most 3 s (before: 2.5 s on average)."""
    seconds = [probe_once(64, SIGMA[2.0], seed)[1] for seed in range(20)]
    assert statistics.fmean(seconds) < 3.0, statistics.fmean(seconds)


def test_a_probe_at_a_thousand_slots_costs_a_window_of_the_limit_in_memory() -> None:
    """At 1000 slots (sigma 0.25), the probe at 250 holds 1000 samples at most, a window's
    at that limit (O(window) still); it lasts 0.55 s of 100 ms exchanges, the drain and four
    rounds (at 64 slots, sigma 0.5: 0.59 s, 0.25 s before; at a ``probe_interval`` of 60 s
    three quarters of the limit idle 0.74% of the time, against 0.31%)."""
    gradient, seconds, fed = probe_once(1000, SIGMA[0.25], 0)
    assert gradient._probe_n <= PROBE_ROUNDS * 250 and len(gradient._pool) <= 24
    assert abs(math.log((gradient.no_load or math.inf) / 0.1)) < 0.02
    assert seconds < 0.7 and fed <= 1000 + PROBE_ROUNDS * 250, (seconds, fed)
