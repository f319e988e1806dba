"""An eighteenth review's attack on 1444c43 (the gradient's chained probes, ``REPROBE_OVER``,
``SPREAD_MIN``).

1444c43: a probe that reads ``no_load`` more than ``max(tolerance, REPROBE_OVER)`` (and the
spread's margin) over the last estimate runs again at half its slots, and goes on halving
while the reading stays that far over the estimate before the first probe of the chain and
fell that far since the last; a window measures the spread from ``SPREAD_MIN`` (6) latencies,
not 8.  A strict xfail is a defect (its reason says what is wrong); a plain test is an attack
that held.  The pure algorithm is fed by ``window`` (``tests/unit/test_adaptive.py``) or by a
saturated rotation against a FIFO queue (review 17's, with a capacity that can change every
round, a share of fast refusals and a coarse clock); "before" is 62929d4 in the same feed.

What did not hold:

- The chain's fall is judged at the re-probe threshold, ``max(tolerance, REPROBE_OVER) +
  margin``, but halving a probe's slots halves its queue at most: a reading can fall by 2x,
  never more.  At a tolerance of 2 or more (``AdaptiveLimit`` allows 3) no chain goes past its
  second probe, and a reading up to twice the threshold stands: 16 slots for 2 workers read 8x
  at tolerance 2, 8 slots 4x (a fall of exactly 2x, not more), and 4x stands (at 2.5: 14 and
  7 slots, 3.5x stands).  Fed a saturated rotation at 2 workers after it, the limit settles at
  16 slots, every exchange 8x the service time, until the next periodic probe (60 s by
  default).  The same with the spread's margin at the default tolerance: at a spread of 1 the
  threshold is 1.6-2.25 (probes of 64 to 8 exchanges), and the chain's later probes, with
  fewer exchanges, have the higher one.  Before the change the same reading stood (the one
  re-probe's): the mend is incomplete, not a regression.  Judging the fall at the threshold
  capped below 2 (or at ``REPROBE_OVER`` plus the margin) would let it go on.
- A chain's probe that measures nothing (every exchange refused at once, or a drop, or a
  latency of 0) leaves the reading that started the chain, the one it judged a queue of the
  probe's own: 8 slots for 2 workers read 4x, the probe at 4 was refused throughout, and 4x
  stands; in a saturated rotation at 2 workers the limit then saws at 8-9 slots (4.2x the
  service time) to the next periodic probe.  Before the change the same.  Falling back to
  the estimate before the chain (the windows then cut, and a fall probes again) or probing
  again would not.
- Not this change's, found on its coarse clock (the last xfail): a probe under a wide spread
  keeps the exchanges that started ``EXPOSURE`` medians before its end when they are 8 or
  more, and on a clock that reads some latencies as 0 their median can be 0; ``_estimate``
  then sets ``no_load`` to 0, and every window after it raises ZeroDivisionError in
  ``_close_window`` (``ratio = judged / self.no_load``), which in the transport escapes from
  the response's close (``_feed_adaptive``), once a window for good.  Ticks of 15.6 ms (the
  resolution of ``time.monotonic`` on Windows before Python 3.13), 16 then 4 workers,
  services of 10, 12, 14 and 15.6 ms, seeds 1-40 at 0, 10% and 25% refused: 3 runs of 480,
  all at a service of one tick (1 before the change, which, counting windows of 6
  latencies, reads the spread wide more often there).

A sketch of the three mends (the chain's fall judged at ``min(over, 1.5)``; the estimate
before the chain back when a chain's probe measured nothing; the exposed exchanges only if
their median is above 0) turns every xfail here into a pass and keeps
``tests/unit/test_adaptive.py`` and reviews 16 and 17 passing; in the model (15 s phases,
seeds 1-20, one process) every target of phases 1 and 3 met in 13 and 6 runs of 20, quiet
and loaded, the same seeds as without it.

Mended after the review, as sketched (the fall's bound is ``REPROBE_FALL``, 1.5; the pool of
the doubted reading is emptied with it): the three defects' tests are plain tests now.

What held (plain tests below, figures where measured):

- A capacity that recovers during the chain ends it at once (the reading is no longer over
  the estimate before), and a reading that did not fall stands (review 17's cases, and
  ``tests/unit/test_adaptive.py``).
- 30% fast refusals and a +-10% spread in every probe window: 8, 4, 2 slots, within 4% of
  the truth (seeds 1-5); 16 slots for 2 workers with the spread: 16, 8, 4, 2, within 3%.
- ``min_limit`` 2: 8, 4, 2 as at 1; 3 and 4: the chain ends at 4 slots (half is under
  ``min_limit``), 2x stands, and the windows at ``min_limit`` then correct it (at 3: the
  limit at 3 slots mostly, 1.60x the service time over the last 100 rounds; 1.5x is the
  floor there).
- A dependency recovering between probes (its latency falling 1.6x from one probe to the
  next) does run the chain down to ``REPROBE_LIMIT`` (16, 8, 4, 2: three probes more, where
  a dependency that slowed costs one), and its last reading, above the latency by then, is
  moved down by the windows (``DESCENT``).  In a saturated rotation where the service time
  rises 4-8x at once and decays back (tau 1-10 s, 16 and 32 workers, seeds 1-12) no chain
  fired: goodput the same as before to three places.  In the lab's model (loaded, seeds
  1-8; phases 16/4/24, 40/2/24 at 500 a second, 48/3/24 at 600; tolerance 1.1 and 2) no
  chain fired either: two first re-probes in 40 runs, both at tolerance 2.
- ``SPREAD_MIN`` 6: a narrow spread never reads wide from windows of 6-7 latencies at a
  capacity flipping 4<->2 or 6<->3 every 3, 7 or 15 rounds, with 25% refused or none (seeds
  1-20, every figure as before).  A clock of 15.6 ms ticks, 16 then 4 workers, 25% refused
  (seeds 1-12): at services of 10 and 20 ms never wide, as before; at 15.6 ms (half the
  latencies read 0) wide in 1% of the rounds (0%; seeds 1-40: 2 runs, 14% and 3% of their
  rounds, against 1 run, 6%; the goodput 0.799 against 0.804); at 33 ms 1% (4%); at 30 ms,
  where a latency reads one tick or two, 27% (37%), the goodput 0.500 (0.516), and without
  refusals 51% and 0.477 either way: a clock that quantises the latency to one or two ticks
  reads as a wide spread, not this change's.  Timeouts as drops (the slow tail at
  sigma 0.5 dropped at 1.5-2x the service time): goodput 0.323 (0.282) and 0.727 (0.692).
  A bimodal mix (30% at 10x) with 10-20% refused: 0.609-0.649 (0.614-0.631); steady at the
  bimodal mix from the first probe, without refusals, 0.659 either way (the first probe's
  median of 8 can be a miss; the rotation has no periodic probe): not this change's.
- Figures of the change, reproduced: seeds 1-40 of review 17's rotation, goodput from the
  change 0.891 (before 0.716) at sigma 1 and 20% refused, 0.889 (0.459) at sigma 0.5 and 30%,
  the spread learned in 40 (22) of 40; ``REPROBE_OVER`` at tolerance 1.01, 3000 rounds, probes
  every 15 s, seeds 1-12: 0.925, the worst 0.872 (0.900, 0.814) at 64 workers and 0.792,
  0.718 (0.760, 0.598) at 16, as the CHANGELOG says, with ``initial_limit`` at the capacity
  (at 64 workers from ``initial_limit=16``: 0.912, the worst 0.754).  ``SPREAD_MIN``'s "6
  read a lognormal's sigma within 2%": 2.1-2.5% high at sigma 0.1-1 (8: 1.5-2.2%; 4: 13-16%
  high, "15%" as stated).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from httpx_bulkhead import AdaptiveLimit
from httpx_bulkhead._adaptive import (
    CENTRE_BIAS,
    IQR_BIAS,
    IQR_SD,
    REPROBE_LIMIT,
    SPREAD_MIN,
    Gradient,
    _iqr,
    _median,
)
from tests.unit.test_adaptive import window

from .rounds import narrow, saturated_round


def fall_to_a_probe(limit: int, latency: float, **spec: float) -> tuple[Gradient, float]:
    """A gradient at ``limit`` slots after its first probe (no-load latency 0.1 s), fed
    windows at ``latency`` until a fall starts a probe (``spec``: ``AdaptiveLimit``'s)."""
    options: dict[str, float | None] = {"initial_limit": limit, "probe_interval": None}
    options.update(spec)
    algorithm = Gradient(AdaptiveLimit(**options), random.Random(3))  # type: ignore[arg-type]
    now = 0.0
    while algorithm.no_load is None:
        now = window(algorithm, now, [0.1] * algorithm.applied)
    while not algorithm._probing:
        now = window(algorithm, now, [latency] * max(8, algorithm.applied))
    return algorithm, now


def chain(
    algorithm: Gradient,
    now: float,
    reading: Callable[[int], float],
    rng: random.Random | None = None,
    refused: float = 0.0,
) -> tuple[list[int], float]:
    """Probe windows (four rounds of their slots, 8 exchanges at least) until the probes
    end, each exchange at ``reading(slots)`` (spread +-10% with ``rng``, and refused at once
    at a rate ``refused``): the slots of each probe, and the time after them."""
    slots = []
    while algorithm._probing:
        at = algorithm.applied
        slots.append(at)
        value = reading(at)
        for _ in range(max(8, 4 * at)):
            if rng is not None and rng.random() < refused:
                algorithm.unfed_end(now + 0.001, at, refused=now)
                continue
            latency = value * (rng.uniform(0.9, 1.1) if rng is not None else 1.0)
            algorithm.update(now + latency, now, latency, False, at)
        now += value * 1.1
    return slots, now


def saturated(algorithm: Gradient, now: float, workers: int, rounds: int) -> list[int]:
    """Saturated rounds against a FIFO queue of ``workers`` (service 0.1 s): the limits."""
    limits = []
    for _ in range(rounds):
        limit = algorithm.applied
        latency = 0.1 * max(1.0, limit / workers)
        for _ in range(limit):
            algorithm.update(now + latency, now, latency, False, limit)
        now += latency
        limits.append(limit)
    return limits


def queue_of_2(slots: int) -> float:
    """What a probe at ``slots`` reads at 2 workers (no-load 0.1 s)."""
    return 0.1 * max(1.0, slots / 2)


# -- the chain --


@pytest.mark.parametrize("tolerance", [2.0, 2.5])
def test_at_a_high_tolerance_the_chain_halves_a_queue_away(tolerance: float) -> None:
    algorithm, now = fall_to_a_probe(160, 0.15 * tolerance / 1.1, tolerance=tolerance)
    slots, now = chain(algorithm, now, queue_of_2)
    assert slots[0] >= 4 * tolerance  # (a queue of twice the tolerance at half the slots)
    assert algorithm.no_load is not None and algorithm.no_load <= 0.1 * tolerance


def test_a_chain_whose_probe_measures_nothing_does_not_keep_the_queue_it_doubted() -> None:
    algorithm, now = fall_to_a_probe(80, 0.15)
    at = algorithm.applied
    now = window(algorithm, now, [queue_of_2(at)] * max(8, 4 * at))
    assert algorithm._probing and algorithm.applied == at // 2
    for i in range(max(8, 4 * algorithm.applied)):
        algorithm.unfed_end(now + 0.001 * (i + 1), algorithm.applied, refused=now)
    assert algorithm._probing or (algorithm.no_load is not None and algorithm.no_load <= 0.1 * 1.1)


def test_a_capacity_that_recovers_during_the_chain_ends_it() -> None:
    """16 slots for 2 workers read 8x; the capacity is back to 32 by the second probe,
    which reads the truth: not over the estimate before, it stands, no third."""
    algorithm, now = fall_to_a_probe(160, 0.15)
    workers = iter([2, 32, 32])
    slots, _ = chain(algorithm, now, lambda at: 0.1 * max(1.0, at / next(workers)))
    assert slots == [16, 8]
    assert algorithm.no_load == pytest.approx(0.1)


def test_a_dependency_recovering_between_probes_costs_a_chain_to_reprobe_limit() -> None:
    """(Measured.)  A latency falling 1.6x from one probe to the next, no queue: each
    reading is over the estimate before and fell, so the chain runs to ``REPROBE_LIMIT``
    (three probes more, not one), and its last reading, 2x the latency by the time the
    windows run, is moved down by them (``DESCENT``) within 20 windows."""
    algorithm, now = fall_to_a_probe(160, 0.15)
    readings = iter([0.8, 0.5, 0.31, 0.2])
    slots, now = chain(algorithm, now, lambda _: next(readings))
    assert slots == [16, 8, 4, REPROBE_LIMIT]
    assert algorithm.no_load == pytest.approx(0.2)
    for _ in range(20):
        now = window(algorithm, now, [0.1] * max(8, algorithm.applied))
    assert algorithm.no_load is not None and algorithm.no_load < 0.11


@pytest.mark.parametrize("seed", range(1, 6))
def test_refusals_and_a_spread_in_the_probes_still_halve_the_queue_away(seed: int) -> None:
    """30% of each probe's exchanges refused at once, the rest +-10%: 8, 4, 2 slots, and
    the reading at 2 within 5% of the truth; from 16 slots without refusals, 16 to 2."""
    algorithm, now = fall_to_a_probe(80, 0.15)
    slots, _ = chain(algorithm, now, queue_of_2, random.Random(seed), refused=0.3)
    assert slots == [8, 4, 2]
    assert algorithm.no_load == pytest.approx(0.1, rel=0.05)
    algorithm, now = fall_to_a_probe(160, 0.15)
    slots, _ = chain(algorithm, now, queue_of_2, random.Random(seed))
    assert slots == [16, 8, 4, 2]
    assert algorithm.no_load == pytest.approx(0.1, rel=0.05)


@pytest.mark.parametrize("min_limit", [2, 3, 4])
def test_a_chain_at_a_min_limit_of_2_to_4(min_limit: int) -> None:
    """The chain stops where half its slots is under ``min_limit``: at 2, as at 1; at 3 and
    4, at 4 slots, whose 2x stands; the windows at ``min_limit`` then read the rest (at 3:
    1.60x the service time over the last 100 of 200 rounds at 2 workers, 1.5x the floor)."""
    algorithm, now = fall_to_a_probe(80, 0.15, min_limit=min_limit)
    slots, now = chain(algorithm, now, queue_of_2)
    assert slots == ([8, 4, 2] if min_limit <= 2 else [8, 4])
    limits = saturated(algorithm, now, 2, 200)[-100:]
    floor = max(1.0, min_limit / 2)
    assert sum(max(1.0, limit / 2) for limit in limits) / len(limits) <= floor * 1.1


# -- SPREAD_MIN --


def rotation(
    seed: int,
    workers: Callable[[int], int],
    refused: float = 0.0,
    tick: float = 0.0,
    service: float = 0.1,
    rounds: int = 450,
) -> list[bool]:
    """Saturated rounds against a FIFO queue of ``workers(round)`` at ``service`` (+-10%),
    refusing ``refused`` of the requests at once, latencies seen by a clock of ``tick``
    (0: exact): whether the spread read wide, per round."""
    rng = random.Random(seed)
    algorithm = Gradient(AdaptiveLimit(initial_limit=16, probe_interval=None), rng)
    seen = (lambda latency: math.floor(latency / tick) * tick) if tick else None
    now, wide = 0.0, []
    for index in range(rounds):
        queue = max(1.0, algorithm.applied / workers(index))
        saturated_round(algorithm, rng, now, service, narrow, queue, refused, seen)
        now += service * queue
        wide.append(algorithm._wide)
    return wide


@pytest.mark.parametrize(("high", "low", "period"), [(4, 2, 3), (4, 2, 7), (6, 3, 15)])
def test_windows_of_six_at_a_flipping_small_capacity_do_not_read_a_wide_spread(
    high: int, low: int, period: int
) -> None:
    """A capacity flipping between ``high`` and ``low`` workers every ``period`` rounds,
    25% refused at once: windows of 8 exchanges at small limits span rounds at both
    capacities and hold 6 or 7 latencies, now measured; a narrow spread still never reads
    wide (seeds 1-6; 1-20 in the module docstring)."""
    for seed in range(1, 7):
        wide = rotation(seed, lambda i: high if (i // period) % 2 else low, refused=0.25)
        assert not any(wide[150:])


@pytest.mark.parametrize("service", [0.010, 0.020])
def test_windows_of_six_on_a_coarse_clock_do_not_read_a_wide_spread(service: float) -> None:
    """Ticks of 15.6 ms, 16 then 4 workers, 25% refused at once: the spread reads wide in 1%
    of the rounds at most (seeds 1-6).  (At a service of one tick, where half the latencies
    read 0, it does in 2 runs of 40, 14% and 3% of their rounds, against 1 run, 6%, before:
    the goodput 0.799 against 0.804.)"""
    for seed in range(1, 7):
        wide = rotation(
            seed, lambda i: 16 if i < 150 else 4, refused=0.25, tick=0.0156, service=service
        )
        assert sum(wide[150:]) <= 0.01 * len(wide[150:])


@pytest.mark.parametrize(("seed", "refused"), [(30, 0.0), (18, 0.1)])
def test_a_probe_on_a_coarse_clock_does_not_set_a_no_load_of_zero(
    seed: int, refused: float
) -> None:
    """Ticks of 15.6 ms and a service of one tick (+-10%: half the latencies read 0), 16
    then 4 workers; seeds 1-40 at 0, 10% and 25% refused, services of 10-15.6 ms."""
    rotation(
        seed,
        lambda i: 16 if i < 150 else 4,
        refused=refused,
        tick=0.0156,
        service=0.0156,
        rounds=600,
    )


def test_six_latencies_read_a_lognormal_spread_nearly_as_eight_do() -> None:
    """``SPREAD_MIN``'s figure: windows of 6 latencies, each less its own median and
    corrected by ``CENTRE_BIAS``, read a lognormal's sigma 2-3% high (8: 1.5-2%; 4: 13-16%)."""
    rng = random.Random(18)

    def reads(n: int, sigma: float) -> float:
        estimates = []
        for _ in range(400):
            deviations: list[float] = []
            while len(deviations) < 64:
                latencies = [rng.lognormvariate(0, sigma) for _ in range(n)]
                middle, scale = math.log(_median(latencies)), 1 / math.sqrt(1 - CENTRE_BIAS / n)
                deviations += [(math.log(x) - middle) * scale for x in latencies]
            estimates.append(_iqr(sorted(deviations[-64:])) / (IQR_SD * IQR_BIAS))
        return sum(estimates) / len(estimates) / sigma

    assert SPREAD_MIN == 6
    for sigma in (0.5, 1.0):
        assert abs(reads(6, sigma) - 1) < 0.04
        assert reads(4, sigma) > 1.1
