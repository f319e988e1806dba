"""The floor+models table of the benchmark report (``benchmarks/models_floor.py``), from a
made-up overhead row: the ratios it reads, the target verdicts and the share that is ours."""

from __future__ import annotations

from benchmarks import harness as h
from benchmarks import models_floor as mf


def _row(level: str, concurrency: int, paired: dict[str, float]) -> dict[str, object]:
    return {
        "level": level,
        "concurrency": concurrency,
        "summary": {mf.H11_MODELS: {"cpu_us": 150.0}, mf.HTTPTOOLS_MODELS: {"cpu_us": 90.0}},
        "paired": {k: [v, v, v] for k, v in paired.items()},
    }


def test_models_table_reads_the_pairs_it_records() -> None:
    recorded = {f"{a}/{b}" for a, b in mf.pairs()}
    assert recorded == {
        f"{h.BULKHEAD}/{mf.H11_MODELS}",
        f"{mf.H11_MODELS}/{h.FLOOR}",
        f"{h.HTTPTOOLS}/{mf.HTTPTOOLS_MODELS}",
        f"{mf.HTTPTOOLS_MODELS}/{h.HTTPTOOLS_FLOOR}",
    }


def test_models_table_marks_targets_and_our_share() -> None:
    row = _row(
        "transport",
        64,
        {
            f"{h.BULKHEAD}/{mf.H11_MODELS}": 1.1,
            f"{mf.H11_MODELS}/{h.FLOOR}": 1.2,
            f"{h.BULKHEAD}/{h.FLOOR}": 1.32,  # under 1.4: met; ours (1.32-1.2)/(0.32) = 38%
            f"{h.HTTPTOOLS}/{mf.HTTPTOOLS_MODELS}": 1.5,
            f"{mf.HTTPTOOLS_MODELS}/{h.HTTPTOOLS_FLOOR}": 2.0,
            f"{h.HTTPTOOLS}/{h.HTTPTOOLS_FLOOR}": 3.0,  # not met; ours (3-2)/2 = 50%
        },
    )
    lines = mf.models_table([row]).splitlines()
    assert len(lines) == 4
    h11_line, httptools_line = lines[2], lines[3]
    assert (
        "| transport | h11 | 64 | 150 | 1.20x | 1.10x | 1.32x | <= 1.40x: **met** | 38% |"
        in h11_line
    )
    assert "| 3.00x | <= 1.40x: not met | 50% |" in httptools_line


def test_models_table_has_no_target_at_the_client_level() -> None:
    row = _row("client", 1, {f"{h.BULKHEAD}/{h.FLOOR}": 3.0, f"{mf.H11_MODELS}/{h.FLOOR}": 2.0})
    h11_line = mf.models_table([row]).splitlines()[2]
    assert "| 3.00x | - | - |" in h11_line  # no target; no share without bulkhead/models
