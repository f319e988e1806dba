"""What must hold while no request comes: deadlines of held responses, idle expiry in every
compartment, leaked responses freed by a garbage collector in another thread, statistics
read from other threads, eviction of compartments at rest, and route keys that cannot be
bypassed by another spelling of the host."""

from __future__ import annotations

import gc
import socket
import threading
import time
import tracemalloc
from collections.abc import Callable

import anyio
import httpx
import pytest

from httpx_bulkhead import BulkheadTransport, CompartmentStats, Policy, RequestTimeout
from httpx_bulkhead.testing import MockNetwork
from tests.conftest import until
from tests.servers import HypercornServer, RawConn, RawServer, response_bytes

pytestmark = pytest.mark.anyio


def ok(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, text=request.url.host)


def counters_agree(stats: CompartmentStats) -> bool:
    """Every slot handed out is held, or was given back exactly once with an outcome."""
    ended = stats.completed + stats.failed + stats.cancelled
    return stats.acquired == stats.running + ended


# -- request_timeout whatever the caller does ---------------------------------------------
@pytest.mark.parametrize("http2", [False, True], ids=["http1", "h2c"])
async def test_a_response_held_unread_gives_its_slot_back_at_the_deadline(
    server: HypercornServer, http2: bool
) -> None:
    """Before: the held response kept its slot for ever and the second request waited."""
    transport = BulkheadTransport(
        default=Policy(max_concurrency=1, request_timeout=0.3), http1=not http2, http2=http2
    )
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:
        held = await client.send(
            client.build_request("GET", f"{server.url}/bytes/1000000"), stream=True
        )
        with anyio.fail_after(5):  # the only slot is held: this waits for the deadline timer
            second = await client.get(f"{server.url}/")
        assert second.text == "hello"
        with pytest.raises(RequestTimeout, match="held unread"):
            await held.aread()
        await held.aclose()
        stats = transport.statistics()[server.url]
        assert (stats.running, stats.completed, stats.failed) == (0, 1, 1)
        if http2:  # the stream was reset; the connection serves on
            assert (stats.streams_reset, stats.connections_created, stats.error) == (1, 1, 0)
            assert (await client.get(f"{server.url}/")).text == "hello"
        else:  # HTTP/1.1 cannot cancel one exchange: the connection went
            assert stats.unknown_state == 1
        assert counters_agree(transport.statistics()[server.url])


@pytest.mark.usefixtures("http1_parser")
async def test_buffered_body_is_not_handed_out_after_the_deadline() -> None:
    """The head and the whole body arrive in one segment, so the body is already buffered
    when the deadline passes.  Before: it was returned anyway (on both backends)."""
    body = b"x" * 32_000

    def handler(conn: RawConn) -> None:
        while conn.read_request() is not None:
            conn.send(response_bytes(200, body, []))

    with RawServer(handler) as srv:
        transport = BulkheadTransport(default=Policy(request_timeout=0.2))
        async with httpx.AsyncClient(transport=transport, timeout=10) as client:
            async with client.stream("GET", f"{srv.url}/") as response:
                deadline = time.monotonic() + 0.25
                while time.monotonic() < deadline:  # a slow consumer: no checkpoint at all
                    pass
                with pytest.raises(RequestTimeout):
                    await response.aread()
            stats = transport.statistics()[srv.url]
            assert (stats.running, stats.failed, stats.unknown_state) == (0, 1, 1)
            assert (await client.get(f"{srv.url}/")).content == body  # the next one is fine


# -- leaked responses freed by the garbage collector of another thread --------------------
async def test_leaked_response_collected_in_another_thread_wakes_the_waiter(
    server: HypercornServer,
) -> None:
    """Before: the slot was handed to the waiter from the collector's thread: under asyncio
    the loop slept on until something else woke it; under trio the waiter never woke."""
    transport = BulkheadTransport(default=Policy(max_concurrency=1))
    name = server.url
    done = anyio.Event()
    gc.disable()  # the response must be freed by the collector in *our* thread, below
    try:
        async with httpx.AsyncClient(transport=transport, timeout=10) as client:
            response = await client.send(client.build_request("GET", f"{server.url}/"), stream=True)

            async def waiter() -> None:
                assert (await client.get(f"{server.url}/")).text == "hello"
                done.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter)
                await until(lambda: transport.statistics()[name].waiting == 1)
                del response  # now only a reference cycle keeps it
                collector = threading.Thread(target=gc.collect)
                with pytest.warns(ResourceWarning, match="never closed"):
                    collector.start()
                    # The loop is idle in its selector until something wakes it.
                    with anyio.fail_after(3):
                        await done.wait()
                collector.join()
    finally:
        gc.enable()
    stats = transport.statistics()[name]
    assert (stats.running, stats.leaked_responses, stats.completed) == (0, 1, 1)
    assert counters_agree(stats)


# -- statistics from other threads ---------------------------------------------------------
async def test_statistics_from_another_thread_are_consistent_snapshots() -> None:
    """A metrics thread reads while the loop makes requests to new origins.  Before: the
    reader crashed ('dictionary changed size during iteration') and saw counters that did
    not add up."""
    transport = BulkheadTransport(default=Policy(max_concurrency=2), network=MockNetwork(ok))
    stop = threading.Event()
    problems: list[str] = []
    reads = 0

    def reader() -> None:
        nonlocal reads
        while not stop.is_set():
            try:
                snapshot = transport.statistics()
            except Exception as exc:
                problems.append(repr(exc))
                return
            reads += 1
            problems.extend(name for name, s in snapshot.items() if not counters_agree(s))

    async with httpx.AsyncClient(transport=transport) as client:
        thread = threading.Thread(target=reader)
        thread.start()
        try:
            async with anyio.create_task_group() as tg:
                for i in range(600):
                    tg.start_soon(client.get, f"http://h{i % 300}.example/")
                    if i % 50 == 0:
                        await anyio.sleep(0)
        finally:
            stop.set()
            await anyio.to_thread.run_sync(thread.join)
    assert reads > 0
    assert problems == []
    assert sum(s.completed for s in transport.statistics().values()) == 600


async def test_statistics_from_a_worker_thread_of_the_loop() -> None:
    transport = BulkheadTransport(network=MockNetwork(ok))
    async with httpx.AsyncClient(transport=transport) as client:
        await client.get("http://a.example/")
    result: list[dict[str, CompartmentStats]] = []
    # The loop that served the requests is still running but idle here; the read from the
    # worker thread is answered by it.
    await anyio.to_thread.run_sync(lambda: result.append(transport.statistics()))
    assert result[0]["http://a.example:80"].completed == 1


# -- idle expiry in every compartment, whatever the traffic --------------------------------
def counting_closes(closed: list[int]) -> Callable[[RawConn], None]:
    def handler(conn: RawConn) -> None:
        while conn.read_request() is not None:
            conn.send_response(200, b"ok")
        closed.append(conn.index)  # the client closed it

    return handler


async def test_idle_connections_close_in_every_compartment_without_traffic() -> None:
    """Twenty compartments each make one request, then nothing happens.  Before: their
    connections stayed open until each compartment was used again (never)."""
    closed: list[int] = []
    with RawServer(counting_closes(closed)) as srv:
        keys = [f"127.0.0.1:{srv.port}/c{i}" for i in range(20)]
        transport = BulkheadTransport(hosts={k: Policy(idle_timeout=0.3) for k in keys})
        async with httpx.AsyncClient(transport=transport, timeout=10) as client:
            for i in range(20):
                assert (await client.get(f"{srv.url}/c{i}")).text == "ok"
            assert sum(s.idle_connections for s in transport.statistics().values()) == 20
            await until(lambda: len(closed) == 20, timeout=5)  # the server saw every close
            stats = transport.statistics()
            assert sum(s.connections for s in stats.values()) == 0
            assert sum(s.idle_expired for s in stats.values()) == 20
            # Expiry freed nothing that matters: the next request dials again.
            assert (await client.get(f"{srv.url}/c0")).text == "ok"


async def test_lifetime_closes_idle_connections_without_traffic() -> None:
    closed: list[int] = []
    with RawServer(counting_closes(closed)) as srv:
        policy = Policy(idle_timeout=None, max_lifetime=0.3, lifetime_jitter=0)
        transport = BulkheadTransport(default=policy)
        async with httpx.AsyncClient(transport=transport, timeout=10) as client:
            assert (await client.get(f"{srv.url}/")).text == "ok"
            await until(lambda: len(closed) == 1, timeout=5)
            assert transport.statistics()[srv.url].lifetime_expired == 1


async def test_nothing_of_the_transport_runs_after_aclose(anyio_backend: str) -> None:
    network = MockNetwork(ok)
    before = _live_tasks(anyio_backend)
    transport = BulkheadTransport(
        default=Policy(idle_timeout=30, request_timeout=30), network=network
    )
    async with httpx.AsyncClient(transport=transport) as client:
        for i in range(5):
            await client.get(f"http://h{i}.example/")  # five idle sweeps armed
        held = await client.send(client.build_request("GET", "http://h0.example/"), stream=True)
        # asyncio timers are loop callbacks; trio's are served by one system task.
        assert _live_tasks(anyio_backend) == before + (anyio_backend == "trio")
    await held.aclose()
    assert _live_tasks(anyio_backend) == before
    assert network.open_connections == 0


def _live_tasks(backend: str) -> int:
    if backend == "trio":
        import trio

        return trio.lowlevel.current_statistics().tasks_living
    import asyncio

    return len(asyncio.all_tasks())


# -- compartments of unlisted origins are bounded ------------------------------------------
async def test_compartments_at_rest_are_evicted_beyond_the_bound() -> None:
    """Before: one compartment per origin for ever (20,000 origins: 260 MB)."""
    network = MockNetwork(ok)
    transport = BulkheadTransport(network=network, max_default_compartments=20)
    async with httpx.AsyncClient(transport=transport) as client:
        held = await client.send(
            client.build_request("GET", "http://busy.example/"), stream=True
        )  # a busy compartment is never evicted
        for i in range(500):
            assert (await client.get(f"http://h{i}.example/")).text == f"h{i}.example"
        stats = transport.statistics()
        assert len(stats) <= 20 + 4 + 1  # bound, probes of slack, the "(evicted)" entry
        assert stats["http://busy.example:80"].running == 1
        # Nothing is lost from the totals: evicted counters live on in "(evicted)".
        assert sum(s.acquired for s in stats.values()) == 501
        assert sum(s.completed for s in stats.values()) == 500
        assert stats["(evicted)"].connections == 0 and stats["(evicted)"].acquired > 450
        # Evicted compartments closed their idle connections.
        live = sum(s.connections for s in stats.values())
        assert network.open_connections == live
        await held.aclose()
        # An evicted origin comes back with a fresh compartment.
        assert (await client.get("http://h0.example/")).text == "h0.example"
        assert transport.statistics()["http://h0.example:80"].acquired == 1


async def test_memory_stays_bounded_with_many_origins(monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx_bulkhead._routing as routing

    monkeypatch.setattr(routing, "MAX_CACHED_ORIGINS", 100)  # reached within the test
    network = MockNetwork(ok)
    transport = BulkheadTransport(network=network, max_default_compartments=50)
    async with httpx.AsyncClient(transport=transport) as client:

        async def calls(first: int, n: int) -> int:
            for i in range(first, first + n):
                await client.get(f"http://o{i}.example/")
                # MockNetwork never suspends: let the loop turn (and drop cancelled timer
                # handles) as it would between real network reads.
                await anyio.sleep(0)
            network.requests.clear()  # the mock's own record of every request
            gc.collect()
            return tracemalloc.get_traced_memory()[0]

        tracemalloc.start()
        try:
            warm = await calls(0, 200)  # the bound and the cache are full from here on
            grown = await calls(200, 400) - warm
        finally:
            tracemalloc.stop()
        # 400 more origins: no growth with their number (before: ~13 KB each, 5 MB; now
        # within +-200 KB of noise from objects the collector frees late).
        assert grown < 1_000_000, grown
        assert len(transport.statistics()) <= 50 + 4 + 1


# -- route keys: one spelling of a host -----------------------------------------------------
@pytest.mark.parametrize(
    ("key", "url"),
    [
        ("api.example.com", "https://api.example.com./v1"),
        ("api.example.com", "https://API.Example.COM/v1"),
        ("api.example.com.", "https://api.example.com/v1"),
        ("bücher.example", "https://xn--bcher-kva.example/"),
        ("xn--bcher-kva.example", "https://bücher.example/"),
        ("[::1]:8080", "http://[0:0::1]:8080/"),
        ("[0:0::1]:8080", "http://[::1]:8080/"),
        ("https://api.example.com/v1", "https://api.example.com.:443/v1/x"),
    ],
)
async def test_equivalent_spellings_of_a_host_share_its_bulkhead(key: str, url: str) -> None:
    """Before: a trailing dot, punycode or another IPv6 spelling routed around the key."""
    transport = BulkheadTransport(hosts={key: Policy(max_concurrency=1)}, network=MockNetwork(ok))
    async with httpx.AsyncClient(transport=transport) as client:
        assert (await client.get(url)).status_code == 200
    stats = transport.statistics()
    assert stats[key].completed == 1
    assert sum(s.completed for s in stats.values()) == 1


async def test_compartments_that_never_connected_are_evicted_cleanly(
    server: HypercornServer,
) -> None:
    """Compartments whose only request was refused hold no connection and no expiry
    timer: beyond the bound they are evicted like any other, their counters kept, and the
    transport goes on serving."""
    holders = []
    for _ in range(8):  # bound, never listening: a connection is refused, deterministically
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        holders.append(sock)
    transport = BulkheadTransport(max_default_compartments=2)
    try:
        async with httpx.AsyncClient(transport=transport, timeout=5) as client:
            for sock in holders:
                port = sock.getsockname()[1]
                with pytest.raises(httpx.ConnectError):
                    await client.get(f"http://127.0.0.1:{port}/")
            assert (await client.get(f"{server.url}/")).text == "hello"
            stats = transport.statistics()
            assert stats["(evicted)"].failed >= 8 - 2 - 4  # the bound and its slack
            assert sum(s.failed for s in stats.values()) == 8  # nothing lost
            assert sum(s.connections for s in stats.values()) == 1
    finally:
        for sock in holders:
            sock.close()
    assert transport.statistics()[server.url].completed == 1
