"""HTTP/2 against hypercorn (h2 inside): stream caps, scale-out, per-stream cancellation,
flow control, ALPN."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
import httpx
import pytest

from httpx_bulkhead import BulkheadTransport, Policy
from tests.conftest import until
from tests.flavours import Flavour, Transport, client_for, make_transport
from tests.servers import HypercornServer, TestApp, default_server_tls

pytestmark = pytest.mark.anyio


def h2c_transport(**policy: object) -> BulkheadTransport:
    """HTTP/2 with prior knowledge on http:// (as httpx's ``http1=False, http2=True``)."""
    return BulkheadTransport(default=Policy(**policy), http1=False, http2=True)  # type: ignore[arg-type]


def h2c_transport_in(flavour: Flavour, **policy: object) -> Transport:
    """``h2c_transport``, of either flavour (``tests/flavours.py``)."""
    policy_ = Policy(**policy)  # type: ignore[arg-type]
    return make_transport(flavour, default=policy_, http1=False, http2=True)


@pytest.mark.parametrize(("connections", "expected"), [(1, 1), (4, 4)])
async def test_stream_cap_is_respected_and_scales_out(
    app: TestApp,
    unique: Callable[[str], str],
    connections: int,
    expected: int,
    flavour: Flavour,
) -> None:
    gate = app.gate(unique("cap"))
    with HypercornServer(app, h2_max_concurrent_streams=3) as srv:
        bucket = f"127.0.0.1:{srv.port}"
        transport = h2c_transport_in(flavour, max_concurrency=30, max_connections=connections)
        statuses: list[str] = []
        async with client_for(transport, timeout=10) as client:

            async def call() -> None:
                response = await client.get(f"{srv.url}/gate/{gate.name}")
                statuses.append(response.http_version)

            async with anyio.create_task_group() as tg:
                for _ in range(30):
                    tg.start_soon(call)
                await gate.until_entered(3 * expected)
                # (threads start in their own time: wait until all 30 hold their slots)
                await until(lambda: transport.statistics()[srv.url].running == 30)
                stats = transport.statistics()[srv.url]
                assert stats.open_streams == 3 * expected
                assert stats.stream_caps == (3,) * expected
                assert stats.running == 30
                assert app.current(bucket) == 3 * expected
                gate.open()
        assert statuses == ["HTTP/2"] * 30
        assert app.max_concurrent(bucket) <= 3 * expected
        stats = transport.statistics()[srv.url]
        # (seen in two full local runs under trio, once each: a connection more than
        # expected on the server's side; the transport's view says which side made it)
        assert len(app.connections(bucket)) == expected, stats
        assert stats.connections_created == expected and stats.scale_outs == expected - 1
        assert (stats.running, stats.open_streams, stats.completed) == (0, 0, 30)


async def test_a_burst_coalesces_onto_one_connection(app: TestApp) -> None:
    tls = default_server_tls()
    with HypercornServer(app, tls=tls) as srv:
        transport = BulkheadTransport(
            default=Policy(max_concurrency=50, max_connections=10),
            http2=True,
            verify=tls.client_ssl_context(),
        )
        async with httpx.AsyncClient(transport=transport, timeout=10) as client:
            async with anyio.create_task_group() as tg:
                for _ in range(40):
                    tg.start_soon(client.get, f"{srv.url}/")
            stats = transport.statistics()[srv.url]
            assert stats.connections_created == 1 and stats.completed == 40
            assert stats.stream_caps == (100,)  # min(hypercorn's 100, ours 100)


@pytest.mark.parametrize(
    ("alpn", "version"), [(("h2", "http/1.1"), "HTTP/2"), (("http/1.1",), "HTTP/1.1")]
)
async def test_alpn_negotiates_h2_when_offered(
    app: TestApp, alpn: tuple[str, ...], version: str
) -> None:
    tls = default_server_tls()
    with HypercornServer(app, tls=tls, alpn=alpn) as srv:
        transport = BulkheadTransport(http2=True, verify=tls.client_ssl_context())
        async with httpx.AsyncClient(transport=transport) as client:
            first = await client.get(f"{srv.url}/")
            second = await client.get(f"{srv.url}/")
        assert (first.http_version, second.http_version) == (version, version)
        assert first.headers["x-http-version"] == version.removeprefix("HTTP/").replace(".0", "")
        assert second.extensions["bulkhead"].reused


async def test_cancelled_stream_is_reset_and_the_connection_stays_usable(
    server: HypercornServer, app: TestApp, unique: Callable[[str], str]
) -> None:
    gate = app.gate(unique("h2cancel"))
    transport = h2c_transport(max_concurrency=4)
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:
        scope = anyio.CancelScope()

        async def cancelled() -> None:
            with scope:
                await client.get(f"{server.url}/gate/{gate.name}")

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancelled)
            await gate.until_entered(1)
            scope.cancel()
        stats = transport.statistics()[server.url]
        assert (stats.streams_reset, stats.cancelled, stats.running) == (1, 1, 0)
        assert stats.connections == 1 and stats.unknown_state == 0
        for _ in range(3):
            response = await client.get(f"{server.url}/")
            assert response.text == "hello" and response.extensions["bulkhead"].reused
        gate.open()
    assert transport.statistics()[server.url].connections_created == 1


async def test_one_stream_timing_out_does_not_fail_the_others(
    server: HypercornServer,
    app: TestApp,
    unique: Callable[[str], str],
    flavour: Flavour,
) -> None:
    slow, fast = app.gate(unique("slow")), app.gate(unique("fast"))
    transport = h2c_transport_in(flavour, max_concurrency=4)
    async with client_for(transport, timeout=10) as client:
        await client.get(f"{server.url}/")  # one connection, known to be HTTP/2
        results: dict[str, object] = {}

        async def timed_out() -> None:
            try:
                await client.get(
                    f"{server.url}/gate/{slow.name}", timeout=httpx.Timeout(10, read=0.2)
                )
            except httpx.ReadTimeout as exc:
                results["slow"] = exc

        async def patient() -> None:
            results["fast"] = (await client.get(f"{server.url}/gate/{fast.name}")).status_code

        async with anyio.create_task_group() as tg:
            tg.start_soon(timed_out)
            tg.start_soon(patient)
            await fast.until_entered(1)
            await until(lambda: "slow" in results)
            fast.open()
        assert isinstance(results["slow"], httpx.ReadTimeout) and results["fast"] == 200
        stats = transport.statistics()[server.url]
        assert stats.connections_created == 1 and stats.streams_reset == 1
        slow.open()


async def test_large_bodies_in_both_directions(server: HypercornServer, flavour: Flavour) -> None:
    payload = bytes(range(256)) * 12_000  # ~3 MB: many windows' worth
    transport = h2c_transport_in(flavour, max_concurrency=4)
    async with client_for(transport, timeout=30) as client:

        async def chunks() -> AsyncIterator[bytes]:
            for start in range(0, len(payload), 100_000):
                yield payload[start : start + 100_000]

        def sync_chunks() -> Iterator[bytes]:  # a sync client's streamed body
            for start in range(0, len(payload), 100_000):
                yield payload[start : start + 100_000]

        echoed = await client.post(f"{server.url}/echo", content=payload)
        assert echoed.content == payload
        body = chunks() if flavour == "async" else sync_chunks()
        streamed = await client.post(f"{server.url}/echo", content=body)
        assert streamed.content == payload
        big = await client.get(f"{server.url}/bytes/5000000")
        assert len(big.content) == 5_000_000
        async with anyio.create_task_group() as tg:  # concurrent streams sharing the window
            for _ in range(4):
                tg.start_soon(client.get, f"{server.url}/bytes/2000000")
    stats = transport.statistics()[server.url]
    assert stats.connections_created == 1 and stats.failed == 0


async def test_lifetime_drains_a_busy_connection_and_closes_it_when_idle(
    server: HypercornServer, app: TestApp, unique: Callable[[str], str]
) -> None:
    from tests.integration.test_connections import FakeClock

    clock = FakeClock()
    gate = app.gate(unique("drain"))
    transport = BulkheadTransport(
        default=Policy(max_lifetime=10.0, lifetime_jitter=0.0),
        http1=False,
        http2=True,
        _clock=clock,
    )
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.get, f"{server.url}/gate/{gate.name}")
            await gate.until_entered(1)
            clock.now += 20.0  # the connection is past its lifetime, with a stream open
            fresh = await client.get(f"{server.url}/")
            assert not fresh.extensions["bulkhead"].reused  # no new stream on the old one
            stats = transport.statistics()[server.url]
            assert stats.connections_created == 2 and stats.lifetime_expired == 0
            gate.open()
        stats = transport.statistics()[server.url]
        assert stats.lifetime_expired == 1 and stats.connections == 1


async def test_connection_specific_headers_stay_off_http2(server: HypercornServer) -> None:
    """RFC 9113 §8.2.2: Connection, Keep-Alive, Proxy-Connection, Transfer-Encoding and
    Upgrade are not sent over HTTP/2, and TE only as ``trailers`` (a server must treat
    anything else as malformed); the rest goes through."""
    transport = h2c_transport()
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:
        dropped = await client.get(
            f"{server.url}/headers",
            headers={"TE": "gzip", "Connection": "keep-alive", "Keep-Alive": "5", "X-Kept": "1"},
        )
        kept = await client.get(f"{server.url}/headers", headers={"TE": "trailers"})
    assert dropped.http_version == kept.http_version == "HTTP/2"
    seen = dropped.json()
    assert seen["x-kept"] == "1"
    assert not {"te", "connection", "keep-alive"} & set(seen)
    assert kept.json()["te"] == "trailers"
    stats = transport.statistics()[server.url]
    assert (stats.completed, stats.failed, stats.connections_created) == (2, 0, 1)


@pytest.mark.parametrize("http2", [False, True], ids=["http1", "http2"])
async def test_a_sync_request_body_is_refused_and_the_slot_returned(
    server: HypercornServer, http2: bool
) -> None:
    """An ``httpx.Request`` built with a sync iterator cannot be sent by an async transport:
    a clear RuntimeError, the slot back, and the next request goes through."""
    transport = BulkheadTransport(http1=not http2, http2=http2)
    request = httpx.Request("POST", f"{server.url}/echo", content=iter([b"sync", b"body"]))
    with pytest.raises(RuntimeError, match="needs an async request stream"):
        await transport.handle_async_request(request)
    assert transport.statistics()[server.url].running == 0
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:
        response = await client.post(f"{server.url}/echo", content=b"async body")
    assert response.content == b"async body"
    assert response.http_version == ("HTTP/2" if http2 else "HTTP/1.1")
    stats = transport.statistics()[server.url]
    assert (stats.running, stats.completed) == (0, 1)


async def test_data_arriving_after_a_stream_was_reset_is_dropped(
    server: HypercornServer,
) -> None:
    """A response closed after its first chunk resets its stream; the DATA already on its
    way (waiting unread in the socket when the stream is closed) is read by the next
    request and dropped, its flow-control credit returned, and the connection goes on:
    5 x 4 MB abandoned, each followed by 4 MB read in full on the same connection.  (The
    credit itself is not observable here: 5 x 64 KB is far below the connection window.)
    A closed body cannot be iterated again."""
    transport = h2c_transport()
    size = 4_000_000
    url = f"{server.url}/bytes/{size}"
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:
        for _ in range(5):
            response = await transport.handle_async_request(httpx.Request("GET", url))
            body = response.stream
            assert isinstance(body, httpx.AsyncByteStream)
            chunks = body.__aiter__()
            assert await chunks.__anext__()
            # more of its DATA is in the socket, unread: it will arrive after the reset
            await until(functools.partial(readable, response.extensions["network_stream"]))
            await response.aclose()
            with pytest.raises(httpx.StreamClosed):  # never a clean end of a cut body
                await chunks.__anext__()
            with pytest.raises(httpx.StreamClosed):
                body.__aiter__()
            whole = await client.get(url)
            assert len(whole.content) == size
    stats = transport.statistics()[server.url]
    assert stats.connections_created == 1 and stats.failed == 0
    assert stats.streams_reset == 5 and stats.completed == 5  # the abandoned: not completed


def readable(network_stream: Any) -> bool:
    return bool(network_stream.get_extra_info("is_readable"))
