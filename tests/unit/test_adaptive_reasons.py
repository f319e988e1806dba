"""Why the adaptive limit moved: the algorithms' ``reason`` and the controller's DEBUG line
on ``httpx_bulkhead.adaptive`` for each change of the limit (``_adaptive.py``, "Why the
limit moved"), without an event loop.

The account must agree with the history it explains: one record per change of the base
limit, chained (each record's ``previous`` is the last one's ``limit``), in the history's
order, each reason one of ``REASONS`` and its words naming the figure that decided.
"""

from __future__ import annotations

import itertools
import logging
import random
import re
from typing import NamedTuple

import httpx
import pytest

from httpx_bulkhead import AdaptiveLimit
from httpx_bulkhead._adaptive import AIMD, HISTORY, REASONS, AdaptiveController, Gradient
from tests.unit.test_adaptive import rounds
from tests.unit.test_adaptive_headroom import Rotation

LOGGER = "httpx_bulkhead.adaptive"


class Change(NamedTuple):
    """One DEBUG record of a change of the limit, by its ``extra`` attributes."""

    previous: int
    limit: int
    reason: str
    detail: str
    compartment: str
    message: str


def changes(caplog: pytest.LogCaptureFixture) -> list[Change]:
    out = []
    for record in caplog.records:
        if getattr(record, "event", None) != "limit":
            continue
        assert record.name == LOGGER and record.levelno == logging.DEBUG
        get = record.__dict__.__getitem__
        out.append(
            Change(
                get("previous"),
                get("limit"),
                get("reason"),
                get("detail"),
                get("compartment"),
                record.getMessage(),
            )
        )
    return out


def assert_accounts_for(controller: AdaptiveController, seen: list[Change]) -> None:
    """One record per change in ``controller.history`` (not yet overflowed), in order."""
    history = [limit for _, limit in controller.history]
    assert len(history) < HISTORY
    assert len(seen) == len(history) - 1
    for limit, previous, change in zip(history[1:], history[:-1], seen, strict=True):
        assert (change.previous, change.limit) == (previous, limit)
        assert change.reason in REASONS and change.detail
        assert f"adaptive limit {previous} -> {limit} ({change.reason}: " in change.message


def a_timeout() -> BaseException:
    """An httpx timeout: a drop."""
    return httpx.ReadTimeout("slow", request=httpx.Request("GET", "http://127.0.0.1/"))


@pytest.mark.parametrize("seed", range(1, 5))
def test_each_change_in_the_labs_phases_is_logged_with_its_reason(
    seed: int, caplog: pytest.LogCaptureFixture
) -> None:
    """16 -> 4 -> 24 workers (the lab's phases, 100 ms), through a controller with timed
    headroom tests: the first probe's end, cuts, growth, the probe after the fall and the
    tests' doubling each say so, with the figure that decided."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    spec = AdaptiveLimit(probe_interval=None)

    def workers(now: float) -> int:
        return 16 if now < 15 else 4 if now < 30 else 24

    rotation = Rotation(spec, workers, seed, controlled=True)
    rotation.run(45.0)
    controller = rotation.controller
    assert controller is not None
    seen = changes(caplog)
    assert_accounts_for(controller, seen)
    at = [t for t, _ in controller.history][1:]  # when each change was made
    reasons = [change.reason for change in seen]
    # 1 -> 10 once the first probe measured the no-load latency (100 ms x U[0.9, 1.1]).
    assert reasons[0] == "probed"
    measured = re.fullmatch(r"no-load latency (\d+\.\d) ms", seen[0].detail)
    assert measured is not None and 90 <= float(measured[1]) <= 110, seen[0].detail
    assert {"probed", "growth", "queue", "probe", "headroom"} <= set(reasons), reasons
    for change in seen:
        if change.reason == "queue":
            ratio = re.fullmatch(
                r"(window median|median of the later starters) (\d+\.\d\d)x"
                r" the no-load latency",
                change.detail,
            )
            assert ratio is not None and float(ratio[2]) >= spec.tolerance - 0.005, change
            assert change.limit < change.previous
        elif change.reason == "growth":
            grew = r".* \d+\.\d\dx the no-load latency, \d+% of the slots in use"
            assert re.fullmatch(grew, change.detail), change
            assert change.limit > change.previous
        elif change.reason == "headroom":
            assert change.previous <= 8 and change.limit > change.previous, change
    # The fall to 4 workers: a probe that names the fall.
    falls = [c for c, t in zip(seen, at, strict=True) if c.reason == "probe" and 15 <= t < 30]
    assert falls and all("half its peak" in c.detail for c in falls), falls
    # ... right after the cut that took it there, in the same window: two lines.
    for fall in falls:
        assert seen[seen.index(fall) - 1].reason == "queue"
    # After the rise to 24, headroom tests doubled the limit from 8 slots or fewer.
    assert "headroom" in [c.reason for c, t in zip(seen, at, strict=True) if t >= 30]


def test_a_periodic_probe_and_drops_say_so(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    now = [0.0]
    controller = AdaptiveController(
        AdaptiveLimit(initial_limit=20, probe_interval=5.0, backoff=0.5),
        lambda limit: None,
        lambda: controller.algorithm.applied,
        lambda: now[0],
        random.Random(1),
        name="api.example",
    )

    def round_of(latency: float, dropped: bool = False) -> None:
        started = now[0]
        now[0] += latency
        for _ in range(controller.algorithm.applied):
            if dropped:
                controller.failed(started, a_timeout())
            else:
                controller.ended(started, latency, 200, None)

    while now[0] < 7.0:
        round_of(0.01)
    seen = changes(caplog)
    assert (seen[0].reason, seen[0].detail) == ("probed", "no-load latency 10.0 ms")
    assert ("probe", "periodic") in [(c.reason, c.detail) for c in seen], seen
    assert {c.compartment for c in seen} == {"api.example"}
    assert "compartment 'api.example': adaptive limit 1 -> 20 (probed: " in seen[0].message
    caplog.clear()
    before = controller.algorithm.applied
    round_of(0.01, dropped=True)
    [drop] = changes(caplog)
    assert drop.reason == "drop" and drop.previous == before and drop.limit < before
    assert re.fullmatch(r"\d+ drop\(s\) in the window, x0\.5", drop.detail), drop
    assert [limit for _, limit in controller.history][-2:] == [before, drop.limit]


def test_aimd_says_drop_and_growth(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    now = [0.0]
    spec = AdaptiveLimit(algorithm="aimd", initial_limit=4, drop_statuses=frozenset({503}))
    controller = AdaptiveController(spec, lambda limit: None, lambda: 100, lambda: now[0])
    for i in range(200):
        now[0] += 0.01
        controller.ended(now[0] - 0.01, 0.01, 503 if i == 150 else 200, None)
    seen = changes(caplog)
    assert_accounts_for(controller, seen)
    reasons = [c.reason for c in seen]
    assert set(reasons) == {"growth", "drop"} and reasons.count("drop") == 1, reasons
    [drop] = [c for c in seen if c.reason == "drop"]
    assert drop.detail == "a drop, x0.9" and drop.limit < drop.previous


def test_the_pure_algorithms_keep_their_moves_until_taken() -> None:
    """Without a controller: each change of the base is a move, ``(base, reason, words)``,
    kept until the caller takes them (the initial probe is the initial state, not a move)."""
    gradient = Gradient(AdaptiveLimit(initial_limit=12, probe_interval=None), random.Random(2))
    assert gradient.base == 1 and gradient.moves == []
    now, _ = rounds(gradient, lambda now, limit: 0.05, 0.399)  # the probe's 8 exchanges
    assert gradient.moves == [(12, "probed", "no-load latency 50.0 ms")]
    gradient.moves.clear()
    # 4 workers: a queue, and the limit is cut for it, each move from the last one's base.
    _, trace = rounds(gradient, lambda now, limit: 0.05 * max(1.0, limit / 4), now + 0.5, now)
    bases = [12] + [base for base, _, _ in gradient.moves]
    assert min(trace) < 12 and "queue" in [reason for _, reason, _ in gradient.moves]
    assert all(a != b for a, b in itertools.pairwise(bases)) and bases[-1] == gradient.base
    aimd = AIMD(AdaptiveLimit(algorithm="aimd", initial_limit=3))
    for i in range(30):
        aimd.update(i * 0.01, i * 0.01 - 0.01, 0.01, i == 20, 3)
    reasons = [reason for _, reason, _ in aimd.moves]
    assert set(reasons) == {"growth", "drop"} and reasons.count("drop") == 1, reasons
    assert aimd.moves[-1][0] == aimd.applied


def test_nothing_is_logged_when_the_logger_is_off(caplog: pytest.LogCaptureFixture) -> None:
    """The default: the decisions' logger at WARNING, as its parent and the root."""
    caplog.set_level(logging.WARNING)
    now = [0.0]
    spec = AdaptiveLimit(algorithm="aimd", initial_limit=4)
    controller = AdaptiveController(spec, lambda limit: None, lambda: 100, lambda: now[0])
    for _ in range(100):
        now[0] += 0.01
        controller.ended(now[0] - 0.01, 0.01, 200, None)
    assert len(controller.history) > 5 and not caplog.records
