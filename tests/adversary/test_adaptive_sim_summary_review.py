"""Review 14: ``python -m benchmarks.adaptive_sim --seeds 1-160 --summary`` (f3ca425).

Pure: the model in virtual time, a seed or two at a time (about 0.4 s a seed).  Mended: the
summary asked for beside ``--markdown`` or ``--by-limit`` silently dropped them (now the
three are refused together), and a single seed was titled "1 seeds (3-3)".
"""

from __future__ import annotations

import sys

import pytest

from benchmarks import adaptive_sim


@pytest.mark.parametrize("other", [["--markdown"], ["--by-limit", "2"]])
def test_the_summary_is_not_asked_for_beside_another_output(
    other: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--summary --by-limit 2`` printed the summary alone, exit 0: the other output asked
    for was dropped without a word.  Refused at parsing, before any seed is run."""
    monkeypatch.setattr(sys, "argv", ["adaptive_sim", "--seeds", "1", "--summary", *other])
    with pytest.raises(SystemExit) as exit_:
        adaptive_sim.main()
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "not allowed with argument" in err and "--summary" in err


def test_one_seed_is_titled_as_one() -> None:
    """``--seeds 3 --summary`` was titled "1 seeds (3-3)"."""
    text = adaptive_sim.summary([3], "quiet", workers=1)
    assert text.startswith("The model, quiet noise, 1 seed (3): a run a seed.\n")
