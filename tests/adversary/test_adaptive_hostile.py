"""An independent review's attack on adaptive limits, through the sync transport (threads:
the flavour the adaptive suite covers least) against a raw server whose answers are
hostile: every response a 503 with ``drop_statuses`` set, answers that never come (the
``request_timeout`` drop), 200s of latency 0, bodies never read, all mixed by a seeded
schedule over 24 threads while the limit moves.

After each phase: no thread hangs; every outcome is a response or a bulkhead error;
counters agree (``acquired == completed + failed + cancelled``, nothing running, waiting
or in use); the limit stays within ``[min_limit, max_limit]`` and its history bounded;
a run of drops takes AIMD to ``min_limit`` and a run of successes raises it again; no
thread outlives ``close()``; no descriptor is left open.

``BULKHEAD_ADVERSARY_ADAPTIVE_SEED`` picks the schedule.
"""

from __future__ import annotations

import gc
import os
import random
import threading

import httpx

from httpx_bulkhead import (
    AcquireTimeout,
    AdaptiveLimit,
    BulkheadFull,
    BulkheadHTTPTransport,
    CompartmentStats,
    Policy,
    RequestTimeout,
)
from httpx_bulkhead._adaptive import HISTORY
from tests.resources import FdSnapshot, assert_no_fd_growth
from tests.servers import RawServer
from tests.servers.raw import RawConn, request_path

from .threads import left_behind, transport_threads

SEED = int(os.environ.get("BULKHEAD_ADVERSARY_ADAPTIVE_SEED", "0"))
THREADS = 24
REQUESTS = 12
WAIT = 30.0
SPEC = AdaptiveLimit(
    algorithm="aimd", min_limit=2, max_limit=16, initial_limit=8, drop_statuses={503}
)


def hostile(conn: RawConn) -> None:
    """``/503``: 503; ``/stall``: no answer, ever; anything else: 200 at once (a large
    body for ``/big``, which the client never reads)."""
    while (request := conn.read_request()) is not None:
        path = request_path(request)
        if path == b"/stall":
            conn.wait("never")
            return
        if path == b"/503":
            conn.send_response(503, b"busy")
        else:
            conn.send_response(200, b"x" * (1 << 20 if path == b"/big" else 2))


def check(stats: CompartmentStats) -> None:
    assert (stats.running, stats.waiting, stats.in_use_connections) == (0, 0, 0), stats
    assert stats.acquired == stats.completed + stats.failed + stats.cancelled, stats
    assert SPEC.min_limit <= stats.limit <= SPEC.max_limit, stats
    assert len(stats.limit_history) <= HISTORY
    assert all(SPEC.min_limit <= limit <= SPEC.max_limit for _, limit in stats.limit_history)


def test_adaptive_limit_under_a_hostile_server_and_many_threads() -> None:
    gc.collect()
    before = FdSnapshot.take()
    threads_before = transport_threads()
    rng = random.Random(SEED)
    schedule = [
        [rng.choice(["/503", "/503", "/stall", "/ok", "/big"]) for _ in range(REQUESTS)]
        for _ in range(THREADS)
    ]
    with RawServer(hostile) as srv:
        policy = Policy(
            max_concurrency=SPEC, max_pending=6, acquire_timeout=0.3, request_timeout=0.3
        )
        transport = BulkheadHTTPTransport(default=policy)
        with httpx.Client(transport=transport, timeout=5) as client:
            outcomes: list[str] = []

            def worker(paths: list[str]) -> None:
                for path in paths:
                    try:
                        with client.stream("GET", f"{srv.url}{path}") as response:
                            outcomes.append(str(response.status_code))
                            if path != "/big":
                                response.read()  # /big: closed unread
                    except (AcquireTimeout, BulkheadFull, RequestTimeout) as exc:
                        outcomes.append(type(exc).__name__)
                    except BaseException as exc:  # recorded: the assertion below names it
                        outcomes.append(repr(exc))

            threads = [threading.Thread(target=worker, args=(p,)) for p in schedule]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(WAIT)
            assert not any(t.is_alive() for t in threads), "a thread hangs"
            allowed = {"200", "503", "AcquireTimeout", "BulkheadFull", "RequestTimeout"}
            assert set(outcomes) <= allowed, set(outcomes) - allowed
            assert len(outcomes) == THREADS * REQUESTS
            [stats] = transport.statistics().values()
            check(stats)
            assert stats.limit_history, "the limit never moved"

            for _ in range(40):  # drops one after another: each is a new round trip
                assert client.get(f"{srv.url}/503").status_code == 503
            [stats] = transport.statistics().values()
            check(stats)
            assert stats.limit == SPEC.min_limit, stats.limit_history[-5:]

            for _ in range(60):  # successes of latency ~0: the limit grows again
                assert client.get(f"{srv.url}/ok").status_code == 200
            [stats] = transport.statistics().values()
            check(stats)
            assert stats.limit > SPEC.min_limit, stats.limit_history[-5:]
        assert left_behind(threads_before) == []
    assert_no_fd_growth(before)
