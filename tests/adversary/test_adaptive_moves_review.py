"""An adversarial review of the moves refactor (0b4f776) and the lab's ``--runs`` (1eda22f).

Pure: the controller in virtual time (``Clocked`` of review 6), and the lab's summary and
report read from the committed ``benchmarks/adaptive_lab.json``.  Its four defects, since
mended: the docs listed probes that write no line (at ``min_limit``, the first), the README
quoted lines its committed run does not have, and the summary's ranges over a phase without
a figure depended on the runs' order.
"""

from __future__ import annotations

import copy
import itertools
import json
import logging
import random
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import adaptive_lab
from httpx_bulkhead import AdaptiveLimit
from httpx_bulkhead._adaptive import AdaptiveController, Gradient
from tests.adversary.test_adaptive_reasons_review import Clocked, adaptive_logger, records
from tests.unit.test_adaptive_reasons import a_timeout

ROOT = Path(__file__).resolve().parents[2]
LAB = json.loads((ROOT / "benchmarks" / "adaptive_lab.json").read_text())


def feed(lab: Clocked, latency: float, running: int, dropped: bool = False) -> None:
    started = lab.now
    lab.advance(started + latency)
    lab.running = running
    if dropped:
        lab.controller.failed(started, a_timeout())
    else:
        lab.controller.ended(started, latency, 200, None)


@pytest.mark.parametrize(("algorithm", "seed"), [("gradient", 1), ("gradient", 2), ("aimd", 3)])
def test_the_history_the_lines_and_the_base_stay_one_chain(
    caplog: pytest.LogCaptureFixture, algorithm: str, seed: int
) -> None:
    """Clamps at both bounds, probes at min_limit, drops, unfed ends, test slots: after
    every call the history ends at the base, and each line is one step of it, none twice."""
    caplog.set_level(logging.DEBUG, logger="httpx_bulkhead.adaptive")
    spec = AdaptiveLimit(
        algorithm=algorithm,  # type: ignore[arg-type]
        min_limit=2,
        max_limit=12,
        initial_limit=6,
        probe_interval=0.5,
    )
    lab = Clocked(spec, timed=algorithm == "gradient", seed=seed)
    controller, rng = lab.controller, random.Random(seed)
    for step in range(2500):
        regime = (step // 300) % 3  # quiet, a queue, a stall
        latency = 0.1 * (1.0, 2.5, 6.0)[regime] * rng.uniform(0.9, 1.1)
        running = rng.choice((0, 1) + (controller.algorithm.applied,) * 6)
        if rng.random() < 0.03:
            controller.unfed(lab.now)
        else:
            feed(lab, latency, running, dropped=rng.random() < (0.01, 0.05, 0.3)[regime])
        assert controller.history[-1][1] == controller.algorithm.base
    # The lines chain from the first limit (a line lost or twice would break it), and the
    # history (its last HISTORY entries) is their tail.
    steps = [(p, n) for p, n, _, _ in records(caplog)]
    assert steps[0][0] == (2 if algorithm == "gradient" else 6)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(steps))
    history = [limit for _, limit in controller.history]
    assert steps[-len(history) + 1 :] == list(itertools.pairwise(history))
    assert {2, 12} <= {n for _, n in steps}  # both clamps were reached


def test_a_raising_handler_mid_batch_loses_no_move_and_repeats_none() -> None:
    """A window that cuts and drops makes two moves in one call; a handler raising on the
    first line leaves both in the history, and the next call records neither again."""
    lab = Clocked(AdaptiveLimit(initial_limit=20, probe_interval=None), timed=False)
    controller = lab.controller
    for _ in range(8):  # the first probe, at one slot
        feed(lab, 0.1, 1)
    assert controller.algorithm.base == 20

    class Broken(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            raise RuntimeError("broken")

    with adaptive_logger(Broken()), pytest.raises(RuntimeError):
        for index in range(20):  # a saturated window at 3x, its last exchange a drop
            feed(lab, 0.3, 20, dropped=index == 19)
    history = [limit for _, limit in controller.history]
    assert history[:2] == [1, 20] and len(history) == 4  # the cut and the drop, each once
    assert history[-1] == controller.algorithm.base
    feed(lab, 0.3, 1)
    assert len(controller.history) == 4 and not controller.algorithm.moves


def test_a_probe_at_min_limit_writes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """Review 7 found this probe never recorded while the docs listed its reason; the docs now
    say that a probe leaving the base where it is writes nothing (the line stays one per
    change of ``limit_history``)."""
    caplog.set_level(logging.DEBUG, logger="httpx_bulkhead.adaptive")
    lab = Clocked(AdaptiveLimit(min_limit=2, initial_limit=2, probe_interval=None))
    algorithm = lab.controller.algorithm
    assert type(algorithm) is Gradient
    probes = 0
    for _ in range(200):  # idle callers: nothing grows it, every window at min_limit
        probing = algorithm._probing
        feed(lab, 0.1, 0)
        probes += algorithm._probing and not probing
    if probes < 2:  # (the scenario, not the claim)
        raise RuntimeError(f"no probe at min_limit: {probes}")
    assert not [words for *_, words in records(caplog) if "min_limit" in words]
    assert [limit for _, limit in lab.controller.history] == [2]


def test_the_first_probe_has_no_line_its_end_has(caplog: pytest.LogCaptureFixture) -> None:
    """(The README listed "the first" among the probes written; it no longer does.)"""
    caplog.set_level(logging.DEBUG, logger="httpx_bulkhead.adaptive")
    lab = Clocked(AdaptiveLimit(initial_limit=6))
    for _ in range(8):
        feed(lab, 0.1, 1)
    assert lab.controller.algorithm.base == 6
    assert [reason for _, _, reason, _ in records(caplog)] == ["probed"]


def test_the_one_run_report_reads_as_committed() -> None:
    text = (ROOT / "benchmarks" / "adaptive_lab.md").read_text()
    assert adaptive_lab.markdown(LAB) == text


def test_the_readmes_quoted_lines_are_in_the_committed_run() -> None:
    readme = (ROOT / "README.md").read_text()
    quoted = re.findall(r"^adaptive limit (\d+) -> (\d+) \((\w+): (.*)\)$", readme, re.M)
    assert len(quoted) == 4
    lines = {(str(a), str(b), r, w) for _, a, b, r, w in LAB["decisions"]["adaptive"]}
    assert [q for q in quoted if q not in lines] == []


def with_phase_1(result: dict[str, Any], **figures: float | None) -> dict[str, Any]:
    """``result`` with phase 1's adaptive row changed (``p99_ms``, ``goodput`` ...)."""
    changed = copy.deepcopy(result)
    for row in changed["rows"]:
        if (row["phase"], row["contestant"]) == (1, "adaptive"):
            row.update(figures)
    return changed


def summary_line(text: str, phase: int) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"- phase {phase} "))


def test_a_p99_of_exactly_1_5_is_met_and_not_counted_over() -> None:
    edge = with_phase_1(LAB, p99_ms=1.5 * LAB["service_ms"], first_in_band_s=None)
    text = adaptive_lab.runs_summary([edge, LAB])
    line = summary_line(text, 1)
    row = next(r for r in LAB["rows"] if (r["phase"], r["contestant"]) == (1, "adaptive"))
    best = max(
        r["goodput"] for r in LAB["rows"] if r["phase"] == 1 and r["contestant"] != "adaptive"
    )
    p99, late = row["p99_ms"] / LAB["service_ms"], row["p99_after_5s_ms"] / LAB["service_ms"]
    assert p99 < 1.5  # (the committed run's; the edge is the other run)
    assert f"p99 {p99:.2f}x-1.50x, over 1.5x in 0" in line and "in band within 5 s in 1" in line
    share = row["goodput"] / best
    assert f"| 1 | {share:.1%}, 1.50x, {late:.2f}x, never |" in text  # never in band: NOT met
    committed = all(adaptive_lab.met(v) for v in adaptive_lab.verdicts(LAB) if v["phase"] != 2)
    assert f"met in {int(committed)} of 2 runs" in text  # (the edge run: never in band)


def test_a_phase_without_a_p99_does_not_change_the_summary_with_the_order() -> None:
    empty = with_phase_1(LAB, p99_ms=float("nan"))
    first = summary_line(adaptive_lab.runs_summary([empty, LAB]), 1)
    last = summary_line(adaptive_lab.runs_summary([LAB, empty]), 1)
    assert first == last


@pytest.mark.parametrize("runs", ["0", "-1"])
def test_runs_below_one_are_refused(
    runs: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["adaptive_lab", "--runs", runs])
    with pytest.raises(SystemExit):
        adaptive_lab.main()
    assert f"--runs must be at least 1, got {runs}" in capsys.readouterr().err


def test_the_controller_at_construction_records_no_move() -> None:
    controller = AdaptiveController(
        AdaptiveLimit(initial_limit=9), lambda limit: None, lambda: 0, lambda: 0.0
    )
    assert [limit for _, limit in controller.history] == [1]
    assert controller.algorithm.moves == []
