"""respx in both of its modes, in front of a real server on 127.0.0.1 that must not be
reached by a mocked request.

Default mode (``respx.mock``, no ``using=``) patches httpcore, which we do not use: before,
a request went to the real server and the route was never called (a test suite could hit
production).  Now the transport offers each request to respx's routers first; a mocked
route answers without the bulkheads (no ``extensions["bulkhead"]``, as under
``using="httpx"``), a pass-through goes through them."""

from __future__ import annotations

import sys
import types

import httpx
import pytest
import respx

from httpx_bulkhead import BulkheadHTTPTransport, BulkheadTransport, Policy
from tests.servers import HypercornServer, TestApp

pytestmark = pytest.mark.anyio


async def test_default_mode_intercepts_and_the_server_sees_nothing(
    server: HypercornServer, app: TestApp
) -> None:
    """Before: ``route.called`` was False and the response was the server's ``hello``."""
    transport = BulkheadTransport(hosts={f"127.0.0.1:{server.port}": Policy(max_concurrency=2)})
    async with httpx.AsyncClient(transport=transport) as client:
        with respx.mock:
            route = respx.get(f"{server.url}/").respond(200, text="mocked")
            posted = respx.post(f"{server.url}/echo", content=b"ping").respond(201)
            response = await client.get(f"{server.url}/")
            created = await client.post(f"{server.url}/echo", content=b"ping")
        assert route.call_count == 1 and posted.call_count == 1  # matched on the body too
        assert (response.status_code, response.text) == (200, "mocked")
        assert created.status_code == 201
        assert "bulkhead" not in response.extensions  # answered in front of the bulkheads
        assert app.records() == []  # nothing reached the server
        # The mock is over: the next request goes to the network, through the bulkheads.
        real = await client.get(f"{server.url}/")
        assert real.text == "hello" and "bulkhead" in real.extensions
    assert len(app.records()) == 1


async def test_default_mode_as_a_decorator_and_unmocked_requests(server: HypercornServer) -> None:
    transport = BulkheadTransport()

    @respx.mock
    async def decorated() -> httpx.Response:
        respx.get(f"{server.url}/items").respond(200, json=[1, 2])  # the server: 404
        async with httpx.AsyncClient(transport=transport) as client:
            with pytest.raises(AssertionError, match="not mocked"):  # respx's verdict
                await client.get(f"{server.url}/other")
            return await client.get(f"{server.url}/items")

    assert (await decorated()).json() == [1, 2]

    # assert_all_mocked=False: an unmatched request gets respx's automatic 200.
    async with httpx.AsyncClient(transport=BulkheadTransport()) as client:
        with respx.mock(assert_all_mocked=False, assert_all_called=False):
            empty = await client.get(f"{server.url}/")
        assert (empty.status_code, empty.content) == (200, b"")


async def test_default_mode_pass_through_goes_through_the_bulkheads(
    server: HypercornServer, app: TestApp
) -> None:
    key = f"127.0.0.1:{server.port}"
    transport = BulkheadTransport(hosts={key: Policy(max_concurrency=2)})
    async with httpx.AsyncClient(transport=transport) as client:
        with respx.mock:
            through = respx.get(f"{server.url}/").pass_through()
            response = await client.get(f"{server.url}/")
    assert through.call_count == 1
    assert response.text == "hello"
    assert response.extensions["bulkhead"].compartment == key
    assert transport.statistics()[key].completed == 1
    assert len(app.records()) == 1


async def test_using_httpx_mode_answers_in_front_of_the_transport(
    server: HypercornServer, app: TestApp
) -> None:
    """``using="httpx"`` replaces the client's transport for mocked routes: no
    ``extensions["bulkhead"]`` there; a pass-through reaches our transport."""
    transport = BulkheadTransport()
    async with httpx.AsyncClient(transport=transport) as client:
        with respx.mock(using="httpx") as router:
            router.get(f"{server.url}/").respond(200, text="mocked")
            router.get(f"{server.url}/echo").pass_through()
            mocked = await client.get(f"{server.url}/")
            through = await client.get(f"{server.url}/echo")
    assert mocked.text == "mocked" and "bulkhead" not in mocked.extensions
    assert through.extensions["bulkhead"].compartment == server.url
    assert [r.path for r in app.records()] == ["/echo"]


async def test_an_unknown_respx_is_refused_not_sent(
    server: HypercornServer, app: TestApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If a respx release stops offering what we use while it patches httpcore, the
    request fails loudly instead of reaching the network."""
    async with httpx.AsyncClient(transport=BulkheadTransport()) as client:
        with respx.mock(assert_all_called=False):
            respx.get(f"{server.url}/").respond(200, text="mocked")
            monkeypatch.setitem(sys.modules, "respx.mocks", types.ModuleType("respx.mocks"))
            with pytest.raises(RuntimeError, match=r"respx\.mock is active in its default mode"):
                await client.get(f"{server.url}/")
            monkeypatch.undo()
    assert app.records() == []


def test_default_mode_intercepts_for_the_sync_transport(
    server: HypercornServer, app: TestApp
) -> None:
    """The sync transport asks respx too (respx's sync handler), with httpx.Client."""
    transport = BulkheadHTTPTransport(hosts={f"127.0.0.1:{server.port}": Policy()})
    with httpx.Client(transport=transport) as client:
        with respx.mock:
            route = respx.get(f"{server.url}/").respond(200, text="mocked")
            passed = respx.get(f"{server.url}/echo").pass_through()
            response = client.get(f"{server.url}/")
            real = client.get(f"{server.url}/echo")
            # (read inside the block: leaving it may reset the global router's routes)
            assert route.call_count == 1 and passed.call_count == 1
        assert response.text == "mocked" and "bulkhead" not in response.extensions
        assert real.status_code == 200 and "bulkhead" in real.extensions
    assert [r.path for r in app.records()] == ["/echo"]  # only the pass-through
