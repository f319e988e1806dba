"""A second independent review's attack on the adaptive limit's refusals and spread.

What landed after eb2abd9: a response of status 5xx or 429 outside ``drop_statuses`` is a
*refusal*, no latency sample (unless slower than the tolerance allows), and a window mostly
refused does not grow the limit; the gradient measures the latency's *spread*
(``Gradient._measure_spread``) and, above ``TEST_SPREAD``, widens its tolerance by it
(``Gradient._margin``); an ``initial_limit`` left at its default is a ``_Default`` that
``dataclasses.replace`` fits anew.

The defects were strict xfails whose reason said what was wrong; those fixed are regression
tests now, and the comment above each says what it was (one,
``test_equal_specs_replace_alike``, is a limitation kept: it stays an xfail); the attacks
that held stay as regression tests.  The algorithm is driven directly (it is pure) by a
closed loop in rounds (``_rounds``: the limit's slots start together, each end taken again
at once, so every slot is in use) against a dependency of ``N`` workers whose latency grows
as ``limit / N`` above them, or by the lab's model (``benchmarks/adaptive_sim.py``); one
test goes through the sync transport to a raw server on 127.0.0.1.
"""

from __future__ import annotations

import dataclasses
import math
import pickle
import random
import statistics
import threading
from collections.abc import Callable

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks import adaptive_sim
from httpx_bulkhead import AdaptiveLimit, BulkheadHTTPTransport, Policy
from httpx_bulkhead._adaptive import (
    FIRST_PROBE_SAMPLES,
    HISTORY,
    SPREAD_SAMPLES,
    TEST_SPREAD,
    AdaptiveController,
    Gradient,
)
from tests.servers import RawServer
from tests.servers.raw import RawConn

#: A latency model: ``(rng, limit) -> seconds``.
Latency = Callable[[random.Random, int], float]
#: A status model: ``(rng, limit) -> status``.
Status = Callable[[random.Random, int], int]


def queue(capacity: int, service: float, sigma: float = 0.05) -> Latency:
    """A dependency of ``capacity`` workers and a queue: every slot above them waits."""
    return lambda rng, limit: service * max(1.0, limit / capacity) * rng.lognormvariate(0, sigma)


def ok(rng: random.Random, limit: int) -> int:
    return 200


def _rounds(
    gradient: Gradient,
    latency: Latency,
    count: int,
    rng: random.Random,
    now: float = 0.0,
    status: Status = ok,
) -> tuple[float, list[tuple[float, int]]]:
    """``count`` rounds of a closed loop: the applied limit's exchanges start together and
    end in latency order (a refusal ends unfed, as ``AdaptiveController.ended`` ends it);
    returns the time after the last and ``(time, limit)`` after each round."""
    history = []
    for _ in range(count):
        limit = gradient.applied
        ends = sorted((latency(rng, limit), status(rng, limit)) for _ in range(limit))
        start = now
        for took, code in ends:
            if code >= 500 or code == 429:
                gradient.unfed_end(start + took, limit, start)
            else:
                gradient.update(start + took, start, took, False, limit)
        now = start + ends[-1][0] + 1e-6
        history.append((now, gradient.applied))
    return now, history


# -- refusals ---------------------------------------------------------------------------


# Was a defect, fixed since: a 5xx answered slowly (an overloaded backend timing out
# inside: 504 after 100x the no-load latency) is taken for a refusal 'answered without the
# work of a request' and ignored: windows of nothing but such answers never cut the limit,
# though a timeout of the same length would (the slowness is the load signal)
def test_a_server_error_answered_slowly_still_says_the_dependency_is_loaded() -> None:
    now = [0.0]
    controller = AdaptiveController(
        AdaptiveLimit(initial_limit=10, probe_interval=None),
        lambda limit: None,
        lambda: 10,
        lambda: now[0],
    )
    gradient = controller.algorithm
    assert isinstance(gradient, Gradient)
    for _ in range(FIRST_PROBE_SAMPLES):  # the first probe measures 10 ms
        now[0] += 0.01
        controller.ended(now[0] - 0.01, 0.01, 200, None)
    assert gradient.no_load == pytest.approx(0.01) and gradient.applied == 10
    for _ in range(50):  # 50 windows of 504s, each after a second
        start = now[0]
        now[0] += 1.0
        for _ in range(10):
            controller.ended(start, 1.0, 504, None)
    assert gradient.applied < 10


# Was a defect, fixed since: 'a window with a refusal does not grow the limit': a refusal
# rate that does not depend on the load (20% of answers 500 at once: a buggy endpoint,
# per-key 429 quotas) puts one in nearly every window of 30 or more, and the limit stays
# far below a capacity of 64 (4 runs of 5 do not reach 48 in 30 s, 3 not in 110 s; without
# the 500s, 0.7 s)
def test_refusals_that_do_not_depend_on_the_load_do_not_cap_the_limit() -> None:
    def status(rng: random.Random, limit: int) -> int:
        return 500 if rng.random() < 0.2 else 200

    reached = []
    for seed in range(1, 6):
        gradient = Gradient(AdaptiveLimit(probe_interval=None), random.Random(seed))
        _, history = _rounds(gradient, queue(64, 0.05), 600, random.Random(seed), status=status)
        reached.append(next((t for t, limit in history if limit >= 48), None))
    assert all(t is not None and t < 30 for t in reached), reached


def test_without_refusals_the_same_climb_is_quick() -> None:
    """The control of the test above: the same dependency without its 500s."""
    for seed in range(1, 6):
        gradient = Gradient(AdaptiveLimit(probe_interval=None), random.Random(seed))
        _, history = _rounds(gradient, queue(64, 0.05), 200, random.Random(seed))
        assert next(t for t, limit in history if limit >= 48) < 2.0, history[:40]


def test_refusals_at_once_to_everything_move_nothing() -> None:
    """A dependency answering 429 at once to every request, from the first probe on: no
    ``no_load`` is ever made of them, the limit stays within its bounds and never grows
    (it alternates between probes, at ``min_limit`` or a quarter, and the initial limit), and
    AIMD given
    ``drop_statuses={429}`` falls to ``min_limit``."""
    spec = AdaptiveLimit(initial_limit=10, max_limit=50, probe_interval=None)
    gradient = Gradient(spec, random.Random(1))
    _, history = _rounds(gradient, queue(8, 0.01), 300, random.Random(1), status=lambda r, n: 429)
    assert gradient.no_load is None
    assert max(limit for _, limit in history) == spec.initial_limit
    now = [0.0]
    controller = AdaptiveController(
        dataclasses.replace(spec, algorithm="aimd", drop_statuses={429}),
        lambda limit: None,
        lambda: 10,
        lambda: now[0],
    )
    for _ in range(200):
        now[0] += 0.01
        controller.ended(now[0] - 0.001, 0.001, 429, None)
    assert controller.algorithm.applied == spec.min_limit


def test_refusals_during_the_first_probe_leave_no_estimate_of_one_sample_alone() -> None:
    """Seven refusals and one answer close the first probe's window: its ``no_load`` is
    that one answer's latency (``_probe_n`` 1), and the margin the spread would add for so
    thin a probe is large; once the spread is known, a window at the no-load latency does
    not read as a queue.  (Held: the one sample is kept as the estimate, see the report.)"""
    gradient = Gradient(AdaptiveLimit(initial_limit=10, probe_interval=None), random.Random(1))
    start = 0.0
    for i in range(FIRST_PROBE_SAMPLES):
        if i == 0:
            gradient.update(start + 0.01, start, 0.01, False, 1)
        else:
            gradient.unfed_end(start + 0.001, 1, start)
    assert gradient.no_load == pytest.approx(0.01) and gradient._probe_n == 1
    assert gradient.applied == 10


# Was a defect, fixed since: README: against a dependency shedding beyond 8 queued, the
# gradient is refused 'in the model, never for a request sent from 5 s into a phase';
# loaded seed 5 (outside the seeds 1-3 its test runs) drifts to 33 slots 9.5 s into phase
# 3 (N + 8 = 32) and is refused 7 times
def test_the_gradient_is_never_refused_from_5_s_into_a_phase() -> None:
    runs: list[adaptive_sim.Run] = []
    adaptive_sim.run(5, adaptive_sim.LOADED, shed=8, into=runs)
    gradient = runs[2]
    late = [a for a, _, outcome in gradient.calls if outcome == "status 503" and a % 15 >= 5]
    assert not late, late


# -- the spread -------------------------------------------------------------------------


def _measured_spread(window: int, sigma: float, seeds: range = range(40)) -> float:
    """The mean of ``Gradient._spread`` over ``seeds``, each after enough windows of
    ``window`` lognormal latencies of ``sigma`` to fill the spread's memory twice."""
    measured = []
    for seed in seeds:
        gradient = Gradient(AdaptiveLimit(probe_interval=None, max_limit=400))
        rng = random.Random(seed)
        for _ in range(max(2, 2 * SPREAD_SAMPLES // window)):
            samples = [0.1 * rng.lognormvariate(0, sigma) for _ in range(window)]
            gradient._measure_spread(samples, statistics.median(samples))
        assert gradient._spread is not None
        measured.append(gradient._spread)
    return statistics.mean(measured)


def test_the_spread_of_windows_of_16_to_64_is_about_right() -> None:
    for window in (16, 32, 64):
        assert _measured_spread(window, 0.5) == pytest.approx(0.5, rel=0.12), window


# Was a defect, fixed since: _measure_spread extends the 64-deviation memory with a
# window's deviations *sorted*: a window larger than 64 (a limit above 64) leaves only its
# highest 64, whose IQR reads a lognormal spread of 0.5 as 0.30 (window of 128) or 0.25
# (200): the margin shrinks by half exactly where the docstring says 'the last 64
# exchanges'
def test_the_spread_of_a_window_larger_than_the_memory_is_not_its_upper_tail() -> None:
    for window in (100, 128, 200):
        assert _measured_spread(window, 0.5, range(10)) == pytest.approx(0.5, rel=0.2), window


# Was a defect, fixed since: the spread of windows of 8 (every limit up to 8, and every
# probe) reads 0.83x the true one on average (each deviation is taken from its own
# window's median, which the middle two samples straddle): the margin's 2 standard errors
# are 1.66, and at sigma 1 a probe 30% low reads as a queue (see the model test below)
def test_the_spread_of_windows_of_8_is_not_biased_low() -> None:
    for sigma in (0.5, 1.0):
        assert _measured_spread(8, sigma, range(100)) == pytest.approx(sigma, rel=0.1), sigma


# Was a defect, fixed since: README/CHANGELOG: at sigma 1 'now 0.84 ... (0.48 at the worst
# of 8 runs)' of a static 16's goodput; seed 8 (quiet) gives 0.34: a probe 32% low, a
# margin made small by the spread read 0.6-0.7 for 1.0, and the limit sits at 1-2 slots
# for the last 16 s of 30 (with the spread's scale corrected, IQR_SD 1.12, the same run
# gives 0.89)
def test_a_wide_spread_does_not_hold_the_limit_at_a_slot() -> None:
    runs: list[adaptive_sim.Run] = []
    result = adaptive_sim.run(
        8, adaptive_sim.QUIET, phases=(16,), phase_seconds=30.0, sigma=1.0, into=runs
    )
    rows = {row["contestant"]: row for row in result["rows"]}
    assert rows["adaptive"]["goodput"] >= 0.48 * rows["static 16"]["goodput"]


# Was a defect, fixed since: the margin has no bound and _measure_spread floors a latency
# at 1e-9 s: a clock that reads 0 for some exchanges (Windows' time.monotonic before
# Python 3.13 ticks every 15.6 ms) makes the spread ~12 and the tolerance ~14x, so a
# window at 4x the no-load latency reads as quiet and grows the limit x1.5
def test_a_clock_that_reads_zero_does_not_blind_the_gradient_to_a_queue() -> None:
    tick = 0.015625
    gradient = Gradient(AdaptiveLimit(initial_limit=16, probe_interval=None))
    now = 0.0

    def window(latencies: list[float], limit: int) -> None:
        nonlocal now
        start = now + 1e-6
        now = start + max(latencies) + 1e-6
        for latency in latencies:
            gradient.update(now, start, latency, False, limit)

    window([tick] * FIRST_PROBE_SAMPLES, 1)  # the probe: one tick
    assert gradient.no_load == tick
    for _ in range(3):  # a dependency a little faster than a tick: some exchanges read 0
        limit = gradient.applied
        window([0.0 if i % 3 == 0 else tick for i in range(limit)], limit)
    before = gradient.applied
    window([4 * tick] * before, before)  # a queue: four times the no-load latency
    assert gradient.applied <= before


def test_a_wide_spread_that_narrows_again_does_not_hide_a_queue_for_long() -> None:
    """Narrow, then a lognormal spread of sigma 1 for 200 rounds, then narrow: three rounds
    later the spread reads narrow again (64 samples; it read under 0.1 until windows that
    read a queue its own dispersion cannot explain stopped adding to a narrow spread, and
    the wide spread's last samples can stay a little longer: 0.108 here), and when the
    capacity halves the limit follows within a second (it was held at the capacity
    throughout)."""
    rng = random.Random(5)
    gradient = Gradient(AdaptiveLimit(probe_interval=None), random.Random(1))
    now, _ = _rounds(gradient, queue(16, 0.1), 400, rng)
    now, _ = _rounds(gradient, queue(16, 0.1, sigma=1.0), 200, rng, now)
    now, _ = _rounds(gradient, queue(16, 0.1), 4, rng, now)
    assert gradient._spread is not None and gradient._spread < TEST_SPREAD
    _, history = _rounds(gradient, queue(8, 0.1), 300, rng, now)
    assert next(t for t, limit in history if limit <= 10) - now < 1.0
    assert max(limit for _, limit in history[len(history) // 2 :]) <= 10


def test_a_window_of_refusals_alone_changes_nothing() -> None:
    gradient = Gradient(AdaptiveLimit(probe_interval=None), random.Random(1))
    now, _ = _rounds(gradient, queue(16, 0.1), 100, random.Random(2))
    state = (gradient.applied, gradient.no_load, gradient._spread, list(gradient._deviations))
    for _ in range(5 * gradient.applied):
        now += 0.001
        gradient.unfed_end(now, gradient.applied, now - 0.0005)
    assert state == (
        gradient.applied,
        gradient.no_load,
        gradient._spread,
        list(gradient._deviations),
    )


# -- invariants under hostile input -----------------------------------------------------

_latencies = st.one_of(
    st.sampled_from([0.0, -0.5, math.nan, math.inf, 1e300, 1e-300, 5e-324]),
    st.floats(min_value=1e-6, max_value=100.0),
)
_events = st.lists(
    st.tuples(
        st.sampled_from(["sample", "drop", "refused", "unfed", "open"]),
        _latencies,
        st.integers(min_value=0, max_value=300),
        st.floats(min_value=0.0, max_value=2.0),
    ),
    max_size=400,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    events=_events,
    bounds=st.tuples(st.integers(1, 20), st.integers(0, 100)),
    timed=st.booleans(),
)
def test_hostile_latencies_keep_the_limit_in_bounds_and_the_memory_bounded(
    events: list[tuple[str, float, int, float]], bounds: tuple[int, int], timed: bool
) -> None:
    """Latencies of 0, negative, NaN, infinite, huge and subnormal, refusals, unfed ends,
    drops and tests opened at any instant: no exception, the applied limit within
    ``[min_limit, max_limit]``, the spread's memory at most ``SPREAD_SAMPLES``, a window's
    samples at most its size."""
    low, extra = bounds
    spec = AdaptiveLimit(min_limit=low, max_limit=low + extra, probe_interval=1.0)
    gradient = Gradient(spec, random.Random(0), timed=timed)
    now = 0.0
    for kind, latency, inflight, step in events:
        now += step
        started = now - (latency if math.isfinite(latency) and latency >= 0 else 0.0)
        if kind in ("sample", "drop"):
            gradient.update(now, started, latency, kind == "drop", inflight)
        elif kind == "refused":
            gradient.unfed_end(now, inflight, started)
        elif kind == "unfed":
            gradient.unfed_end(now, inflight)
        else:
            gradient.open_test(now, inflight)
        assert spec.min_limit <= gradient.applied <= spec.max_limit
        assert spec.min_limit <= gradient.base <= spec.max_limit
        assert len(gradient._deviations) <= SPREAD_SAMPLES
        assert len(gradient._samples) <= max(16, spec.max_limit)


# -- AdaptiveLimit and its _Default ------------------------------------------------------


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_a_default_survives_every_pickle_protocol_and_deepcopy(protocol: int) -> None:
    spec = AdaptiveLimit(max_limit=4)
    copy = pickle.loads(pickle.dumps(spec, protocol=protocol))
    assert dataclasses.replace(copy, max_limit=300).initial_limit == 10
    assert dataclasses.replace(dataclasses.replace(spec), max_limit=300).initial_limit == 10


@pytest.mark.xfail(
    strict=True,
    reason="AdaptiveLimit(max_limit=4) == AdaptiveLimit(max_limit=4, initial_limit=4) (same"
    " hash, same repr), yet replace(..., max_limit=300) gives 10 for one and 4 for the"
    " other: the default's mark is state that equality and repr hide (a spec rebuilt from"
    " its repr, or deduplicated in a set, changes meaning under replace)",
)
def test_equal_specs_replace_alike() -> None:
    fitted, given_ = AdaptiveLimit(max_limit=4), AdaptiveLimit(max_limit=4, initial_limit=4)
    alike = fitted == given_ or repr(fitted) == repr(given_)
    assert not alike or (
        dataclasses.replace(fitted, max_limit=300).initial_limit
        == dataclasses.replace(given_, max_limit=300).initial_limit
    )


# -- through the transport --------------------------------------------------------------


def _slow_server_errors(conn: RawConn) -> None:
    """The first ``FIRST_PROBE_SAMPLES`` requests: 200 at once (the probe); then every
    request answered 504 after 100 ms (a gateway whose upstream times out inside: the
    delay is the dependency's latency under test, not a synchronisation)."""
    while conn.read_request() is not None:
        if len(conn.server.requests) > FIRST_PROBE_SAMPLES:
            if not conn.sleep(0.1):
                return
            conn.send_response(504, b"upstream timed out")
        else:
            conn.send_response(200, b"ok")


# Was a defect, fixed since: as the pure test above: slow 504s are refusals, and the
# transport's limit stays at 10 through 15 windows of answers 100 ms late against a no-
# load latency of ~0.1 ms
def test_slow_gateway_timeouts_cut_the_limit_through_the_transport() -> None:
    spec = AdaptiveLimit(initial_limit=10, max_limit=10, probe_interval=None)
    with RawServer(_slow_server_errors) as srv:
        transport = BulkheadHTTPTransport(default=Policy(max_concurrency=spec, max_pending=64))
        with httpx.Client(transport=transport, timeout=10) as client:
            for _ in range(FIRST_PROBE_SAMPLES):
                assert client.get(srv.url).status_code == 200
            statuses: list[int] = []

            def caller() -> None:
                for _ in range(15):
                    statuses.append(client.get(srv.url).status_code)

            threads = [threading.Thread(target=caller) for _ in range(10)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            assert set(statuses) == {504} and len(statuses) == 150
            [stats] = transport.statistics().values()
            assert len(stats.limit_history) <= HISTORY
            assert stats.limit < 10, stats.limit_history
