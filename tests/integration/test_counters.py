"""Each request is counted once among the request counters of ``statistics()``: a wait
that ends in ``AcquireTimeout`` is an acquire timeout, not also a cancelled wait; and
``str()``/``as_dict()`` of a live snapshot say the same as its fields."""

from __future__ import annotations

import anyio
import httpx
import pytest

from httpx_bulkhead import AcquireTimeout, BulkheadFull, BulkheadTransport, Policy
from tests.conftest import until
from tests.servers import RawServer
from tests.servers.raw import hold_on_request

pytestmark = pytest.mark.anyio


async def test_every_request_is_counted_once() -> None:
    transport = BulkheadTransport(default=Policy(max_concurrency=1, max_pending=1))
    with RawServer(hold_on_request) as srv:
        name = f"http://127.0.0.1:{srv.port}"

        async with (
            httpx.AsyncClient(transport=transport, timeout=5) as client,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(client.get, srv.url + "/hold")
            await srv.wait_event("held")
            for _ in range(3):  # each waits alone in the queue, then gives up
                with pytest.raises(AcquireTimeout):
                    await client.get(srv.url, timeout=httpx.Timeout(5, pool=0.01))
            scope = anyio.CancelScope()

            async def cancelled() -> None:
                with scope:
                    await client.get(srv.url)

            tg.start_soon(cancelled)
            await until(lambda: transport.statistics()[name].waiting == 1)
            with pytest.raises(BulkheadFull):
                await client.get(srv.url)
            scope.cancel()
            await until(lambda: transport.statistics()[name].waiting == 0)
            srv.event("release").set()
    s = transport.statistics()[name]
    counted = (
        s.acquired,
        s.completed,
        s.failed,
        s.cancelled,
        s.rejected,
        s.acquire_timeouts,
        s.cancelled_waiting,
    )
    assert counted == (1, 1, 0, 0, 1, 3, 1)
    requests_made = 6
    assert s.acquired + s.rejected + s.acquire_timeouts + s.cancelled_waiting == requests_made
    text = str(s)
    assert text.startswith(f"{name}: 0/1 running, 0 waiting (max_pending 1)\n")
    assert (
        "  requests: acquired 1, completed 1, rejected 1, acquire timeouts 3, cancelled waiting 1\n"
        in text
    )
    grouped = s.as_dict()["requests"]
    assert isinstance(grouped, dict)
    assert grouped["acquire_timeouts"] == 3 and grouped["cancelled_waiting"] == 1
