"""Review 14: ``python -m benchmarks.adaptive_sim --seeds 1-160 --summary`` (f3ca425).

The model in virtual time, a seed at a time (about 0.4 s a seed), and a forked pool held on
an event.  Mended: the summary asked for beside ``--markdown`` or ``--by-limit`` dropped
them without a word (the three are now refused together); one seed was titled "1 seeds
(3-3)"; a Ctrl-C while ``map`` handed the seeds to the pool (seconds of it for ``--seeds
1-1000000``) waited for every seed handed out; a seed given twice (``--seeds 1-3 2``,
overlapping ranges) was run and counted twice (now once).
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

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
    assert text.startswith("The model, quiet noise, 15 s a phase, 1 seed (3): a run a seed.\n")


# Mended (was a strict xfail: a seed given twice, --seeds 1-3 2 or overlapping ranges
# 1-100 50-150, was run and counted twice: '2 seeds (1, 1)', 'met in 2 of 2 runs').
def test_a_seed_given_twice_is_not_counted_twice() -> None:
    """The model is deterministic: a seed's second run is its first again, so counting it
    twice weighs that seed double in every count of the summary.  Run once."""
    text = adaptive_sim.summary([1, 1], "quiet", workers=1)
    assert text.startswith("The model, quiet noise, 15 s a phase, 1 seed (1): a run a seed.\n")


FORK = multiprocessing.get_context("fork")
#: Holds the worker in its first chunk until the interrupt (set just before it is raised).
GATE = FORK.Event()


def _held_seed(job: tuple[int, str]) -> dict[str, Any]:
    GATE.wait(30)  # (a bound, should the interrupt never come)
    return {}


def test_an_interrupt_while_the_seeds_are_handed_out_cancels_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Executor.map`` hands every chunk to the pool before it returns (9 s, 663 MB for a
    million seeds here): a Ctrl-C in that loop never reached ``map``'s own cancelling of
    what is left, and the ``with`` waited for every chunk handed out, the workers carrying
    on past their own ``KeyboardInterrupt`` (still at it 2 min after a Ctrl-C 3 s into
    ``--seeds 1-1000000``).  The interrupt comes at the 201st chunk here, the worker held in
    its first: the chunks it has not started are cancelled, not run."""
    handed: list[Future[Any]] = []

    class Interrupted(ProcessPoolExecutor):
        def __init__(self, max_workers: int | None = None) -> None:
            super().__init__(max_workers, mp_context=FORK)

        def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
            if len(handed) == 200:
                GATE.set()
                raise KeyboardInterrupt
            handed.append(super().submit(fn, *args, **kwargs))
            return handed[-1]

    GATE.clear()
    monkeypatch.setattr(adaptive_sim, "ProcessPoolExecutor", Interrupted)
    monkeypatch.setattr(adaptive_sim, "_run_seed", _held_seed)
    with pytest.raises(KeyboardInterrupt):
        adaptive_sim.summary(range(1, 1001), "quiet", workers=1)
    assert sum(future.cancelled() for future in handed) > 150
