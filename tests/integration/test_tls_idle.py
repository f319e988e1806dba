"""What a TLS connection holds while idle: bytes the peer sent that nobody asked for must
keep the connection from being reused, whether they are still in the socket, already
decrypted, or a record not yet complete in the TLS layer's buffer; and checking an idle
connection never waits longer than a short bound.

The servers script the TLS records on the wire (``RawServer(tls=...)``), so the same
bytes arrive in the same groups on every run."""

from __future__ import annotations

import anyio
import httpx
import pytest

from httpx_bulkhead import BulkheadTransport, CompartmentStats, Policy
from tests.faults.handlers import h2_partial_record_while_idle
from tests.servers import (
    RawServer,
    default_server_tls,
    extra_response_in_next_record,
    extra_response_while_idle,
)
from tests.servers.raw import Handler

pytestmark = pytest.mark.anyio

TIMEOUT = 5.0


def trusting_transport(**kwargs: object) -> BulkheadTransport:
    return BulkheadTransport(verify=default_server_tls().client_ssl_context(), **kwargs)  # type: ignore[arg-type]


def only_stats(transport: BulkheadTransport) -> CompartmentStats:
    (stats,) = transport.statistics().values()
    return stats


async def checkpoints() -> None:
    """Let the event loop read what has arrived (checkpoints, not a timed wait)."""
    for _ in range(10):
        await anyio.sleep(0)


@pytest.mark.usefixtures("http1_parser")
@pytest.mark.parametrize("tls", [True, False], ids=["tls", "tcp"])
async def test_unsolicited_response_in_the_next_record_is_never_read(tls: bool) -> None:
    """The first response and an unsolicited second one arrive in one read from the
    socket, in two TLS records: the TLS layer hands out the first and keeps the second.
    It used to be read (trio) as the answer to the next request."""
    handler: Handler = extra_response_in_next_record()
    with RawServer(handler, tls=default_server_tls() if tls else None) as srv:
        transport = trusting_transport()
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
            first = await client.get(f"{srv.url}/first")
            second = await client.get(f"{srv.url}/second")
            assert (first.text, second.text) == ("ok", "fresh")
            assert second.extensions["bulkhead"].reused is False
            stats = only_stats(transport)
        # h11 sees the extra bytes when the connection is checked out (peer_closed);
        # httptools when the first response ends (not_reusable).
        discarded = stats.peer_closed + stats.not_reusable
        assert (discarded, stats.connections_created, stats.completed) == (1, 2, 2), stats
        assert srv.connections == 2


@pytest.mark.usefixtures("http1_parser")
@pytest.mark.parametrize("tls", [True, False], ids=["tls", "tcp"])
async def test_partial_unsolicited_record_while_idle_keeps_the_connection_out(tls: bool) -> None:
    """While the connection is idle the server sends part of an unsolicited response (of
    its TLS record).  The bytes were read from the socket by the TLS layer, which waits
    for the rest of the record: it used to be reused (asyncio), and the rest of the
    record read as the answer to the next request."""
    with RawServer(extra_response_while_idle(), tls=default_server_tls() if tls else None) as srv:
        transport = trusting_transport()
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
            assert (await client.get(f"{srv.url}/first")).text == "ok"
            srv.set_event("idle")
            await srv.wait_event("partial")
            await checkpoints()
            second = await client.get(f"{srv.url}/second")
            assert second.text == "fresh"
            assert second.extensions["bulkhead"].reused is False
            stats = only_stats(transport)
        assert (stats.peer_closed, stats.connections_created, stats.completed) == (1, 2, 2), stats


async def test_h2_partial_record_while_idle_is_not_waited_on() -> None:
    """HTTP/2 over TLS: while the connection is idle, the server sends part of a TLS
    record and stalls.  Checking the connection before reuse reads what arrived; that
    read used to have no timeout (trio: the second request waited for ever, well past
    httpx's 2 s timeout and the 1 s acquire timeout).  It is bounded now, and the
    connection is discarded rather than waited on."""
    server_tls = default_server_tls()
    with RawServer(h2_partial_record_while_idle(), tls=server_tls, alpn=("h2",)) as srv:
        transport = trusting_transport(
            http2=True, default=Policy(acquire_timeout=1.0, max_connections=2)
        )
        async with httpx.AsyncClient(transport=transport, timeout=2.0) as client:
            first = await client.get(srv.url)
            assert (first.http_version, first.text) == ("HTTP/2", "first")
            srv.set_event("idle")
            await srv.wait_event("partial")
            await checkpoints()
            with anyio.fail_after(1.0):  # far below httpx's timeout and the acquire timeout
                second = await client.get(srv.url)
            assert (second.text, second.extensions["bulkhead"].reused) == ("fresh", False)
            stats = only_stats(transport)
        assert (stats.completed, stats.connections_created, stats.peer_closed) == (2, 2, 1), stats
        assert (stats.running, stats.in_use_connections) == (0, 0), stats
