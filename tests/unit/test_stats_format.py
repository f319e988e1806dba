"""``CompartmentStats`` reads: a grouped ``str()`` without zeros, a grouped ``as_dict()``
holding every field, and a documented meaning for every field."""

from __future__ import annotations

import dataclasses
import inspect
import json
from typing import Any

from httpx_bulkhead import CompartmentStats
from httpx_bulkhead._stats import GROUPS

FIELDS = [f.name for f in dataclasses.fields(CompartmentStats)]


def snapshot(**values: Any) -> CompartmentStats:
    base: dict[str, Any] = {name: 0 for name in FIELDS}
    base.update(name="llm", limit=4, max_pending=None, stream_caps=())
    base.update({k: 0.0 for k in ("wait_p50", "wait_p95", "wait_p99", "wait_max")})
    base.update(values)
    return CompartmentStats(**base)


def test_every_field_but_the_name_is_in_exactly_one_group() -> None:
    grouped = [field for _, fields in GROUPS for _, field in fields]
    assert sorted(grouped) == sorted(set(FIELDS) - {"name"})
    for _, fields in GROUPS:
        labels = [label for label, _ in fields]
        assert len(labels) == len(set(labels))


def test_as_dict_holds_every_value_grouped_and_is_json() -> None:
    values: dict[str, Any] = {name: i + 1 for i, name in enumerate(FIELDS) if name != "name"}
    values.update(stream_caps=(3, 100), wait_p50=0.25, wait_max=1.5)
    stats = snapshot(**values)
    out = stats.as_dict()
    assert list(out) == [
        "name",
        "slots",
        "connections",
        "requests",
        "discards",
        "http2",
        "wait",
        "fleet",
    ]
    assert out["name"] == "llm"
    for group, fields in GROUPS:
        section = out[group]
        assert isinstance(section, dict)
        for label, field in fields:
            expected = getattr(stats, field)
            assert section[label] == (list(expected) if isinstance(expected, tuple) else expected)
    assert json.loads(json.dumps(out)) == out
    assert out["discards"] == {
        reason: values[reason]
        for reason in (
            "idle_expired",
            "lifetime_expired",
            "unknown_state",
            "peer_closed",
            "error",
            "not_reusable",
            "surplus",
            "closed",
            "ping_timeouts",
            "loop_changed",
        )
    }


def test_str_is_grouped_and_leaves_zeros_out() -> None:
    stats = snapshot(
        running=1,
        waiting=2,
        max_pending=10,
        connections=2,
        idle_connections=1,
        in_use_connections=1,
        connections_created=3,
        acquired=9,
        completed=7,
        rejected=3,
        acquire_timeouts=1,
        unknown_state=1,
        http2_connections=2,
        open_streams=1,
        stream_caps=(100, 250),
        wait_p95=0.2,
        wait_max=0.5125,
    )
    assert str(stats) == (
        "llm: 1/4 running, 2 waiting (max_pending 10)\n"
        "  connections: open 2, idle 1, in use 1, created 3\n"
        "  requests: acquired 9, completed 7, rejected 3, acquire timeouts 1\n"
        "  discards: unknown state 1\n"
        "  http2: connections 2, open streams 1, stream caps 100,250\n"
        "  wait: p95 200.0 ms, max 512.5 ms"
    )


def test_str_of_an_untouched_compartment_is_one_line() -> None:
    assert str(snapshot(limit=100)) == "llm: 0/100 running, 0 waiting"


#: Fields that share the comment of the field above them.
SHARED = {"open_streams", "wait_p95", "wait_p99", "wait_max"}


def test_every_field_is_documented() -> None:
    """Each field has a ``#:`` comment right above it, but those that share the one above
    the field before them (the quantiles, ``open_streams``)."""
    lines = [line.strip() for line in inspect.getsource(CompartmentStats).splitlines()]
    undocumented = []
    for name in FIELDS:
        index = lines.index(next(line for line in lines if line.startswith(f"{name}:")))
        above = lines[index - 1]
        if name in SHARED:
            assert above.split(":")[0] in FIELDS, name
        elif not above.startswith("#:"):
            undocumented.append(name)
    assert undocumented == []


def test_str_shows_the_fleet_group_with_an_unavailable_redis() -> None:
    """The fleet line lists what is not zero; an unavailable Redis shows (a flag named for
    the state that matters, since ``str()`` leaves false values out)."""
    stats = snapshot(
        fleet_limit=50,
        fleet_leases_held=3,
        fleet_leases_local=1,
        fleet_in_use=41,
        fleet_unavailable=True,
        fleet_acquired=9,
        fleet_round_trips=12,
        fleet_fallbacks=1,
        fleet_outages=1,
    )
    assert str(stats).splitlines()[1] == (
        "  fleet: limit 50, leases held 3, leases local 1, in use 41, unavailable True,"
        " acquired 9, round trips 12, fallbacks 1, outages 1"
    )
    assert stats.as_dict()["fleet"] == {
        "limit": 50,
        "leases_held": 3,
        "leases_local": 1,
        "waiting": 0,
        "in_use": 41,
        "unavailable": True,
        "acquired": 9,
        "round_trips": 12,
        "fallbacks": 1,
        "outages": 1,
        "rejected": 0,
        "timeouts": 0,
        "renewals": 0,
        "lost": 0,
    }


def test_a_compartment_without_a_fleet_has_the_defaults_and_no_fleet_line() -> None:
    """The fleet fields default to ``None``/0 (so a snapshot built without them is
    valid); ``str()`` then has no fleet line, ``as_dict()`` says ``None``."""
    values = {
        f.name: getattr(snapshot(acquired=2), f.name)
        for f in dataclasses.fields(CompartmentStats)
        if not f.name.startswith("fleet_")
    }
    stats = CompartmentStats(**values)
    assert "fleet" not in str(stats) and "acquired 2" in str(stats)
    fleet = stats.as_dict()["fleet"]
    assert isinstance(fleet, dict)
    assert fleet["limit"] is None and fleet["in_use"] is None and fleet["unavailable"] is None
    assert fleet["acquired"] == fleet["lost"] == fleet["leases_held"] == 0
