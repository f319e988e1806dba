"""What only threads can do to ``BulkheadHTTPTransport``: FIFO service of 64 waiting
threads, a waiter interrupted by ``KeyboardInterrupt``, idle expiry and response deadlines
with no traffic (the timer thread, gone after ``close()``), a response dropped unclosed,
``close()`` with threads waiting and in flight, and the settings a thread cannot have."""

from __future__ import annotations

import contextlib
import gc
import signal
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from httpx_bulkhead import (
    BulkheadHTTPTransport,
    CompartmentStats,
    Policy,
    RequestTimeout,
    TransportClosed,
)
from httpx_bulkhead import _sync_transport as sync_transport
from httpx_bulkhead.testing import MockNetwork
from tests.resources import FdSnapshot, assert_no_fd_growth
from tests.servers import HypercornServer, RawServer
from tests.servers.raw import hold_on_request, keepalive_ok, request_path

THREADS = 64
WAIT = 10.0


def wait_for(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    """Poll ``predicate`` (a snapshot) until it holds; the timeout turns a hang into a
    failure."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.001)


def timer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "httpx_bulkhead timers"]


@pytest.fixture
def stats_of() -> Iterator[Callable[[BulkheadHTTPTransport], CompartmentStats]]:
    def one(transport: BulkheadHTTPTransport) -> CompartmentStats:
        [stats] = transport.statistics().values()
        return stats

    yield one


def test_sixty_four_waiting_threads_are_served_in_arrival_order(
    stats_of: Callable[[BulkheadHTTPTransport], CompartmentStats],
) -> None:
    """One slot, held; 64 threads queue one after another; once it is released the server
    sees them in exactly that order (no barging, no reordering by the OS scheduler)."""
    with RawServer(hold_on_request) as srv:
        transport = BulkheadHTTPTransport(default=Policy(max_concurrency=1))
        with httpx.Client(transport=transport, timeout=httpx.Timeout(30, pool=None)) as client:
            threads = [threading.Thread(target=client.get, args=(f"{srv.url}/hold",))]
            threads[0].start()
            srv.wait_event_sync("held")
            for i in range(THREADS):
                thread = threading.Thread(target=client.get, args=(f"{srv.url}/{i}",))
                thread.start()
                threads.append(thread)
                wait_for(lambda i=i: stats_of(transport).waiting == i + 1)  # type: ignore[misc]
            srv.event("release").set()
            for thread in threads:
                thread.join(WAIT)
        served = [request_path(r) for r in srv.requests]
        assert served == [b"/hold"] + [f"/{i}".encode() for i in range(THREADS)]
        stats = stats_of(transport)
        assert (stats.completed, stats.running, stats.waiting) == (THREADS + 1, 0, 0)


@contextlib.contextmanager
def ctrl_c_when(ready: Callable[[], bool]) -> Iterator[None]:
    """Ctrl-C for the main thread once ``ready()`` holds: SIGINT, sent again every 50 ms
    until one raises ``KeyboardInterrupt`` (once: later ones are ignored).  A SIGINT that
    lands just before the main thread blocks on a lock is seen by CPython only when the
    lock is acquired (its wake-up is lost), so one signal cannot be relied on to
    interrupt the wait; a second Ctrl-C, as a user would press, does."""
    main = threading.main_thread().ident
    assert main is not None and threading.get_ident() == main
    raised = threading.Event()
    done = threading.Event()

    def once(signum: int, frame: object) -> None:
        if not raised.is_set():
            raised.set()
            raise KeyboardInterrupt

    def interrupt() -> None:
        wait_for(ready)
        while not (raised.is_set() or done.is_set()):
            signal.pthread_kill(main, signal.SIGINT)
            raised.wait(0.05)

    previous = signal.signal(signal.SIGINT, once)
    thread = threading.Thread(target=interrupt)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(WAIT)
        signal.signal(signal.SIGINT, previous)


def test_keyboard_interrupt_while_waiting_leaves_the_queue_and_keeps_no_slot(
    stats_of: Callable[[BulkheadHTTPTransport], CompartmentStats],
) -> None:
    """Ctrl-C (SIGINT to the main thread) while it waits for a slot: KeyboardInterrupt is
    raised, the waiter has left the queue, and the slot goes to the next request."""
    assert threading.current_thread() is threading.main_thread()
    with RawServer(hold_on_request) as srv:
        transport = BulkheadHTTPTransport(default=Policy(max_concurrency=1))
        with httpx.Client(transport=transport, timeout=httpx.Timeout(30, pool=None)) as client:
            holder = threading.Thread(target=client.get, args=(f"{srv.url}/hold",))
            holder.start()
            srv.wait_event_sync("held")
            with ctrl_c_when(lambda: stats_of(transport).waiting == 1):
                with pytest.raises(KeyboardInterrupt):
                    client.get(f"{srv.url}/waiting")
            stats = stats_of(transport)
            assert (stats.waiting, stats.cancelled_waiting, stats.running) == (0, 1, 1)
            srv.event("release").set()
            holder.join(WAIT)
            assert client.get(f"{srv.url}/next").status_code == 200
        stats = stats_of(transport)
        assert (stats.acquired, stats.completed, stats.running) == (2, 2, 0)
        assert [request_path(r) for r in srv.requests] == [b"/hold", b"/next"]


def test_keyboard_interrupt_while_waiting_for_a_connection_returns_slot_and_place(
    stats_of: Callable[[BulkheadHTTPTransport], CompartmentStats],
) -> None:
    """The same while the main thread holds a slot and waits for the only connection: it
    leaves the connection queue and gives its slot back (counted cancelled)."""
    assert threading.current_thread() is threading.main_thread()
    with RawServer(hold_on_request) as srv:
        transport = BulkheadHTTPTransport(default=Policy(max_concurrency=2, max_connections=1))
        with httpx.Client(transport=transport, timeout=httpx.Timeout(30, pool=None)) as client:
            holder = threading.Thread(target=client.get, args=(f"{srv.url}/hold",))
            holder.start()
            srv.wait_event_sync("held")
            with ctrl_c_when(lambda: stats_of(transport).waiting_for_connection == 1):
                with pytest.raises(KeyboardInterrupt):
                    client.get(f"{srv.url}/waiting")
            stats = stats_of(transport)
            assert (stats.waiting_for_connection, stats.running, stats.cancelled) == (0, 1, 1)
            srv.event("release").set()
            holder.join(WAIT)
            assert client.get(f"{srv.url}/next").extensions["bulkhead"].reused
        stats = stats_of(transport)
        assert (stats.completed, stats.running, stats.connections_created) == (2, 0, 1)
        assert [request_path(r) for r in srv.requests] == [b"/hold", b"/next"]


def test_idle_connections_expire_without_traffic_and_close_stops_the_timer_thread(
    server: HypercornServer,
    stats_of: Callable[[BulkheadHTTPTransport], CompartmentStats],
) -> None:
    before = len(timer_threads())
    transport = BulkheadHTTPTransport(default=Policy(idle_timeout=0.1))
    client = httpx.Client(transport=transport)
    assert client.get(f"{server.url}/").status_code == 200
    assert len(timer_threads()) == before + 1  # the sweep is armed
    wait_for(lambda: stats_of(transport).idle_expired == 1)  # no request made meanwhile
    assert stats_of(transport).connections == 0
    wait_for(lambda: len(timer_threads()) == before)  # nothing scheduled: the thread ends
    assert client.get(f"{server.url}/").status_code == 200
    assert len(timer_threads()) == before + 1
    client.close()
    assert len(timer_threads()) == before  # joined by close()


def test_a_response_held_unread_gives_its_slot_back_at_the_deadline(
    server: HypercornServer,
    stats_of: Callable[[BulkheadHTTPTransport], CompartmentStats],
) -> None:
    transport = BulkheadHTTPTransport(default=Policy(max_concurrency=1, request_timeout=0.2))
    with httpx.Client(transport=transport) as client:
        with client.stream("GET", f"{server.url}/stream/4") as response:
            assert response.status_code == 200
            wait_for(lambda: stats_of(transport).running == 0)  # the timer ended it
            with pytest.raises(RequestTimeout, match="held unread"):
                response.read()
        assert client.get(f"{server.url}/").status_code == 200
    stats = stats_of(transport)
    assert (stats.failed, stats.completed, stats.unknown_state) == (1, 1, 1)


def test_a_response_dropped_unclosed_is_reported_and_its_slot_returned(
    server: HypercornServer,
    stats_of: Callable[[BulkheadHTTPTransport], CompartmentStats],
) -> None:
    transport = BulkheadHTTPTransport(default=Policy(max_concurrency=1))
    with httpx.Client(transport=transport) as client:
        request = client.build_request("GET", f"{server.url}/stream/4")
        with pytest.warns(ResourceWarning, match="never closed"):
            response = client.send(request, stream=True)
            del response
            gc.collect()
        wait_for(lambda: stats_of(transport).running == 0)  # handed to the timer thread
        assert client.get(f"{server.url}/").status_code == 200
    stats = stats_of(transport)
    assert (stats.leaked_responses, stats.cancelled, stats.completed) == (1, 1, 1)


def test_close_wakes_waiting_threads_and_fails_those_in_flight(
    stats_of: Callable[[BulkheadHTTPTransport], CompartmentStats],
) -> None:
    before = FdSnapshot.take()
    with RawServer(hold_on_request) as srv:
        transport = BulkheadHTTPTransport(default=Policy(max_concurrency=4))
        client = httpx.Client(transport=transport, timeout=httpx.Timeout(30, pool=None))
        outcomes: list[type[BaseException] | None] = []

        def call() -> None:
            try:
                client.get(f"{srv.url}/hold")
                outcomes.append(None)
            except httpx.TransportError as exc:
                outcomes.append(type(exc))

        threads = [threading.Thread(target=call) for _ in range(THREADS)]
        for thread in threads:
            thread.start()
        wait_for(lambda: stats_of(transport).waiting == THREADS - 4)
        srv.wait_requests(4)
        client.close()
        for thread in threads:
            thread.join(WAIT)
        assert not any(t.is_alive() for t in threads)
        assert outcomes.count(TransportClosed) == THREADS - 4
        assert len(outcomes) == THREADS and None not in outcomes
        with pytest.raises(TransportClosed):  # (the client refuses before the transport)
            transport.handle_request(httpx.Request("GET", f"{srv.url}/"))
        stats = stats_of(transport)
        assert (stats.running, stats.waiting, stats.connections) == (0, 0, 0)
        srv.event("release").set()
    assert_no_fd_growth(before, "close with threads waiting")


def test_settings_a_thread_cannot_have_are_refused_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(TypeError, match=r"network= is an async network"):
        BulkheadHTTPTransport(
            hosts={"a.example": Policy()},
            network=MockNetwork(lambda request: httpx.Response(200)),  # type: ignore[arg-type]
        )
    # A Policy field only the async transport supports (the fleet limit) names itself.
    monkeypatch.setitem(sync_transport.ASYNC_ONLY_FIELDS, "max_lifetime", "asyncio only")
    with pytest.raises(TypeError, match=r"Policy\.max_lifetime \(compartment 'a\.example'\)"):
        BulkheadHTTPTransport(hosts={"a.example": Policy(max_lifetime=5)})
    BulkheadHTTPTransport(hosts={"a.example": Policy(max_lifetime=None)})  # unset: fine


def test_keep_alive_is_shared_by_threads_one_exchange_at_a_time(
    stats_of: Callable[[BulkheadHTTPTransport], CompartmentStats],
) -> None:
    """64 threads, 8 connections: every request is answered with its own response (a
    connection is never read by two threads), and no more than 8 connections open."""
    before = FdSnapshot.take()
    with RawServer(keepalive_ok()) as srv:
        transport = BulkheadHTTPTransport(default=Policy(max_concurrency=8))
        with httpx.Client(transport=transport, timeout=30) as client:
            errors: list[BaseException] = []

            def call(i: int) -> None:
                try:
                    for j in range(10):
                        response = client.post(f"{srv.url}/{i}/{j}", content=b"x" * (i * j))
                        assert response.status_code == 200, response
                except BaseException as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=call, args=(i,)) for i in range(THREADS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(WAIT * 3)
            assert errors == []
        stats = stats_of(transport)
        assert stats.completed == THREADS * 10 and stats.connections_created <= 8
        assert srv.connections <= 8
    assert_no_fd_growth(before, "64 threads on keep-alive")
