"""What the ``httpx_bulkhead`` logger says, event by event, driven by real servers.

DEBUG: a rejection, an acquire timeout (for a slot, for a connection), an eviction, a
connection closed with its reason, an HTTP/2 replay, a stale keep-alive retry.  WARNING: an
HTTP/2 server refusing a stream within the cap it advertised (leaks: ``test_leaks.py``).
A request that simply succeeds logs nothing at all.  Every record names its compartment
(``record.compartment``, and in the message) and its event and reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio
import httpx
import pytest

from httpx_bulkhead import AcquireTimeout, BulkheadFull, BulkheadTransport, Policy
from tests.conftest import until
from tests.integration.test_connections import race_then_serve
from tests.servers import HypercornServer, TestApp, h2script
from tests.servers.raw import RawServer

pytestmark = pytest.mark.anyio


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger="httpx_bulkhead")
    return caplog


def events(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    """Our records of ``event``, each checked to name its compartment."""
    found = []
    for record in caplog.records:
        if record.name == "httpx_bulkhead" and getattr(record, "event", None) == event:
            compartment = record.compartment  # type: ignore[attr-defined]
            assert f"compartment {compartment!r}" in record.getMessage()
            found.append(record)
    return found


async def test_rejection_and_acquire_timeouts_are_debug(
    server: HypercornServer,
    app: TestApp,
    logs: pytest.LogCaptureFixture,
    unique: Callable[[str], str],
) -> None:
    gate = app.gate(unique("log-full"))
    name = f"127.0.0.1:{server.port}"
    transport = BulkheadTransport(
        hosts={name: Policy(max_concurrency=1, max_pending=1, acquire_timeout=0.2)}
    )
    errors: list[BaseException] = []

    async def waiter() -> None:
        try:
            await client.get(f"{server.url}/")
        except AcquireTimeout as exc:
            errors.append(exc)

    async with transport, httpx.AsyncClient(transport=transport, timeout=10) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.get, f"{server.url}/gate/{gate.name}")
            await gate.until_entered(1)
            tg.start_soon(waiter)  # waits (the one place), then times out...
            await until(lambda: transport.statistics()[name].waiting == 1)
            with pytest.raises(BulkheadFull):  # ...while the queue is full
                await client.get(f"{server.url}/")
            await until(lambda: bool(errors))
            gate.open()
    [rejected] = events(logs, "rejected")
    assert rejected.levelno == logging.DEBUG and rejected.reason == "full"  # type: ignore[attr-defined]
    assert "is full: 1 running, 1 waiting (max_pending=1)" in rejected.getMessage()
    [timeout] = events(logs, "acquire_timeout")
    assert timeout.levelno == logging.DEBUG and timeout.reason == "slot"  # type: ignore[attr-defined]
    assert "no slot in time (1 running, 0 waiting)" in timeout.getMessage()
    assert timeout.compartment == name  # type: ignore[attr-defined]


async def test_connection_acquire_timeout_is_debug(
    server: HypercornServer,
    app: TestApp,
    logs: pytest.LogCaptureFixture,
    unique: Callable[[str], str],
) -> None:
    gate = app.gate(unique("log-conn"))
    policy = Policy(max_concurrency=2, max_connections=1, acquire_timeout=0.2)
    transport = BulkheadTransport(default=policy)
    async with transport, httpx.AsyncClient(transport=transport, timeout=10) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.get, f"{server.url}/gate/{gate.name}")
            await gate.until_entered(1)
            with pytest.raises(AcquireTimeout):
                await client.get(f"{server.url}/")
            gate.open()
    [timeout] = events(logs, "acquire_timeout")
    assert timeout.reason == "connection" and "no connection in time" in timeout.getMessage()  # type: ignore[attr-defined]


async def test_eviction_and_connection_discards_are_debug(
    server: HypercornServer, app: TestApp, logs: pytest.LogCaptureFixture
) -> None:
    with HypercornServer(app) as other:
        transport = BulkheadTransport(max_default_compartments=1)
        async with transport, httpx.AsyncClient(transport=transport) as client:
            await client.get(f"{server.url}/close")  # Connection: close
            [closed] = events(logs, "connection_closed")
            assert closed.levelno == logging.DEBUG and closed.reason == "not_reusable"  # type: ignore[attr-defined]
            assert "closed (not_reusable) after" in closed.getMessage()
            assert closed.compartment == server.url  # type: ignore[attr-defined]
            await client.get(f"{server.url}/")  # an idle connection, closed by eviction
            await client.get(f"{other.url}/")  # (a second chance: used since last seen)
            await client.get(f"{other.url}/")
            with HypercornServer(app) as third:
                await client.get(f"{third.url}/")
                evicted = events(logs, "evicted")
                assert [r.compartment for r in evicted][:1] == [server.url]  # type: ignore[attr-defined]
                assert all(r.levelno == logging.DEBUG for r in evicted)
                reasons = {(r.compartment, r.reason) for r in events(logs, "connection_closed")}  # type: ignore[attr-defined]
                assert (server.url, "closed") in reasons  # the idle one, at eviction
    stats = transport.statistics()
    assert stats["(evicted)"].closed >= 1


async def test_http2_replay_is_debug_and_a_refusal_within_the_cap_warns(
    logs: pytest.LogCaptureFixture,
) -> None:
    with h2script.refuse_stream("/once", times=2, max_streams=10) as srv:
        transport = BulkheadTransport(http1=False, http2=True)
        async with transport, httpx.AsyncClient(transport=transport, timeout=10) as client:
            await client.get(f"{srv.url}/")  # the server's SETTINGS (cap 10) are in
            response = await client.get(f"{srv.url}/once")  # refused twice, then served
            assert response.status_code == 200 and response.extensions["bulkhead"].retried
            assert transport.statistics()[srv.url].replays == 2
    replays = events(logs, "replay")
    assert [r.reason for r in replays] == ["refused_stream", "refused_stream"]  # type: ignore[attr-defined]
    assert all(r.levelno == logging.DEBUG for r in replays)
    assert "replay 1 of at most 3" in replays[0].getMessage()
    [violation] = events(logs, "stream_cap_violation")  # once per connection
    assert violation.levelno == logging.WARNING
    assert "open stream 1 of the 10 it allows" in violation.getMessage()


async def test_refusal_beyond_an_unknown_cap_does_not_warn(
    logs: pytest.LogCaptureFixture,
) -> None:
    """A server that advertises no SETTINGS_MAX_CONCURRENT_STREAMS has no cap to violate."""
    with h2script.refuse_stream("/once", times=1, max_streams=None) as srv:
        transport = BulkheadTransport(http1=False, http2=True)
        async with transport, httpx.AsyncClient(transport=transport, timeout=10) as client:
            await client.get(f"{srv.url}/")
            assert (await client.get(f"{srv.url}/once")).status_code == 200
    assert len(events(logs, "replay")) == 1
    assert not events(logs, "stream_cap_violation")


async def test_stale_retry_is_debug(logs: pytest.LogCaptureFixture) -> None:
    with RawServer(race_then_serve) as srv:
        transport = BulkheadTransport()
        async with transport, httpx.AsyncClient(transport=transport) as client:
            assert (await client.get(srv.url)).text == "first"
            assert (await client.get(srv.url)).text == "fresh"
    [retry] = events(logs, "stale_retry")
    assert retry.levelno == logging.DEBUG and retry.compartment == srv.url  # type: ignore[attr-defined]
    assert "sent again on a new connection" in retry.getMessage()
    reasons = [r.reason for r in events(logs, "connection_closed")]  # type: ignore[attr-defined]
    assert "peer_closed" in reasons


async def test_a_successful_request_logs_nothing(
    server: HypercornServer, logs: pytest.LogCaptureFixture
) -> None:
    """Nothing at INFO or above, and with a kept-alive connection nothing at all (a
    connection closed by ``aclose`` is the only DEBUG line), after the one line saying
    which HTTP/1.1 parser the new transport runs."""
    transport = BulkheadTransport(default=Policy(leak_threshold=5))
    made = [r for r in logs.records if r.name.startswith("httpx_bulkhead")]
    assert [getattr(r, "event", None) for r in made] == ["http1_parser"]
    logs.clear()
    async with transport, httpx.AsyncClient(transport=transport) as client:
        for _ in range(3):
            assert (await client.get(f"{server.url}/")).status_code == 200
            async with client.stream("GET", f"{server.url}/stream/2") as response:
                await response.aread()
        assert not [r for r in logs.records if r.name.startswith("httpx_bulkhead")]
    ours = [r for r in logs.records if r.name.startswith("httpx_bulkhead")]
    assert [getattr(r, "event", None) for r in ours] == ["connection_closed"]
    assert ours[0].levelno == logging.DEBUG and ours[0].reason == "closed"  # type: ignore[attr-defined]
