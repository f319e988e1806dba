"""Issue 18's HTTP/1.1 targets, read off the overhead rows, and the table of the contestants
beside the default ones (the parsers' floors, httpx + httpx-aiohttp, aiohttp alone).

Each target is a same-run, same-round CPU ratio (``paired`` in a row of the ``overhead`` or
``uvloop`` suite), met when its median is at or below the bound:

* transport level, concurrency 1: ``bulkhead / h11-floor`` and ``bulkhead+httptools /
  httptools-floor`` <= 1.25; at concurrency 64, <= 1.4;
* client level, concurrency 64: ``bulkhead+httptools / httpx-aiohttp`` (BulkheadTransport
  with the default codec, httptools when installed, inside ``httpx.AsyncClient``, against
  httpx with the aiohttp transport) <= 1.0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks import harness as h

__all__ = ["PAIRS", "TARGETS", "Target", "contestants_table", "targets_table"]


@dataclass(frozen=True)
class Target:
    """``a / b`` (same-round CPU per request) at ``level`` and ``concurrency`` <= ``bound``."""

    label: str
    level: h.Level
    concurrency: int
    a: str
    b: str
    bound: float


TARGETS = (
    Target("h11 transport vs h11 floor", "transport", 1, h.BULKHEAD, h.FLOOR, 1.25),
    Target("h11 transport vs h11 floor", "transport", 64, h.BULKHEAD, h.FLOOR, 1.4),
    Target(
        "httptools transport vs httptools floor",
        "transport",
        1,
        h.HTTPTOOLS,
        h.HTTPTOOLS_FLOOR,
        1.25,
    ),
    Target(
        "httptools transport vs httptools floor",
        "transport",
        64,
        h.HTTPTOOLS,
        h.HTTPTOOLS_FLOOR,
        1.4,
    ),
    Target(
        "whole client (default codec, httptools) vs httpx + httpx-aiohttp",
        "client",
        64,
        h.HTTPTOOLS,
        h.HTTPX_AIOHTTP,
        1.0,
    ),
)

#: The same-round ratios the overhead suites record for these tables.
PAIRS = (
    (h.HTTPTOOLS, h.HTTPTOOLS_FLOOR),
    (h.BULKHEAD, h.HTTPX_AIOHTTP),
    (h.HTTPTOOLS, h.HTTPX_AIOHTTP),
    (h.BULKHEAD, h.AIOHTTP),
    (h.HTTPX_AIOHTTP, h.AIOHTTP),
)


def _ratio(row: dict[str, Any], a: str, b: str) -> list[float] | None:
    ratio: list[float] | None = row.get("paired", {}).get(f"{a}/{b}")
    return ratio


def targets_table(suites: Sequence[tuple[str, Sequence[dict[str, Any]]]]) -> str:
    """One line per target and event loop (``suites``: ``(loop name, overhead rows)``)."""
    lines = [
        "| target | loop | level | conc. | ratio (range over rounds) | bound | met |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for loop, rows in suites:
        for t in TARGETS:
            row = next(
                (r for r in rows if r["level"] == t.level and r["concurrency"] == t.concurrency),
                None,
            )
            ratio = None if row is None else _ratio(row, t.a, t.b)
            if ratio is None:
                cell, met = "-", "not measured"
            else:
                cell = f"{ratio[0]:.2f}x ({ratio[1]:.2f}-{ratio[2]:.2f})"
                met = "**met**" if ratio[0] <= t.bound else "not met"
            lines.append(
                f"| {t.label} (`{t.a}` / `{t.b}`) | {loop} | {t.level} | {t.concurrency}"
                f" | {cell} | <= {t.bound:.2f}x | {met} |"
            )
    return "\n".join(lines)


def _cpu(row: dict[str, Any], name: str) -> str:
    summary = row["summary"].get(name)
    return "-" if summary is None else f"{summary['cpu_us']:,.0f}"


def _cell(row: dict[str, Any], a: str, b: str) -> str:
    ratio = _ratio(row, a, b)
    return "-" if ratio is None else f"{ratio[0]:.2f}x"


def _samples(row: dict[str, Any], name: str) -> str:
    batches = [s["requests"] for s in row.get("samples", {}).get(name, [])]
    if not batches:
        return "-"
    low, high = min(batches), max(batches)
    return f"{len(batches)} x {low:,}" + ("" if low == high else f"-{high:,}")


def contestants_table(rows: Sequence[dict[str, Any]]) -> str:
    """CPU per request of the floors and the aiohttp clients, and BulkheadTransport's ratios
    to them (same rounds as the main overhead table)."""
    names = (h.HTTPTOOLS_FLOOR, h.HTTPX_AIOHTTP, h.AIOHTTP)
    lines = [
        "| level | conc. | httptools floor µs/req | +httptools / httptools floor |"
        " httpx + httpx-aiohttp µs/req | bulkhead / httpx-aiohttp | +httptools /"
        " httpx-aiohttp | aiohttp alone µs/req | bulkhead / aiohttp | httpx-aiohttp /"
        " aiohttp | samples: rounds x requests, httptools floor / httpx-aiohttp / aiohttp |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['level']} | {row['concurrency']} | {_cpu(row, h.HTTPTOOLS_FLOOR)}"
            f" | {_cell(row, h.HTTPTOOLS, h.HTTPTOOLS_FLOOR)} | {_cpu(row, h.HTTPX_AIOHTTP)}"
            f" | {_cell(row, h.BULKHEAD, h.HTTPX_AIOHTTP)}"
            f" | {_cell(row, h.HTTPTOOLS, h.HTTPX_AIOHTTP)} | {_cpu(row, h.AIOHTTP)}"
            f" | {_cell(row, h.BULKHEAD, h.AIOHTTP)} | {_cell(row, h.HTTPX_AIOHTTP, h.AIOHTTP)}"
            f" | {' / '.join(_samples(row, n) for n in names)} |"
        )
    return "\n".join(lines)
