"""``FleetLimiter``: one process's side of a fleet-wide limit on Redis (asyncio only).

Theory of operation
-------------------
The decisions (who is admitted, which leases are alive) are taken by Redis in one atomic
Lua script per call (``_fleet_lua.py``); this module asks, sleeps and keeps counters.

**Acquire.**  ``acquire(budget)`` returns a ``Lease`` or raises.  With nobody of this
process refused and waiting, it asks Redis at once: one round trip when capacity is free
(at most 16 such asks at a time, the others wait for a turn to ask, so a burst cannot
exhaust the client's connection pool).  Once refused, requests queue here in FIFO order
and only the head of the queue asks Redis; when it is admitted the next one asks at once,
so a contended process admits one request per round trip.  A refused head sleeps until a
release is announced (pub/sub on ``K:free``, read by one listener task per limiter; our
own releases wake it directly), the earliest lease expires, or the poll interval passes
(jittered ±50%, so processes that missed an announcement do not ask in lockstep),
whichever comes first.
Fairness between processes is Redis's: round-robin among the waiting processes, oldest
wait first (``_fleet_lua.py``).

**Every Redis call is bounded** by ``redis_timeout`` and by what is left of the budget,
so a paused Redis (SIGSTOP) costs at most the budget.  A call cut by the budget raises
``AcquireTimeout`` (the deadline passed; Redis is not declared down).  A call that fails
otherwise (refused, reset, ``redis_timeout``) makes Redis *unavailable*: logged once at
WARNING, counted as an outage, and for ``retry_interval`` seconds no request asks it again:
``on_unavailable="local"`` admits on the local limit alone (a *local* lease, counted as a
fallback), ``"reject"`` raises ``FleetUnavailable``.  The first answer after that (an
acquire, or the renewal round, which keeps probing) makes it available again (logged once).
A script cut by a timeout or a cancellation may still have run on the server: its lease
id is released in the background like any other, and its expiry is the backstop.

**Release** (``Lease.release()``) is synchronous and idempotent, callable from any thread
(the compartment's garbage-collector hand-off): the lease leaves this process's books at
once when called on the loop, and the Redis removal is batched into one background round
trip scheduled with ``Timers`` (a callback returning an awaitable runs as a task).  If Redis
does not answer, the ids are kept (up to 10,000) and sent once it answers again.  With no
loop to run it, nothing is sent: the lease expires in Redis after at most ``lease``.

**Renewal.**  One timer per limiter, armed while leases are held, fires every ``lease / 3``
and renews every held lease in one round trip.  A lease Redis no longer has, or whose
expiry passed locally while Redis did not answer, is *lost*: counted, logged, and the
request goes on as a local lease.  Local leases (fallbacks, lost ones) are adopted by the
next renewal that Redis answers, even past the limit, so after an outage the fleet count
includes every request still running and the limit holds again.

**Another event loop.**  A transport used from a new loop hands everything of the old one
over (``BulkheadTransport._abandon``); here ``abandon`` drops the loop's part: our own Redis
client (its sockets closed without the old loop), the listener task, the waiters and the
events they sleep on.  The next ``acquire`` starts afresh on the new loop; held leases stay
held (renewed from the new loop once it asks, given back by their requests as usual).  A
client the caller gave is theirs: it must suit the new loop.

**Backends.**  redis-py's asyncio client needs asyncio: under trio (or any other loop)
``acquire`` raises ``RuntimeError`` naming the backend before doing anything.

No redis-py exception, ``OSError`` or ``TimeoutError`` escapes: they become availability
transitions, ``FleetUnavailable`` or ``AcquireTimeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import random
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import sniffio

from . import _fleet_lua as lua
from ._exceptions import AcquireTimeout, FleetUnavailable, TransportClosed
from ._fleet_config import DEFAULT_WAIT_TTL, FleetStats, RedisFleetLimit, redact_url
from ._streams import close_stranded
from ._timers import TimerHandle, Timers

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.client import PubSub
    from redis.commands.core import AsyncScript

__all__ = ["FleetLimiter", "Lease"]

logger = logging.getLogger("httpx_bulkhead")


class Lease:
    """One admitted request's share of the fleet limit.  ``release()`` exactly once (more
    calls do nothing), from any thread.

    Attributes:
        id: the lease's member in ``K:leases`` (unique per limiter).
        fleet: True while Redis counts it; False for a local lease (admitted while Redis
            was unavailable, or lost), which the next answered renewal adopts.
        lost: whether Redis lost it once while it was held.
    """

    __slots__ = ("_limiter", "expires", "fleet", "id", "lost", "released")

    def __init__(self, limiter: FleetLimiter, lease_id: str, fleet: bool, expires: float) -> None:
        self._limiter = limiter
        self.id = lease_id
        self.fleet = fleet
        self.expires = expires  # time.monotonic(): when Redis drops it unless renewed
        self.lost = False
        self.released = False

    def release(self) -> None:
        """Give the lease back: now in this process, in Redis soon (in the background)."""
        if not self.released:
            self.released = True
            self._limiter._release(self)

    def __repr__(self) -> str:
        state = "released" if self.released else "fleet" if self.fleet else "local"
        return f"<Lease {self.id} {state}>"


class _Waiter:
    __slots__ = ("turn",)

    def __init__(self) -> None:
        self.turn = asyncio.Event()  # set when it becomes the head of the queue


_Refused = int  # ms until the earliest lease expires (0: unknown)
#: Acquires of one limiter that may ask Redis at once outside the queue (more wait for a
#: turn to ask), so a limiter needs at most this many connections plus three (release,
#: renewal, pub/sub): redis-py's pool holds 100.
_MAX_ASKING = 16
#: Lease ids kept for removal while Redis is unavailable (older ones just expire there).
_MAX_UNSENT = 10_000


def _redis_errors() -> tuple[type[BaseException], ...]:
    from redis.exceptions import RedisError

    return (RedisError, OSError, TimeoutError)


class FleetLimiter:
    """One process's side of a ``RedisFleetLimit``; see the module docstring.

    Args:
        config: the limit.
        timers: where background work is scheduled (the transport's, in a compartment); by
            default the limiter's own, closed by ``aclose``.
        name: for log lines and messages (the compartment's name); default the key.
    """

    def __init__(
        self, config: RedisFleetLimit, *, timers: Timers | None = None, name: str | None = None
    ) -> None:
        self.config = config
        self.name = name if name is not None else config.key
        self._timers = timers if timers is not None else Timers()
        self._own_timers = timers is None
        self._keys = lua.keys(config.key)
        self._process = uuid.uuid4().hex[:16]
        self._ids = itertools.count()
        self._lease_ms = max(1, round(config.lease * 1000))
        self._wait_ttl_ms = round(max(DEFAULT_WAIT_TTL, 3 * config.poll_interval) * 1000)
        self._errors = _redis_errors()
        self._client: Redis | None = None
        self._acquire_script: AsyncScript | None = None
        self._renew_script: AsyncScript | None = None
        self._release_script: AsyncScript | None = None
        self._thread: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # where the client was made
        self._listener: asyncio.Task[None] | None = None
        self._subscribed = False
        self._wake = asyncio.Event()  # the head waiter sleeps on it
        self._wakes = 0  # wake-ups so far: one during an attempt is not lost
        self._queue: OrderedDict[_Waiter, None] = OrderedDict()
        self._asking = asyncio.Semaphore(_MAX_ASKING)  # asks outside the queue at once
        self._held: dict[str, Lease] = {}
        self._to_remove: list[str] = []
        self._flushing = False
        self._flushed = asyncio.Event()  # set while no removal is scheduled or in flight
        self._flushed.set()
        self._renewal: TimerHandle | None = None
        self._closed = False
        self._available = True
        self._retry_at = 0.0
        # counters (see FleetStats)
        self._fleet_in_use: int | None = None
        self._acquired = 0
        self._round_trips = 0
        self._fallbacks = 0
        self._outages = 0
        self._rejected = 0
        self._timeouts = 0
        self._renewals = 0
        self._lost = 0

    # -- public ----------------------------------------------------------------------------
    async def acquire(self, budget: float | None, request: httpx.Request | None = None) -> Lease:
        """A lease, waiting at most ``budget`` seconds: every Redis call is cut by what is
        left of it.  ``None``: no limit but ``redis_timeout`` per call.  ``<= 0``: never
        wait: one ask (bounded by ``redis_timeout`` alone, as no ask takes no time), and
        none if requests of this process already wait.  ``request`` is attached to the
        exceptions.

        Raises:
            AcquireTimeout: no lease within ``budget``.
            FleetUnavailable: Redis is unavailable and ``on_unavailable="reject"``.
            TransportClosed: ``aclose`` was called.
            RuntimeError: not running under asyncio (redis-py's client needs it).
        """
        self._start()
        if budget is not None and budget <= 0:  # never wait: ask once, if nobody queues
            if not self._queue:
                outcome = await self._attempt(None, more=False, request=request)
                if isinstance(outcome, Lease):
                    return outcome
            self._timed_out(request)
        deadline = None if budget is None else time.monotonic() + budget
        refused: _Refused | None = None
        wakes = self._wakes  # a wake-up during an attempt is not lost
        if not self._queue:  # nobody of ours was refused: ask (16 asks at a time)
            asked = await self._ask(deadline, request)
            if isinstance(asked, Lease):
                return asked
            refused = asked
        waiter = _Waiter()
        self._queue[waiter] = None
        try:
            if next(iter(self._queue)) is not waiter:
                await self._wait(waiter.turn, deadline, request)
                refused = None  # our turn: the one before us left, ask at once
            while True:
                if self._closed:
                    raise TransportClosed("the fleet limiter is closed", request=request)
                if refused is not None and wakes == self._wakes:
                    await self._pause(refused, deadline, request)
                wakes = self._wakes
                outcome = await self._attempt(deadline, more=len(self._queue) > 1, request=request)
                if isinstance(outcome, Lease):
                    return outcome
                refused = outcome
        finally:
            if waiter in self._queue:  # (not after ``abandon``: the queue is another one)
                head = next(iter(self._queue)) is waiter
                del self._queue[waiter]
                if head and self._queue:
                    next(iter(self._queue)).turn.set()

    def abandon(self) -> None:
        """The transport moved to another event loop: drop what belongs to the old one (see
        the module docstring); the next ``acquire`` starts afresh.  Waiters of the old loop
        are not woken (its loop may be closed)."""
        client, loop, listener = self._client, self._loop, self._listener
        if client is None or self._closed:
            return
        self._client = self._loop = self._listener = None
        self._acquire_script = self._renew_script = self._release_script = None
        self._subscribed = False
        if listener is not None and loop is not None and not loop.is_closed():
            listener.cancel()  # (a closed loop runs it no more)
        if loop is not None and isinstance(self.config.url_or_client, str):
            _close_stranded_client(client, loop)
        self._queue = OrderedDict()
        self._wake = asyncio.Event()
        self._asking = asyncio.Semaphore(_MAX_ASKING)
        self._flushing = False  # a removal in flight there: its ids are sent again
        self._flushed = asyncio.Event()
        self._flushed.set()
        if self._renewal is not None:
            self._renewal.cancel()
            self._renewal = None

    def statistics(self) -> FleetStats:
        """A snapshot of the counters (see ``FleetStats``)."""
        fleet = sum(1 for lease in self._held.values() if lease.fleet)
        return FleetStats(
            limit=self.config.limit,
            held=fleet,
            held_local=len(self._held) - fleet,
            waiting=len(self._queue),
            fleet_in_use=self._fleet_in_use,
            available=self._available,
            subscribed=self._subscribed,
            acquired=self._acquired,
            round_trips=self._round_trips,
            fallbacks=self._fallbacks,
            outages=self._outages,
            rejected=self._rejected,
            timeouts=self._timeouts,
            renewals=self._renewals,
            lost=self._lost,
        )

    async def aclose(self) -> None:
        """Stop: waiters get ``TransportClosed``, held leases are released in Redis (one
        round trip, best effort), the listener stops, and an own client is closed."""
        if self._closed:
            return
        if self._client is None and self._to_remove and _current_library() == "asyncio":
            self._start()  # leases given back at the end of a loop the transport has left
        self._closed = True
        for waiter in self._queue:
            waiter.turn.set()
        self._wake_up()
        if self._renewal is not None:
            self._renewal.cancel()
            self._renewal = None
        for lease in list(self._held.values()):
            lease.release()
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
            self._listener = None
        await self._last_flush()
        if self._own_timers:
            await self._timers.aclose()
        client, self._client = self._client, None
        if client is not None and isinstance(self.config.url_or_client, str):
            with contextlib.suppress(*self._errors):
                await client.aclose()

    # -- acquiring -------------------------------------------------------------------------
    def _start(self) -> None:
        if self._client is not None:
            if self._closed:
                raise TransportClosed("the fleet limiter is closed")
            return
        library = _current_library()
        if library != "asyncio":
            raise RuntimeError(
                f"RedisFleetLimit needs asyncio: redis-py's asyncio client cannot run under"
                f" {library}"
            )
        if self._closed:
            raise TransportClosed("the fleet limiter is closed")
        self._client = _make_client(self.config)
        self._acquire_script = self._client.register_script(lua.ACQUIRE)
        self._renew_script = self._client.register_script(lua.RENEW)
        self._release_script = self._client.register_script(lua.RELEASE)
        self._thread = threading.get_ident()
        self._timers.bind()
        self._loop = asyncio.get_running_loop()
        self._listener = self._loop.create_task(self._listen())
        if self._to_remove:  # given back at the end of a loop this one took over from
            self._forget_later()

    async def _ask(
        self, deadline: float | None, request: httpx.Request | None
    ) -> Lease | _Refused | None:
        """The fast path: ask once, outside the queue, when an ask slot is free in time.
        ``None`` when a request of ours was refused meanwhile (then queue behind it)."""
        asking = self._asking
        if asking.locked():
            await self._wait_for(asking.acquire(), deadline, request)
        else:
            await asking.acquire()  # free: takes it without suspending
        try:
            if self._queue:
                return None
            return await self._attempt(deadline, more=False, request=request)
        finally:
            asking.release()

    def _wake_up(self) -> None:
        self._wakes += 1
        self._wake.set()

    async def _attempt(
        self, deadline: float | None, *, more: bool, request: httpx.Request | None
    ) -> Lease | _Refused:
        """One ask: a lease (from Redis, or local when it is unavailable and we fall back),
        or the ms until the earliest lease expires when refused."""
        now = time.monotonic()
        if deadline is not None and deadline <= now:
            self._timed_out(request)
        if not self._available and now < self._retry_at:
            return self._unavailable(None, request)
        if not self._available:
            self._retry_at = now + self.config.retry_interval  # one probe at a time
        lease_id = f"{self._process}:{next(self._ids)}"
        args = (self.config.limit, self._lease_ms, lease_id, self._process, self._wait_ttl_ms)
        assert self._acquire_script is not None
        script = self._acquire_script
        try:
            reply = await self._call(
                lambda: script(keys=self._keys[:3], args=(*args, int(more))), deadline, request
            )
        except BaseException as exc:
            self._forget(lease_id)  # the script may have run before the cut
            if isinstance(exc, _Unavailable):
                return self._unavailable(exc.__cause__, request)
            raise
        admitted, used, soonest = (int(x) for x in reply)
        self._fleet_in_use = used
        if not admitted:
            return soonest
        self._acquired += 1
        return self._hold(Lease(self, lease_id, True, now + self.config.lease))

    def _unavailable(self, cause: BaseException | None, request: httpx.Request | None) -> Lease:
        if self.config.on_unavailable == "reject":
            self._rejected += 1
            raise FleetUnavailable(
                f"fleet limit {self.name!r}: Redis is unavailable"
                f" ({_describe(cause) if cause is not None else 'retrying later'});"
                " on_unavailable='reject'",
                request=request,
            )
        self._fallbacks += 1
        lease_id = f"{self._process}:{next(self._ids)}"
        return self._hold(Lease(self, lease_id, False, time.monotonic() + self.config.lease))

    def _hold(self, lease: Lease) -> Lease:
        self._held[lease.id] = lease
        if self._renewal is None and not self._closed:
            self._renewal = self._timers.call_later(self.config.lease / 3, self._renew_due)
        return lease

    async def _call(
        self,
        call: Callable[[], Awaitable[Any]],
        deadline: float | None,
        request: httpx.Request | None = None,
    ) -> Any:
        """One Redis round trip, bounded by ``redis_timeout`` and the deadline.

        Raises:
            AcquireTimeout: the deadline cut it (Redis is not declared down for that).
            _Unavailable: Redis failed or did not answer in ``redis_timeout`` (marked down).
        """
        timeout = self.config.redis_timeout
        by_deadline = False
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                self._timed_out(request)
            if left < timeout:
                timeout, by_deadline = left, True
        self._round_trips += 1
        try:
            with anyio.fail_after(timeout):
                result = await call()
        except self._errors as exc:
            if by_deadline and isinstance(exc, TimeoutError):
                self._timed_out(request)
            self._down(exc)
            raise _Unavailable from exc
        self._up()
        return result

    async def _wait(
        self, event: asyncio.Event, deadline: float | None, request: httpx.Request | None
    ) -> None:
        await self._wait_for(event.wait(), deadline, request)

    async def _wait_for(
        self, awaitable: Awaitable[Any], deadline: float | None, request: httpx.Request | None
    ) -> None:
        timeout = None if deadline is None else deadline - time.monotonic()
        with anyio.move_on_after(timeout):
            await awaitable
            return
        self._timed_out(request)

    async def _pause(
        self, soonest_ms: int, deadline: float | None, request: httpx.Request | None
    ) -> None:
        """Sleep until a release is announced, the earliest lease expires or the jittered
        poll interval passes; ``AcquireTimeout`` at the deadline.  Only the head waiter
        sleeps here, and only when nothing woke it since its last attempt."""
        delay = self.config.poll_interval * random.uniform(0.5, 1.5)
        if soonest_ms > 0:
            delay = min(delay, soonest_ms / 1000)
        now = time.monotonic()
        if deadline is not None:
            if deadline <= now:
                self._timed_out(request)
            delay = min(delay, deadline - now)
        self._wake.clear()
        with anyio.move_on_after(delay):
            await self._wake.wait()

    def _timed_out(self, request: httpx.Request | None) -> None:
        self._timeouts += 1
        seen = "unknown" if self._fleet_in_use is None else str(self._fleet_in_use)
        raise AcquireTimeout(
            f"fleet limit {self.name!r}: no lease within the acquire budget"
            f" (fleet in use {seen} of limit={self.config.limit},"
            f" {len(self._queue)} waiting here)",
            request=request,
        )

    # -- availability ----------------------------------------------------------------------
    def _down(self, exc: BaseException) -> None:
        self._retry_at = time.monotonic() + self.config.retry_interval
        if self._available:
            self._available = False
            self._outages += 1
            action = (
                "falling back to the local limit"
                if self.config.on_unavailable == "local"
                else "rejecting requests"
            )
            logger.warning(
                "httpx_bulkhead: fleet limit %r: Redis is unavailable (%s); %s until it answers",
                self.name,
                _describe(exc),
                action,
            )

    def _up(self) -> None:
        if not self._available:
            self._available = True
            logger.warning(
                "httpx_bulkhead: fleet limit %r: Redis answers again; the fleet limit applies",
                self.name,
            )
            if any(not lease.fleet for lease in self._held.values()):
                self._rearm_renewal(0.0)  # adopt the local leases now
            if self._to_remove and not self._flushing:
                self._forget_later()

    # -- releasing -------------------------------------------------------------------------
    def _release(self, lease: Lease) -> None:
        if threading.get_ident() == self._thread:
            self._released(lease)
        elif not self._timers.call_soon_threadsafe(lambda: self._released(lease)):
            self._held.pop(lease.id, None)  # no loop runs: the lease expires in Redis

    def _released(self, lease: Lease) -> Awaitable[None] | None:
        self._held.pop(lease.id, None)
        if lease.fleet:
            self._forget(lease.id)
        self._wake_up()  # a local lease frees no fleet capacity, but its owner may go on
        return None

    def _forget(self, lease_id: str) -> None:
        """Remove ``lease_id`` from Redis in the background (batched)."""
        self._to_remove.append(lease_id)
        self._forget_later()

    def _forget_later(self) -> None:
        if not self._flushing and self._client is not None:
            self._flushing = True
            self._flushed.clear()
            if not self._timers.call_soon_threadsafe(self._flush):
                self._flushing = False
                self._flushed.set()

    async def _last_flush(self) -> None:
        """At ``aclose``: let a removal scheduled or in flight end (a connection it takes
        after the client is closed would stay open), then send what is left."""
        if self._client is None:
            return
        with anyio.move_on_after(self.config.redis_timeout):
            await self._flushed.wait()
        if self._to_remove and not self._flushing:
            self._flushing = True
            self._flushed.clear()
            await self._flush()

    async def _flush(self) -> None:
        try:
            while self._to_remove and self._client is not None:
                batch, self._to_remove = self._to_remove, []
                assert self._release_script is not None
                script = self._release_script
                try:
                    call = functools.partial(script, self._keys[:1], (self._keys[3], *batch))
                    await self._call(call, None)
                except _Unavailable:  # again once Redis answers; expiry is the backstop
                    self._to_remove = [*batch, *self._to_remove][-_MAX_UNSENT:]  # the newest
                    return
                self._wake_up()  # our own head waiter may take it now
        finally:
            self._flushing = False
            self._flushed.set()

    # -- renewal ---------------------------------------------------------------------------
    def _rearm_renewal(self, delay: float) -> None:
        if self._renewal is not None:
            self._renewal.cancel()
        self._renewal = None
        if self._held and not self._closed:
            self._renewal = self._timers.call_later(delay, self._renew_due)

    def _renew_due(self) -> Awaitable[None] | None:
        self._renewal = None
        if not self._held or self._closed:
            return None
        return self._renew()

    async def _renew(self) -> None:
        leases = list(self._held.values())
        adopt = [not lease.fleet for lease in leases]
        args: list[str | int] = [self._lease_ms]
        for lease, adopted in zip(leases, adopt, strict=True):
            args += (lease.id, int(adopted))
        assert self._renew_script is not None
        script = self._renew_script
        sent = time.monotonic()
        try:
            used, gone = await self._call(lambda: script(keys=self._keys[:1], args=args), None)
        except _Unavailable:  # leases whose expiry passed meanwhile are gone in Redis
            lost = [lease for lease in leases if lease.fleet and lease.expires <= sent]
        else:
            self._fleet_in_use = int(used)
            gone_ids = {_text(member) for member in gone}
            lost = []
            for lease, adopted in zip(leases, adopt, strict=True):
                if lease.released:  # while the renewal was in flight
                    if adopted:
                        self._forget(lease.id)  # it was added after its release
                elif lease.id in gone_ids:
                    lost.append(lease)
                else:
                    self._renewals += not adopted
                    lease.fleet = True
                    lease.expires = sent + self.config.lease
        lost = [lease for lease in lost if not lease.released]
        for lease in lost:
            lease.fleet = False
            lease.lost = True
        if lost:
            self._lost += len(lost)
            logger.warning(
                "httpx_bulkhead: fleet limit %r: %d lease(s) lost before renewal; the"
                " requests go on and are counted again once Redis answers",
                self.name,
                len(lost),
            )
        self._rearm_renewal(self.config.lease / 3)

    # -- announcements ---------------------------------------------------------------------
    async def _listen(self) -> None:
        """Wake the head waiter on every release announced on ``K:free``; reconnect after
        failures (jittered), for as long as the limiter lives."""
        assert self._client is not None
        while not self._closed:
            pubsub: PubSub = self._client.pubsub(ignore_subscribe_messages=True)
            try:
                with anyio.fail_after(self.config.redis_timeout):
                    await pubsub.subscribe(self._keys[3])
                self._subscribed = True
                while True:
                    message = await pubsub.get_message(timeout=self.config.poll_interval)
                    if message is not None:
                        self._wake_up()
            except self._errors:
                pass  # the acquires and renewals notice and log; we only retry
            except Exception:  # not Redis's failure: ours or redis-py's; keep listening
                logger.warning(
                    "httpx_bulkhead: fleet limit %r: the release listener failed",
                    self.name,
                    exc_info=True,
                )
            finally:
                self._subscribed = False
                with contextlib.suppress(*self._errors):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]  # unannotated upstream
            await anyio.sleep(self.config.retry_interval * random.uniform(0.5, 1.5))


class _Unavailable(Exception):
    """Private: Redis failed (the cause is chained); never escapes this module."""


def _current_library() -> str:
    try:
        return sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return "no async library"


def _close_stranded_client(client: Redis, loop: asyncio.AbstractEventLoop) -> None:
    """Close the sockets of our own ``client``, made on ``loop``, without awaiting on that
    loop (it may be closed).  redis-py closes a connection only by awaiting on its loop, so
    this reads its pool's two connection lists and each connection's ``_writer`` (redis-py
    5 to 8; ``tests/integration/test_loop_change.py`` holds it: no descriptor left, no
    ``ResourceWarning``) and leaves each connection without a writer, as its own
    ``disconnect`` does."""
    pool = client.connection_pool
    connections = [
        *getattr(pool, "_available_connections", ()),
        *getattr(pool, "_in_use_connections", ()),
    ]
    for connection in connections:
        writer = getattr(connection, "_writer", None)
        if writer is not None:
            close_stranded(writer.transport, loop)
            connection._writer = connection._reader = None


def _make_client(config: RedisFleetLimit) -> Redis:
    target = config.url_or_client
    if not isinstance(target, str):
        return target
    from redis.asyncio import Redis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return Redis.from_url(
        target,
        socket_timeout=None,  # each call is bounded by our own timeout instead
        socket_connect_timeout=config.redis_timeout,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
    )


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _describe(exc: BaseException | None) -> str:
    """A short cause for messages: the class and text, with any URL's credentials hidden."""
    if exc is None:
        return "unknown"
    text = str(exc)
    if "@" in text:
        text = " ".join(redact_url(word) if "://" in word else word for word in text.split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
