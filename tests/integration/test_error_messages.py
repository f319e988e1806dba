"""Errors that carry their numbers: every refusal or deadline of the bulkhead names its
compartment and the configured value that was exceeded, is a ``BulkheadError`` (so one
``except`` catches them all) and keeps its httpx base (so ``except httpx.TimeoutException``
still catches the timeouts).  No message holds a URL (credentials) or a header value.

Against hypercorn on 127.0.0.1; a gate holds the request that owns the only slot."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import httpx
import pytest

from httpx_bulkhead import (
    AcquireTimeout,
    BulkheadError,
    BulkheadFull,
    BulkheadTransport,
    Policy,
    RequestTimeout,
)
from tests.conftest import until
from tests.servers import HypercornServer, RawServer, TestApp, never_answer

pytestmark = pytest.mark.anyio

SECRET = "s3cr3t-value"


def assert_no_secrets(exc: BaseException) -> None:
    text = str(exc)
    assert SECRET not in text and "user" not in text and "/gate/" not in text, text


async def hold_the_only_slot(
    client: httpx.AsyncClient, url: str, tg: anyio.abc.TaskGroup, app: TestApp, gate: str
) -> None:
    tg.start_soon(client.get, f"{url}/gate/{gate}")
    await app.gate(gate).until_entered(1)


async def test_acquire_timeout_names_compartment_value_and_load(
    server: HypercornServer, app: TestApp, unique: Callable[[str], str]
) -> None:
    """Before: ``compartment '...': no slot within the acquire timeout`` (no value, no load)."""
    key = f"127.0.0.1:{server.port}"
    gate = unique("msg")
    transport = BulkheadTransport(
        hosts={key: Policy(max_concurrency=1, max_pending=5, acquire_timeout=0.05)}
    )
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:
        async with anyio.create_task_group() as tg:
            await hold_the_only_slot(client, server.url, tg, app, gate)
            url = server.url.replace("http://", f"http://user:{SECRET}@")
            with pytest.raises(BulkheadError) as caught:  # one except for every refusal
                await client.get(f"{url}/gate/{gate}?token={SECRET}", headers={"x-key": SECRET})
            app.gate(gate).open()
    exc = caught.value
    assert type(exc) is AcquireTimeout and isinstance(exc, httpx.PoolTimeout)
    assert str(exc) == (
        f"compartment '{key}': no slot within acquire_timeout=0.05 s (1 running, 0 waiting)"
    )
    assert_no_secrets(exc)


async def test_acquire_timeout_names_the_clients_pool_timeout_when_it_is_shorter(
    server: HypercornServer, app: TestApp, unique: Callable[[str], str]
) -> None:
    gate = unique("msg")
    transport = BulkheadTransport(default=Policy(max_concurrency=1, acquire_timeout=5))
    async with httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(10, pool=0.05)) as c:
        async with anyio.create_task_group() as tg:
            await hold_the_only_slot(c, server.url, tg, app, gate)
            with pytest.raises(AcquireTimeout) as caught:
                await c.get(f"{server.url}/")
            app.gate(gate).open()
    assert str(caught.value) == (
        f"compartment '{server.url}': no slot within the client's pool timeout=0.05 s"
        " (1 running, 0 waiting)"
    )


async def test_waiting_for_a_connection_names_max_connections(
    server: HypercornServer, app: TestApp, unique: Callable[[str], str]
) -> None:
    """Two slots, one connection: the second request has its slot and waits for the
    connection, so the message speaks of connections."""
    gate = unique("msg")
    transport = BulkheadTransport(
        default=Policy(max_concurrency=2, max_connections=1, acquire_timeout=0.05)
    )
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:
        async with anyio.create_task_group() as tg:
            await hold_the_only_slot(client, server.url, tg, app, gate)
            with pytest.raises(AcquireTimeout) as caught:
                await client.get(f"{server.url}/")
            app.gate(gate).open()
    assert str(caught.value) == (
        f"compartment '{server.url}': no connection within acquire_timeout=0.05 s"
        " (1 connections, 1 in use, max_connections=1)"
    )


async def test_request_timeout_is_a_bulkhead_error_and_an_httpx_timeout(
    server: HypercornServer, app: TestApp, unique: Callable[[str], str]
) -> None:
    """Before: ``request_timeout passed``, and ``except BulkheadError`` missed it."""
    key = f"127.0.0.1:{server.port}"
    gate = unique("msg")
    transport = BulkheadTransport(hosts={key: Policy(request_timeout=0.1)})
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:
        with pytest.raises(BulkheadError) as caught:
            await client.get(f"{server.url}/gate/{gate}", headers={"authorization": SECRET})
        app.gate(gate).open()
    exc = caught.value
    assert type(exc) is RequestTimeout and isinstance(exc, httpx.TimeoutException)
    assert str(exc) == (
        f"compartment '{key}': request_timeout=0.1 s passed"
        " while waiting for or reading the response"
    )
    assert_no_secrets(exc)


async def test_request_timeout_while_the_body_is_read(server: HypercornServer) -> None:
    transport = BulkheadTransport(default=Policy(request_timeout=0.5))
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:
        request = client.build_request("GET", f"{server.url}/bytes/20000000")
        async with client.stream(request.method, request.url) as response:
            with pytest.raises(httpx.TimeoutException) as reading:
                async for _ in response.aiter_raw():
                    await anyio.sleep(0.05)  # a slow reader: the deadline passes mid-body
    assert type(reading.value) is RequestTimeout
    assert str(reading.value).startswith(
        f"compartment '{server.url}': request_timeout=0.5 s passed while "
    )


async def test_a_response_held_unread_past_its_deadline(server: HypercornServer) -> None:
    transport = BulkheadTransport(default=Policy(max_concurrency=1, request_timeout=0.5))
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:
        held = await client.send(
            client.build_request("GET", f"{server.url}/bytes/1000000"), stream=True
        )
        await until(lambda: transport.statistics()[server.url].running == 0)  # the timer
        with pytest.raises(RequestTimeout) as caught:
            await held.aread()
        await held.aclose()
    assert str(caught.value) == (
        f"compartment '{server.url}': request_timeout=0.5 s passed"
        " while the response was held unread"
    )


async def test_bulkhead_full_names_the_queue_bound(
    server: HypercornServer, app: TestApp, unique: Callable[[str], str]
) -> None:
    gate = unique("msg")
    transport = BulkheadTransport(default=Policy(max_concurrency=1, max_pending=0))
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:
        async with anyio.create_task_group() as tg:
            await hold_the_only_slot(client, server.url, tg, app, gate)
            with pytest.raises(BulkheadFull) as caught:
                await client.get(f"{server.url}/?k={SECRET}")
            app.gate(gate).open()
    assert str(caught.value) == (
        f"compartment '{server.url}' is full: 1 running, 0 waiting (max_pending=0)"
    )
    assert_no_secrets(caught.value)


async def test_request_timeout_bounds_the_connect_too() -> None:
    """A TLS handshake the server never answers, with ``request_timeout`` shorter than the
    client's connect timeout: the deadline is what passed.  Before: ``ConnectTimeout`` (the
    connect was given the whole ``request_timeout`` as its own timeout, whatever was left)."""
    with RawServer(never_answer()) as srv:
        url = srv.url.replace("http://", "https://")
        transport = BulkheadTransport(default=Policy(request_timeout=0.3))
        async with httpx.AsyncClient(transport=transport, timeout=10) as client:
            with pytest.raises(
                RequestTimeout, match=r"request_timeout=0.3 s passed while connecting"
            ):
                await client.get(f"{url}/")
        stats = transport.statistics()[f"https://127.0.0.1:{srv.port}"]
        assert (stats.running, stats.failed, stats.connections) == (0, 1, 0)
