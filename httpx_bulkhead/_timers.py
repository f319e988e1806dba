"""Work for later, and work handed over from other threads: the transport's only clock hooks.

Theory of operation
-------------------
A transport owns no task group, yet three of its rules must hold while no request comes:

* idle connections close at their deadline, in every compartment, whatever the traffic;
* a response held unread past ``Policy.request_timeout`` gives its slot back;
* a response the garbage collector frees, in whatever thread it runs, returns its slot on
  the event loop that owns the transport (never from the collector's thread).

``Timers`` is the one place that schedules such work.  It binds to the event loop of the
first call made from inside one, and rebinds if the transport is later used from another
loop (the old loop is gone, and its timers with it).  ``current_loop`` names the loop a
call runs on, for the transport's one check per request: a request from another loop
hands the transport over to it (``BulkheadTransport``'s theory of operation).

* asyncio: ``loop.call_later`` handles; no task exists unless a callback needs one.
* trio (which has no ``call_later``): one system task sleeps until the earliest deadline
  in a heap of handles (cancelled ones are dropped lazily).  It is started with the first
  timer and cancelled by ``aclose``.

A callback is synchronous and runs on the loop; if it returns an awaitable (closing
sockets), that is awaited in a task of its own (asyncio) or by the timer task (trio).  A
callback that raises is a bug: it is logged, never propagated into the loop.

``aclose`` makes every pending and later callback a no-op and waits for the awaitables
already started, so nothing of the transport runs after it returns.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import heapq
import inspect
import itertools
import math
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ._log import logger

__all__ = ["Callback", "TimerHandle", "Timers", "current_loop", "running_loop"]

T = TypeVar("T")
Callback = Callable[[], "Awaitable[None] | None"]


#: asyncio's running loop, or ``None`` (under trio), without raising: a C function that
#: ``asyncio`` exports.  The transport's check per request calls it first (one C call, no
#: Python frame); ``current_loop`` only when it is not the owner (always under trio).
running_loop: Callable[[], object] = asyncio._get_running_loop


def current_loop() -> object:
    """The event loop this call runs on: asyncio's loop, else trio's run (its token), else
    ``None``."""
    loop = running_loop()
    if loop is not None:
        return loop
    try:
        import trio  # only reached under trio (or outside any loop)

        return trio.lowlevel.current_trio_token()
    except (ImportError, RuntimeError):
        return None


class TimerHandle:
    """A scheduled callback; ``cancel()`` makes it a no-op (idempotent)."""

    __slots__ = ("_native", "callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callback) -> None:
        self.when = when  # time.monotonic() instant
        self.callback = callback
        self.cancelled = False
        self._native: asyncio.TimerHandle | None = None

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            if self._native is not None:
                self._native.cancel()
                self._native = None


class Timers:
    """Timers and thread hand-offs bound to the event loop a transport runs on."""

    __slots__ = ("_backend", "_closed")

    def __init__(self) -> None:
        self._backend: _Asyncio | _Trio | None = None
        self._closed = False

    # -- scheduling (call from the loop) --------------------------------------------------
    def call_later(self, delay: float, callback: Callback) -> TimerHandle:
        """Run ``callback`` on this loop in ``delay`` seconds (at once if ``<= 0``)."""
        handle = TimerHandle(time.monotonic() + max(0.0, delay), callback)
        if not self._closed:
            try:
                backend = self._bind()
            except RuntimeError:  # not on an event loop: nothing could run it
                handle.cancelled = True
                return handle
            backend.schedule(handle, self._run)
        return handle

    def call_soon_threadsafe(self, callback: Callback) -> bool:
        """Run ``callback`` on the bound loop soon; callable from any thread (and from
        ``__del__``).  False when there is no live loop to run it (nothing then waits on
        the transport, so the caller may act directly)."""
        backend = self._backend
        if backend is None or self._closed:
            return False
        return backend.call_soon_threadsafe(lambda: self._run(callback))

    def run_in_loop(self, fn: Callable[[], T], timeout: float) -> tuple[bool, T | None]:
        """From another thread: ``fn()`` run on the bound loop, between two of its steps, so
        it sees a consistent state.  Returns ``(True, result)``; ``(False, None)`` when
        called from the loop's own thread, with no live loop, or when the loop did not run
        it within ``timeout`` seconds (it is then not run at all)."""
        backend = self._backend
        if backend is None or backend.thread == threading.get_ident():
            return False, None
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:  # handed to the calling thread
                    future.set_exception(exc)

        if not backend.call_soon_threadsafe(run):
            return False, None
        try:
            return True, future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return False, None

    @property
    def bound(self) -> bool:
        """Whether a loop has been seen (timers exist or may exist)."""
        return self._backend is not None

    def bind(self) -> None:
        """Remember the running loop (call from it), so that hand-offs from other threads
        know where to go before any timer was needed."""
        if not self._closed:
            with contextlib.suppress(RuntimeError):  # not on an event loop
                self._bind()

    async def aclose(self) -> None:
        """Stop: pending callbacks never run; awaitables already started are awaited."""
        self._closed = True
        backend, self._backend = self._backend, None
        if backend is not None:
            await backend.aclose()

    # -- internals ---------------------------------------------------------------------
    def _bind(self) -> _Asyncio | _Trio:
        backend = self._backend
        if backend is not None and backend.is_current():
            return backend
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            backend = _Trio()
        else:
            backend = _Asyncio(loop)
        self._backend = backend
        return backend

    def _run(self, callback: Callback) -> Awaitable[None] | None:
        if self._closed:
            return None
        try:
            return callback()
        except Exception:  # a bug of ours: report it, keep the loop alive
            logger.exception("httpx_bulkhead: a timer callback failed")
            return None


def _task_done(
    tasks: set[asyncio.Task[None]], awaitable: Awaitable[None], task: asyncio.Task[None]
) -> None:
    tasks.discard(task)
    # Cancelled before its first step (``asyncio.run`` ends with the task just spawned):
    # the awaitable never started; closed, it says nothing ("never awaited" otherwise).
    if task.cancelled() and inspect.iscoroutine(awaitable):
        awaitable.close()


async def _await_logged(awaitable: Awaitable[None]) -> None:
    try:
        await awaitable
    except Exception:
        logger.exception("httpx_bulkhead: a timer task failed")


class _Asyncio:
    __slots__ = ("loop", "tasks", "thread")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.thread = threading.get_ident()
        self.tasks: set[asyncio.Task[None]] = set()

    def is_current(self) -> bool:
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    def schedule(
        self, handle: TimerHandle, run: Callable[[Callback], Awaitable[None] | None]
    ) -> None:
        def fire() -> None:
            handle._native = None
            if not handle.cancelled:
                handle.cancelled = True  # fired: cancel() is now a no-op
                self._spawn(run(handle.callback))

        handle._native = self.loop.call_at(
            self.loop.time() + (handle.when - time.monotonic()), fire
        )

    def _spawn(self, awaitable: Awaitable[None] | None) -> None:
        if awaitable is None:
            return
        task = self.loop.create_task(_await_logged(awaitable))
        self.tasks.add(task)
        task.add_done_callback(functools.partial(_task_done, self.tasks, awaitable))

    def call_soon_threadsafe(self, fn: Callable[[], Awaitable[None] | None]) -> bool:
        if self.loop.is_closed() or not self.loop.is_running():
            return False  # nothing runs on it now: the caller may act directly
        try:
            self.loop.call_soon_threadsafe(lambda: self._spawn(fn()))
        except RuntimeError:  # closed in the meantime
            return False
        return True

    async def aclose(self) -> None:
        if self.tasks and self.is_current():
            await asyncio.gather(*self.tasks, return_exceptions=True)


class _Trio:
    """One system task sleeping until the earliest handle's deadline."""

    __slots__ = (
        "_done",
        "_heap",
        "_ready",
        "_run",
        "_scope",
        "_seq",
        "_started",
        "_wake",
        "thread",
        "token",
    )

    def __init__(self) -> None:
        import trio  # only reached under trio

        self.token = trio.lowlevel.current_trio_token()
        self.thread = threading.get_ident()
        self._heap: list[tuple[float, int, TimerHandle]] = []
        self._seq = itertools.count()
        self._ready: list[Callable[[], Awaitable[None] | None]] = []
        self._scope: Any = None  # the timer task's sleep scope
        self._wake: Any = None  # trio.Event set to make the task look again
        self._started = False
        self._done: Any = None  # trio.Event set when the timer task has ended
        self._run: Callable[[Callback], Awaitable[None] | None] | None = None

    def is_current(self) -> bool:
        import trio

        try:
            return trio.lowlevel.current_trio_token() is self.token
        except RuntimeError:
            return False

    def schedule(
        self, handle: TimerHandle, run: Callable[[Callback], Awaitable[None] | None]
    ) -> None:
        self._run = run
        heap = self._heap
        if len(heap) > 64 and len(heap) > 2 * sum(1 for e in heap if not e[2].cancelled):
            heap[:] = [e for e in heap if not e[2].cancelled]  # amortized compaction
            heapq.heapify(heap)
        heapq.heappush(heap, (handle.when, next(self._seq), handle))
        if not self._started:
            self._start()
        elif heap[0][2] is handle:  # earlier than what the task sleeps for
            self._poke()

    def _start(self) -> None:
        import trio

        self._started = True
        self._done = trio.Event()
        self._scope = trio.CancelScope()  # made here: ``aclose`` may cancel it before it runs
        trio.lowlevel.spawn_system_task(self._loop, name="httpx_bulkhead timers")

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def call_soon_threadsafe(self, fn: Callable[[], Awaitable[None] | None]) -> bool:
        import trio

        def enqueue() -> None:
            self._ready.append(fn)
            if not self._started:
                self._start()
            self._poke()

        try:
            self.token.run_sync_soon(enqueue)
        except trio.RunFinishedError:
            return False
        return True

    async def _loop(self) -> None:
        import trio

        try:
            with self._scope:
                await self._serve(trio)
        finally:
            self._done.set()

    async def _serve(self, trio: Any) -> None:
        while True:
            while self._ready:
                fn = self._ready.pop(0)
                await self._await(fn())
            now = time.monotonic()
            heap = self._heap
            while heap and (heap[0][2].cancelled or heap[0][0] <= now):
                _, _, handle = heapq.heappop(heap)
                if not handle.cancelled and self._run is not None:
                    handle.cancelled = True
                    await self._await(self._run(handle.callback))
            if self._ready:
                continue
            delay = heap[0][0] - time.monotonic() if heap else math.inf
            self._wake = trio.Event()
            with trio.move_on_after(max(0.0, delay)):
                await self._wake.wait()
            self._wake = None

    @staticmethod
    async def _await(awaitable: Awaitable[None] | None) -> None:
        if awaitable is not None:
            await _await_logged(awaitable)

    async def aclose(self) -> None:
        self._heap.clear()
        self._ready.clear()
        if self._scope is not None:
            self._scope.cancel()
        if self._done is not None and self.is_current():
            await self._done.wait()
