"""Threads as callers: the sync shell's loop lock, its waiting primitives and its timers.

Theory of operation
-------------------
The sync shell (``_sync/``) is generated from the async one, whose invariants were reasoned
for one event loop: code between two awaits runs alone.  A sync transport keeps that
property with one ``LoopLock`` (owned by its ``Timers``): a thread runs transport code
only while holding it, and releases it exactly where the async code would await something
that waits: socket I/O, a wait for a slot, a connection or an HTTP/2 stream's frame, a
sleep, and user code that may block (a request body's iterator).  So the pure core
(``Limiter``, ``Pool``, routing, h2's state) needs no lock of its own, a decision and the
I/O it calls for are separated as on the loop, and no lock is ever held across I/O: a
thread blocked on a slow dependency holds nothing.  The lock guards microseconds of
decision code (Python's GIL serializes that work anyway).

Entry points (``LoopLock.run``): the transport's ``handle_request``, ``close`` and
``statistics``, a response stream's iteration and ``close``, and the timer thread.  A
thread already holding the lock (a trace callback asking for ``statistics()``) re-enters.

Waiting: ``Event`` (one per waiter: the slot and connection queues stay FIFO with no
barging, as ``Limiter`` and ``Pool`` grant before waking), ``Lock`` (HTTP/2 writes),
``sleep``, and ``blocking`` for socket calls, each releasing the loop lock while it waits
and taking it back before returning or raising, even when ``KeyboardInterrupt`` lands in
between (the interrupt is raised once the lock is held again, so the caller's cleanup,
which gives a slot back or leaves the queue, runs as the async code's does on
cancellation).

Deadlines: ``fail_after``, ``move_on_after`` and ``CancelScope(shield=True)`` behave as
anyio's, per thread: a scope's deadline bounds every wait made inside it; when it passes,
the wait raises ``Expired`` (a ``BaseException``, as a cancellation is) which the scope
that set the deadline turns into ``TimeoutError`` (``fail_after``) or swallows
(``move_on_after``); a shielded scope hides the deadlines of the scopes around it.

Timers: one thread per transport, started on demand, runs callbacks (idle sweeps, response
deadlines, responses the garbage collector freed) under the loop lock.  It exits when
nothing is scheduled (so an unclosed transport leaves no thread behind once its pool is
empty) and ``close()`` stops and joins it: no thread of the transport outlives ``close()``
but a name lookup its deadline abandoned (``getaddrinfo``), which ends when the system
resolver answers.
Every timer thread is registered before its ``start()`` and stays registered until it has
left and ended, so ``close()`` joins each one that may still run: the one serving, one an
interrupt cut off from its starter (an exception landing in ``Thread.start()`` while it
waits for the new thread, which is then already running), and the ones that left for lack
of work and are still finishing (several, when work came back in between).
"""

from __future__ import annotations

import _thread
import heapq
import itertools
import logging
import math
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any, TypeVar

__all__ = [
    "CancelScope",
    "Event",
    "Expired",
    "Lock",
    "LoopLock",
    "TimerHandle",
    "Timers",
    "blocking",
    "current_loop",
    "fail_after",
    "getaddrinfo",
    "iterate_unlocked",
    "move_on_after",
    "running_loop",
    "sleep",
]

T = TypeVar("T")
Callback = Callable[[], None]

logger = logging.getLogger("httpx_bulkhead")

_local = threading.local()
#: Shortest wait handed to a socket: ``settimeout(0)`` would mean non-blocking instead.
_MIN_WAIT = 1e-6


# -- the loop lock ---------------------------------------------------------------------------
class LoopLock:
    """Held by a thread while it runs transport code (see the module docstring).

    An interrupt (``KeyboardInterrupt``, or any exception raised in the thread from
    outside) can land between any two steps of Python code, so the lock is a C ``RLock``:
    taking it and recording its owner is one call, giving it back another, and ownership
    is asked of the lock itself.  Every path tests ownership inside the ``try`` that gives
    the lock back, so an interrupt landing just before or after either call neither leaks
    the lock (every other thread, and the timer thread, would wait for ever) nor takes it
    twice."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.RLock()

    def held(self) -> bool:
        """Whether the calling thread holds it."""
        owned: bool = self._lock._is_owned()  # type: ignore[attr-defined]
        return owned

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` holding the lock (re-entrant for the thread holding it)."""
        lock = self._lock
        if lock._is_owned():  # type: ignore[attr-defined]
            return fn(*args)
        previous = getattr(_local, "lock", None)
        try:
            lock.acquire()
            _local.lock = self
            return fn(*args)
        finally:
            _local.lock = previous
            # Inline, not a method of ours: an interrupt landing as a Python function starts
            # would keep the lock for ever (here it lands only once the C call returned).
            try:  # noqa: SIM105 - contextlib.suppress is Python code too
                lock.release()
            except RuntimeError:  # not ours: interrupted before or while taking it
                pass

    def try_run(self, fn: Callable[[], T], timeout: float) -> tuple[bool, T | None]:
        """Like ``run``, giving up after ``timeout`` seconds: ``(False, None)``."""
        lock = self._lock
        if lock._is_owned():  # type: ignore[attr-defined]
            return True, fn()
        previous = getattr(_local, "lock", None)
        try:
            if not lock.acquire(timeout=timeout):
                return False, None
            _local.lock = self
            return True, fn()
        finally:
            _local.lock = previous
            try:  # noqa: SIM105 - inline, as in ``run``
                lock.release()
            except RuntimeError:
                pass

    def acquire(self) -> None:
        self._lock.acquire()

    def release(self) -> None:
        self._lock.release()


def _held() -> LoopLock | None:
    """The loop lock this thread holds (if any)."""
    lock: LoopLock | None = getattr(_local, "lock", None)
    if lock is None or not lock.held():
        return None
    return lock


def _reacquire(lock: LoopLock | None) -> None:
    """Take the loop lock back (if it was let go); an interrupt meanwhile is raised once
    it is held.  Ownership is tested inside the ``try``: an interrupt landing right after
    the lock was taken, or before it was let go, finds it held and never takes it twice."""
    if lock is None:
        return
    pending: BaseException | None = None
    while True:
        try:
            if lock.held():
                break
            lock.acquire()
        except BaseException as exc:  # KeyboardInterrupt: hold the lock first
            pending = exc
    if pending is not None:
        raise pending


# -- deadlines (anyio's cancel scopes, per thread) -------------------------------------------
class Expired(BaseException):
    """A scope's deadline passed during a wait (caught by that scope).  A
    ``BaseException``, as anyio's cancellation is: only cleanup code sees it."""

    def __init__(self, scope: CancelScope) -> None:
        super().__init__()
        self.scope = scope


class CancelScope:
    """A deadline (``time.monotonic()`` instant) for the waits made inside it; ``shield``
    hides the deadlines of the scopes around it."""

    __slots__ = ("cancelled_caught", "deadline", "shield")

    def __init__(self, *, deadline: float = math.inf, shield: bool = False) -> None:
        self.deadline = deadline
        self.shield = shield
        self.cancelled_caught = False

    def __enter__(self) -> CancelScope:
        _scopes().append(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        stack = _scopes()
        stack.remove(self)
        if isinstance(exc, Expired) and exc.scope is self:
            self.cancelled_caught = True
            return True
        return False


class _FailAfter:
    """``fail_after``'s scope: its deadline passing raises ``TimeoutError``."""

    __slots__ = ("_scope",)

    def __init__(self, scope: CancelScope) -> None:
        self._scope = scope

    def __enter__(self) -> CancelScope:
        return self._scope.__enter__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._scope.__exit__(exc_type, exc, tb):
            raise TimeoutError


def _scopes() -> list[CancelScope]:
    stack: list[CancelScope] | None = getattr(_local, "scopes", None)
    if stack is None:
        stack = _local.scopes = []
    return stack


def fail_after(delay: float | None, shield: bool = False) -> _FailAfter:
    """A scope that raises ``TimeoutError`` when ``delay`` seconds pass (``None``: never)."""
    deadline = math.inf if delay is None else time.monotonic() + delay
    return _FailAfter(CancelScope(deadline=deadline, shield=shield))


def move_on_after(delay: float | None, shield: bool = False) -> CancelScope:
    """A scope whose block is left quietly when ``delay`` seconds pass."""
    deadline = math.inf if delay is None else time.monotonic() + delay
    return CancelScope(deadline=deadline, shield=shield)


def _deadline() -> tuple[float, CancelScope | None]:
    """The earliest deadline that applies to this thread's next wait, and its scope."""
    stack: list[CancelScope] | None = getattr(_local, "scopes", None)
    best, owner = math.inf, None
    if stack:
        for scope in reversed(stack):
            if scope.deadline < best:
                best, owner = scope.deadline, scope
            if scope.shield:
                break
    return best, owner


# -- waiting -----------------------------------------------------------------------------------
def blocking(call: Callable[[float | None], T], timeout: float | None) -> T:
    """``call(limit)`` with the loop lock released, where ``limit`` is the shorter of
    ``timeout`` and the enclosing scopes' deadline (``None``: no limit).  ``call`` raises
    ``TimeoutError`` when ``limit`` passes; that becomes ``Expired`` if a scope's deadline
    was the limit."""
    deadline, scope = _deadline()
    limit = timeout
    by_scope = False
    if scope is not None:
        left = deadline - time.monotonic()
        if limit is None or left < limit:
            limit, by_scope = left, True
            if left <= 0:
                raise Expired(scope)
    if limit is not None and limit < _MIN_WAIT:
        limit = _MIN_WAIT
    lock = _held()
    try:
        if lock is not None:
            lock.release()  # inside the try: an interrupt after it still takes it back
        return call(limit)
    except TimeoutError:
        if by_scope and scope is not None:
            raise Expired(scope) from None
        raise
    finally:
        _reacquire(lock)


def getaddrinfo(host: str, port: int, *, type: int = 0) -> list[Any]:
    """anyio's ``getaddrinfo`` for threads: the system resolver, waited for with the loop
    lock released and within the scopes' deadline, as anyio's is under its cancel scope.

    The resolver cannot be interrupted, so it runs in a thread of its own
    (``httpx_bulkhead resolver``, a daemon) that the caller waits for: when the deadline
    passes first, the caller leaves with ``Expired`` and the lookup is abandoned (it ends
    when the resolver answers, its answer dropped), as trio abandons its resolver thread
    on cancellation.  A lookup that answered in time has ended its thread before this
    returns.  Raises ``OSError`` (the resolver's failure)."""
    outcome: list[Any] = []

    def resolve() -> None:
        try:
            outcome.append(socket.getaddrinfo(host, port, type=type))
        except BaseException as exc:  # handed to the caller, which raises it
            outcome.append(exc)

    def wait(limit: float | None) -> None:
        thread = threading.Thread(target=resolve, name="httpx_bulkhead resolver", daemon=True)
        thread.start()
        thread.join(limit)
        if thread.is_alive():
            raise TimeoutError

    blocking(wait, None)
    result = outcome[0]
    if isinstance(result, BaseException):
        raise result
    return result  # type: ignore[no-any-return]


class Event:
    """anyio's ``Event`` for threads: ``wait()`` releases the loop lock while it waits."""

    __slots__ = ("_flag",)

    def __init__(self) -> None:
        self._flag = threading.Event()

    def set(self) -> None:
        self._flag.set()

    def is_set(self) -> bool:
        return self._flag.is_set()

    def wait(self) -> None:
        if not self._flag.is_set():
            blocking(self._wait, None)

    def _wait(self, limit: float | None) -> None:
        if not self._flag.wait(limit):
            raise TimeoutError


class Lock(_thread.RLock):  # type: ignore[misc]  # (final in typeshed; CPython allows it)
    """anyio's ``Lock`` for threads holding the loop lock (HTTP/2 writes): a C lock, so
    that no interrupt keeps it.

    Its ``__exit__`` is the C lock's own (a ``release``): no Python frame stands between
    a ``with`` body's end and the release, so an interrupt lands before the body ends
    (the release then runs as the ``with`` unwinds) or once the lock is given back, never
    in between (as ``LoopLock.run`` gives the loop lock back).  ``__enter__`` waits with
    the loop lock released (``blocking``); an interrupt landing once the lock is taken and
    before ``__enter__`` returns (no ``with`` body to release it yet) has it given back
    there, ownership asked of the lock inside the ``try``.  Waiters take it in the order
    the system wakes them, not first come first served: each holder sends all that h2
    has queued, the waiters' frames included."""

    __slots__ = ()

    def __enter__(self) -> bool:  # type: ignore[override]  # (the C one is ``acquire``)
        try:
            if not self.acquire(False):
                blocking(self._wait, None)
        except BaseException:
            if self._is_owned():  # type: ignore[attr-defined]
                self.release()
            raise
        return True

    def _wait(self, limit: float | None) -> None:
        if not self.acquire(True, -1 if limit is None else limit):
            raise TimeoutError


def sleep(delay: float) -> None:
    """Sleep ``delay`` seconds with the loop lock released (within the scopes' deadline)."""

    def pause(limit: float | None) -> None:
        seconds = delay if limit is None else min(delay, limit)
        time.sleep(max(0.0, seconds))
        if seconds < delay:
            raise TimeoutError

    blocking(pause, None)


class _Unlocked(Iterator[T]):
    __slots__ = ("_inner",)

    def __init__(self, inner: Iterator[T]) -> None:
        self._inner = inner

    def __next__(self) -> T:
        lock = _held()
        try:
            if lock is not None:
                lock.release()
            return next(self._inner)
        finally:
            _reacquire(lock)

    def close(self) -> None:
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()


def iterate_unlocked(iterable: Iterable[T]) -> Iterator[T]:
    """Iterate user code (a request body) with the loop lock released: it may block."""
    return _Unlocked(iter(iterable))


# -- timers ------------------------------------------------------------------------------------
def current_loop() -> object:
    """What ``_timers.current_loop`` is for the async transport: threads share one loop
    (the loop lock), so this is always the same and a sync transport never changes hands."""
    return _THREADS_LOOP


running_loop = current_loop  # (``_timers.running_loop``'s twin)

_THREADS_LOOP = object()


class TimerHandle:
    """A scheduled callback; ``cancel()`` makes it a no-op (idempotent)."""

    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callback) -> None:
        self.when = when  # time.monotonic() instant
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Timers:
    """A sync transport's loop lock, timers and hand-offs (see the module docstring)."""

    __slots__ = ("_closed", "_cond", "_heap", "_ready", "_seq", "_thread", "_threads", "lock")

    def __init__(self) -> None:
        self.lock = LoopLock()
        # Guards the fields below only.  Re-entrant: the garbage collector may run a
        # response's ``__del__`` (which calls ``call_soon_threadsafe``) inside a block.
        self._cond = threading.Condition(threading.RLock())
        self._heap: list[tuple[float, int, TimerHandle]] = []
        self._ready: deque[TimerHandle] = deque()
        self._seq = itertools.count()
        #: The thread serving the callbacks (set before it is started).
        self._thread: threading.Thread | None = None
        #: Every timer thread that may still run, registered before ``start()``: whether it
        #: has left ``_serve``'s loop.  ``close()`` joins them all; one that has left and
        #: ended is dropped at the next start.
        self._threads: dict[threading.Thread, bool] = {}
        self._closed = False

    def call_later(self, delay: float, callback: Callback) -> TimerHandle:
        """Run ``callback`` under the loop lock in ``delay`` seconds (soon if ``<= 0``)."""
        handle = TimerHandle(time.monotonic() + max(0.0, delay), callback)
        with self._cond:
            if self._closed:
                handle.cancelled = True
                return handle
            heap = self._heap
            if len(heap) > 64 and len(heap) > 2 * sum(1 for e in heap if not e[2].cancelled):
                heap[:] = [e for e in heap if not e[2].cancelled]  # amortized compaction
                heapq.heapify(heap)
            heapq.heappush(heap, (handle.when, next(self._seq), handle))
            if not self._wake():
                handle.cancelled = True
        return handle

    def call_soon_threadsafe(self, callback: Callback) -> bool:
        """Run ``callback`` under the loop lock soon, from any thread (and ``__del__``);
        false when the transport is closed (the caller then acts directly)."""
        with self._cond:
            if self._closed:
                return False
            self._ready.append(TimerHandle(0.0, callback))
            return self._wake()

    def run_in_loop(self, fn: Callable[[], T], timeout: float) -> tuple[bool, T | None]:
        """``fn()`` under the loop lock, waiting at most ``timeout`` seconds for it;
        ``(False, None)`` if it did not come."""
        return self.lock.try_run(fn, timeout)

    @property
    def bound(self) -> bool:
        return True

    def bind(self) -> None:
        """Nothing to bind to: every thread may call."""

    def close(self) -> None:
        """Stop: pending callbacks never run; every timer thread is joined (no timeout:
        each sees ``_closed`` at its next step and leaves)."""
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._ready.clear()
            threads = list(self._threads)  # (none is started once ``_closed`` is set)
            self._cond.notify_all()
        me = threading.current_thread()
        threads = [t for t in threads if t is not me]
        if threads:
            lock = _held()  # it may be waiting for the loop lock to see that it is closed
            try:
                if lock is not None:
                    lock.release()
                for thread in threads:
                    # ``is_alive()`` is false for a thread not started: one whose
                    # ``start()`` was interrupted before it launched it (it never runs)
                    # or, in the few steps between launching it and waiting for it, one
                    # that has not run yet (it finds ``_closed`` at once and leaves).
                    if thread.is_alive():
                        thread.join()
            finally:
                _reacquire(lock)

    # -- internals -----------------------------------------------------------------------
    def _wake(self) -> bool:
        """(With ``_cond`` held.)  Make the timer thread look again, starting it if need be.

        The new thread is registered before ``start()``: an interrupt (``KeyboardInterrupt``,
        an exception raised in this thread from outside) landing inside ``start()`` most
        likely lands in its wait for the new thread, which is then running; registered, it
        is joined by ``close()`` like any other.  Were it known only once ``start()`` had
        returned, it would serve unknown to ``close()``, which would return while it runs."""
        if self._thread is not None:
            self._cond.notify()
            return True
        threads = self._threads
        for old in [t for t, left in threads.items() if left and not t.is_alive()]:
            del threads[old]  # left and ended: nothing to join
        thread = threading.Thread(target=self._serve, name="httpx_bulkhead timers", daemon=True)
        threads[thread] = False
        self._thread = thread
        try:
            thread.start()
        except RuntimeError:  # interpreter shutting down: no thread was started
            self._thread = None
            del threads[thread]
            return False
        except BaseException:
            # Interrupted.  Running (it was being waited for): it serves, and is joined by
            # ``close()``.  Not started, or not yet: the next call starts another (both
            # serve: each callback still runs once) and ``close()`` skips a thread that
            # never started.
            if not thread.is_alive():
                self._thread = None
            raise
        return True

    def _next(self) -> TimerHandle | None:
        """The next callback due, waiting for it; ``None``: closed, or nothing scheduled."""
        with self._cond:
            while True:
                if self._closed:
                    self._leave()
                    return None
                if self._ready:
                    return self._ready.popleft()
                heap = self._heap
                while heap and heap[0][2].cancelled:
                    heapq.heappop(heap)
                if not heap:
                    self._leave()  # idle: the next timer starts a new thread
                    return None
                delay = heap[0][0] - time.monotonic()
                if delay <= 0:
                    return heapq.heappop(heap)[2]  # (``_run`` sees a late cancel())
                self._cond.wait(delay)

    def _leave(self) -> None:
        """(With ``_cond`` held, in a timer thread that stops serving.)  It stays
        registered, for ``close()`` to join, until it has ended."""
        me = threading.current_thread()
        if self._thread is me:  # (another may serve: one whose starter was interrupted)
            self._thread = None
        self._threads[me] = True

    def _serve(self) -> None:
        while (handle := self._next()) is not None:
            self.lock.run(self._run, handle)

    def _run(self, handle: TimerHandle) -> None:
        if self._closed or handle.cancelled:
            return
        handle.cancelled = True  # fired: cancel() is now a no-op
        try:
            handle.callback()
        except Exception:  # a bug of ours: report it, keep the timers alive
            logger.exception("httpx_bulkhead: a timer callback failed")
