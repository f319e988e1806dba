"""Users who mock with respx keep working, and ``MockNetwork`` routes respx's responses
*through* a BulkheadTransport so isolation can be tested without a network."""

from __future__ import annotations

import anyio
import httpx
import pytest
import respx

from httpx_bulkhead import AcquireTimeout, BulkheadTransport, Policy
from httpx_bulkhead.testing import MockNetwork
from tests.conftest import until

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("http1_parser")]


async def test_respx_mock_using_httpx_works_with_our_transport() -> None:
    async with httpx.AsyncClient(transport=BulkheadTransport()) as client:
        with respx.mock(using="httpx", assert_all_called=True) as router:
            router.get("https://api.example.com/items").respond(200, json=[1, 2])
            response = await client.get("https://api.example.com/items")
    assert response.json() == [1, 2]


async def test_isolation_property_with_mock_network() -> None:
    """The LLM is stuck; the search API is still served, and the LLM's own extra calls
    time out in their compartment: shown without a socket."""
    llm_stuck = anyio.Event()
    router = respx.MockRouter(assert_all_called=False)

    async def stuck(request: httpx.Request) -> httpx.Response:
        await llm_stuck.wait()
        return httpx.Response(200, text="late")

    router.post("https://llm.example.com/v1/generate").mock(side_effect=stuck)
    router.get("https://search.example.com/q").respond(200, text="results")
    network = MockNetwork(router.async_handler)
    transport = BulkheadTransport(
        hosts={"llm.example.com": Policy(max_concurrency=2, acquire_timeout=0.05)},
        network=network,
    )
    async with httpx.AsyncClient(transport=transport) as client:
        async with anyio.create_task_group() as tg:
            for _ in range(2):
                tg.start_soon(client.post, "https://llm.example.com/v1/generate")
            await until(lambda: transport.statistics()["llm.example.com"].running == 2)
            with pytest.raises(AcquireTimeout):
                await client.post("https://llm.example.com/v1/generate")
            for _ in range(10):
                assert (await client.get("https://search.example.com/q")).text == "results"
            llm_stuck.set()
        stats = transport.statistics()
        assert stats["llm.example.com"].acquire_timeouts == 1
        assert stats["llm.example.com"].completed == 2
        search = stats["https://search.example.com:443"]
        assert search.completed == 10 and search.connections_created == 1  # keep-alive reuse
    assert len(network.requests) == 12


async def test_mock_network_handler_errors_and_bodies() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/boom":
            raise RuntimeError("handler bug")
        return httpx.Response(201, content=request.content[::-1], headers={"x-m": request.method})

    transport = BulkheadTransport(network=MockNetwork(handler))
    async with httpx.AsyncClient(transport=transport) as client:
        echoed = await client.put("http://svc.test/echo", content=b"abc")
        assert (echoed.status_code, echoed.content, echoed.headers["x-m"]) == (201, b"cba", "PUT")
        with pytest.raises(httpx.ReadError, match="handler bug"):
            await client.get("http://svc.test/boom")
        stats = transport.statistics()["http://svc.test:80"]
        assert stats.running == 0 and stats.error == 1
