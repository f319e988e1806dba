"""The reader role of an HTTP/2 connection, handed to a sleeper that is cancelled at the
same moment (issue 18 review: is there a hang in the generic ``wait_until``?).

Three streams wait on one connection of a scripted server: ``r`` reads for the connection,
``a`` and ``b`` sleep, in that order.  One outer cancellation reaches ``r`` and ``a`` in
the same scheduling step (one scope cancelled, as a task group or a ``move_on_after``
around several requests does).  ``r`` leaves the read and hands the role to the first
sleeper, ``a``; whether ``a`` has already been told it is cancelled depends on which of the
two runs first (trio runs a batch of ready tasks in random order).  Then the server answers
``b``: it must get its response well within its read timeout.

Both waits hand the role on when their sleeper leaves by an exception and nobody reads
(``wait_timed``, the asyncio response wait, always did; ``wait_until``, used under trio, by
the sync twin and for window and PING waits on every backend, did not: the hand-over was
spent on a sleeper that was leaving, and ``b`` slept with nobody reading until its read
timeout, ``ReadTimeout`` though the server had answered it).  The cases: trio (either order
of the two cancelled tasks, random per round), the sync twin (an interrupt pending in the
sleeper's thread lands when the hand-over wakes it: deterministic), and a window wait (an
upload waiting for send window; under asyncio its FIFO ready queue makes it deterministic).
``ROUNDS`` rounds run in CI (each order comes up with probability 1/2 per round under
trio); ``H2_HANDOVER_ROUNDS`` runs more.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from collections.abc import Callable

import anyio
import httpx
import pytest

from httpx_bulkhead import BulkheadHTTPTransport, BulkheadTransport, Policy
from tests.servers import h2script

pytestmark = pytest.mark.anyio

ROUNDS = int(os.environ.get("H2_HANDOVER_ROUNDS", "12"))
#: ``b``'s read timeout: answered at once when somebody reads, this long when nobody does.
B_READ_TIMEOUT = 1.0
HANG = 30.0


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_cancelled_reader_and_first_sleeper_leave_the_role_to_the_next() -> None:
    with h2script.serve() as srv:
        transport = BulkheadTransport(
            default=Policy(max_connections=1), http1=False, http2=True, trust_env=False
        )
        async with httpx.AsyncClient(transport=transport) as client:
            assert (await client.get(f"{srv.url}/")).status_code == 200  # one connection
            with anyio.fail_after(HANG):
                for round_ in range(ROUNDS):
                    outcome = await _round(client, srv, round_)
                    assert outcome == 200, f"round {round_}: b got {outcome!r}"
                after = await client.get(f"{srv.url}/")
            assert after.status_code == 200
            assert after.extensions["bulkhead"].reused
            s = transport.statistics()[srv.url]
            assert (s.connections_created, s.open_streams, s.running) == (1, 0, 0)
            assert s.streams_reset == 2 * ROUNDS


async def _round(client: httpx.AsyncClient, srv: h2script.H2ScriptServer, round_: int) -> object:
    names = {who: f"{who}{round_}" for who in "rab"}
    scopes = {"r": anyio.CancelScope(), "a": anyio.CancelScope()}
    done = {who: anyio.Event() for who in "rab"}
    outcome: dict[str, object] = {}

    async def call(who: str) -> None:
        timeout = httpx.Timeout(10, read=B_READ_TIMEOUT if who == "b" else 10)
        try:
            response = await client.get(f"{srv.url}/hold/{names[who]}", timeout=timeout)
            outcome[who] = response.status_code
        except httpx.HTTPError as exc:
            outcome[who] = exc
        finally:
            done[who].set()

    async def cancellable(who: str) -> None:
        with scopes[who]:
            await call(who)

    async with anyio.create_task_group() as tg:
        for who in "rab":  # r first: the reader; then a and b sleep, in that order
            tg.start_soon(cancellable if who in "ra" else call, who)
            await srv.until_held(names[who])
            await anyio.wait_all_tasks_blocked()
        for who in "ra" if round_ % 2 else "ar":  # in one step, as one outer scope does
            scopes[who].cancel()
        await done["r"].wait()
        await done["a"].wait()
        assert "r" not in outcome and "a" not in outcome  # both cancelled
        srv.release(names["b"])
        await done["b"].wait()
    for who in "ra":
        srv.release(names[who])
    return outcome["b"]


# -- the sync twin: an interrupt delivered by the hand-over itself ----------------------------


class Interrupt(BaseException):
    """Raised in a caller's thread from outside, as ``KeyboardInterrupt`` is."""


def _interrupt(thread: threading.Thread) -> None:
    assert thread.ident is not None
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident), ctypes.py_object(Interrupt)
    )


def _blocked_in(thread: threading.Thread, *calls: str) -> bool:
    """Whether the innermost calls of ``thread`` are ``calls`` (outermost first)."""
    frame = sys._current_frames().get(thread.ident or 0)
    names: list[str] = []
    while frame is not None and len(names) < len(calls):
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return names[::-1] == list(calls)


#: Where a thread blocks as the connection's reader (a socket poll), and as a sleeper (an
#: ``Event``, whose ``threading.Event.wait`` waits on a ``Condition``).
READING = ("_recv", "_poll")
SLEEPING = ("_wait", "wait", "wait")


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + HANG
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


def test_sync_sleeper_interrupted_by_the_hand_over_passes_the_role_on() -> None:
    # An interrupt raised in a thread blocked in C waits for the thread to run Python code:
    # set while ``a`` sleeps, it lands exactly when the reader's hand-over wakes ``a``.
    with h2script.serve() as srv:
        transport = BulkheadHTTPTransport(
            default=Policy(max_connections=1), http1=False, http2=True, trust_env=False
        )
        with httpx.Client(transport=transport) as client:
            assert client.get(f"{srv.url}/").status_code == 200
            outcome: dict[str, object] = {}

            def call(who: str) -> None:
                timeout = httpx.Timeout(10, read=B_READ_TIMEOUT if who == "b" else 10)
                try:
                    outcome[who] = client.get(f"{srv.url}/hold/{who}", timeout=timeout).status_code
                except (httpx.HTTPError, Interrupt) as exc:
                    outcome[who] = exc

            threads = {who: threading.Thread(target=call, args=(who,)) for who in "rab"}
            for who in "rab":  # r reads, then a and b sleep, in that order
                threads[who].start()
                srv.wait_held(who)
                where = READING if who == "r" else SLEEPING
                _until(
                    lambda who=who, where=where: _blocked_in(threads[who], *where),  # type: ignore[misc]
                    f"{who} blocks in {where}",
                )
            _interrupt(threads["a"])
            srv.release("r")  # r reads its response and hands the role to a
            threads["r"].join(HANG)
            threads["a"].join(HANG)
            assert outcome["r"] == 200
            assert isinstance(outcome["a"], Interrupt)
            srv.release("b")
            threads["b"].join(HANG)
            assert outcome["b"] == 200  # before the fix: ReadTimeout after B_READ_TIMEOUT
            s = transport.statistics()[srv.url]
            assert (s.connections_created, s.open_streams, s.running) == (1, 0, 0)
            assert client.get(f"{srv.url}/").status_code == 200


# -- asyncio too: a wait for send window is a ``wait_until`` ------------------------------


async def test_cancelled_reader_and_window_sleeper_leave_the_role_to_the_next() -> None:
    # ``a`` is an upload waiting for send window (the server never reopens its stream's
    # window), a ``wait_until`` sleeper under asyncio as well.  Cancelling ``r`` first
    # runs it first under asyncio (its ready queue is FIFO): its hand-over reaches ``a``,
    # which is leaving.  Under trio the order is random per round.
    with h2script.serve() as srv:
        transport = BulkheadTransport(
            default=Policy(max_connections=1), http1=False, http2=True, trust_env=False
        )
        async with httpx.AsyncClient(transport=transport) as client:
            assert (await client.get(f"{srv.url}/")).status_code == 200
            with anyio.fail_after(HANG):
                for round_ in range(ROUNDS):
                    outcome = await _window_round(client, srv, round_)
                    assert outcome == 200, f"round {round_}: b got {outcome!r}"


async def _window_round(
    client: httpx.AsyncClient, srv: h2script.H2ScriptServer, round_: int
) -> object:
    scopes = {"r": anyio.CancelScope(), "a": anyio.CancelScope()}
    outcome: dict[str, object] = {}
    done = anyio.Event()

    async def reader() -> None:
        with scopes["r"]:
            await client.get(f"{srv.url}/hold/r{round_}")

    async def upload() -> None:
        with scopes["a"]:
            await client.post(f"{srv.url}/stall/a{round_}", content=b"u" * 100_000)

    async def waiter() -> None:
        timeout = httpx.Timeout(10, read=B_READ_TIMEOUT)
        try:
            response = await client.get(f"{srv.url}/hold/b{round_}", timeout=timeout)
            outcome["b"] = response.status_code
        except httpx.HTTPError as exc:
            outcome["b"] = exc
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        await srv.until_held(f"r{round_}")
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(upload)
        await srv.until_event("stalled")
        srv.event("stalled").clear()
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(waiter)
        await srv.until_held(f"b{round_}")
        await anyio.wait_all_tasks_blocked()
        scopes["r"].cancel()  # r first: under asyncio it then runs first
        scopes["a"].cancel()
        await anyio.wait_all_tasks_blocked()
        srv.release(f"b{round_}")
        await done.wait()
    srv.release(f"r{round_}")
    return outcome["b"]
