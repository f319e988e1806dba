"""Review 12 of the interrupt-safety change re-landed with review 11's mends (branch
intr2: ``Connections.reclaim`` resets a multiplexed exchange's stream alone unless the
connection's state is unknown, ``HTTP2Connection.flush`` breaks a connection whose write was
cut part-way, ``ResponseStream._ending``, ``Tracer.closing`` keeping any BaseException).

The sync shell's interrupts land through ``test_sync_interrupt_windows``'s profile hook;
the async transport's native cancellations through ``Task.cancel`` (what
``asyncio.timeout`` and ``asyncio.wait_for`` deliver).

Defects (strict xfails at first; mended, now plain tests that fail without the mends):

* ``H2Stream.cut`` sets ``ended`` before RST_STREAM is queued: an interrupt in between
  (``HTTP2Connection.reset``/``forget``, h2's ``reset_stream``) and ``reclaim``'s second
  ``cut`` answers "reset, keep": the connection is kept with the stream never reset.
  Mended: ``H2Stream.resetting``; a cut stopped part-way answers ``UNKNOWN_STATE``.
* An interrupt as the sync write lock's ``__exit__`` starts (``_threads.Lock``, main's)
  keeps the lock on a kept HTTP/2 connection: every later write on it waits for ever.
  Mended: ``_threads.Lock`` is a C lock, its ``__exit__`` the C release.
* An interrupt as ``stream.hold()`` starts leaves the stream's deadline timer armed: it
  ends the exchange and gives the slot back a second time.  Mended: a stream never handed
  over ends nothing at its deadline (``ResponseStream._expire``).

Holds: a native cancellation at each await of an HTTP/2 close (a sibling stream in
flight) or an HTTP/1.1 close (another connection's response open); an anyio cancellation
(asyncio, trio) while a close trace callback awaits.  A sweep of every function start and
C return of an unread HTTP/2 stream's ``close()`` (events 1-127) found only the first two
defects' windows; it also showed conservative discards (an interrupt as ``data_to_send``
or ``run_io`` starts: nothing taken yet, the connection dropped all the same).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
import httpx
import pytest

from httpx_bulkhead import BulkheadHTTPTransport, BulkheadTransport, Policy
from tests.servers import RawServer, h2script, keepalive_ok

from .test_sync_interrupt_windows import Window, drain_timers, h2_held_sibling, interrupted, unread
from .test_sync_interrupts import Interrupt


def _assert_settled(
    srv: h2script.H2ScriptServer,
    client: httpx.Client,
    transport: BulkheadHTTPTransport,
    outcome: list[object],
) -> None:
    """Whatever the cut did: nothing held, and a connection kept is in step with the
    server (the cut stream was reset: no stream left open there, no protocol error)."""
    s = transport.statistics()[srv.url]
    assert (s.running, s.in_use_connections) == (0, 0), s
    assert s.acquired == s.completed + s.failed + s.cancelled, s
    assert client.get(f"{srv.url}/").status_code == 200  # (after every frame sent before)
    s = transport.statistics()[srv.url]
    if s.connections_created == 1:  # the connection was kept: it must be in step
        assert outcome == [200], outcome
        assert srv.protocol_errors == [], srv.protocol_errors
        assert srv.open_streams == 0, f"{srv.open_streams} stream(s) never reset"
    else:
        assert len(outcome) == 1, outcome


# -- an interrupt inside H2Stream.cut: ``ended`` is set before the reset is queued ---------

#: Steps of ``H2Stream.cut`` after ``self.ended = True``, before RST_STREAM is queued.
CUT_STEPS = {
    "HTTP2Connection.reset": Window("_http2.py", "reset", "cut"),
    "HTTP2Connection.forget": Window("_http2.py", "forget", "cut"),
    "h2 reset_stream": Window("h2/connection.py", "reset_stream", "cut"),
    "h2 stream state machine": Window("h2/stream.py", "reset_stream", "cut"),
}


@pytest.mark.parametrize("where", CUT_STEPS.keys())
def test_an_interrupt_inside_the_cut_still_resets_the_stream_or_drops_the_connection(
    where: str,
) -> None:
    """One interrupt landing in ``H2Stream.cut`` after ``self.ended = True`` and before h2
    has queued the RST_STREAM (``HTTP2Connection.reset``, ``forget``, or h2's
    ``reset_stream`` itself: its state machine may be half-moved).  ``reclaim`` calls
    ``cut`` again, which finds the first one stopped part-way (``resetting``) and answers
    ``UNKNOWN_STATE``: the connection is discarded.  (Review 12's defect: the second cut
    did nothing for an ended stream and answered ``None``, so the pool kept a connection
    whose cut stream was never reset, open at the server for good.)"""
    with h2script.serve() as srv:
        client, transport, outcome, other = h2_held_sibling(srv)
        response = unread(client, srv.url)
        assert interrupted(CUT_STEPS[where], response.close), f"never reached {where}"
        srv.release("b")
        other.join(10)
        _assert_settled(srv, client, transport, outcome)
        client.close()


def test_control_an_interrupt_as_the_end_starts_leaves_the_connection_in_step() -> None:
    """Control for the check above (holds): landing before the cut, ``reclaim`` resets."""
    with h2script.serve() as srv:
        client, transport, outcome, other = h2_held_sibling(srv)
        response = unread(client, srv.url)
        window = Window("", "end_exchange", "_finish")
        assert interrupted(window, response.close), f"never reached {window}"
        srv.release("b")
        other.join(10)
        _assert_settled(srv, client, transport, outcome)
        assert transport.statistics()[srv.url].connections_created == 1
        client.close()


# -- a native asyncio cancellation at each await of an HTTP/2 stream's close --------------


async def _async_settled(
    srv: h2script.H2ScriptServer,
    client: httpx.AsyncClient,
    transport: BulkheadTransport,
    sibling: asyncio.Task[httpx.Response],
) -> None:
    """As ``_assert_settled``: the sibling survives unless the connection was dropped."""
    srv.release("b")
    try:
        outcome: object = (await asyncio.wait_for(sibling, 10)).status_code
    except httpx.TransportError as exc:
        outcome = exc
    s = transport.statistics()[srv.url]
    assert (s.running, s.waiting, s.in_use_connections) == (0, 0, 0), s
    assert s.acquired == s.completed + s.failed + s.cancelled, s
    assert (await client.get(f"{srv.url}/")).status_code == 200
    s = transport.statistics()[srv.url]
    if s.connections_created == 1:
        assert outcome == 200, outcome
        assert srv.protocol_errors == [], srv.protocol_errors
        assert srv.open_streams == 0, f"{srv.open_streams} stream(s) never reset"
        assert len(srv.client_resets) <= 1, srv.client_resets  # (never twice)


def _yielding_trace() -> Callable[[str, Mapping[str, Any]], Awaitable[None]]:
    async def trace(name: str, info: Mapping[str, Any]) -> None:
        await asyncio.sleep(0)  # an async log sink: one more await per event

    return trace


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("traced", [False, True], ids=["untraced", "traced"])
@pytest.mark.parametrize("turns", range(1, 9))
async def test_a_native_cancel_at_each_await_of_an_h2_close_keeps_the_sibling(
    anyio_backend: str, traced: bool, turns: int
) -> None:
    """Holds.  ``aclose`` of a partly read HTTP/2 stream, with another stream in flight on
    the connection, cancelled (``Task.cancel``) after ``turns`` turns of the loop: wherever
    it lands, nothing is held afterwards, and a connection kept is in step with the server
    (the stream reset once, no stream left open, the sibling answered)."""
    with h2script.serve() as srv:
        transport = BulkheadTransport(
            default=Policy(max_connections=1), http1=False, http2=True, trust_env=False
        )
        async with httpx.AsyncClient(transport=transport, timeout=10) as client:
            assert (await client.get(f"{srv.url}/")).status_code == 200  # one connection
            sibling = asyncio.create_task(client.post(f"{srv.url}/hold/b", content=b"once"))
            await srv.until_held("b")
            extensions = {"trace": _yielding_trace()} if traced else {}
            request = client.build_request("GET", f"{srv.url}/bytes/1000000", extensions=extensions)
            response = await client.send(request, stream=True)
            assert await response.aiter_raw().__anext__()
            closing = asyncio.create_task(response.aclose())
            for _ in range(turns):
                await asyncio.sleep(0)
            closing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await closing
            await _async_settled(srv, client, transport, sibling)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("turns", range(1, 9))
async def test_a_native_cancel_at_each_await_of_an_http11_close_keeps_the_sibling(
    anyio_backend: str, turns: int
) -> None:
    """Holds.  The same on HTTP/1.1: the closed response's connection goes (its body was
    not read), the other connection's response, open meanwhile, reads to its end."""
    transport = BulkheadTransport(default=Policy(max_connections=2), trust_env=False)
    with RawServer(keepalive_ok(b"x" * 1_000_000)) as srv:
        async with httpx.AsyncClient(transport=transport, timeout=10) as client:
            other = await client.send(client.build_request("GET", srv.url), stream=True)
            response = await client.send(client.build_request("GET", srv.url), stream=True)
            assert await response.aiter_raw().__anext__()
            closing = asyncio.create_task(response.aclose())
            for _ in range(turns):
                await asyncio.sleep(0)
            closing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await closing
            assert len(await other.aread()) == 1_000_000
            [s] = transport.statistics().values()
            assert (s.running, s.waiting, s.in_use_connections) == (0, 0, 0), s
            assert s.acquired == s.completed + s.failed + s.cancelled == 2, s
            assert s.completed == 1, s
            assert (await client.get(srv.url)).status_code == 200


# -- an anyio cancellation (asyncio and trio) while a close trace callback awaits ---------


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.parametrize("event", ["response_closed.started", "response_closed.complete"])
async def test_a_scope_cancelled_in_a_close_trace_settles_and_spares_the_sibling(
    anyio_backend: str, event: str
) -> None:
    """Holds.  ``Tracer.closing``/``closed`` are shielded: a cancel scope cancelled while
    the callback awaits lets it finish, the exchange is settled (COMPLETED: the body was
    read), the sibling stream survives and nothing is held."""
    with h2script.serve() as srv:
        transport = BulkheadTransport(
            default=Policy(max_connections=1), http1=False, http2=True, trust_env=False
        )
        async with httpx.AsyncClient(transport=transport, timeout=10) as client:
            assert (await client.get(f"{srv.url}/")).status_code == 200  # one connection
            in_trace = anyio.Event()
            go_on = anyio.Event()

            async def trace(name: str, info: Mapping[str, Any]) -> None:
                if name.endswith(event):
                    in_trace.set()
                    await go_on.wait()

            outcome: list[object] = []

            async def sibling() -> None:
                outcome.append((await client.post(f"{srv.url}/hold/b", content=b"x")).status_code)

            async with anyio.create_task_group() as tg:
                tg.start_soon(sibling)
                await srv.until_held("b")
                with anyio.CancelScope() as scope:
                    async with anyio.create_task_group() as inner:
                        inner.start_soon(
                            functools.partial(
                                client.get, f"{srv.url}/", extensions={"trace": trace}
                            )
                        )
                        with anyio.fail_after(10):
                            await in_trace.wait()
                        scope.cancel()
                        go_on.set()
                srv.release("b")  # (trio may finish the request: no checkpoint after)
            assert outcome == [200], outcome
            s = transport.statistics()[srv.url]
            assert (s.running, s.waiting, s.in_use_connections) == (0, 0, 0), s
            assert (s.acquired, s.completed, s.connections_created) == (3, 3, 1), s


# -- an interrupt as the sync HTTP/2 write lock is given back ----------------------------


#: Steps of the sync HTTP/2 write lock's hand-back and taking, in ``flush``.
WRITE_LOCK_STEPS = {
    # the first Python ``__exit__`` met after the write: before the mend the lock's own
    # (``_release`` never ran); since, the shield's, the lock given back in C before it
    "the lock's give-back": Window("_threads.py", "__exit__", "flush"),
    # the lock just taken, ``__enter__`` not yet returned (no ``with`` body to release it)
    "the lock's taking": Window("_threads.py", "__enter__", "flush", "acquire"),
}


@pytest.mark.parametrize("where", WRITE_LOCK_STEPS.keys())
def test_an_interrupt_as_the_h2_write_lock_is_given_back_blocks_no_writer(where: str) -> None:
    """Found by sweeping every function start and C return of ``response.close()`` (an
    unread HTTP/2 stream, a sibling POST in flight).  ``flush`` holds ``self._write_lock``
    (``_threads.Lock`` in the sync shell) in a ``with``.  Review 12's defect: an interrupt
    landing as its Python ``__exit__`` started never ran ``_release``; the write had
    completed, so ``flush`` did not break the connection, ``reclaim`` kept it (the reset
    was sent), and the next writer on it (the sibling's request body or its window
    update, any new request) waited on the lock for ever.  Now the lock is a C lock whose
    ``__exit__`` is its release: the first Python ``__exit__`` after the write is the
    shield's, the lock already given back; and an interrupt landing as the lock is taken,
    before ``__enter__`` returns, has ``__enter__`` give it back.  The gate: a new request
    finishes (fails before the mend at the give-back: it waits for ever; at the taking,
    the old lock had no such step: never reached)."""
    with h2script.serve() as srv:
        transport = BulkheadHTTPTransport(
            default=Policy(max_connections=1), http1=False, http2=True
        )
        client = httpx.Client(transport=transport, timeout=10)
        assert client.get(f"{srv.url}/").status_code == 200  # one connection
        outcome: list[object] = []
        big = b"x" * 200_000  # (more than one window: the sibling writes after the cut)

        def sibling() -> None:
            try:
                outcome.append(client.post(f"{srv.url}/hold/b", content=big).status_code)
            except httpx.HTTPError as exc:
                outcome.append(exc)

        other = threading.Thread(target=sibling, daemon=True)  # (it may never end)
        other.start()
        srv.wait_held("b")
        response = unread(client, srv.url)
        window = WRITE_LOCK_STEPS[where]
        assert interrupted(window, response.close), f"never reached {window}"
        srv.release("b")
        other.join(10)
        later: list[object] = []  # a new request on the kept connection writes its HEADERS
        probe = threading.Thread(
            target=lambda: later.append(client.get(f"{srv.url}/").status_code), daemon=True
        )
        probe.start()
        probe.join(10)
        assert later == [200], "a new request never finished (blocked on the write lock)"
        assert outcome == [200] or isinstance(outcome[0], httpx.TransportError), outcome
        client.close()


# -- an interrupt at the hand-over, with a request deadline armed ----------------------

#: Steps between the stream's deadline timer being armed and ``hold()``'s hand-over.
HAND_OVER_STEPS = {
    # the timer queued, its handle not yet stored (``stream._timer`` stays ``None``)
    "the timer's arming": Window("_threads.py", "_wake", "__init__"),
    "the hand-over": Window("_response.py", "hold", "handle"),
}


@pytest.mark.parametrize("where", HAND_OVER_STEPS.keys())
def test_an_interrupt_at_the_hand_over_then_the_deadline_ends_nothing_twice(
    caplog: pytest.LogCaptureFixture, where: str
) -> None:
    """An interrupt landing once the stream is made (its deadline timer armed) and
    before ``stream.hold()`` hands it over: ``Compartment.handle`` ends the exchange and
    gives the slot back.  The stream lives on while the interrupt's traceback is kept (an
    interactive session keeps the last one), and its timer's ``_expire`` finds it
    unfinished; never handed over, the stream ends nothing.  (Review 12's defect: it
    called ``end_abandoned``, a second end of the exchange and a second slot release,
    taking another request's slot or failing with "release() without a slot held",
    logged as "a timer callback failed".)  The gate: a marker queued on the timer thread
    just after the stream's deadline has run; no timer callback failed."""
    transport = BulkheadHTTPTransport(
        default=Policy(max_concurrency=2, max_connections=2, request_timeout=0.3)
    )
    client = httpx.Client(transport=transport, timeout=5)
    with RawServer(keepalive_ok()) as srv:
        assert client.get(srv.url).status_code == 200
        kept: list[BaseException] = []

        def action() -> None:
            try:
                client.get(srv.url)
            except Interrupt as exc:
                kept.append(exc)  # (its traceback holds ``handle``'s frame, and the stream)
                raise

        window = HAND_OVER_STEPS[where]
        assert interrupted(window, action), f"never reached {window}"
        tb = kept[0].__traceback__
        frames = []
        while tb is not None:
            frames.append(tb.tb_frame)
            tb = tb.tb_next
        # another request holds a slot (its own deadline comes after the stray timer's)
        held = client.send(client.build_request("GET", srv.url), stream=True)
        [stream] = [
            f.f_locals["self"] if f.f_code.co_name == "__init__" else f.f_locals["stream"]
            for f in frames
            if (f.f_code.co_name == "handle" and "stream" in f.f_locals)
            or (f.f_code.co_name == "__init__" and f.f_code.co_filename.endswith("_response.py"))
        ]
        assert not stream._owes_slot
        timeouts = stream._timeouts
        ran = threading.Event()  # (timers run in order of their instants, then of arming)
        transport._timers.call_later(timeouts.deadline - timeouts.clock() + 0.001, ran.set)
        assert ran.wait(10), "the timer thread did not reach the stream's deadline"
        # (seen before the mend: "0/2 running" here, the held response open: its slot
        # went, and its own deadline's give-back then failed)
        held.close()
        drain_timers(transport)
        failed = [r.getMessage() for r in caplog.records if "callback failed" in r.getMessage()]
        assert failed == [], failed
        [s] = transport.statistics().values()
        assert (s.running, s.waiting, s.in_use_connections) == (0, 0, 0), s
        assert s.acquired == s.completed + s.failed + s.cancelled, s
        assert client.get(srv.url).status_code == 200
        client.close()
