"""Regression tests for ``test_sync_interrupts.py``'s rare failures: an exception raised in a
thread from outside (``KeyboardInterrupt``) landing at one chosen step of a request's
release, where the random attack lands about once in a thousand runs.

CPython delivers such an exception where a Python function starts or a C call returns
(or at a loop's back edge), so each window below is the start of one function, or the
return of one C call, met while the request gives its slot or its connection back (or
takes them over).  A profile function (``sys.setprofile``) sees exactly those points: it
raises ``Interrupt`` at the chosen one, once, as the interrupt would (CPython then unsets
it).  Whatever the window, nothing may be left running or in use afterwards, the counters
must agree and the next request must succeed.  Before the fix each of these kept a slot,
a connection or both for good (the sweep that found them: every such point of one request,
726 of them, interrupted in turn).
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

import httpx
import pytest

from httpx_bulkhead import BulkheadHTTPTransport, Policy
from tests.servers import RawServer, garbage_status_line, h2script, keepalive_ok

from .test_sync_interrupts import Interrupt


@dataclass(frozen=True)
class Window:
    """Where the interrupt lands: the start of a function named ``function`` (``|``
    between names the step has had; ``None``: any) or the return of the C call ``c_call``
    made by it, in a module whose file name ends with ``module``, while a frame of
    ``within`` is on the stack (``""``: anywhere)."""

    module: str
    function: str | None
    within: str
    c_call: str | None = None

    def matches(self, frame: FrameType, event: str, arg: Any) -> bool:
        code = frame.f_code
        if not code.co_filename.endswith(self.module):
            return False
        if self.function is not None and code.co_name not in self.function.split("|"):
            return False
        if self.c_call is None:
            if event != "call":
                return False
        elif event != "c_return" or getattr(arg, "__name__", None) != self.c_call:
            return False
        return not self.within or _on_stack(frame, self.within)


def _on_stack(frame: FrameType | None, name: str) -> bool:
    while frame is not None:
        if frame.f_code.co_name == name:
            return True
        frame = frame.f_back
    return False


class Landing:
    """A profile function that raises ``Interrupt`` at the first point matching
    ``window``, once."""

    def __init__(self, window: Window) -> None:
        self.window = window
        self.landed = threading.Event()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.landed.is_set() and self.window.matches(frame, event, arg):
            self.landed.set()
            raise Interrupt


def interrupted(window: Window, action: Callable[[], object], then: Window | None = None) -> bool:
    """Run ``action`` with an interrupt landing at ``window``; true if it landed (the
    action then raised ``Interrupt``, unless a cleanup step swallowed it).  ``then``: a
    second interrupt, landing there after the first; true if both landed.  (CPython unsets
    a hook that raises: the first then lands through the trace function, at a function's
    start, and the second through the profile function.)"""
    landing = Landing(window)
    second = None if then is None else Landing(then)
    if second is None:
        sys.setprofile(landing)
    else:
        assert window.c_call is None, "the trace function sees no C call"
        sys.setprofile(second)
        sys.settrace(landing)
    try:
        action()
    except Interrupt:
        assert landing.landed.is_set()
    finally:
        sys.settrace(None)
        sys.setprofile(None)
    return landing.landed.is_set() and (second is None or second.landed.is_set())


def drain_timers(transport: BulkheadHTTPTransport) -> None:
    """Wait for the timer thread to have run every callback handed to it so far (a
    response the collector freed is ended there): a marker queued behind them."""
    done = threading.Event()
    assert transport._timers.call_soon_threadsafe(done.set)
    assert done.wait(10), "the timer thread did not run"


@pytest.fixture
def served() -> Iterator[tuple[httpx.Client, BulkheadHTTPTransport, str]]:
    transport = BulkheadHTTPTransport(default=Policy(max_concurrency=2, max_connections=2))
    client = httpx.Client(transport=transport, timeout=5)
    with RawServer(keepalive_ok()) as srv:
        assert client.get(srv.url).status_code == 200  # pooled: the requests below reuse it
        yield client, transport, srv.url
        client.close()


def assert_at_rest(client: httpx.Client, transport: BulkheadHTTPTransport, url: str) -> None:
    [stats] = transport.statistics().values()
    assert (stats.running, stats.waiting, stats.in_use_connections) == (0, 0, 0), stats
    assert stats.acquired == stats.completed + stats.failed + stats.cancelled, stats
    assert client.get(url).status_code == 200


# Each window names the step of the fixed code and of the code before it where they differ.
WINDOWS = {
    # Compartment.handle: ``send`` returned, the response stream is being made.
    "the response stream's making": Window("_response.py", "__init__", "handle"),
    # Compartment.send: the checkout answered, the exchange has not started.
    "the exchange's start": Window("_http11.py", "start_exchange", "send"),
    # Connections.checkout: the pool granted an idle connection, not yet returned.
    "the checkout's answer": Window("_connections.py", "checkout", "", c_call="isinstance"),
    # ResponseStream._finish: the body was read; ending the exchange starts
    # (before: Compartment.end_exchange; now: Connections.end_exchange).
    "the exchange's end": Window("", "end_exchange", "_finish"),
    # Connections.end_exchange: the pool takes the connection back.
    "the pool's release": Window("_pool.py", "release", "end_exchange"),
    # ResponseStream._finish: the slot goes back to the limiter
    # (before: Limiter.release; now: Limiter.give_back).
    "the slot's release": Window("_limiter.py", None, "_finish"),
}


@pytest.mark.parametrize("window", WINDOWS.values(), ids=WINDOWS.keys())
def test_an_interrupt_in_a_release_step_keeps_neither_slot_nor_connection(
    window: Window, served: tuple[httpx.Client, BulkheadHTTPTransport, str]
) -> None:
    client, transport, url = served
    assert interrupted(window, lambda: client.get(url)), f"never reached {window}"
    assert_at_rest(client, transport, url)


@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_an_interrupt_in_the_hand_over_of_a_collected_response_keeps_nothing(
    served: tuple[httpx.Client, BulkheadHTTPTransport, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A response dropped unclosed is freed by the collector, in whatever thread it runs:
    ``ResponseStream.__del__`` hands its end to the timer thread.  An interrupt landing
    as it does (``Timers.call_soon_threadsafe`` starting) was swallowed with the hand-off
    (``contextlib.suppress``): slot and connection kept for good."""
    client, transport, url = served
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: None)
    response = client.send(client.build_request("GET", url), stream=True)
    window = Window("_threads.py", "call_soon_threadsafe", "__del__")

    def drop() -> None:
        nonlocal response
        del response
        gc.collect()

    assert interrupted(window, drop), "the collector did not free the response"
    drain_timers(transport)
    assert_at_rest(client, transport, url)


def test_an_interrupt_as_a_failed_requests_slot_goes_back_keeps_nothing() -> None:
    """A request that failed (a garbled status line: ``RemoteProtocolError``) gives its
    slot back in ``Compartment.handle``'s cleanup; an interrupt landing as it starts to
    (before: ``Slots.release``; now: ``Slots.give_back``, tried again) kept the slot."""
    transport = BulkheadHTTPTransport(default=Policy(max_concurrency=2, max_connections=2))
    client = httpx.Client(transport=transport, timeout=5)
    window = Window("_slots.py", "release|give_back", "handle")
    with RawServer(garbage_status_line()) as srv:
        assert interrupted(window, lambda: client.get(srv.url)), f"never reached {window}"
        [stats] = transport.statistics().values()
        assert (stats.running, stats.waiting, stats.in_use_connections) == (0, 0, 0), stats
        assert stats.acquired == stats.completed + stats.failed + stats.cancelled, stats
    client.close()


# -- HTTP/2: the stream cut is reset, its connection and the other streams on it stay -----
#
# ``Connections.reclaim`` ends a multiplexed exchange as ``end_abandoned`` does; the
# connection goes only when its state is unknown: a write of the reset (or of anything)
# cut part-way, which ``HTTP2Connection.flush`` knows and says by breaking it.

#: The reset's write: ``sock.send`` has returned, how much it took is not recorded yet.
RESET_WRITE = {
    "end_exchange": Window("_blocking.py", "_sendall", "end_exchange", c_call="send"),
    "reclaim": Window("_blocking.py", "_sendall", "reclaim", c_call="send"),
}


def h2_held_sibling(
    srv: h2script.H2ScriptServer,
) -> tuple[httpx.Client, BulkheadHTTPTransport, list[object], threading.Thread]:
    """One HTTP/2 connection carrying another thread's POST, held by the server on
    ``"b"``; its outcome (status or exception) goes to the list once released."""
    transport = BulkheadHTTPTransport(default=Policy(max_connections=1), http1=False, http2=True)
    client = httpx.Client(transport=transport, timeout=10)
    assert client.get(f"{srv.url}/").status_code == 200  # one connection
    outcome: list[object] = []

    def sibling() -> None:
        try:
            outcome.append(client.post(f"{srv.url}/hold/b", content=b"once").status_code)
        except httpx.HTTPError as exc:
            outcome.append(exc)

    other = threading.Thread(target=sibling)
    other.start()
    srv.wait_held("b")
    return client, transport, outcome, other


def unread(client: httpx.Client, url: str) -> httpx.Response:
    """A response whose body is far from read (the server waits for window): closing it
    resets its stream."""
    response = client.send(client.build_request("GET", f"{url}/bytes/1000000"), stream=True)
    assert next(response.iter_raw())
    return response


def assert_discarded_with_sibling(
    srv: h2script.H2ScriptServer,
    client: httpx.Client,
    transport: BulkheadHTTPTransport,
    outcome: list[object],
    other: threading.Thread,
) -> None:
    """The held sibling released: the connection was discarded (the sibling failed with
    it), nothing is held, and the next request is served on a new connection."""
    srv.release("b")
    other.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], httpx.TransportError), outcome
    s = transport.statistics()[srv.url]
    assert (s.running, s.in_use_connections, s.connections) == (0, 0, 0), s
    assert s.acquired == s.completed + s.failed + s.cancelled, s
    assert client.get(f"{srv.url}/").status_code == 200
    assert transport.statistics()[srv.url].connections_created == 2
    client.close()


def test_one_interrupt_as_an_unread_h2_streams_end_starts_resets_that_stream_alone() -> None:
    """Landing as ``end_exchange`` starts, before the reset is even queued: ``reclaim``
    queues and sends it; the connection and the other thread's stream stay."""
    with h2script.serve() as srv:
        client, transport, outcome, other = h2_held_sibling(srv)
        response = unread(client, srv.url)
        window = Window("", "end_exchange", "_finish")
        assert interrupted(window, response.close), f"never reached {window}"
        srv.wait_until(lambda: len(srv.client_resets) == 1, what="the stream's reset")
        srv.release("b")
        other.join(10)
        assert outcome == [200], outcome
        assert client.get(f"{srv.url}/").status_code == 200
        s = transport.statistics()[srv.url]
        assert (s.running, s.in_use_connections, s.connections_created) == (0, 0, 1), s
        assert s.acquired == s.completed + s.failed + s.cancelled, s
        client.close()


@pytest.mark.parametrize("where", RESET_WRITE.keys())
def test_an_interrupt_in_an_h2_resets_write_discards_the_connection(where: str) -> None:
    """The reset's write cut after ``sock.send`` returned: how much of the frame went out
    is unknown (the project's rule: unknown state, discard), so the connection is closed
    and the other thread's stream fails with it, as on any broken connection; nothing is
    kept and the next request gets a new connection.  Kept before (the pool's answer
    came after the write, which no one knew was cut): ``connections_created`` stayed 1.
    In ``end_exchange``: one interrupt; in ``reclaim``: a second one, the first landing
    as ``end_exchange`` starts."""
    with h2script.serve() as srv:
        client, transport, outcome, other = h2_held_sibling(srv)
        response = unread(client, srv.url)
        if where == "reclaim":  # a first interrupt as end_exchange starts, then this one
            first = Window("", "end_exchange", "_finish")
            landed = interrupted(first, response.close, then=RESET_WRITE[where])
        else:
            landed = interrupted(RESET_WRITE[where], response.close)
        assert landed, f"never reached {where}"
        assert_discarded_with_sibling(srv, client, transport, outcome, other)


def test_an_interrupt_inside_the_pools_answer_discards_the_h2_connection() -> None:
    """Landing inside ``Pool.release`` (its record of the connection half updated: the
    stream's count taken off, the entry not indexed again), the pool's record is unknown:
    ``reclaim`` discards the connection, with the other thread's stream, rather than
    release it a second time (then ``in_use_connections`` stayed 1 for good)."""
    with h2script.serve() as srv:
        client, transport, outcome, other = h2_held_sibling(srv)
        window = Window("_pool.py", "_index", "end_exchange")
        assert interrupted(window, lambda: client.get(f"{srv.url}/")), f"never reached {window}"
        assert_discarded_with_sibling(srv, client, transport, outcome, other)
