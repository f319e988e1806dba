"""A seventeenth review's attack on two changes to the gradient (753258c, 051d105).

753258c: while the spread reads narrow (and once one is known), a window whose judged ratio is
over the tolerance its own dispersion would widen to adds nothing to the spread.  051d105: a
probe that reads ``no_load`` more than the tolerance above the last estimate probes again at
half its slots (``REPROBE_LIMIT`` at least).  A strict xfail is a defect (its reason says what
is wrong); a plain test is an attack that held.  The pure algorithm is fed as review 16 fed it
(``rotation``: saturated rounds against a FIFO queue, each exchange fed as it ends), or by
``window`` as ``tests/unit/test_adaptive.py`` does; "before" is main (1c03355) in the same
rotation, same seeds.

What did not hold:

- A spread that widens at a fall, with refusals (the first xfail): review 16's guard starts
  wide, so the first probe learns it; narrow at first (the lab's +-10% at 16 workers), then 8
  workers at sigma 1 and 20% refused, the goodput from the change on is 0.748 of the
  capacity's (0.870 before), and at sigma 0.5 and 30% refused the spread never reads wide in
  6 of 12 runs (1).
- A probe still over the capacity at half its slots (the second xfail): the reprobe compares
  its reading with the first probe's, so after a fall deeper than the first probe's slots
  (8 slots for 2 workers: 4x, then 4 slots: 2x) the second reading, lower but still a queue,
  stands, and ``no_load`` is twice the dependency's; a reading higher still runs a third
  (``test_probes_in_a_row_end_by_halving``: a chain to ``REPROBE_LIMIT``, not a loop; "the
  second reading stands" is not quite what the code does).  Not reached in the model: deep
  falls there (40 -> 2 workers at 500 a second, 48 -> 3 at 600, loaded, seeds 1-12) start
  the fall's probe at 1 slot (the implied concurrency), and no reprobe fired.

Mended after the review (both strict xfails now hold): the probes go on halving while the
reading is over the estimate before the first and fell since the last (8, 4 and then 2
slots read the truth; a reading that did not fall stands, so the chain below ends at its
second probe); a window measures the spread from 6 latencies (``SPREAD_MIN``), not 8, so the
windows at the capacity with their refusals count: seeds 1-40, at sigma 1 and 20% refused
the goodput from the change on 0.891 (0.716 before the mend), at sigma 0.5 and 30% refused
0.889 (0.459), the spread learned in 40 of 40 runs (22); without refusals as before (0.909,
0.945).  From 5: 0.902 and 0.912, but review 16's refusals held its seed 8 at 4 slots or
fewer for 21% of the rounds; from 6, its seeds 1-40 do as from 8, or better.  A re-probe
needs ``REPROBE_OVER`` (10%) over the estimate at least, whatever the tolerance (the
measured cost at 1.01, below; since the floor, 0.925 and 0.792 at 64 and 16 workers).

Measured, not a defect:

- The spread that widens at a fall is learned later (``test_a_spread_that_widens_at_a_fall_
  is_learned``, figures there): at sigma 1 and 8 workers the goodput from the change on
  0.909 of the capacity's (0.944), elsewhere within a point; a bimodal mix (30% misses at
  10x) reads wide less often (77% of the rounds, 86%: the windows whose median is a miss are
  left out, and the misses weigh less), 0.877 (0.910), seeds 1-40.
- At a tolerance of 1.01 the reprobe fires on a probe's own noise (a few percent over the
  estimate): probes every 15 s, 3000 rounds, seeds 1-12, 64 workers: 274 probes (222), the
  goodput 0.903 of the capacity's (0.931, the worst run 0.833, 0.885); 16 workers 0.759
  (0.794, the worst 0.562, 0.722); with the reprobe off, as before.  At 1.05 and 1.1, as
  before.  The check is against the user's tolerance, not the probe's precision.
- The lab's model (15 s phases, seeds 1-40, as before in brackets): every target of phases 1
  and 3 met in 10/40 loaded (10) and 32/40 quiet (32); phase 2's p99 from 5 s in 1.488x
  (1.482x) and 1.412x (1.412x); cuts at a tolerance the spread widened in phase 2, loaded: 4
  in 1 run (4 in 3).  Seeds 1-20, loaded: ``min_limit=2`` phase 2's p99 1.504x (1.557x),
  widened cuts 0 (6 in 3 runs); sigma 0.5 3.830x (3.922x); SLOWER 2.177x (2.165x), probes 41
  (40); tolerance 1.01 and 3.0 as before.  A steady 16 workers at sigma 1 (30 s, seeds 1-12)
  0.934 of the static 16's goodput from 5 s in (0.938).  The deep falls above: widened cuts
  in phase 2, 3 in 2 runs (29 in 11) and 4 in 2 (24 in 9), what 753258c is for; phase 2's
  p99 from 5 s in 16.4x and 11.1x either way (a window of 39 slots for 2 workers takes 4 s).
- Held as before: a dependency slower for good by 15, 30 and 50% at 16 workers (its probes
  run at 2-4 slots), and at 4 workers after 20; a coarse clock (ticks of 15.6 ms, service
  of 10 and 20 ms); ``min_limit=4``; tolerance 3.0.
- Docstring figures: ``tests/adversary/test_adaptive_review2.py`` (0.108) and the unit tests'
  (1.25x the last estimate) are as stated; the CHANGELOG's tolerance "1.25-1.41" is
  "1.26-1.41" in the module docstring and README; README.md still lists "a slot of queue at
  a small capacity can pass for a wide latency spread" as known, not mended, and does not
  mention the reprobe.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from httpx_bulkhead import AdaptiveLimit
from httpx_bulkhead._adaptive import REPROBE_LIMIT, Gradient
from tests.unit.test_adaptive import fall_to_a_probe, window

from .rounds import narrow, saturated_round

Factor = Callable[[random.Random], float]


def lognormal(sigma: float) -> Factor:
    return lambda rng: rng.lognormvariate(0, sigma)


def bimodal(slow: float) -> Factor:
    """Cache hits (20 ms) and a share ``slow`` of misses (200 ms), each +-10%."""
    return lambda rng: (2.0 if rng.random() < slow else 0.2) * rng.uniform(0.9, 1.1)


Phase = tuple[int, Factor]  # workers, spread of the service time


def rotation(
    seed: int,
    before: Phase,
    after: Phase,
    rounds: int = 600,
    change: int = 150,
    refused: float = 0.0,
    spec: dict[str, float] | None = None,
) -> tuple[Gradient, list[tuple[int, bool, float, float]]]:
    """A dependency of ``before`` (workers, spread) until round ``change``, then of ``after``,
    with a FIFO queue and a service time of 100 ms, which refuses ``refused`` of the requests
    at once; ``spec``: fields of ``AdaptiveLimit``.  Saturated rounds, each exchange fed as it
    ends (as ``tests/adversary/test_adaptive_review16.py`` feeds them).  Returns, per round,
    the limit in force, whether the spread read wide, the requests served and those a static
    limit at the capacity would have served in the round's time."""
    rng = random.Random(seed)
    options: dict[str, float | None] = {"initial_limit": 16, "probe_interval": None}
    options.update(spec or {})
    gradient = Gradient(AdaptiveLimit(**options), rng)  # type: ignore[arg-type]
    trace: list[tuple[int, bool, float, float]] = []
    now = 0.0
    for index in range(rounds):
        workers, factor = before if index < change else after
        limit = gradient.applied
        queue = max(1.0, limit / workers)
        served = saturated_round(gradient, rng, now, 0.1, factor, queue, refused)
        now += 0.1 * queue
        trace.append((limit, gradient._wide, served, workers * (1 - refused) * queue))
    return gradient, trace


def after_change(
    trace: list[tuple[int, bool, float, float]], change: int = 150
) -> tuple[int | None, float]:
    """Rounds from the change until the spread read wide (``None``: never), and the goodput
    from then on as a share of a static limit at the capacity's."""
    rest = trace[change:]
    wide = next((i for i, (_, is_wide, _, _) in enumerate(rest) if is_wide), None)
    return wide, sum(served for *_, served, _ in rest) / sum(best for *_, best in rest)


# -- 051d105: a probe that reads no_load over the tolerance probes again at half its slots --


def probe_window(algorithm: Gradient, now: float, latency: float) -> float:
    """One probe window at ``latency`` (four rounds of its slots, 8 exchanges at least)."""
    return window(algorithm, now, [latency] * max(8, 4 * algorithm.applied))


def test_a_second_probe_still_over_a_deep_fall_reads_its_queue_and_it_stands() -> None:
    """A fall deeper than the first probe's slots: 8 slots for 2 workers read 4x, so the
    probe runs again at 4; still over the capacity, it reads 2x, less than the first, and
    that reading stood (it was compared with the first probe's 4x, not with the estimate
    before the fall): the windows then took a queue of 2x for no queue.  Halving again, to
    2 (``REPROBE_LIMIT``), reads it right.  Mended after the review (was a strict xfail):
    the probes go on halving while the reading is over the estimate before the first and
    fell since the last."""
    algorithm, now = fall_to_a_probe(80, 0.15)
    at = algorithm.applied
    assert at == 8
    now = probe_window(algorithm, now, 0.1 * at / 2)
    assert algorithm._probing and algorithm.applied == at // 2
    now = probe_window(algorithm, now, 0.1 * (at // 2) / 2)
    assert algorithm._probing and algorithm.applied == at // 4 >= REPROBE_LIMIT


def test_probes_in_a_row_end_by_halving() -> None:
    """A dependency that reads slower at each probe (each 1.2x the last: it keeps slowing,
    or its capacity keeps falling) ends the chain: a chain, not a loop.  As reviewed it ran
    a probe at half the slots of the last each time, down to ``REPROBE_LIMIT``; since the
    mend above, a reading that did not fall at half the slots is no queue of the probe's
    own, and the second probe's stands."""
    algorithm, now = fall_to_a_probe(200, 0.15)
    slots = [algorithm.applied]
    latency = 0.1
    while algorithm._probing:
        latency *= 1.2
        now = probe_window(algorithm, now, latency)
        slots.append(algorithm.applied)
    assert slots[:-1] == [slots[0], slots[0] // 2]
    assert algorithm.no_load == pytest.approx(latency)


# -- 753258c: while the spread reads narrow, a window over its own widened tolerance is left out --


@pytest.mark.parametrize(
    ("after", "spec", "least"),
    [
        ((8, lognormal(1.0)), {}, 0.85),
        ((8, lognormal(0.5)), {}, 0.9),
        ((4, lognormal(1.0)), {}, 0.85),
        ((8, bimodal(0.3)), {}, 0.85),
        ((8, lognormal(0.5)), {"min_limit": 4}, 0.93),
        ((8, lognormal(0.5)), {"tolerance": 3.0}, 0.99),
        ((8, lognormal(0.5)), {"tolerance": 1.01}, 0.93),
    ],
)
def test_a_spread_that_widens_at_a_fall_is_learned(
    after: Phase, spec: dict[str, float], least: float
) -> None:
    """(Held, at a cost.)  The lab's spread at 16 workers, then at round 150 fewer workers
    and a wide spread (a lognormal, or cache hits at 20 ms and 30% misses at 200 ms): the
    spread is learned in every run, and the goodput from the change on stays above
    ``least`` of a static limit at the capacity's on average (seeds 1-12).  Later than before
    753258c (the windows over the narrow tolerance that their own dispersion does not
    explain are left out): at sigma 1 and 8 workers, wide after 33 rounds as the median of
    seeds 1-40 (22.5), the goodput 0.909 (0.944); at sigma 0.5, 18 rounds (12.5), 0.945
    (0.952); at sigma 1 and 4 workers, 48.5 (30), 0.910 (0.900); the bimodal mix, read wide
    from round 200 on in 77% of the rounds (86%: the windows whose median is a miss are
    left out, so the misses weigh less in the spread), the goodput 0.877 (0.910)."""
    runs = [
        after_change(rotation(seed, (16, narrow), after, spec=spec)[1]) for seed in range(1, 13)
    ]
    assert all(wide is not None for wide, _ in runs)
    assert sum(share for _, share in runs) / len(runs) >= least


@pytest.mark.parametrize(("sigma", "refused"), [(1.0, 0.2), (0.5, 0.3)])
def test_a_spread_that_widens_at_a_fall_with_refusals_is_learned(
    sigma: float, refused: float
) -> None:
    """Review 16's refusals, but the spread narrow at first (the lab's +-10% at 16 workers),
    then, at round 150, 8 workers and a lognormal spread: a dependency in trouble, slower to
    serve and more erratic at once, refusing a share of the requests at once throughout.
    The first probe measured a narrow spread, so the windows that read over the tolerance
    their own dispersion would widen to are left out; with refusals the windows at small
    limits hold fewer than ``WINDOW_SAMPLES`` latencies and measure nothing either, and the
    windows left to learn from are few.  Seeds 1-12, from the change on: at sigma 1 and 20%
    refused, the goodput is 0.748 of a static limit at the capacity's on average (0.870
    before 753258c), under 0.5 in 2 runs (none); at sigma 0.5 and 30% refused, the spread
    never read wide in 6 of 12 runs (1 of 12), the goodput 0.421 (0.545), under 0.5 in 9
    runs (6).  Mended after the review (was a strict xfail): a window measures the spread
    from 6 latencies (``SPREAD_MIN``), so the windows at the capacity count."""
    results = [
        after_change(rotation(seed, (16, narrow), (8, lognormal(sigma)), refused=refused)[1])
        for seed in range(1, 13)
    ]
    learned = [wide for wide, _ in results if wide is not None]
    goodput = [share for _, share in results]
    assert len(learned) >= 10
    assert sum(goodput) / len(goodput) >= (0.85 if sigma == 1.0 else 0.5)
