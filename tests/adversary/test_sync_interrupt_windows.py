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
from tests.servers import RawServer, garbage_status_line, keepalive_ok

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


def interrupted(window: Window, action: Callable[[], object]) -> bool:
    """Run ``action`` with an interrupt landing at ``window``; true if it landed (the
    action then raised ``Interrupt``, unless a cleanup step swallowed it)."""
    landing = Landing(window)
    sys.setprofile(landing)
    try:
        action()
    except Interrupt:
        assert landing.landed.is_set()
    finally:
        sys.setprofile(None)
    return landing.landed.is_set()


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
