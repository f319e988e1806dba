"""An independent review's attack on ``BulkheadHTTPTransport`` over HTTP/2: threads share
a connection's streams while a scripted h2 server resets some of them (before and after
the response head), sends GOAWAY at random moments (answering the streams it keeps), and
holds others for ever (the ``request_timeout`` cuts them); a quarter of the responses
are read and closed by another thread than the one that sent the request.

After the run: no thread hangs; every outcome is a response or an httpx error; counters
agree and nothing is running, waiting, in use or open on either side; the next request
succeeds; no thread of the transport outlives ``close()``; no descriptor is left open.

``BULKHEAD_ADVERSARY_H2_SEED`` picks the schedule.
"""

from __future__ import annotations

import gc
import os
import queue
import random
import threading
import time

import h2.errors
import httpx

from httpx_bulkhead import BulkheadHTTPTransport, Policy
from tests.resources import FdSnapshot, assert_no_fd_growth
from tests.servers.h2script import H2Reset, H2ScriptServer

from .threads import left_behind, transport_threads

SEED = int(os.environ.get("BULKHEAD_ADVERSARY_H2_SEED", "0"))
THREADS = 16
REQUESTS = 10
WAIT = 30.0
PATHS = ["/ok", "/ok", "/bytes/200000", "/reset", "/reset-late", "/hold/never"]


def test_threads_sharing_h2_streams_with_a_hostile_server() -> None:
    gc.collect()
    before = FdSnapshot.take()
    threads_before = transport_threads()
    rng = random.Random(SEED)
    schedule = [[rng.choice(PATHS) for _ in range(REQUESTS)] for _ in range(THREADS)]
    handoff = [[rng.random() < 0.25 for _ in range(REQUESTS)] for _ in range(THREADS)]
    resets = {
        "/reset": H2Reset(h2.errors.ErrorCodes.INTERNAL_ERROR),
        "/reset-late": H2Reset(h2.errors.ErrorCodes.CANCEL, after_headers=True),
    }
    with H2ScriptServer(max_streams=4, resets=resets) as srv:
        transport = BulkheadHTTPTransport(
            default=Policy(max_concurrency=12, max_connections=3, request_timeout=0.5),
            http1=False,
            http2=True,
        )
        client = httpx.Client(transport=transport, timeout=5)
        outcomes: list[str] = []
        paths: list[tuple[str, str]] = []
        handed: queue.Queue[httpx.Response | None] = queue.Queue()

        def read(response: httpx.Response) -> None:
            try:
                response.read()
                outcomes.append(str(response.status_code))
                paths.append((response.request.url.path, str(response.status_code)))
            except httpx.HTTPError as exc:
                outcomes.append(type(exc).__name__)
                paths.append((response.request.url.path, type(exc).__name__))
            finally:
                response.close()

        def reader() -> None:  # reads responses other threads sent the requests of
            while (response := handed.get()) is not None:
                read(response)

        def worker(index: int) -> None:
            for path, hand in zip(schedule[index], handoff[index], strict=True):
                try:
                    response = client.send(client.build_request("GET", srv.url + path), stream=True)
                except httpx.HTTPError as exc:
                    outcomes.append(type(exc).__name__)
                    paths.append((path, f"{type(exc).__name__}: {exc}"))
                    continue
                if hand:
                    handed.put(response)
                else:
                    read(response)

        readers = [threading.Thread(target=reader) for _ in range(2)]
        workers = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
        for thread in readers + workers:
            thread.start()
        while any(t.is_alive() for t in workers):
            time.sleep(rng.random() * 0.2)
            if rng.random() < 0.5:
                srv.goaway_now(last_stream_id=rng.choice([0, 1, 3, 2**31 - 1]))
        for thread in workers:
            thread.join(WAIT)
        for _ in readers:
            handed.put(None)
        for thread in readers:
            thread.join(WAIT)
        assert not any(t.is_alive() for t in workers + readers), "a thread hangs"

        assert len(outcomes) == THREADS * REQUESTS
        allowed = {"200", "RemoteProtocolError", "RequestTimeout", "ReadError"}
        assert set(outcomes) <= allowed, sorted(set(paths))
        assert outcomes.count("200") > 0
        [stats] = transport.statistics().values()
        assert (stats.running, stats.waiting, stats.in_use_connections) == (0, 0, 0), stats
        assert stats.open_streams == 0, stats
        assert stats.acquired == stats.completed + stats.failed + stats.cancelled, stats
        assert client.get(f"{srv.url}/ok").status_code == 200
        client.close()
        assert left_behind(threads_before) == []
        srv.wait_until(lambda: srv.open_streams == 0, timeout=WAIT)
    assert_no_fd_growth(before)
