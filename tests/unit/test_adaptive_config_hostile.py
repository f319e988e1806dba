"""An independent review's attack on ``AdaptiveLimit``'s validation: hostile values for
every field raise ``TypeError``/``ValueError`` naming the field and the value; and the
defaults of one field never make a valid setting of another invalid."""

from __future__ import annotations

import dataclasses
import math
import pickle

import pytest

from httpx_bulkhead import AdaptiveLimit, Policy

HOSTILE: list[tuple[dict[str, object], type[Exception], str]] = [
    ({"min_limit": True}, TypeError, "min_limit must be an int, got True"),
    ({"min_limit": 2.0}, TypeError, "min_limit must be an int, got 2.0"),
    ({"min_limit": -1}, ValueError, "min_limit must be >= 1, got -1"),
    ({"max_limit": math.inf}, TypeError, "max_limit must be an int, got inf"),
    ({"max_limit": False}, TypeError, "max_limit must be an int, got False"),
    (
        {"min_limit": 5, "max_limit": 2, "initial_limit": 2},
        ValueError,
        "min_limit must be <= max_limit=2",
    ),
    ({"initial_limit": 500}, ValueError, "initial_limit must be <= max_limit=200, got 500"),
    ({"initial_limit": 0}, ValueError, "initial_limit must be >= 1, got 0"),
    ({"tolerance": math.nan}, ValueError, "tolerance must be in (1, 3], got nan"),
    ({"tolerance": math.inf}, ValueError, "tolerance must be in (1, 3], got inf"),
    ({"tolerance": True}, TypeError, "tolerance must be a number, got True"),
    ({"probe_interval": math.nan}, ValueError, "probe_interval must be in (0, inf], got nan"),
    ({"probe_interval": -1.0}, ValueError, "probe_interval must be in (0, inf], got -1.0"),
    ({"probe_interval": True}, TypeError, "probe_interval must be a number, got True"),
    ({"backoff": math.nan}, ValueError, "backoff must be in (0, 1), got nan"),
    ({"backoff": math.inf}, ValueError, "backoff must be in (0, 1), got inf"),
    ({"backoff": True}, TypeError, "backoff must be a number, got True"),
    ({"drop_statuses": {True}}, ValueError, "drop_statuses must hold status codes, got True"),
    ({"drop_statuses": {503.0}}, ValueError, "drop_statuses must hold status codes, got 503.0"),
    ({"drop_statuses": {600}}, ValueError, "drop_statuses must hold status codes, got 600"),
    ({"drop_statuses": "503"}, TypeError, "drop_statuses must be a set of status codes"),
    ({"drop_statuses": [503]}, TypeError, "drop_statuses must be a set of status codes"),
    ({"algorithm": "AIMD"}, ValueError, "algorithm must be 'gradient' or 'aimd', got 'AIMD'"),
]


@pytest.mark.parametrize(("kwargs", "error", "says"), HOSTILE, ids=[str(c[0]) for c in HOSTILE])
def test_hostile_values_are_refused_naming_field_and_value(
    kwargs: dict[str, object], error: type[Exception], says: str
) -> None:
    with pytest.raises(error) as info:
        AdaptiveLimit(**kwargs)  # type: ignore[arg-type]
    assert type(info.value) is error
    assert f"AdaptiveLimit.{says}" in str(info.value)


def test_a_min_limit_above_the_default_maximum_names_min_limit() -> None:
    with pytest.raises(ValueError, match=r"AdaptiveLimit\.min_limit"):
        AdaptiveLimit(min_limit=10**30)


def test_the_backoff_range_in_the_message_is_the_range_accepted() -> None:
    with pytest.raises(ValueError, match=r"backoff must be in \(0, 1\)"):
        AdaptiveLimit(backoff=0.0)


@pytest.mark.parametrize("maximum", [1, 4, 9])
def test_a_small_max_limit_alone_is_a_valid_setting(maximum: int) -> None:
    spec = AdaptiveLimit(max_limit=maximum)
    assert spec.min_limit <= spec.initial_limit <= maximum
    assert Policy(max_concurrency=spec).max_concurrency == spec


def test_replace_refits_an_initial_limit_left_at_its_default() -> None:
    """``dataclasses.replace`` passes every field on: an ``initial_limit`` fitted to a small
    ``max_limit`` must not stick once that maximum is raised (it was left alone)."""
    small = AdaptiveLimit(max_limit=4)
    assert small.initial_limit == 4
    assert dataclasses.replace(small, max_limit=300).initial_limit == 10
    raised = AdaptiveLimit(min_limit=20, max_limit=50)
    assert dataclasses.replace(raised, min_limit=1).initial_limit == 10
    chosen = AdaptiveLimit(max_limit=8, initial_limit=3)
    assert dataclasses.replace(chosen, max_limit=300).initial_limit == 3  # a value given stays


def test_a_spec_with_defaults_pickles_and_compares_equal() -> None:
    spec = AdaptiveLimit(max_limit=4)
    copy = pickle.loads(pickle.dumps(spec))
    assert copy == spec == AdaptiveLimit(max_limit=4, initial_limit=4)
    assert dataclasses.replace(copy, max_limit=300).initial_limit == 10
    assert repr(spec) == repr(AdaptiveLimit(max_limit=4, initial_limit=4))
