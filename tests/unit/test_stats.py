"""Statistics: the nearest-rank quantile, the bounded wait window, the evicted entry."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from httpx_bulkhead import CompartmentStats
from httpx_bulkhead._stats import EVICTED, WaitWindow, fold_evicted, quantile


@pytest.mark.parametrize(
    ("q", "expected"),
    [(0.0, 1.0), (0.01, 1.0), (0.1, 1.0), (0.11, 2.0), (0.5, 5.0), (0.51, 6.0), (0.95, 10.0)],
)
def test_quantile_is_nearest_rank(q: float, expected: float) -> None:
    ordered = [float(i) for i in range(1, 11)]
    assert quantile(ordered, q) == expected
    assert quantile(ordered, 1.0) == 10.0


def test_quantile_of_nothing_is_zero() -> None:
    assert quantile([], 0.5) == 0.0
    assert quantile([7.0], 0.0) == 7.0 and quantile([7.0], 1.0) == 7.0


@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=50), st.floats(0.0, 1.0))
def test_quantile_matches_its_definition(values: list[float], q: float) -> None:
    """The smallest value with at least ``q`` of the values at or below it."""
    ordered = sorted(values)
    result = quantile(ordered, q)
    at_or_below = sum(v <= result for v in ordered)
    assert at_or_below >= q * len(ordered)
    below = sum(v < result for v in ordered)
    assert below < max(1, math.ceil(q * len(ordered)))


def test_wait_window_summary_keeps_only_the_most_recent() -> None:
    window = WaitWindow(size=4)
    assert window.summary() == (0.0, 0.0, 0.0, 0.0)
    for seconds in (100.0, 4.0, 1.0, 3.0, 2.0):  # 100 s falls out of the window
        window.record(seconds)
    assert window.summary() == (2.0, 4.0, 4.0, 4.0)
    wide = WaitWindow()
    for i in range(1, 1025):
        wide.record(float(i))
    assert wide.summary() == (512.0, 973.0, 1014.0, 1024.0)
    wide.record(0.5)  # the window holds 1024: the oldest (1.0) is forgotten
    assert wide.summary() == (512.0, 973.0, 1014.0, 1024.0)
    assert sorted(wide._waits)[:2] == [0.5, 2.0]


def stats(name: str, **values: int) -> CompartmentStats:
    fields: dict[str, object] = {f.name: 1 for f in dataclasses.fields(CompartmentStats)}
    fields.update(name=name, max_pending=9, stream_caps=(3, 4), wait_p50=0.5)
    fields.update(values)
    return CompartmentStats(**fields)  # type: ignore[arg-type]


def test_fold_evicted_sums_counters_and_zeroes_gauges() -> None:
    first = fold_evicted(None, stats("a", acquired=3, completed=2, leaked_responses=1))
    total = fold_evicted(first, stats("b", acquired=4, stream_waits=7))
    assert total.name == EVICTED
    assert total.acquired == 7 and total.completed == 3 and total.leaked_responses == 2
    assert total.stream_waits == 8 and total.connections_created == 2
    assert total.running == 0 and total.connections == 0 and total.http2_connections == 0
    assert total.wait_p50 == 0.0 and total.stream_caps == () and total.max_pending is None


def test_fold_evicted_sums_the_fleet_counters_and_unsets_its_gauges() -> None:
    """An evicted compartment with a fleet limit keeps its fleet counters in the total;
    the fleet's gauges have no value there (``None``/0), as without a fleet."""
    first = fold_evicted(None, stats("a", fleet_limit=10, fleet_acquired=5, fleet_lost=2))
    total = fold_evicted(first, stats("b", fleet_round_trips=7, fleet_fallbacks=3))
    assert total.fleet_acquired == 6 and total.fleet_lost == 3
    assert total.fleet_round_trips == 8 and total.fleet_fallbacks == 4
    assert total.fleet_outages == total.fleet_rejected == total.fleet_timeouts == 2
    assert total.fleet_renewals == 2
    assert total.fleet_limit is None and total.fleet_in_use is None
    assert total.fleet_unavailable is None
    assert total.fleet_leases_held == total.fleet_leases_local == total.fleet_waiting == 0
