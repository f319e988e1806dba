"""An independent review's attack on ``BulkheadHTTPTransport``: exceptions raised inside
threads from outside, at random points of their requests.

``KeyboardInterrupt`` lands in the main thread between any two steps of Python code; an
exception raised in a thread with ``PyThreadState_SetAsyncExc`` does the same in any
thread, so a seeded loop of them stands in for Ctrl-C at every point of a request:
waiting for a slot, for the loop lock, for a connection, mid-exchange; with a static
limit and with an adaptive one that 503s move both ways meanwhile (but not while the
thread a worker starts does not run yet: CPython 3.11 would raise the exception in that
new thread instead, see ``interrupt``).  After each run:
no thread hangs, the transport's counters agree, nothing is left running, waiting or in
use, the next request succeeds, no thread of the transport outlives ``close()`` and no
descriptor is left open.  One leftover is allowed for, and only once the collector has
given it back: an interrupt landing in httpx's own code after ``handle_request`` returned
(reading the headers, say) drops the response unclosed, and its slot and connection come
back when the collector frees it (``ResponseStream.__del__``, then the timer thread), as
they would for a caller that never closed it; counted in ``leaked_responses``.  Anything
still held then is a leak (``test_sync_interrupt_windows.py`` has the ones found).

``BULKHEAD_ADVERSARY_INTERRUPT_RUNS`` (default 3) sets the number of seeded runs,
``BULKHEAD_ADVERSARY_INTERRUPT_SEED`` the first seed (the failing seed is in the message).
"""

from __future__ import annotations

import ctypes
import gc
import os
import random
import sys
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from httpx_bulkhead import AdaptiveLimit, BulkheadHTTPTransport, CompartmentStats, Policy
from tests.resources import FdSnapshot, assert_no_fd_growth
from tests.servers import RawServer
from tests.servers.raw import RawConn, request_path

from .threads import left_behind, transport_threads

RUNS = int(os.environ.get("BULKHEAD_ADVERSARY_INTERRUPT_RUNS", "3"))
FIRST_SEED = int(os.environ.get("BULKHEAD_ADVERSARY_INTERRUPT_SEED", "0"))
THREADS = 8
REQUESTS = 25
#: Longest a run may take on a loaded machine; a wedged transport never ends.
DEADLINE = 20.0


class Interrupt(Exception):
    """Raised in a worker thread from outside."""


#: Held by ``interrupt`` from its look at ``_starting`` to its call, and by a thread
#: entering ``Thread.start()`` while it adds itself there (see ``interrupt``).
_guard = threading.Lock()
#: The threads inside ``Thread.start()`` whose new thread may not run yet.
_starting: set[int] = set()


def interrupt(thread: threading.Thread) -> None:
    """Raise ``Interrupt`` in ``thread``, unless it is starting a thread that does not run
    yet.  There, CPython 3.11 misdelivers it: the new thread's state carries its starter's
    id until the new thread runs, and ``PyThreadState_SetAsyncExc`` raises in the first
    state with that id, the new one.  The new thread dies at its first step, before it
    tells ``start()`` it started, and ``start()`` waits for ever (the transport's loop
    lock held meanwhile: every thread wedged).  Once the new thread runs, the interrupt
    lands in ``start()`` (its wait) as anywhere else."""
    assert thread.ident is not None
    ident = thread.ident
    set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
    target, exc = ctypes.c_ulong(ident), ctypes.py_object(Interrupt)
    with _guard:
        if ident not in _starting:
            set_async_exc(target, exc)


def _guarded_start(start: Callable[[threading.Thread], None]) -> Callable[..., None]:
    """``Thread.start`` that keeps its caller in ``_starting`` until the new thread runs
    (it leaves as its first step) or ``start()`` ended without launching it."""

    def guarded(self: threading.Thread) -> None:
        starter = threading.get_ident()
        run = self.run

        def running() -> None:
            _starting.discard(starter)
            run()

        self.run = running  # type: ignore[method-assign]
        with _guard:
            _starting.add(starter)
        try:
            start(self)
        except BaseException:
            if self.is_alive():  # started: the interrupt was its caller's
                _starting.discard(starter)
            raise  # (else launched or not: interrupts wait for ``running``; rare)
        _starting.discard(starter)

    return guarded


def odd_503(conn: RawConn) -> None:
    """``/1``: 503 (a drop for the adaptive limit); anything else: 200."""
    while (request := conn.read_request()) is not None:
        conn.send_response(503 if request_path(request) == b"/1" else 200, b"ok")


def one_run(seed: int, url: str, adaptive: bool) -> None:
    rng = random.Random(seed)
    threads_before = transport_threads()
    limit: int | AdaptiveLimit = 2
    if adaptive:  # the limit moves both ways while waiters are interrupted
        limit = AdaptiveLimit(
            algorithm="aimd", min_limit=1, max_limit=4, initial_limit=2, drop_statuses={503}
        )
    transport = BulkheadHTTPTransport(default=Policy(max_concurrency=limit, max_connections=2))
    client = httpx.Client(transport=transport, timeout=5)
    # Written by plain stores (no interrupt can land inside one), read by the main thread.
    results: list[list[str | None]] = [[None] * REQUESTS for _ in range(THREADS)]
    finished = [False] * THREADS
    stopped = [False]

    def requests(mine: list[str | None]) -> None:
        for i in range(mine.index(None), REQUESTS):
            try:
                try:
                    client.get(f"{url}/{i % 2}")
                    mine[i] = "ok"
                except Interrupt:
                    raise
                except Exception as exc:  # anything but an interrupt fails the run below
                    mine[i] = type(exc).__name__
            except Interrupt:
                mine[i] = "interrupted"

    def worker(index: int) -> None:
        mine = results[index]
        while None in mine:
            # CPython also delivers a pending interrupt at the loop's back edge, outside
            # the request's ``try``: it ends ``requests`` between two requests, the harness
            # and not the transport, so go on from the first request not recorded.
            try:  # noqa: SIM105 - suppress's own code could be interrupted
                requests(mine)
            except Interrupt:
                pass
        finished[index] = True
        while not stopped[0]:  # interrupts sent late land here, harmlessly
            try:  # noqa: SIM105 - suppress's own code could be interrupted
                time.sleep(0.001)
            except Interrupt:
                pass

    workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(THREADS)]
    for thread in workers:
        thread.start()
    deadline = time.monotonic() + DEADLINE
    while not all(finished) and time.monotonic() < deadline:
        time.sleep(rng.random() * 0.003)
        index = rng.randrange(THREADS)
        if not finished[index]:
            interrupt(workers[index])
    outcomes = [outcome for mine in results for outcome in mine]
    assert all(finished), (
        f"seed {seed}: {outcomes.count(None)} requests never ended (the transport is wedged)"
    )
    stopped[0] = True
    for thread in workers:
        thread.join(DEADLINE)
    [stats] = transport.statistics().values()
    if (stats.running, stats.waiting, stats.in_use_connections) != (0, 0, 0):
        stats = after_collection(transport, stats)
    assert "ok" in outcomes, f"seed {seed}: {outcomes}"
    assert set(outcomes) <= {"ok", "interrupted"}, f"seed {seed}: {set(outcomes)}"
    assert (stats.running, stats.waiting, stats.in_use_connections) == (0, 0, 0), (seed, stats)
    assert stats.acquired == stats.completed + stats.failed + stats.cancelled, (seed, stats)
    assert stats.completed >= outcomes.count("ok"), (seed, stats)
    assert client.get(f"{url}/0").status_code == 200
    client.close()
    assert left_behind(threads_before) == [], f"seed {seed}: threads outlive close()"


def after_collection(transport: BulkheadHTTPTransport, stats: CompartmentStats) -> CompartmentStats:
    """The counters once the collector has freed the responses interrupts dropped unclosed
    and the timer thread has ended them (a marker queued behind those hand-offs); at least
    one such response must have been freed, or the leftover is not of that kind."""
    gc.collect()
    done = threading.Event()
    assert transport._timers.call_soon_threadsafe(done.set)
    assert done.wait(DEADLINE), "the timer thread did not run"
    [after] = transport.statistics().values()
    assert after.leaked_responses > stats.leaked_responses, (
        "left running or in use, and no response was freed unclosed",
        stats,
    )
    return after


# An interrupt that lands inside ``socket.create_connection`` (or just after it returned)
# drops a socket that the garbage collector closes, with a ``ResourceWarning``; the
# descriptor check below still fails on any socket left open.  One that lands in a
# finalizer is "ignored" by Python, and one landing in pytest's own (Python) unraisable
# hook breaks the hook: a C callable takes the hook's place meanwhile (nothing can be
# interrupted inside it).  The counters below still fail on a slot a finalizer lost.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.parametrize("adaptive", [False, True], ids=["static", "adaptive"])
def test_interrupts_at_random_points_never_wedge_the_sync_transport(
    adaptive: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    unraisable: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    monkeypatch.setattr(threading.Thread, "start", _guarded_start(threading.Thread.start))
    gc.collect()
    before = FdSnapshot.take()
    with RawServer(odd_503) as srv:
        for seed in range(FIRST_SEED, FIRST_SEED + RUNS):
            one_run(seed, srv.url, adaptive)
    gc.collect()  # the sockets dropped by interrupts inside socket.create_connection
    assert_no_fd_growth(before)
