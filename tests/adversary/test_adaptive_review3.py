"""A third review's attack on the gradient's judging of the first window after a raise.

What landed in aed83cf: the first window after the limit rose (a growth step, a headroom
test's doubling; not a probe's end) is judged by the median of the samples whose exchange
started after the window's median start (``Gradient._raised``, ``Gradient._starts``), when
those are at least a quarter of the window; otherwise by the window's median.

A strict xfail is a defect (its reason says what is wrong); a plain test is an attack that
held.  The algorithm is driven directly (it is pure) with the helpers of
``tests/unit/test_adaptive.py``: ``raised_to_24`` (18 slots grown to 24 by a quiet window,
``no_load`` 0.1 s), ``window`` (one window, every slot in use, the i-th exchange started
``i * spacing`` after ``now``, all fed in order of end).

The model (``benchmarks/adaptive_sim.py``, seeds 1-80, quiet/loaded) reproduces the
commit's figures: runs meeting all of phases 1 and 3's targets 26/6, phase 1's p99 above
1.5x in 5/23, phase 3's in 24/42, phase 3's goodput 0.898/0.879.  The obvious mends cost
there: judging by ``max(median, later median)`` (the LIFO and closed-loop defects) 21/4,
5/29, 31/51; by ``max(median, the later starters' lower quartile)`` (all six) 20/1, 7/39,
40/58; by the later starters only when the median is not quiet 29/5, 8/34, 25/56.
"""

from __future__ import annotations

import copy
import heapq
import random
from collections.abc import Callable

import pytest

from httpx_bulkhead import AdaptiveLimit
from httpx_bulkhead._adaptive import GROWTH, Gradient
from tests.unit.test_adaptive import building, raised_to_24, window


def raised_to_6() -> tuple[Gradient, float]:
    """An untimed gradient at 5 slots after its probe, grown by a quiet window to 6,
    ``no_load`` 0.1 s (windows of 8 samples)."""
    algorithm = Gradient(AdaptiveLimit(initial_limit=5, probe_interval=None), random.Random(3))
    now = 0.0
    while algorithm.applied <= 5:
        now = window(algorithm, now, [0.1] * 8)
    assert algorithm.applied == 6 and algorithm.no_load == pytest.approx(0.1)
    return algorithm, now


# --- what holds ---------------------------------------------------------------------


def test_samples_and_starts_stay_aligned_through_drops_and_refusals() -> None:
    """Drops and refusals have no latency: neither list grows for them, both are emptied
    at every window's end (also a probe's), so ``zip(strict=True)`` never raises and the
    memory stays O(window) over a long hostile run."""
    algorithm, now = raised_to_24()
    rng = random.Random(7)
    for _ in range(3000):
        now += rng.expovariate(200)
        started = now - rng.uniform(0.0, 0.3)
        kind = rng.random()
        if kind < 0.1:
            algorithm.update(now, started, now - started, True, algorithm.applied)
        elif kind < 0.25:
            algorithm.unfed_end(now, algorithm.applied, started)
        else:
            algorithm.update(now, started, now - started, False, algorithm.applied)
        assert len(algorithm._samples) == len(algorithm._starts)
        assert len(algorithm._starts) <= max(16, algorithm.base)
        assert 1 <= algorithm.applied <= 200


def test_a_coarse_clock_that_ties_every_start_falls_back_to_the_median() -> None:
    """A clock of 15.6 ms ticks stamps a window of 24 exchanges with two starts only, the
    later tick holding 4: fewer than a quarter started after the median start, so the
    window is judged by its median (no queue there: the limit grows, not cut)."""
    algorithm, now = raised_to_24()
    latencies = [0.1] * 20 + [0.14] * 4  # the late tick's exchanges are the slow ones
    for i, latency in enumerate(latencies):
        started = now if i < 20 else now + 0.0156
        algorithm.update(started + latency, started, latency, False, 24)
    assert algorithm.applied > 24


def test_a_raise_that_starts_a_probe_is_no_raise_for_the_window_after_the_probe() -> None:
    """The window whose end grows the limit is also the one whose end is due to probe: the
    probe's end restores the raised limit, and the window after it is judged by its
    median (a probe's end is no raise), though the raise never had its judged window."""
    algorithm, now = raised_to_24()
    algorithm._next_probe = now  # the next window's end probes
    window(algorithm, now, [0.1] * 24)  # quiet and in use: grows, then probes
    assert algorithm._probing and int(algorithm._saved) >= int(24 * GROWTH)
    grown = int(algorithm._saved)
    while algorithm._probing:
        now = window(algorithm, now, [0.1] * algorithm.applied)
    assert algorithm.applied == grown and not algorithm._raised
    window(algorithm, now, building(grown), spacing=0.001)
    assert algorithm.applied >= grown


# --- defects ------------------------------------------------------------------------


@pytest.mark.xfail(
    strict=True,
    reason="the later starters' median is used even when it is below the window's: a "
    "dependency that serves its queue last in, first out (or a window whose late starters "
    "are the fast ones that ended in time) hides a queue the median shows; the limit grows "
    "by GROWTH into it",
)
def test_a_first_window_whose_median_reads_a_queue_is_not_grown() -> None:
    """A LIFO dependency under a queue: the first 14 exchanges to start waited (0.15 s),
    the last 10 were served at once (0.1 s).  The window's median reads 1.5x: a cut.  Its
    later starters read 1.0x: quiet, so the limit grows (to 32)."""
    algorithm, now = raised_to_24()
    window(algorithm, now, [0.15] * 14 + [0.1] * 10, spacing=0.001)
    assert algorithm.applied < 24


@pytest.mark.xfail(
    strict=True,
    reason="a stall of our own late in the first window after a raise delays the exchanges "
    "in flight then, which are the later starters: a quarter of the window delayed cuts the "
    "limit (the window's median, which the docstring keeps for later windows for this very "
    "reason, reads no queue)",
)
@pytest.mark.parametrize(("raised", "stalled"), [(raised_to_24, 6), (raised_to_6, 2)])
def test_a_stall_of_our_own_late_in_the_first_window_after_a_raise_does_not_cut(
    raised: Callable[[], tuple[Gradient, float]], stalled: int
) -> None:
    """Exchanges 1 ms apart, 0.1 s each; the loop stalls for 50 ms before the last
    ``stalled`` ends (a quarter of the window), so they read 0.15 s.  The window's median
    is 0.1 s; the later starters' is 0.125 s (1.25x), over the tolerance."""
    algorithm, now = raised()
    before = algorithm.applied
    n = max(8, before)
    window(algorithm, now, [0.1] * (n - stalled) + [0.15] * stalled, spacing=0.001)
    assert algorithm.applied >= before


def _lognormal(sigma: float) -> Callable[[random.Random], float]:
    return lambda rng: 0.1 * rng.lognormvariate(0, sigma)


def _bimodal(slow: float) -> Callable[[random.Random], float]:
    """A mix of requests of 20 ms and 200 ms (+-10%), ``slow`` of them slow."""
    return lambda rng: (0.2 if rng.random() < slow else 0.02) * rng.uniform(0.9, 1.1)


def _batch_twins(latency: Callable[[random.Random], float], seeds: range) -> tuple[int, int]:
    """A gradient fed batches (every exchange of a window started at once) of ``latency``
    and no queue, for each seed up to a raise from 8 slots or more; the first window after
    it fed twice from the same state and latencies, its starts tied (judged by the median)
    or 1 us apart in an order that has nothing to do with the latency (judged by a random
    half).  Returns how many of each were cut."""
    tied = apart = 0
    for seed in seeds:
        rng = random.Random(seed)
        algorithm = Gradient(AdaptiveLimit(initial_limit=16, probe_interval=None), rng)
        now = 0.0
        while True:
            before = algorithm.base
            n = algorithm.applied if algorithm._probing else max(8, algorithm.applied)
            now = window(algorithm, now, [latency(rng) for _ in range(n)])
            if algorithm._raised and algorithm.base > before >= 8:
                break
        latencies = [latency(rng) for _ in range(max(8, algorithm.applied))]
        twin, before = copy.deepcopy(algorithm), algorithm.base
        window(algorithm, now, latencies)
        window(twin, now, latencies, spacing=1e-6)
        tied += algorithm.base < before
        apart += twin.base < before
    return tied, apart


def test_a_batch_stamped_microseconds_apart_is_cut_about_as_often_as_one_that_ties() -> None:
    """The first window after a raise is judged by the median of half its samples against
    a tolerance widened for a median of all of them (``_margin(len(samples))``).  With a
    lognormal spread of sigma 0.5 (no queue), the margin covers it: of 200 such windows,
    cut 6 with tied starts, 9 with starts 1 us apart (sigma 1: 10 and 13)."""
    tied, apart = _batch_twins(_lognormal(0.5), range(200))
    assert apart <= tied + 8 and apart <= 20, (tied, apart)


@pytest.mark.xfail(
    strict=True,
    reason="a mix of fast and slow requests (30% at 10x) read by the median of a random "
    "half of the first window after a raise (a batch stamped microseconds apart) reads a "
    "queue three times as often as by the whole window's median, and cuts",
)
def test_a_bimodal_batch_stamped_microseconds_apart_is_cut_about_as_often() -> None:
    """Requests of 20 ms and 200 ms, 30% slow, no queue: of 200 first windows after a
    raise, cut 7 with tied starts, 23 with starts 1 us apart (45% slow: 37 and 38)."""
    tied, apart = _batch_twins(_bimodal(0.3), range(200))
    assert apart <= tied + 8, (tied, apart)


def _rotation(seed: int, workers: int, sigma: float, seconds: float) -> tuple[int, int, int]:
    """A closed loop (each end's slot taken again at once; a raise's new slots at once)
    against ``workers`` FIFO workers of lognormal service (median 0.1 s).  At each end of
    a first window after a raise whose limit is past the workers by 10%, a twin judged by
    the window's median (``_raised`` off) takes the same sample; returns those windows, how
    many the twin alone cut, and how many the gradient alone cut."""
    rng = random.Random(seed)
    algorithm = Gradient(AdaptiveLimit(initial_limit=16, probe_interval=None), rng)
    free = [0.0] * workers
    ends: list[tuple[float, float]] = []  # (end, start)
    windows = hidden = shown = 0

    def start(now: float) -> None:
        worker = heapq.heappop(free)
        end = max(now, worker) + 0.1 * rng.lognormvariate(0, sigma)
        heapq.heappush(free, end)
        heapq.heappush(ends, (end, now))

    for _ in range(algorithm.applied):
        start(0.0)
    now = 0.0
    while now < seconds:
        now, started = heapq.heappop(ends)
        before = algorithm.base
        closes = started >= algorithm._opened and len(algorithm._samples) + 1 >= max(8, before)
        judged = algorithm._raised and closes and before > workers * 1.1
        twin = copy.deepcopy(algorithm) if judged else None
        algorithm.update(now, started, now - started, False, len(ends) + 1)
        if twin is not None:
            twin._raised = False
            twin.update(now, started, now - started, False, len(ends) + 1)
            windows += 1
            hidden += twin.base < before <= algorithm.base
            shown += algorithm.base < before <= twin.base
        while len(ends) < algorithm.applied:
            start(now)
    return windows, hidden, shown


HIDDEN = pytest.mark.xfail(
    strict=True,
    reason="in a closed loop (a fixed pool of callers) with a spread of sigma 0.2 and more, "
    "the later starters that ended within the window are the quicker ones: judged by them, "
    "the first window past the capacity after a raise reads less queue than its median and "
    "is cut less often than the median would cut it",
)


@pytest.mark.parametrize(
    ("workers", "sigma"),
    [(24, 0.05), pytest.param(24, 0.2, marks=HIDDEN), pytest.param(24, 0.5, marks=HIDDEN)],
)
def test_in_a_closed_loop_the_later_starters_do_not_hide_a_queue(
    workers: int, sigma: float
) -> None:
    """The rule's premise is an open loop (the queue builds over the window); in a closed
    loop the queue a raise makes is there at once, and the window holds the first
    ``limit`` exchanges to end: those that started late are in it only if they were quick.
    Over seeds 0-9 (20 s each), of the first windows past the capacity, as many should be
    cut by the gradient alone as by a twin judged by the window's median.  Measured (windows,
    cut by the twin alone, by the gradient alone): sigma 0.05 65, 2, 9 (the rule helps);
    0.2 210, 15, 4; 0.5 248, 14, 1; 1.0 190, 11, 2."""
    counts = [_rotation(seed, workers, sigma, 20.0) for seed in range(10)]
    windows, hidden, shown = (sum(column) for column in zip(*counts, strict=True))
    assert hidden <= shown, (windows, hidden, shown)
