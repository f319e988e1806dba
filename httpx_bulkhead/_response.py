"""The response body stream: reads the body from the exchange, then gives everything back.

The slot (and the connection, or HTTP/2 stream) is held until the body has been read to the
end, reading it failed, the response was closed, or ``Policy.request_timeout`` passed,
whichever comes first; then, exactly once, the exchange is ended (the connection pooled,
kept after a stream reset, or closed) and the slot is released.

The deadline holds whatever the caller does: each read is bounded by it (data already
buffered is not handed out after it), and a timer ends the exchange of a response held
unread past it; the caller's next read then raises ``RequestTimeout``.  A response the
garbage collector frees unclosed is ended on the loop that owns the transport (the
collector may run in any thread): ``__del__`` only hands the work over.  A body closed
before its end raises ``httpx.StreamClosed`` for whoever iterates it next (another task or
thread that was reading it): the end of the stream is never taken for the end of the body.

Interrupts (the sync shell: ``KeyboardInterrupt``, or any exception raised in a thread from
outside, lands at any call or loop of Python code, cleanup code included).  The slot is
the stream's from ``hold()`` (the compartment's last step before it returns the response)
until ``_owes_slot`` is cleared, in the step right after the limiter took the slot back
(``Slots.give_back``: no call in between); the waiter the slot went to is woken after.
An interrupt landing before that step leaves the slot owed: ``aclose`` (which httpx calls
when a read fails) or ``__del__`` gives it back, so it is never kept nor given back twice.
Before ``hold()`` the stream owes nothing and ends nothing: an interrupt landing between
the making (which arms the deadline's timer) and the hand-over leaves the exchange and the
slot to the compartment, and the timer then finds nothing to end (``_expire``).
An end merely paused at an await (a trace callback, a close, an HTTP/2 flush) is not cut
short: ``aclose`` from another task meanwhile leaves the slot to it (``_ending``, cleared
as ``_finish``'s last ``finally`` starts, with no await after it).  The connection is
taken back by ``Connections.reclaim`` when its end is cut short.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import AsyncIterator, Awaitable
from typing import TYPE_CHECKING

import httpx

from ._exchange import ClosedEarly, Exchange, Timeouts
from ._stats import CANCELLED, COMPLETED, FAILED, Outcome
from ._timers import TimerHandle

if TYPE_CHECKING:
    from ._compartment import Compartment
    from ._connections import Lease
    from ._leaks import LeakWatch

__all__ = ["ResponseStream"]


class ResponseStream(httpx.AsyncByteStream):
    """Streams one response body; returns the connection and slot when done or closed."""

    #: ``(sent, head latency, status)`` for an adaptive compartment's algorithm, set by
    #: the compartment; fed when the exchange ends (a class default: no cost otherwise).
    adaptive_sample: tuple[float, float, int] | None = None
    #: Whether the slot is the stream's to give back (see the module docstring): a class
    #: default, so a stream made but never handed over (``hold``) owes nothing.
    _owes_slot = False
    #: ``_finish`` is under way: set with ``_finished``, cleared as its last ``finally``
    #: starts (no await after it), so ``aclose`` from another task leaves it the slot.
    _ending = False

    def __init__(
        self,
        compartment: Compartment,
        lease: Lease,
        exchange: Exchange,
        request: httpx.Request,
        timeouts: Timeouts,
        watch: LeakWatch | None = None,
    ) -> None:
        self._compartment = compartment
        self._watch = watch  # the slot's leak timer (``_leaks.py``), if leak_threshold is set
        self._lease = lease
        self._exchange = exchange
        self._request = request
        self._timeouts = timeouts
        self._finished = False
        self._reading = False
        self._error: BaseException | None = None  # raised by reads after a timer ended it
        self._timer: TimerHandle | None = None
        deadline = timeouts.deadline
        if deadline is not None:
            self._timer = compartment.timers.call_later(
                deadline - timeouts.clock(), _expire_later(self)
            )

    def hold(self) -> None:
        """Take the slot over from the compartment (one step, no call in it)."""
        self._owes_slot = True

    def __aiter__(self) -> AsyncIterator[bytes]:
        # An iterator object rather than an async generator: nothing to finalize if the
        # caller stops early (the slot is returned by ``aclose``).
        if self._finished and (self._error is None or isinstance(self._error, httpx.StreamClosed)):
            raise httpx.StreamClosed()
        return self

    async def __anext__(self) -> bytes:
        if self._finished:
            if self._error is not None:
                raise self._error
            raise StopAsyncIteration
        deadline = self._timeouts.deadline
        self._reading = True
        try:
            if deadline is not None and self._timeouts.clock() >= deadline:
                raise self._timeouts.expired("while reading the response body", self._request)
            chunk = await self._exchange.receive_body(self._request, self._timeouts)
        except Exception as exc:
            if isinstance(self._error, httpx.StreamClosed):
                # Closed by another task or thread while this read waited: the read's own
                # error (a socket closed under it) is a consequence, not the cause.
                raise httpx.StreamClosed() from exc
            await self._finish(exc)
            raise
        except BaseException as exc:
            await self._finish(exc)
            raise
        finally:
            self._reading = False
        if chunk is None:
            await self._finish(None)
            if self._error is not None:  # closed meanwhile, by another task or thread
                raise self._error
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        """Close the response.  A body not read to the end leaves an HTTP/1.1 connection in
        an unknown state (it is closed) and an HTTP/2 stream open (it is reset)."""
        if self._finished:
            # The end under way (another task's ``_finish`` awaits) gives the slot back
            # itself; one an interrupt cut short left it owed: give it back.
            if self._owes_slot and not self._ending:
                self._give_slot(CANCELLED)
            return
        if self._exchange.finish_buffered():
            await self._finish(None)
        else:
            # Whoever iterates the body next (another task or thread, or the iteration the
            # caller left) must not take the end of the stream for the end of the body.
            self._error = httpx.StreamClosed()
            await self._finish(ClosedEarly())

    async def fail(self, exc: BaseException) -> None:
        """The response could not be handed over: end the exchange as cut by ``exc``."""
        await self._finish(exc)

    def _expire(self) -> Awaitable[None] | None:
        """The deadline passed (a timer, on the loop).  A read in progress is bounded by the
        deadline itself and reports it; otherwise the exchange ends here.

        Only a stream that was handed over (``hold``) ends anything: one made but never
        handed over (an interrupt landed in the sync shell between the timer's arming and
        ``hold``'s step) owes nothing, the compartment has ended its exchange and given
        its slot back, and its timer (not cancellable: the handle may never have been
        stored) must not end them again.  Unfinished, the stream owes its slot exactly
        when it was handed over."""
        self._timer = None
        if self._finished or self._reading or not self._owes_slot:
            return None
        self._finished = True
        self._owes_slot = False  # (given back by ``end_abandoned``, below)
        self._error = self._timeouts.expired("while the response was held unread", self._request)
        if self.adaptive_sample is not None:
            self._feed_adaptive(self._error)
        closing = self._compartment.end_abandoned(self._lease, self._exchange, self._error, FAILED)
        if self._watch is not None:
            self._watch.release()
        return closing

    def __del__(self) -> None:
        # A response nobody closed would hold its slot for ever (the classic way to exhaust
        # a pool): say so, and have the loop that owns it give the slot and connection back.
        # Also one whose end an interrupt cut short, owing only its slot (``_finished``).
        if not self._owes_slot:
            return
        self._owes_slot = False
        ended, self._finished = self._finished, True
        compartment, lease, exchange = self._compartment, self._lease, self._exchange
        watch = self._watch
        handed: list[bool] = []  # (``end`` runs once, however often it was handed over)

        def end() -> Awaitable[None] | None:
            if handed:
                return None
            handed.append(True)
            closing = None
            if ended:  # its exchange ended (and was fed): only the slot is owed
                compartment.slots.release(CANCELLED)
            else:
                try:
                    if compartment.adaptive is not None:  # (no sample: it frees a slot anyway)
                        compartment.adaptive.unfed()
                finally:
                    closing = compartment.end_abandoned(lease, exchange, ClosedEarly(), CANCELLED)
            if watch is not None:
                watch.release()
            return closing

        try:
            # Warned first: whoever waits for the slot runs only after the hand-off.
            warnings.warn(
                f"a response from compartment {compartment.name!r} was never closed; its "
                "slot has been returned. Use `async with client.stream(...)` or `await "
                "response.aclose()`.",
                ResourceWarning,
                stacklevel=1,
                source=self,
            )
        finally:
            # Handed over again if an interrupt lands in the hand-off (lost, as any
            # exception in ``__del__``); not ``contextlib.suppress``, Python code itself.
            for _ in range(3):
                try:
                    if not compartment.timers.call_soon_threadsafe(end):
                        _close_unawaited(end())  # no loop left: nothing can be waiting on it
                    break
                except BaseException:  # an interrupt, or the interpreter ending
                    continue

    async def _finish(self, exc: BaseException | None) -> None:
        if self._finished:
            return
        connections = self._compartment.connections
        self._finished = self._ending = True  # (one step: no call in between)
        try:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            await connections.end_exchange(self._lease, self._exchange, exc)
        except BaseException as cut:
            await connections.reclaim(self._lease, self._exchange, cut)  # (if cut short)
            raise
        finally:
            # Nothing awaited from here on: no ``aclose`` runs before the slot goes back,
            # unless an interrupt cuts this short (then the slot is ``aclose``'s to give).
            self._ending = False
            if exc is None:
                outcome = COMPLETED
            elif isinstance(exc, Exception) and not isinstance(exc, ClosedEarly):
                outcome = FAILED
            else:
                outcome = CANCELLED
            try:  # (an interrupt landing in the sample's feed must not keep the slot)
                if self.adaptive_sample is not None:
                    self._feed_adaptive(exc)
            finally:
                self._give_slot(outcome)

    def _give_slot(self, outcome: Outcome) -> None:
        """Give the slot back if still owed (see the module docstring), then wake the waiter
        it went to: again if an interrupt lands in the wake (setting an event twice is
        harmless; a waiter never woken would wait for ever)."""
        if self._owes_slot:
            waiter = self._compartment.slots.give_back(outcome)
            self._owes_slot = False
            if waiter is not None:
                try:
                    waiter.wake()
                except BaseException:
                    waiter.wake()
                    raise
        if self._watch is not None:
            self._watch.release()

    def _feed_adaptive(self, exc: BaseException | None) -> None:
        sample, adaptive = self.adaptive_sample, self._compartment.adaptive
        if sample is not None and adaptive is not None:  # (both are, when called)
            adaptive.ended(*sample, exc)


def _expire_later(stream: ResponseStream) -> _Expiry:
    return _Expiry(weakref.ref(stream))


class _Expiry:
    """The deadline timer's callback; holds the stream weakly so that leak detection still
    sees a response dropped unclosed."""

    __slots__ = ("_ref",)

    def __init__(self, ref: weakref.ref[ResponseStream]) -> None:
        self._ref = ref

    def __call__(self) -> Awaitable[None] | None:
        stream = self._ref()
        return None if stream is None else stream._expire()


def _close_unawaited(awaitable: Awaitable[None] | None) -> None:
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()  # a coroutine that cannot run any more: no "never awaited" warning
