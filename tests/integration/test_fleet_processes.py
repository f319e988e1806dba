"""The fleet limit across real worker processes (``fleet_worker.py``), one redis-server.

* 4 workers x 25 concurrent calls, fleet limit 10, against one local counting server: the
  server never sees more than 10 requests in flight, and all 100 complete.
* A worker killed with SIGKILL while holding leases: its capacity returns within one lease
  time and the others proceed.

Workers use ``on_unavailable="reject"`` and a 5 s ``redis_timeout``: on a loaded test
machine a slow answer must fail the test visibly, not admit on the local limit.

The workers start behind a gate (each says ready, then waits for a line on stdin), so the
100 calls really are concurrent.  Each worker is an ``httpx.AsyncClient`` over a
``BulkheadTransport`` whose policy carries the fleet limit: plain ``client.get`` calls.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import anyio
import httpx
import pytest

from httpx_bulkhead import AcquireTimeout, BulkheadTransport, Policy, RedisFleetLimit
from tests.servers.raw import RawConn, RawServer, hold_on_request
from tests.servers.redis import RedisServer, importorskip_redis_py

importorskip_redis_py()

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 30.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


class Worker:
    """``python -m tests.integration.fleet_worker ...``, read line by line (JSON)."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.fleet_worker", *args],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def read(self, timeout: float = TIMEOUT) -> dict[str, Any]:
        """The next JSON line (blocking, in a thread so the deadline holds)."""
        stdout = self.proc.stdout
        assert stdout is not None
        line = _readline(stdout, timeout)
        if not line:
            self.proc.wait(TIMEOUT)
            assert self.proc.stderr is not None
            raise AssertionError(f"worker ended: {self.proc.stderr.read()[-3000:]}")
        result: dict[str, Any] = json.loads(line)
        return result

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(TIMEOUT)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def _readline(stream: IO[str], timeout: float) -> str:
    lines: list[str] = []
    thread = threading.Thread(target=lambda: lines.append(stream.readline()), daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise AssertionError(f"no line from the worker within {timeout} s")
    return lines[0]


@pytest.fixture
def workers() -> Iterator[Callable[..., Worker]]:
    started: list[Worker] = []

    def start(*args: str) -> Worker:
        worker = Worker(*args)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


class InFlight:
    """A raw-socket server's handler that counts requests in flight (and their peak).
    A request counts from its head read until just before its response is sent, so a
    client holding a lease for the whole call covers it entirely."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.peak = self.served = 0

    def __call__(self, conn: RawConn) -> None:
        while conn.read_request() is not None:
            with self.lock:
                self.now += 1
                self.peak = max(self.peak, self.now)
            conn.sleep(0.01)  # hold it, so that requests overlap
            with self.lock:
                self.now -= 1
                self.served += 1
            conn.send_response(200, b"ok")


def test_four_workers_never_exceed_the_fleet_limit(
    redis_server: RedisServer,
    workers: Callable[..., Worker],
    unique: Callable[[str], str],
) -> None:
    counter = InFlight()
    key = unique("fleet-procs")
    with RawServer(counter) as server:
        group = [
            workers(
                "calls",
                f"--redis={redis_server.url}",
                f"--key={key}",
                "--limit=10",
                "--calls=25",
                f"--target={server.url}/",
            )
            for _ in range(4)
        ]
        for worker in group:
            assert worker.read() == {"ready": True}
        for worker in group:
            worker.go()
        results = [worker.read(timeout=60.0) for worker in group]
    assert [r["failed"] for r in results] == [[], [], [], []]
    assert sum(r["done"] for r in results) == 100 == counter.served
    assert 1 < counter.peak <= 10, counter.peak
    for result in results:
        stats = result["stats"]  # the worker's CompartmentStats
        assert stats["fleet_acquired"] == 25 == stats["completed"]
        assert stats["fleet_fallbacks"] == stats["fleet_lost"] == 0
        assert stats["running"] == stats["waiting"] == stats["fleet_waiting"] == 0
        assert stats["fleet_leases_held"] == stats["fleet_leases_local"] == 0
    assert redis_server.client().zcard(f"{key}:leases") == 0


async def test_a_killed_workers_capacity_returns_within_one_lease(
    redis_server: RedisServer,
    workers: Callable[..., Worker],
    unique: Callable[[str], str],
) -> None:
    """A worker holds all 3 leases (its requests parked at a server that never answers)
    and is killed with SIGKILL: nothing renews its leases, so within one lease time (1 s)
    three requests of another transport get theirs and complete."""
    lease = 1.0
    key = unique("fleet-kill")
    with RawServer(hold_on_request) as parked, RawServer(hold_on_request) as server:
        worker = workers(
            "hold",
            f"--redis={redis_server.url}",
            f"--key={key}",
            "--limit=3",
            "--calls=3",
            f"--lease={lease}",
            f"--target={parked.url}/hold",
        )
        held = await anyio.to_thread.run_sync(worker.read)
        assert held["held"] == 3, held
        config = RedisFleetLimit(
            redis_server.url,
            key=key,
            limit=3,
            lease=lease,
            on_unavailable="reject",
            redis_timeout=5.0,
            poll_interval=0.05,
        )
        origin = f"127.0.0.1:{server.port}"
        probe = BulkheadTransport(hosts={origin: Policy(fleet=config, acquire_timeout=0)})
        async with httpx.AsyncClient(transport=probe) as client:
            with pytest.raises(AcquireTimeout, match="fleet limit"):
                await client.get(f"{server.url}/")  # the worker's leases are real
        policy = Policy(fleet=config, acquire_timeout=lease + 1.0)
        transport = BulkheadTransport(hosts={origin: policy})
        async with httpx.AsyncClient(transport=transport) as client:
            os.kill(worker.proc.pid, signal.SIGKILL)
            killed = time.monotonic()
            # all three come back within one lease time (plus scheduling slack): the
            # others proceed
            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(_get_ok, client, f"{server.url}/")
            assert time.monotonic() - killed < lease + 1.0
            stats = transport.statistics()[origin]
            assert (stats.completed, stats.fleet_acquired, stats.fleet_fallbacks) == (3, 3, 0)
    with anyio.fail_after(TIMEOUT):  # ours released, the dead worker's expired
        while redis_server.client().zcard(f"{key}:leases"):
            await anyio.sleep(0.01)


async def _get_ok(client: httpx.AsyncClient, url: str) -> None:
    assert (await client.get(url)).status_code == 200
