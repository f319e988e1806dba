"""HTTP/2 against an independent stack (Node.js ``http2``) and against scripted h2 servers
that change their stream cap mid-connection, send GOAWAY, reset or refuse streams and
ignore PINGs."""

from __future__ import annotations

import anyio
import httpx
import pytest

from httpx_bulkhead import BulkheadTransport, Policy
from tests.conftest import until
from tests.flavours import Flavour, Transport, client_for, make_transport
from tests.servers import NodeH2Server, default_server_tls, h2script

pytestmark = pytest.mark.anyio


def h2c(**policy: object) -> BulkheadTransport:
    return BulkheadTransport(default=Policy(**policy), http1=False, http2=True)  # type: ignore[arg-type]


def h2c_in(flavour: Flavour, **policy: object) -> Transport:
    """``h2c``, of either flavour (``tests/flavours.py``)."""
    policy_ = Policy(**policy)  # type: ignore[arg-type]
    return make_transport(flavour, default=policy_, http1=False, http2=True)


@pytest.mark.parametrize("connections", [1, 4])
async def test_node_stream_cap_and_scale_out(connections: int, flavour: Flavour) -> None:
    with NodeH2Server(max_concurrent_streams=3) as node:
        transport = h2c_in(flavour, max_concurrency=30, max_connections=connections)
        versions: list[str] = []
        async with client_for(transport, timeout=10) as client:

            async def call() -> None:
                versions.append((await client.get(f"{node.url}/hold/cap")).http_version)

            async with anyio.create_task_group() as tg:
                for _ in range(30):
                    tg.start_soon(call)
                held = await node.until_held("cap", 3 * connections)
                assert held["maxStreamsPerSession"] <= 3
                node.release("cap")
            stats = transport.statistics()[node.url]
            assert stats.connections_created == connections
            assert stats.stream_caps == (3,) * connections
        assert versions == ["HTTP/2"] * 30
        final = node.stats()
        assert final["maxStreamsPerSession"] <= 3 and final["sessions"] == connections
        assert final["totalStreams"] == 30


async def test_node_tls_alpn_h2() -> None:
    tls = default_server_tls()
    with NodeH2Server(max_concurrent_streams=10, tls=tls) as node:
        transport = BulkheadTransport(http2=True, verify=tls.client_ssl_context())
        async with httpx.AsyncClient(transport=transport) as client:
            responses = [await client.get(f"{node.url}/") for _ in range(3)]
        assert [r.http_version for r in responses] == ["HTTP/2"] * 3
        assert [r.text for r in responses] == ["hello"] * 3
        assert responses[2].extensions["bulkhead"].reused


async def test_cap_lowered_then_raised_mid_connection(flavour: Flavour) -> None:
    with h2script.change_cap(max_streams=3) as srv:
        transport = h2c_in(flavour, max_concurrency=20, max_connections=1)
        async with client_for(transport, timeout=10) as client:
            await client.get(f"{srv.url}/")  # connection up, cap known
            async with anyio.create_task_group() as tg:
                for _ in range(6):
                    tg.start_soon(client.get, f"{srv.url}/hold/low")
                await srv.until_held("low", 3)
                srv.set_max_streams(1)  # in-flight streams finish; no new one until below 1
                await srv.until_event("settings-acked-1")
                assert transport.statistics()[srv.url].stream_caps == (1,)
                srv.release("low")
            assert not srv.violations
            assert transport.statistics()[srv.url].completed == 7

            srv.set_max_streams(5)
            # The connection is idle: the new SETTINGS are read (and ACKed) when it is next
            # used, by whichever request comes after they arrive.
            with anyio.fail_after(10):
                while not srv.event("settings-acked-5").is_set():
                    await client.get(f"{srv.url}/")
            async with anyio.create_task_group() as tg:
                for _ in range(5):
                    tg.start_soon(client.get, f"{srv.url}/hold/high")
                await srv.until_held("high", 5)  # the raise admitted five at once
                srv.release("high")
            stats = transport.statistics()[srv.url]
            assert stats.connections_created == 1 and stats.stream_caps == (5,)
        assert not srv.violations and not srv.protocol_errors


async def test_goaway_replays_unprocessed_streams_and_finishes_the_others(flavour: Flavour) -> None:
    with h2script.goaway_after(3) as srv:
        transport = h2c_in(flavour, max_concurrency=10)
        results: list[str] = []
        async with client_for(transport, timeout=10) as client:

            async def call() -> None:
                results.append((await client.get(f"{srv.url}/hold/g")).text)

            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(call)
                await srv.until_event("goaway-sent")
                await srv.until_held("g", 5)  # 3 on the first connection, 2 replayed
                srv.release("g")
            stats = transport.statistics()[srv.url]
            assert stats.goaways == 1 and stats.replays == 2
            assert stats.connections_created == 2 and stats.failed == 0
        assert len(results) == 3 and all(r.startswith("stream:") for r in results)
        answered_on = sorted(conn for conn, _ in srv.answered)
        assert answered_on == [0, 1, 1]  # one kept on the first connection, two replayed
        assert not srv.protocol_errors


async def test_unanswered_ping_discards_the_connection(flavour: Flavour) -> None:
    with h2script.never_ping() as srv:
        transport = h2c_in(flavour, ping_after=0.0, ping_timeout=0.2)
        async with client_for(transport, timeout=10) as client:
            first = await client.get(f"{srv.url}/")
            second = await client.get(f"{srv.url}/")  # PING on reuse: no answer
            assert first.status_code == second.status_code == 200
            assert not second.extensions["bulkhead"].reused
            stats = transport.statistics()[srv.url]
            assert stats.ping_timeouts == 1 and stats.connections_created == 2
        assert srv.pings


async def test_answered_ping_keeps_the_connection() -> None:
    with h2script.serve() as srv:
        transport = h2c(ping_after=0.0, ping_timeout=5.0)
        async with httpx.AsyncClient(transport=transport, timeout=10) as client:
            await client.get(f"{srv.url}/")
            second = await client.get(f"{srv.url}/")
            assert second.extensions["bulkhead"].reused
            assert transport.statistics()[srv.url].ping_timeouts == 0


async def test_server_reset_fails_only_that_stream(flavour: Flavour) -> None:
    with h2script.reset_stream("/bad") as srv:
        transport = h2c_in(flavour)
        async with client_for(transport, timeout=10) as client:
            await client.get(f"{srv.url}/")
            with pytest.raises(httpx.RemoteProtocolError, match="reset"):
                await client.get(f"{srv.url}/bad")
            after = await client.get(f"{srv.url}/")
            assert after.extensions["bulkhead"].reused
            stats = transport.statistics()[srv.url]
            assert stats.connections_created == 1 and stats.failed == 1 and stats.running == 0


async def test_refused_stream_is_replayed(flavour: Flavour) -> None:
    with h2script.refuse_stream("/once", times=1) as srv:
        transport = h2c_in(flavour)
        async with client_for(transport, timeout=10) as client:
            response = await client.get(f"{srv.url}/once")
            assert response.status_code == 200 and response.extensions["bulkhead"].retried
            assert transport.statistics()[srv.url].replays == 1


async def test_cap_lowered_to_zero_scales_out(flavour: Flavour) -> None:
    with h2script.settings_zero() as srv:
        transport = h2c_in(flavour, max_connections=4)
        async with client_for(transport, timeout=10) as client:
            first = await client.get(f"{srv.url}/")
            # The server lowers the cap to 0 after its first response; the client sees it
            # when it next uses the connection.
            with anyio.fail_after(10):
                while not srv.event("settings-acked-0").is_set():
                    assert (await client.get(f"{srv.url}/")).status_code == 200
            after = await client.get(f"{srv.url}/")
            assert after.status_code == 200
            assert (
                after.extensions["bulkhead"].connection_id
                != first.extensions["bulkhead"].connection_id
            )  # no stream on a connection whose cap is 0
            assert 0 in transport.statistics()[srv.url].stream_caps
        assert not srv.violations


async def test_cancelled_streams_do_not_leak_capacity() -> None:
    with h2script.serve(max_streams=2) as srv:
        transport = h2c(max_concurrency=10, max_connections=1)
        async with httpx.AsyncClient(transport=transport, timeout=10) as client:
            await client.get(f"{srv.url}/")
            for _ in range(5):  # each cancelled stream is reset and its slot returned
                with anyio.move_on_after(10) as scope:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(client.get, f"{srv.url}/hold/never")
                        await until(lambda: srv.held("never") >= 1)
                        tg.cancel_scope.cancel()
                assert not scope.cancelled_caught
                await srv.until_idle()
            stats = transport.statistics()[srv.url]
            assert stats.streams_reset == 5 and stats.open_streams == 0
            ok = await client.get(f"{srv.url}/")
            assert ok.extensions["bulkhead"].reused
