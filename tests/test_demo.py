"""``python -m httpx_bulkhead demo``: a short run passes, explains what it shows, keeps its
rows in a stable order and starts the bulkhead run from a clean slate."""

from __future__ import annotations

import asyncio
import io
import re
import subprocess
import sys
from pathlib import Path
from typing import cast

import httpx
import pytest

from httpx_bulkhead import BulkheadTransport
from httpx_bulkhead._demo import (
    LEGEND,
    DemoConfig,
    DemoServer,
    RunResult,
    _live_lines,
    make_transports,
    run_demo,
    slow_host_note,
)
from httpx_bulkhead._load import CallRecord
from httpx_bulkhead.testing import MockNetwork

ROOT = Path(__file__).resolve().parent.parent
#: A short run: well under two seconds per transport.
SHORT = DemoConfig(
    slow_seconds=0.5, duration=0.6, connections=4, fast_interval=0.05, pool_timeout=0.2
)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_short_run_passes_and_explains_itself() -> None:
    shared, bulkheads = make_transports(SHORT)
    out = _Terminal()
    assert asyncio.run(run_demo(SHORT, shared, bulkheads, out)) == 0
    text = out.getvalue()
    bulkhead_part = text[text.index("BulkheadTransport (2 per host)") :]
    bulkhead_frames = re.findall(r"slow \d+ in flight on (\d+) connections", bulkhead_part)
    assert bulkhead_frames
    # Before: the first frames of the bulkhead run showed the shared pool's 4 connections.
    assert all(int(n) <= 2 for n in bulkhead_frames), bulkhead_frames
    frames = bulkhead_part.split("BulkheadTransport (2 per host) [")[1:]
    rows = [re.findall(r"\[(slow|fast)\] running", frame) for frame in frames]
    assert ["slow", "fast"] in rows, rows
    assert all(row in (["slow"], ["fast"], ["slow", "fast"]) for row in rows), rows
    assert LEGEND in text and "discards = connections closed instead of" in text
    assert text.rstrip().splitlines()[-1].startswith("PASS:")


def test_the_slow_host_serving_fewer_calls_is_explained() -> None:
    def run(slow_ok: int) -> RunResult:
        result = RunResult("r")
        result.records += [CallRecord("slow", 0.0, 0.5, None)] * slow_ok
        return result

    note = slow_host_note(run(38), run(15), DemoConfig(connections=10))
    assert note.startswith("The slow host served fewer calls under bulkheads (15 against 38)")
    assert "5 connections, not all 10" in " ".join(note.split())
    assert slow_host_note(run(15), run(15), DemoConfig()) == ""  # nothing to explain


class _FakeServer:
    def __init__(self, url: str) -> None:
        self.url = url
        self.in_flight = 0
        self.connections = 0


def test_rows_are_slow_then_fast_whatever_the_ports() -> None:
    """Before: rows were sorted by compartment name, so by the servers' random ports."""

    async def main() -> list[str]:
        transport = BulkheadTransport(network=MockNetwork(lambda _: httpx.Response(200)))
        slow, fast = _FakeServer("http://127.0.0.1:2/"), _FakeServer("http://127.0.0.1:1/")
        async with httpx.AsyncClient(transport=transport) as client:
            for url in (fast.url, slow.url, "http://127.0.0.1:3/"):
                await client.get(url)
            return _live_lines(
                "t", transport, cast(DemoServer, slow), cast(DemoServer, fast), RunResult("t")
            )

    lines = asyncio.run(main())
    labels = [line.split("]")[0].strip(" [") for line in lines if line.startswith("  [")]
    assert labels == ["slow", "fast", "http://127.0.0.1:3"]


def test_pyproject_license_is_an_spdx_string() -> None:
    """setuptools deprecates the ``license = {text = ...}`` table (a warning on every
    install); the SPDX expression is the supported spelling."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "BSD-3-Clause"


def test_the_command_line_help() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "httpx_bulkhead", "demo", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    assert "--slow-seconds" in done.stdout
