"""``httpx.Client`` and the transports: the async ``BulkheadTransport`` given to a sync
client fails at once with a ``TypeError`` that names the sync transport to use
(``BulkheadHTTPTransport``), however it is used; the sync transport serves it."""

from __future__ import annotations

import httpx
import pytest

from httpx_bulkhead import (
    AsyncBulkheadHTTPTransport,
    BulkheadHTTPTransport,
    BulkheadTransport,
    Policy,
)
from tests.servers import HypercornServer

ADVICE = r"async transport: use it with httpx\.AsyncClient, not httpx\.Client"


# (mypy flags the mistake too: the ``type: ignore``s below are the mistake under test)
def test_with_block() -> None:
    with pytest.raises(TypeError, match=ADVICE) as caught:
        with httpx.Client(transport=BulkheadTransport()):  # type: ignore[arg-type]
            pass
    assert "use httpx_bulkhead.BulkheadHTTPTransport" in str(caught.value)


def test_request_without_a_with_block_touches_no_network() -> None:
    client = httpx.Client(transport=BulkheadTransport())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=ADVICE):
        client.get("http://127.0.0.1:9/")  # raised before any connection is attempted
    with pytest.raises(TypeError, match=r"await transport\.aclose\(\)"):
        client.close()


@pytest.mark.anyio
async def test_the_async_client_is_unaffected() -> None:
    async with httpx.AsyncClient(transport=AsyncBulkheadHTTPTransport()) as client:
        assert not client.is_closed
    assert AsyncBulkheadHTTPTransport is BulkheadTransport


def test_the_sync_transport_serves_httpx_client(server: HypercornServer) -> None:
    transport = BulkheadHTTPTransport(default=Policy(max_concurrency=2))
    assert isinstance(transport, httpx.BaseTransport)
    with httpx.Client(transport=transport) as client:
        response = client.get(f"{server.url}/")
        assert response.text == "hello"
        info = response.extensions["bulkhead"]
        assert info.compartment == f"http://127.0.0.1:{server.port}"
        assert client.get(f"{server.url}/").extensions["bulkhead"].reused
    [stats] = transport.statistics().values()
    assert (stats.acquired, stats.completed, stats.connections_created) == (2, 2, 1)
    assert stats.connections == 0  # closed with the client
