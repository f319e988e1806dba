"""Wildcard keys and groups route real requests: one group shares one limit across its
hosts, a wildcard catches every host below its domain, and nothing outside them is caught.

Every URL host reaches one raw server through a Unix socket (``uds=``), so names such as
``api.a.test`` need no DNS; the server reads the ``Host`` each request carried.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from httpx_bulkhead import BulkheadFull, BulkheadTransport, Group, Policy
from tests.servers import RawServer
from tests.servers.raw import hold_on_request

pytestmark = pytest.mark.anyio


async def test_a_group_shares_one_limit_and_a_wildcard_catches_subdomains(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    transport = BulkheadTransport(
        uds=path,
        hosts={
            "llm": Group(
                "api.a.test",
                "api.b.test/v1",
                "*.c.test",
                policy=Policy(max_concurrency=1, max_pending=0),
            ),
            "*.d.test": Policy(max_concurrency=2),
        },
    )
    with RawServer(hold_on_request, uds=path) as srv:
        async with (
            httpx.AsyncClient(transport=transport, timeout=5) as client,
            anyio.create_task_group() as tg,
        ):
            held: list[httpx.Response] = []

            async def hold() -> None:
                held.append(await client.get("http://api.a.test/hold"))

            tg.start_soon(hold)
            await srv.wait_event("held")
            # The group's one slot is taken by api.a.test: its other routes are full too.
            for url in (
                "http://api.b.test/v1/generate",
                "http://deep.x.c.test/",
                "http://c.test.c.test/",
            ):
                with pytest.raises(BulkheadFull, match="compartment 'llm' is full"):
                    await client.get(url)
            # Another spelling of api.a.test is the same host, in the same group.
            with pytest.raises(BulkheadFull):
                await client.get("http://API.A.test.:80/x")
            # Outside the group's routes nothing waits.
            served = {}
            for url in ("http://api.b.test/v2", "http://c.test/", "http://q.d.test/"):
                served[url] = (await client.get(url)).extensions["bulkhead"].compartment
            assert served == {
                "http://api.b.test/v2": "http://api.b.test:80",
                "http://c.test/": "http://c.test:80",
                "http://q.d.test/": "*.d.test",
            }
            srv.event("release").set()
        assert held[0].status_code == 200
        assert held[0].extensions["bulkhead"].compartment == "llm"
        sent = {
            line[5:].strip()
            for request in srv.requests
            for line in request.split(b"\r\n")
            if line.lower().startswith(b"host:")
        }
        assert sent == {b"api.a.test", b"api.b.test", b"c.test", b"q.d.test"}  # no rejected one

    stats = transport.statistics()
    assert set(stats) == {"llm", "*.d.test", "http://api.b.test:80", "http://c.test:80"}
    llm = stats["llm"]
    assert (llm.acquired, llm.completed, llm.rejected, llm.running) == (1, 1, 4, 0)
    assert (stats["*.d.test"].acquired, stats["*.d.test"].limit) == (1, 2)


async def test_one_group_keeps_a_pool_per_origin(tmp_path: Path) -> None:
    """A group shares slots, not connections: a connection opened for one host is never
    sent a request for another."""
    path = str(tmp_path / "s.sock")
    transport = BulkheadTransport(uds=path, hosts={"vendor": Group("a.test", "b.test")})
    with RawServer(hold_on_request, uds=path) as srv:
        async with httpx.AsyncClient(transport=transport, timeout=5) as client:
            first = await client.get("http://a.test/")
            second = await client.get("http://b.test/")
            again = await client.get("http://a.test/")
        assert srv.connections == 2
    info = [r.extensions["bulkhead"] for r in (first, second, again)]
    assert [i.compartment for i in info] == ["vendor"] * 3
    assert info[2].reused and info[2].connection_id == info[0].connection_id
    assert info[1].connection_id != info[0].connection_id
    assert transport.statistics()["vendor"].connections_created == 2
