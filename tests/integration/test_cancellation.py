"""Every way a waiter can be cancelled leaves the queue at once and never runs.

These use asyncio's own primitives (``Task.cancel``, ``asyncio.timeout``) on purpose, beside
the anyio cancel scopes and httpx pool timeouts that run on both backends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import anyio
import httpx
import pytest

from httpx_bulkhead import AcquireTimeout, BulkheadTransport, Policy, RequestTimeout
from tests.conftest import until
from tests.servers import HypercornServer, RawServer, TestApp, keepalive_ok


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("http1_parser")]


@pytest.mark.parametrize("how", ["task.cancel", "asyncio.timeout", "wait_for", "pool timeout"])
async def test_cancelled_waiter_leaves_queue_and_never_runs(
    how: str, server: HypercornServer, app: TestApp, unique: Callable[[str], str]
) -> None:
    gate = app.gate(unique("cancel"))
    name = server.url
    transport = BulkheadTransport(default=Policy(max_concurrency=1))
    url = f"{server.url}/gate/{gate.name}"
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:
        holder = asyncio.ensure_future(client.get(url))
        await gate.until_entered(1)

        async def waiter() -> httpx.Response:
            if how == "asyncio.timeout":
                async with asyncio.timeout(0.05):
                    return await client.get(url)
            if how == "wait_for":
                return await asyncio.wait_for(client.get(url), 0.05)
            if how == "pool timeout":
                return await client.get(url, timeout=httpx.Timeout(10, pool=0.05))
            return await client.get(url)

        task = asyncio.ensure_future(waiter())
        await until(lambda: transport.statistics()[name].waiting == 1)
        if how == "task.cancel":
            task.cancel()
        expected: type[BaseException] = {
            "task.cancel": asyncio.CancelledError,
            "asyncio.timeout": TimeoutError,
            "wait_for": TimeoutError,
            "pool timeout": AcquireTimeout,
        }[how]
        with pytest.raises(expected):
            await task
        stats = transport.statistics()[name]
        assert stats.waiting == 0 and stats.running == 1
        if how == "pool timeout":
            assert stats.acquire_timeouts == 1
        else:
            assert stats.cancelled_waiting == 1
        gate.open()
        assert (await holder).status_code == 200
    assert gate.entered == 1  # the cancelled waiter never reached the server
    final = transport.statistics()[name]
    assert (final.running, final.acquired, final.completed) == (0, 1, 1)


async def test_waiter_cancelled_right_after_its_grant_passes_the_slot_on(
    server: HypercornServer, app: TestApp, unique: Callable[[str], str]
) -> None:
    gate = app.gate(unique("grant"))
    name = server.url
    transport = BulkheadTransport(default=Policy(max_concurrency=1))
    url = f"{server.url}/gate/{gate.name}"
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:
        async with client.stream("GET", f"{server.url}/") as holder:
            granted = asyncio.ensure_future(client.get(url))
            nxt = asyncio.ensure_future(client.get(url))
            await until(lambda: transport.statistics()[name].waiting == 2)
            await holder.aread()  # body read: the slot goes to `granted`...
            assert transport.statistics()[name].waiting == 1
            granted.cancel()  # ...which is cancelled before it could resume
        with pytest.raises(asyncio.CancelledError):
            await granted
        await gate.until_entered(1)
        gate.open()
        assert (await nxt).status_code == 200
    assert gate.entered == 1  # `granted` never ran; `nxt` got the slot it passed on
    stats = transport.statistics()[name]
    assert (stats.running, stats.waiting, stats.cancelled_waiting) == (0, 0, 1)
    assert stats.acquired == stats.completed == 2


async def test_cancelling_an_in_flight_request_discards_its_connection(
    server: HypercornServer, app: TestApp, unique: Callable[[str], str]
) -> None:
    gate = app.gate(unique("inflight"))
    name = server.url
    transport = BulkheadTransport(default=Policy(max_concurrency=1))
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:
        task = asyncio.ensure_future(client.get(f"{server.url}/gate/{gate.name}"))
        await gate.until_entered(1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        stats = transport.statistics()[name]
        assert (stats.running, stats.unknown_state, stats.cancelled) == (0, 1, 1)
        assert stats.connections == 0
        gate.open()
        assert (await client.get(f"{server.url}/")).extensions["bulkhead"].reused is False


async def race_a_grant_with_the_wait_deadline(
    server: HypercornServer,
    waiter: Callable[[httpx.AsyncClient], Coroutine[Any, Any, None]],
    **policy: object,
) -> BulkheadTransport:
    """Make a connection waiter's deadline and the grant of a connection place fall in one
    event-loop step, the deadline first.

    One connection (``max_connections=1``) is held by a response nobody reads, whose
    ``request_timeout`` (1.5 s) frees the place by a timer.  The waiter starts 0.5 s later
    with a deadline 0.2 s away; then the loop is blocked for 1.2 s, past both.  asyncio
    then runs due timers in deadline order: the waiter's cancellation, then the expiry that
    grants it the place.  (The waiter's own request_timeout leaves it 0.3 s to finish.)"""
    transport = BulkheadTransport(
        default=Policy(max_concurrency=3, max_connections=1, request_timeout=1.5, **policy)  # type: ignore[arg-type]
    )
    name = server.url
    client = httpx.AsyncClient(transport=transport, timeout=10)
    async with client:
        held = await client.send(
            client.build_request("GET", f"{server.url}/stream/200"), stream=True
        )
        await asyncio.sleep(0.5)  # constructs the race (the holder is older), not a wait
        async with asyncio.TaskGroup() as tg:
            tg.create_task(waiter(client))
            await until(lambda: transport.statistics()[name].waiting_for_connection >= 1)
            time.sleep(1.2)  # block the loop past both deadlines
        with pytest.raises(RequestTimeout):
            await held.aread()
    return transport


async def test_connection_granted_as_its_wait_times_out_is_used(server: HypercornServer) -> None:
    results: list[httpx.Response] = []

    async def waiter(client: httpx.AsyncClient) -> None:
        results.append(await client.get(f"{server.url}/"))

    transport = await race_a_grant_with_the_wait_deadline(server, waiter, acquire_timeout=0.2)
    assert results[0].text == "hello"
    stats = transport.statistics()[server.url]
    assert stats.acquire_timeouts == 0 and stats.unknown_state == 1
    assert (stats.running, stats.failed, stats.completed, stats.connections_created) == (0, 1, 1, 2)


async def test_connection_waiter_cancelled_as_it_is_granted_passes_the_grant_on(
    server: HypercornServer,
) -> None:
    """A cancel scope's deadline, not the acquire timeout: the waiter is cancelled with its
    grant in hand, and must pass it on (else the next waiter would wait for ever)."""
    results: list[httpx.Response] = []

    async def two_waiters(client: httpx.AsyncClient) -> None:
        async def cancelled() -> None:
            with anyio.move_on_after(0.2):
                await client.get(f"{server.url}/")
                raise AssertionError("the cancelled waiter completed")

        async def served() -> None:
            results.append(await client.get(f"{server.url}/"))

        async with asyncio.TaskGroup() as tg:
            tg.create_task(cancelled())
            await asyncio.sleep(0)  # the first waiter queues first
            tg.create_task(served())

    transport = await race_a_grant_with_the_wait_deadline(server, two_waiters)
    assert results[0].text == "hello"
    stats = transport.statistics()[server.url]
    assert (stats.running, stats.failed, stats.cancelled, stats.completed) == (0, 1, 1, 1)
    assert stats.connections_created == 2 and stats.acquire_timeouts == 0


@pytest.mark.parametrize("paused_at", ["response_closed.started", "response_closed.complete"])
async def test_a_close_then_a_cancel_while_the_reader_ends_the_exchange_give_the_slot_once(
    paused_at: str,
) -> None:
    """Another task closes the response while the reader's end awaits a trace callback
    (before the pool's answer, or after it), then the reader is cancelled there (a native
    cancellation, which the callback's shield does not hold off): the close leaves the
    slot to the end under way, which gives it back once, as the exchange's outcome."""
    transport = BulkheadTransport(default=Policy(max_concurrency=1), trust_env=False)
    with RawServer(keepalive_ok()) as srv:
        async with httpx.AsyncClient(transport=transport, timeout=5) as client:
            paused = asyncio.Event()
            never = asyncio.Event()

            async def trace(name: str, info: Mapping[str, Any]) -> None:
                if name.endswith(paused_at):
                    paused.set()
                    await never.wait()

            request = client.build_request("GET", srv.url, extensions={"trace": trace})
            response = await client.send(request, stream=True)
            reader = asyncio.ensure_future(response.aread())
            await asyncio.wait_for(paused.wait(), 10)
            await response.aclose()
            [s] = transport.statistics().values()
            assert s.running == 1, "the slot left before the end"
            reader.cancel()
            with pytest.raises(asyncio.CancelledError):
                await reader
            [s] = transport.statistics().values()
            assert (s.running, s.in_use_connections) == (0, 0), s
            assert (s.acquired, s.completed, s.failed, s.cancelled) == (1, 1, 0, 0), s
            with anyio.fail_after(5):  # the one slot is free
                assert (await client.get(srv.url)).status_code == 200
