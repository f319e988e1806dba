"""Review 11 of the interrupt-safety merge (53739d0: ``Limiter.give_back``,
``ResponseStream.hold``/``_owes_slot``, ``Exchange.settled``, ``Connections.reclaim``):
what it changed in the async transport, which shares the code, and in the sync one.

Defects (strict xfails in the review; plain tests since their mends, which the two
paragraphs below do not describe: ``reclaim`` resets a multiplexed exchange's stream alone
and ``Tracer.closing`` keeps any ``BaseException``; ``aclose`` leaves the slot to an end
under way, ``ResponseStream._ending``):

* ``reclaim`` discards the whole HTTP/2 connection.  A native asyncio cancellation
  (``Task.cancel``: what ``asyncio.timeout`` and ``asyncio.wait_for`` deliver) is not held
  off by anyio's shield: landing at the trace callback's ``response_closed.started`` await,
  it cuts ``Connections.end_exchange`` short before the pool's answer, and the sibling
  stream on the connection fails (a POST: ``ReadError``; a GET is replayed on a second
  connection).  In the sync shell one interrupt as ``end_exchange`` starts does the same
  (not two, as ``reclaim``'s docstring says).  Before the merge both leaked the stream's
  place (``in_use_connections`` stayed 1).
* ``aclose`` from another task while the reader's ``_finish`` awaits finds ``_finished``
  with ``_owes_slot`` set, the state the merge reserves for an interrupted end, and gives
  the slot back at once, counted CANCELLED, before the connection is back (before the
  merge it left the end to the reader: COMPLETED).

Holds: ``Limiter.give_back`` grants as the old ``release`` (``running -= 1`` then
``_grant_free``) did, over random sequences with limits raised and lowered, cancels of
granted waiters and abandons; the same native cancellation on HTTP/1.1 now keeps nothing
(before: the connection stayed in use); a response closed twice, after its end, or
dropped after closing gives its slot and leak watch back once, with no warning.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import random
import warnings
from collections.abc import Mapping
from typing import Any

import anyio
import httpx
import pytest

from httpx_bulkhead import BulkheadTransport, Policy
from httpx_bulkhead._limiter import Limiter, Waiter, WaiterState
from tests.servers import RawServer, h2script, keepalive_ok

from .test_sync_interrupt_windows import Window, h2_held_sibling, interrupted

# -- a native cancellation at the trace callback's await, on an HTTP/2 connection ---------


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_native_cancel_in_a_close_trace_spares_the_sibling_h2_stream(
    anyio_backend: str,
) -> None:
    with h2script.serve() as srv:
        transport = BulkheadTransport(
            default=Policy(max_connections=1), http1=False, http2=True, trust_env=False
        )
        async with httpx.AsyncClient(transport=transport, timeout=10) as client:
            assert (await client.get(f"{srv.url}/")).status_code == 200  # one connection
            in_trace = asyncio.Event()
            never = asyncio.Event()

            async def trace(name: str, info: Mapping[str, Any]) -> None:
                if name.endswith("response_closed.started"):
                    in_trace.set()
                    await never.wait()  # an awaiting callback (an async log sink)

            sibling = asyncio.create_task(client.post(f"{srv.url}/hold/b", content=b"once"))
            await srv.until_held("b")
            cut = asyncio.create_task(client.get(f"{srv.url}/", extensions={"trace": trace}))
            await asyncio.wait_for(in_trace.wait(), 10)
            cut.cancel()  # what asyncio.timeout() around the request does
            with pytest.raises(asyncio.CancelledError):
                await cut
            srv.release("b")
            response = await asyncio.wait_for(sibling, 10)  # (a POST: not replayed elsewhere)
            assert response.status_code == 200
            s = transport.statistics()[srv.url]
            assert (s.running, s.in_use_connections, s.connections_created) == (0, 0, 1), s


# -- Limiter.give_back against the old release (running -= 1, then _grant_free) ---------


class _OldLimiter(Limiter):
    """The release before the merge, for the differential check below."""

    __slots__ = ()

    def release(self) -> None:
        if self.running <= 0:
            raise RuntimeError("release() without a slot held")
        if self._queue and self.running <= self.limit:
            waiter, _ = self._queue.popitem(last=False)
            waiter.state = WaiterState.GRANTED
            self.acquired += 1
            waiter.wake()
        else:
            self.running -= 1
            self._grant_free()


def _run(limiter: Limiter, ops: list[tuple[str, int]]) -> list[object]:
    """Apply ``ops`` (the same list to both limiters); returns a trace of the states.  A
    request holds a slot from ``try_acquire``, or from its waiter's grant once it resumed;
    a granted waiter not resumed yet may still be cancelled (its slot passes on)."""
    woken: list[int] = []
    waiters: list[Waiter] = []  # not resumed
    holding = 0
    seen: list[object] = []
    for op, arg in ops:
        if op == "acquire":
            if limiter.try_acquire():
                holding += 1
            elif limiter.can_enqueue() and not limiter.closed:
                waiter = Waiter(functools.partial(woken.append, arg))
                waiters.append(waiter)
                limiter.enqueue(waiter)
        elif op == "resume":
            granted = [w for w in waiters if w.state is WaiterState.GRANTED]
            if granted:
                waiters.remove(granted[arg % len(granted)])
                holding += 1
        elif op == "release" and holding:
            holding -= 1
            limiter.release()
        elif op == "cancel" and waiters:
            waiter = waiters.pop(arg % len(waiters))
            limiter.cancel(waiter)
        elif op == "set_limit":
            limiter.set_limit(arg)
        elif op == "abandon":  # (the transport left the loop: its waiters are gone)
            limiter.abandon()
            waiters = [w for w in waiters if w.state is WaiterState.GRANTED]
        # invariant 1/2 with the queue: a waiter waits only while no slot is free
        assert not limiter.waiting or limiter.running >= limiter.limit
        seen.append((limiter.running, limiter.waiting, limiter.acquired, len(woken)))
    return seen


def test_give_back_grants_as_the_old_release_did_over_random_sequences() -> None:
    kinds = ["acquire"] * 4 + ["release"] * 3 + ["resume"] * 2
    kinds += ["cancel", "set_limit", "set_limit", "abandon"]
    for seed in range(400):
        rng = random.Random(seed)
        limit = rng.randint(1, 4)
        ops = [(rng.choice(kinds), rng.randint(1, 6)) for _ in range(60)]
        assert _run(Limiter(limit, 8), ops) == _run(_OldLimiter(limit, 8), ops), seed


# -- _owes_slot and _finished: closed twice, after the end, dropped after closing ---------


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_closing_twice_or_after_the_end_gives_the_slot_back_once(
    anyio_backend: str,
) -> None:
    policy = Policy(max_concurrency=1, max_connections=1, leak_threshold=60)
    transport = BulkheadTransport(default=policy, trust_env=False)
    with RawServer(keepalive_ok()) as srv:
        async with httpx.AsyncClient(transport=transport, timeout=5) as client:
            with warnings.catch_warnings():
                warnings.simplefilter("error", ResourceWarning)
                # read to its end (the slot goes back there), then closed twice
                response = await client.send(client.build_request("GET", srv.url), stream=True)
                await response.aread()
                await response.aclose()
                await response.aclose()
                # closed before its end, twice, then dropped: no warning, nothing given twice
                response = await client.send(client.build_request("GET", srv.url), stream=True)
                await response.aclose()
                await response.aclose()
                del response
                gc.collect()
                # the one slot is free: the next request does not wait
                assert (await client.get(srv.url)).status_code == 200
            [s] = transport.statistics().values()
            assert (s.running, s.waiting, s.in_use_connections) == (0, 0, 0), s
            assert s.acquired == 3 == s.completed + s.failed + s.cancelled, s
            assert (s.leaked_responses, s.slot_leaks) == (0, 0), s


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_native_cancel_in_a_close_trace_keeps_no_http11_connection(
    anyio_backend: str,
) -> None:
    """The same cancellation on HTTP/1.1: ``reclaim`` closes the connection, which the
    pool counted in use for good before the merge (``in_use_connections`` stayed 1)."""
    transport = BulkheadTransport(default=Policy(max_connections=1), trust_env=False)
    with RawServer(keepalive_ok()) as srv:
        async with httpx.AsyncClient(transport=transport, timeout=5) as client:
            in_trace = asyncio.Event()
            never = asyncio.Event()

            async def trace(name: str, info: Mapping[str, Any]) -> None:
                if name.endswith("response_closed.started"):
                    in_trace.set()
                    await never.wait()

            cut = asyncio.create_task(client.get(srv.url, extensions={"trace": trace}))
            await asyncio.wait_for(in_trace.wait(), 10)
            cut.cancel()
            with pytest.raises(asyncio.CancelledError):
                await cut
            [s] = transport.statistics().values()
            assert (s.running, s.waiting, s.in_use_connections) == (0, 0, 0), s
            assert s.acquired == s.completed + s.failed + s.cancelled, s
            assert (await client.get(srv.url)).status_code == 200


@pytest.mark.anyio
async def test_a_close_while_the_reader_ends_the_exchange_leaves_the_slot_to_it() -> None:
    transport = BulkheadTransport(default=Policy(max_concurrency=1), trust_env=False)
    with RawServer(keepalive_ok()) as srv:
        async with httpx.AsyncClient(transport=transport, timeout=5) as client:
            in_trace = anyio.Event()
            go_on = anyio.Event()

            async def trace(name: str, info: Mapping[str, Any]) -> None:
                if name.endswith("response_closed.started"):
                    in_trace.set()
                    await go_on.wait()

            request = client.build_request("GET", srv.url, extensions={"trace": trace})
            response = await client.send(request, stream=True)
            async with anyio.create_task_group() as tg:
                tg.start_soon(response.aread)  # reads to the end: ends the exchange
                with anyio.fail_after(10):
                    await in_trace.wait()
                await response.aclose()  # another task closes the response meanwhile
                [s] = transport.statistics().values()
                running_while_ending = s.running
                go_on.set()
            [s] = transport.statistics().values()
            assert running_while_ending == 1, "the slot left before the connection"
            assert (s.running, s.completed, s.cancelled) == (0, 1, 0), s


def test_one_interrupt_at_an_h2_exchanges_end_spares_the_other_threads_stream() -> None:
    with h2script.serve() as srv:
        client, transport, outcome, other = h2_held_sibling(srv)
        window = Window("", "end_exchange", "_finish")
        assert interrupted(window, lambda: client.get(f"{srv.url}/")), "never reached"
        srv.release("b")
        other.join(10)
        assert outcome == [200], outcome  # the defect: ReadError (connection closed)
        s = transport.statistics()[srv.url]
        assert (s.running, s.in_use_connections, s.connections_created) == (0, 0, 1), s
        client.close()
