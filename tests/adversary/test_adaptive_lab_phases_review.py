"""Review 15: the adaptive lab's 30 s phases (d2b99ad, e4a6ebc).

The lab's phases became 30 s by default and the model took ``--phase-seconds`` too, checked
above 0.  Mended: a phase of 5 s or less (the lab's own docstring runs 3 s phases) printed
``nan%`` and ``nanx`` where ``_x`` already printed ``-``; ``--by-limit`` over such a phase
printed a header over nothing, as ``--by-limit 4`` did before d2b99ad.  Left by the review
and mended after it: a huge ``--phase-seconds`` was taken, and the model draws every arrival
up front (``poisson``), so ``1e9`` grew until a ``MemoryError`` traceback (now 600 s a phase
at most); with ``--shed``, a phase in which no static contestant was answered (a tiny run on a
busy machine) stopped the report with a ``ZeroDivisionError``.  Also checked here: the paths
the change's tests left out (the model's ``--phase-seconds`` without ``--summary``; the lab's
30 s default), each able to fail.

No test here runs the real lab: ``adaptive_lab.run`` is replaced by one that fails the test
if reached, so a refusal that regresses cannot start servers or write the committed report.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import adaptive_lab, adaptive_sim


class Reached(Exception):
    """The lab or the model was about to run."""

    def __init__(self, args: Any) -> None:
        super().__init__("reached the run")
        self.args_seen = args


def _never_run_lab(monkeypatch: pytest.MonkeyPatch) -> None:
    async def run(args: argparse.Namespace) -> dict[str, Any]:
        raise Reached(args)

    monkeypatch.setattr(adaptive_lab, "run", run)


def _never_run_model(monkeypatch: pytest.MonkeyPatch) -> None:
    def run(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise Reached(kwargs)

    monkeypatch.setattr(adaptive_sim, "run", run)


@pytest.mark.parametrize("seconds", [3.0, 5.0, 1e-9])
def test_a_phase_of_5_s_or_less_prints_no_nan(seconds: float) -> None:
    """Nothing from 5 s in: the report said ``in the band nan%``, ``nan% from 5 s in``,
    ``nan ms`` in the table and ``read from 5 s in (nanx)``, where p99s read ``-``."""
    text = adaptive_lab.markdown(adaptive_sim.run(1, adaptive_sim.QUIET, phase_seconds=seconds))
    assert "nan" not in text.lower()
    assert "- from 5 s in" in text


@pytest.mark.parametrize("seconds", ["3", "5"])
def test_by_limit_refuses_a_phase_with_nothing_from_5_s_in(
    seconds: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--phase-seconds 3 --by-limit 1`` printed "phase 1 from 5 s in, by limit at
    admission:" over nothing (exit 0), as ``--by-limit 4`` did before d2b99ad."""
    _never_run_model(monkeypatch)
    monkeypatch.setattr(
        sys, "argv", ["adaptive_sim", "--seeds", "1", "--phase-seconds", seconds, "--by-limit=1"]
    )
    with pytest.raises(SystemExit) as exit_:
        adaptive_sim.main()
    assert exit_.value.code == 2
    assert "--by-limit reads a phase from 5 s in" in capsys.readouterr().err


def test_by_limit_over_a_phase_just_over_5_s_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The refusal's edge: 5.5 s leaves half a second from 5 s in, and its rows print."""
    monkeypatch.setattr(
        sys, "argv", ["adaptive_sim", "--seeds", "1", "--noise", "quiet", "--phase-seconds",
                      "5.5", "--by-limit=1"]
    )  # fmt: skip
    adaptive_sim.main()
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "seed 1: phase 1 from 5 s in, by limit at admission:"
    assert len(out) > 1 and "of responses" in out[1]


def test_the_model_runs_the_phases_asked_for_without_the_summary(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only ``--summary`` was tested with ``--phase-seconds``: the per-seed outputs could
    drop it (reverting ``phase_seconds=`` in ``main``'s loop passed every test)."""
    monkeypatch.setattr(
        sys,
        "argv",
        ["adaptive_sim", "--seeds", "2", "--noise", "quiet", "--phase-seconds", "30", "--markdown"],
    )
    adaptive_sim.main()
    out = capsys.readouterr().out
    assert "30 s per phase" in out
    expected = adaptive_lab.markdown(adaptive_sim.run(2, adaptive_sim.QUIET, phase_seconds=30.0))
    assert out == expected + "\n"


def test_the_lab_runs_30_s_phases_unless_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The change's point, which no test held: ``adaptive_lab`` with no ``--phase-seconds``
    runs ``PHASE_SECONDS`` (30 s) phases; ``--phase-seconds 15`` the lab of before."""
    _never_run_lab(monkeypatch)
    for argv, expected in (([], 30.0), (["--phase-seconds", "15"], 15.0)):
        monkeypatch.setattr(sys, "argv", ["adaptive_lab", "--out", str(tmp_path / "x"), *argv])
        with pytest.raises(Reached) as reached:
            adaptive_lab.main()
        assert reached.value.args_seen.phase_seconds == expected
    assert adaptive_lab.PHASE_SECONDS == 30.0
    assert adaptive_sim.PHASE_SECONDS == 15.0


def test_the_model_refuses_a_phase_it_cannot_hold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--phase-seconds 1e9`` was taken, and ``poisson`` appends 300 arrivals a second for
    3e9 s: memory grew for minutes until a ``MemoryError`` traceback (60 s under a 3 GB
    ``ulimit -v`` for ``1e7``).  Mended after the review: both CLIs take 600 s a phase at
    most (``adaptive_lab.MAX_PHASE_SECONDS``); ``run`` is replaced here, so nothing is drawn."""
    _never_run_model(monkeypatch)
    monkeypatch.setattr(sys, "argv", ["adaptive_sim", "--seeds", "1", "--phase-seconds", "1e9"])
    with pytest.raises(SystemExit) as exit_:
        adaptive_sim.main()
    assert exit_.value.code == 2


def test_a_shedding_phase_without_static_responses_is_reported() -> None:
    """``tests/test_adaptive_lab.py``'s tiny shedding lab (0.5 s phases), on a machine busy
    with the model, once had a phase in which neither static contestant was answered: the
    report divided by that best static goodput of 0 (``shed_lines``).  Now a ``-``."""
    result = adaptive_sim.run(1, adaptive_sim.QUIET, phase_seconds=6.0, shed=8)
    for row in result["rows"]:
        if row["phase"] == 1 and row["contestant"].startswith("static"):
            row["goodput"] = 0.0
    line = next(x for x in adaptive_lab.shed_lines(result) if x.startswith("phase 1 "))
    assert "goodput - of the best static" in line and "the gradient: " in line
    assert ", goodput -, p99 " in line
    assert "nan" not in adaptive_lab.markdown(result).lower()
