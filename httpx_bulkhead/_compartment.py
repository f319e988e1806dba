"""The async shell of one compartment: waiting for a slot and a connection, and one exchange.

The decisions are taken by ``Limiter`` (who holds a slot) and ``Pool`` (which connection
serves); this module only sleeps on their verdicts, does the I/O they call for and keeps
counters.  Nothing here is shared with another compartment, so a saturated compartment
cannot delay another one: there is no lock held across I/O and no shared queue.

Slot accounting: a request that leaves ``acquire()`` owns one slot and must give it back
exactly once, through ``release()``, whatever happens (the response stream and
``BulkheadTransport.handle_async_request`` do that in ``finally``/``except`` blocks).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import anyio
import h11
import httpx

from ._config import Policy
from ._exceptions import AcquireTimeout, BulkheadFull, RequestTimeout, TransportClosed
from ._http11 import HTTP11Connection, Timeouts
from ._limiter import Limiter, Waiter, WaiterState
from ._network import Connector, TraceFn
from ._pool import DIAL, Discard, Grant, Origin, Pool, PoolEntry, PoolWaiter
from ._stats import CompartmentStats, WaitWindow

__all__ = ["Compartment", "Outcome", "discard_reason"]

Clock = Callable[[], float]

#: Methods a request may be replayed with after a stale connection failed it (RFC 9110 §9.2.2).
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})


class Outcome:
    """How an exchange that held a slot ended (for the counters)."""

    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Compartment:
    """One bulkhead: its own slots, wait queue, connections and counters."""

    def __init__(
        self,
        name: str,
        policy: Policy,
        connector: Connector,
        *,
        clock: Clock = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.name = name
        self.policy = policy
        self._connector = connector
        self._clock = clock
        self.limiter = Limiter(policy.max_concurrency, policy.max_pending)
        self.pool = Pool(
            max_connections=policy.connection_limit,
            max_idle=policy.idle_limit,
            idle_timeout=policy.idle_timeout,
            max_lifetime=policy.max_lifetime,
            lifetime_jitter=policy.lifetime_jitter,
            rng=rng,
        )
        self._in_use: set[HTTP11Connection] = set()
        self._waits = WaitWindow()
        self._outcomes = {Outcome.COMPLETED: 0, Outcome.FAILED: 0, Outcome.CANCELLED: 0}
        self.acquire_timeouts = 0
        self.stale_retries = 0

    # -- slots ---------------------------------------------------------------------------
    async def acquire(self, budget: float | None, request: httpx.Request) -> float:
        """Wait for a slot, at most ``budget`` seconds (``None``: no limit); returns the
        seconds waited (0.0 when a slot was free).

        Raises:
            BulkheadFull: the queue is full.  AcquireTimeout: no slot in time.
            TransportClosed: the transport is (or was, while waiting) closed.
        """
        limiter = self.limiter
        if limiter.try_acquire():
            return 0.0
        if limiter.closed:
            raise TransportClosed("the transport is closed", request=request)
        if not limiter.can_enqueue():
            limiter.rejected += 1
            raise BulkheadFull(
                f"compartment {self.name!r} is full: {limiter.running} running, "
                f"{limiter.waiting} waiting (max_pending={limiter.max_pending})",
                request=request,
            )
        if budget is not None and budget <= 0:
            self._timed_out(request, "a slot")
        event = anyio.Event()
        waiter = Waiter(event.set)
        limiter.enqueue(waiter)
        started = time.monotonic()
        try:
            with anyio.fail_after(budget):
                await event.wait()
        except TimeoutError:
            if waiter.state is not WaiterState.GRANTED:  # granted in the same instant: keep it
                limiter.cancel(waiter)
                self._timed_out(request, "a slot")
        except BaseException:
            limiter.cancel(waiter)  # leaves the queue, or passes on a slot it never used
            raise
        if waiter.state is WaiterState.CLOSED:
            raise TransportClosed("the transport was closed", request=request)
        return time.monotonic() - started

    def release(self, outcome: str) -> None:
        """Give the slot back (exactly once per successful ``acquire``)."""
        self._outcomes[outcome] += 1
        self.limiter.release()

    def record_wait(self, seconds: float) -> None:
        self._waits.record(seconds)

    def _timed_out(self, request: httpx.Request, what: str) -> None:
        self.acquire_timeouts += 1
        raise AcquireTimeout(
            f"compartment {self.name!r}: no {what} within the acquire timeout", request=request
        )

    # -- connections ---------------------------------------------------------------------
    async def checkout(
        self,
        request: httpx.Request,
        origin: Origin,
        *,
        acquire_deadline: float | None,
        connect_timeout: float | None,
        fresh: bool = False,
    ) -> tuple[HTTP11Connection, float]:
        """A connection for ``request``: an idle one (LIFO), a new one, or, when
        ``max_connections`` is reached, the next one freed (FIFO).  Also returns the seconds
        spent waiting for it (not counting the connect).

        Raises:
            AcquireTimeout, TransportClosed, httpx.ConnectError, httpx.ConnectTimeout.
        """
        trace: TraceFn | None = request.extensions.get("trace")
        waited = 0.0
        while True:
            grant, to_close = self.pool.checkout(origin, self._clock(), fresh=fresh)
            await self._close_all(to_close)
            if grant is None:
                started = time.monotonic()
                grant = await self._wait_for_connection(request, origin, acquire_deadline)
                waited += time.monotonic() - started
            if isinstance(grant, HTTP11Connection):
                if grant.is_stale():  # the server closed it while idle: never send on it
                    await self._close_all(self.pool.discard(grant, Discard.PEER_CLOSED))
                    continue
                self._in_use.add(grant)
                return grant, waited
            assert grant is DIAL
            try:
                stream = await self._connector.connect(
                    request, timeout=connect_timeout, trace=trace
                )
            except BaseException:
                self.pool.dial_failed()
                raise
            conn = HTTP11Connection(origin, stream)
            self.pool.dialed(conn, self._clock())
            self._in_use.add(conn)
            return conn, waited

    async def _wait_for_connection(
        self, request: httpx.Request, origin: Origin, acquire_deadline: float | None
    ) -> Grant:
        if self.limiter.closed:
            raise TransportClosed("the transport is closed", request=request)
        event = anyio.Event()
        waiter = PoolWaiter(origin, event.set)
        self.pool.wait(waiter)
        budget = None if acquire_deadline is None else acquire_deadline - time.monotonic()
        try:
            with anyio.fail_after(budget):
                await event.wait()
        except BaseException as exc:
            if waiter.grant is not None and isinstance(exc, TimeoutError):
                return waiter.grant  # granted in the same instant: use it
            await self._close_all(self.pool.cancel(waiter))
            if isinstance(exc, TimeoutError):
                self._timed_out(request, "connection")
            raise
        if waiter.grant is None:
            raise TransportClosed("the transport was closed", request=request)
        return waiter.grant

    async def checkin(self, conn: HTTP11Connection) -> None:
        """The exchange on ``conn`` completed: pool it if its state allows."""
        self._in_use.discard(conn)
        reusable = conn.reusable and not self.limiter.closed
        await self._close_all(
            self.pool.checkin(conn, self._clock(), reusable=reusable, keep_alive=conn.keep_alive)
        )

    async def discard(self, conn: HTTP11Connection, reason: Discard) -> None:
        """Close ``conn``: its state is unknown or broken."""
        self._in_use.discard(conn)
        await self._close_all(self.pool.discard(conn, reason))

    async def _close_all(self, entries: list[PoolEntry]) -> None:
        if not entries:
            return
        with anyio.CancelScope(shield=True):
            for entry in entries:
                assert isinstance(entry, HTTP11Connection)
                await entry.aclose()

    # -- one exchange, with the stale-connection retry -----------------------------------
    async def send(
        self,
        request: httpx.Request,
        origin: Origin,
        *,
        acquire_deadline: float | None,
        timeouts: Timeouts,
        connect_timeout: float | None,
    ) -> tuple[HTTP11Connection, h11.Response, bool, float]:
        """Check out a connection and send ``request`` on it; returns the connection, the
        response head, whether a stale connection was retried and the seconds spent
        waiting for a connection.

        A request that fails on a *reused* connection before any response byte arrived (the
        server closed or reset it while idle) is sent again, once, on a new connection when
        that is safe: the body can be replayed and the method is idempotent or nothing was
        written.  Any other failure discards the connection and propagates.
        """
        trace: TraceFn | None = request.extensions.get("trace")
        retried = False
        waited = 0.0
        while True:
            conn, conn_wait = await self.checkout(
                request,
                origin,
                acquire_deadline=acquire_deadline,
                connect_timeout=connect_timeout,
                fresh=retried,
            )
            waited += conn_wait
            try:
                head = await conn.send_request(request, timeouts, trace)
            except BaseException as exc:
                await self.discard(conn, discard_reason(exc, conn))
                if retried or not _can_retry(exc, conn, request):
                    raise
                retried = True
                self.stale_retries += 1
                continue
            return conn, head, retried, waited

    # -- lifecycle -------------------------------------------------------------------------
    async def aclose(self) -> None:
        """Wake every waiter with ``TransportClosed`` and close every connection."""
        self.limiter.close()
        self.pool.max_connections = 0  # no new dial for those still holding slots
        for waiter in self.pool.drain_waiters():
            waiter.wake()
        closing: list[PoolEntry] = list(self.pool.close())
        for conn in list(self._in_use):
            closing.append(conn)
        await self._close_all(closing)

    def statistics(self) -> CompartmentStats:
        limiter, pool = self.limiter, self.pool
        p50, p95, p99, worst = self._waits.summary()
        d = pool.discards
        return CompartmentStats(
            name=self.name,
            running=limiter.running,
            waiting=limiter.waiting,
            limit=limiter.limit,
            max_pending=limiter.max_pending,
            connections=pool.total,
            idle_connections=pool.idle,
            in_use_connections=pool.total - pool.idle,
            waiting_for_connection=pool.waiting,
            acquired=limiter.acquired,
            completed=self._outcomes[Outcome.COMPLETED],
            failed=self._outcomes[Outcome.FAILED],
            cancelled=self._outcomes[Outcome.CANCELLED],
            rejected=limiter.rejected,
            acquire_timeouts=self.acquire_timeouts,
            cancelled_waiting=limiter.cancelled_waiting,
            connections_created=pool.created,
            stale_retries=self.stale_retries,
            idle_expired=d[Discard.IDLE_EXPIRED],
            lifetime_expired=d[Discard.LIFETIME_EXPIRED],
            unknown_state=d[Discard.UNKNOWN_STATE],
            peer_closed=d[Discard.PEER_CLOSED],
            error=d[Discard.ERROR],
            not_reusable=d[Discard.NOT_REUSABLE],
            surplus=d[Discard.SURPLUS],
            closed=d[Discard.CLOSED],
            wait_p50=p50,
            wait_p95=p95,
            wait_p99=p99,
            wait_max=worst,
        )


def discard_reason(exc: BaseException, conn: HTTP11Connection) -> Discard:
    """Why a connection whose exchange raised ``exc`` is closed."""
    if not isinstance(exc, Exception) or isinstance(exc, httpx.TimeoutException | RequestTimeout):
        return Discard.UNKNOWN_STATE  # cancelled or timed out mid-exchange
    if conn.reused and not conn.received_any and _is_disconnect(exc):
        return Discard.PEER_CLOSED
    return Discard.ERROR


def _is_disconnect(exc: BaseException) -> bool:
    return isinstance(exc, httpx.ReadError | httpx.WriteError | httpx.RemoteProtocolError)


def _can_retry(exc: BaseException, conn: HTTP11Connection, request: httpx.Request) -> bool:
    if not (conn.reused and not conn.received_any and _is_disconnect(exc)):
        return False
    if not isinstance(request.stream, httpx.ByteStream):
        return False  # a streamed body was (partly) consumed: it cannot be sent again
    idempotent = request.method in IDEMPOTENT_METHODS or "idempotency-key" in request.headers
    return idempotent or not conn.wrote_any
