"""The async shell of one compartment: waiting for a slot and a connection, and one exchange.

The decisions are taken by ``Limiter`` (who holds a slot) and ``Pool`` (which connection
serves); this module only sleeps on their verdicts, does the I/O they call for and keeps
counters.  Nothing here is shared with another compartment, so a saturated compartment
cannot delay another one: there is no lock held across I/O and no shared queue.

Slot accounting: a request that leaves ``acquire()`` owns one slot and must give it back
exactly once, through ``release()``, whatever happens (the response stream and
``BulkheadTransport.handle_async_request`` do that in ``finally``/``except`` blocks).
Connection accounting: every exchange started on a connection ends exactly once, through
``end_exchange()``, which pools, keeps (HTTP/2 stream reset) or closes the connection.

Idle expiry with no traffic: whenever the pool's ``next_due`` moves earlier than the sweep
already armed, a timer (``Timers``) is armed for it; the sweep closes what expired and
re-arms for the next deadline.  So at most one timer per compartment is pending, and it
fires about once per idle deadline, not per request.

A compartment made for an unlisted origin may be *retired* by the router when there are
too many of them and it is at rest (no slot held, nobody waiting, no connection in use):
its idle connections are closed and its counters folded into the transport's totals.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NoReturn

import anyio
import httpx

from ._config import HTTPVersions, Origin, Policy
from ._exceptions import AcquireTimeout, BulkheadFull, TransportClosed
from ._exchange import (
    ClosedEarly,
    Connection,
    Exchange,
    Refused,
    ResponseHead,
    Timeouts,
    went_stale,
)
from ._http2 import ConnectionListener, HTTP2Connection
from ._http11 import HTTP11Connection
from ._limiter import Limiter, Waiter, WaiterState
from ._network import Network
from ._pool import Discard, Grant, Pool, PoolEntry, PoolWaiter
from ._response import ResponseStream
from ._stats import CANCELLED, FAILED, CompartmentStats, ExchangeInfo, Outcome, WaitWindow
from ._streams import NetworkStream
from ._timers import TimerHandle, Timers
from ._trace import TraceFn

__all__ = ["Compartment"]

Clock = Callable[[], float]

#: Methods a request may be replayed with after a stale connection failed it (RFC 9110 §9.2.2).
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
#: Times a request refused by HTTP/2 (GOAWAY, REFUSED_STREAM) is sent again.
MAX_REPLAYS = 3


class Compartment(ConnectionListener):
    """One bulkhead: its own slots, wait queue, connections and counters."""

    def __init__(
        self,
        name: str,
        policy: Policy,
        connector: Network,
        versions: HTTPVersions,
        *,
        timers: Timers,
        clock: Clock = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.name = name
        self.policy = policy
        self._connector = connector
        self._versions = versions
        self._clock = clock
        self.timers = timers
        self._sweep_at = math.inf  # when the armed sweep fires (our clock); inf: none
        self._sweep: TimerHandle | None = None
        #: Set by the router when it evicted this compartment (see the module docstring).
        self.retired = False
        self.limiter = Limiter(policy.max_concurrency, policy.max_pending)
        self.pool = Pool(
            max_connections=policy.connection_limit,
            max_idle=policy.idle_limit,
            idle_timeout=policy.idle_timeout,
            max_lifetime=policy.max_lifetime,
            lifetime_jitter=policy.lifetime_jitter,
            may_multiplex=versions.may_multiplex,
            rng=rng,
        )
        self._connections: set[Connection] = set()  # open, idle or in use
        self._closing: list[PoolEntry] = []  # decided by pool callbacks, closed soon
        self._waits = WaitWindow()
        self._outcomes = [0, 0, 0]  # by Outcome
        self.acquire_timeouts = 0
        self.stale_retries = 0
        self.replays = 0
        self.goaways = 0
        self.streams_reset = 0
        self.leaked = 0

    # -- a request's whole life ----------------------------------------------------------
    async def handle(self, request: httpx.Request, origin: Origin) -> httpx.Response:
        """Hold a slot, send ``request`` and return its response.  From then on the
        response stream owns the slot and the exchange (see ``_response.py``).

        Raises:
            BulkheadFull, AcquireTimeout, TransportClosed, RequestTimeout, and the httpx
            exceptions of an exchange (``ConnectError``, ``ReadTimeout``, ...).
        """
        timeout = request.extensions.get("timeout") or {}
        started = self._clock()
        budget = _shorter(timeout.get("pool"), self.policy.acquire_timeout)
        try:
            waited = await self.acquire(budget, request)
        except AcquireTimeout:
            self._waits.record(self._clock() - started)  # failed waits count too
            raise
        try:
            timeouts = self._timeouts(timeout)
            conn, exchange, head, retried, conn_wait = await self.send(
                request,
                origin,
                acquire_deadline=None if budget is None else started + budget,
                timeouts=timeouts,
                connect_timeout=timeout.get("connect"),
            )
        except BaseException as exc:
            if isinstance(exc, AcquireTimeout):
                self._waits.record(self._clock() - started)
            self.release(FAILED if isinstance(exc, Exception) else CANCELLED)
            raise
        stream = ResponseStream(self, conn, exchange, request, timeouts)
        try:  # from here the response stream owns the slot and the exchange
            info = ExchangeInfo(self.name, waited + conn_wait, exchange.reused, retried, conn.id)
            self._waits.record(info.queue_wait)
            return _response(head, stream, info, conn.network_stream)
        except BaseException as exc:
            await stream.fail(exc)
            raise

    def _timeouts(self, timeout: Mapping[str, float | None]) -> Timeouts:
        """httpx's read/write timeouts and our deadline, which starts with the slot."""
        request_timeout = self.policy.request_timeout
        return Timeouts(
            timeout.get("read"),
            timeout.get("write"),
            None if request_timeout is None else self._clock() + request_timeout,
            self.name,
            request_timeout,
            self._clock,
        )

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
        if budget is not None and budget <= 0 and limiter.can_enqueue():
            self._timed_out(request, "slot")  # (a full queue is refused first, below)
        event = anyio.Event()
        waiter = Waiter(event.set)
        try:
            limiter.enqueue(waiter)  # counts a refusal
        except OverflowError:
            raise BulkheadFull(
                f"compartment {self.name!r} is full: {limiter.running} running, "
                f"{limiter.waiting} waiting (max_pending={limiter.max_pending})",
                request=request,
            ) from None
        started = self._clock()
        try:
            with anyio.fail_after(budget):
                await event.wait()
        except TimeoutError:
            if waiter.state is not WaiterState.GRANTED:  # granted in the same instant: keep it
                limiter.cancel(waiter)
                self._timed_out(request, "slot")
        except BaseException:
            limiter.cancel(waiter)  # leaves the queue, or passes on a slot it never used
            raise
        if waiter.state is WaiterState.CLOSED:
            raise TransportClosed("the transport was closed", request=request)
        return self._clock() - started

    def release(self, outcome: Outcome) -> None:
        """Give the slot back (exactly once per successful ``acquire``)."""
        self._outcomes[outcome] += 1
        self.limiter.release()

    def _timed_out(self, request: httpx.Request, what: str) -> NoReturn:
        self.acquire_timeouts += 1
        if what == "slot":
            load = f"{self.limiter.running} running, {self.limiter.waiting} waiting"
        else:
            pool = self.pool
            load = (
                f"{pool.total} connections, {pool.total - pool.idle} in use,"
                f" max_connections={pool.max_connections}"
            )
        raise AcquireTimeout(
            f"compartment {self.name!r}: no {what} within {self._acquire_limit(request)} ({load})",
            request=request,
        )

    def _acquire_limit(self, request: httpx.Request) -> str:
        """Which configured value bounded the wait (the shorter one), for messages."""
        pool = (request.extensions.get("timeout") or {}).get("pool")
        own = self.policy.acquire_timeout
        if own is not None and (pool is None or own <= pool):
            return f"acquire_timeout={own:g} s"
        return f"the client's pool timeout={pool:g} s"

    # -- connections ---------------------------------------------------------------------
    async def checkout(
        self,
        request: httpx.Request,
        origin: Origin,
        *,
        acquire_deadline: float | None,
        connect_timeout: float | None,
        timeouts: Timeouts | None = None,
        fresh: bool = False,
    ) -> tuple[Connection, float]:
        """A connection for ``request``: one with spare capacity (most recently used first),
        a new one, or, when ``max_connections`` is reached, the next one freed (FIFO).  Also
        returns the seconds spent waiting for it (not counting the connect).

        Raises:
            AcquireTimeout, TransportClosed, httpx.ConnectError, httpx.ConnectTimeout.
        """
        waited = 0.0
        while True:
            grant, to_close = self.pool.checkout(origin, self._clock(), fresh=fresh)
            await self._close_all(to_close)
            if grant is None:
                started = self._clock()
                grant = await self._wait_for_connection(request, origin, acquire_deadline)
                waited += self._clock() - started
            if isinstance(grant, PoolEntry):
                conn: Connection = grant  # type: ignore[assignment]
                if grant.active == 1:  # idle until now: check before sending on it
                    try:
                        reason = await conn.check_reusable()
                    except BaseException:
                        await self._close_all(
                            self.pool.release(grant, self._clock(), reusable=True)
                        )
                        raise
                    if reason is not None:
                        await self._close_all(self.pool.discard(grant, reason))
                        continue
                return conn, waited
            return await self._dial(request, origin, connect_timeout, timeouts), waited

    async def _dial(
        self,
        request: httpx.Request,
        origin: Origin,
        connect_timeout: float | None,
        timeouts: Timeouts | None,
    ) -> Connection:
        trace: TraceFn | None = request.extensions.get("trace")
        conn: HTTP11Connection | HTTP2Connection
        by_deadline = False
        if timeouts is not None:  # the request's deadline bounds the connect too
            connect_timeout, by_deadline = timeouts.budget(connect_timeout)
        try:
            stream = await self._connector.connect(request, timeout=connect_timeout, trace=trace)
            if self._versions.speaks_h2(origin, stream.alpn):
                policy = self.policy
                conn = HTTP2Connection(
                    origin,
                    stream,
                    listener=self,
                    max_streams=policy.max_streams_per_connection,
                    ping_after=policy.ping_after,
                    ping_timeout=policy.ping_timeout,
                )
                try:
                    await conn.start(request, connect_timeout)
                except BaseException:
                    await conn.aclose()
                    raise
            else:
                conn = HTTP11Connection(origin, stream, self._versions.http1_parser)
        except BaseException as exc:
            await self._close_all(self.pool.dial_failed(origin))
            if by_deadline and isinstance(exc, httpx.ConnectTimeout) and timeouts is not None:
                raise timeouts.expired("while connecting", request) from exc
            raise
        self._connections.add(conn)
        multiplexed = isinstance(conn, HTTP2Connection)
        await self._close_all(self.pool.dialed(conn, self._clock(), multiplexed=multiplexed))
        await self._close_pending()
        return conn

    async def _wait_for_connection(
        self, request: httpx.Request, origin: Origin, acquire_deadline: float | None
    ) -> Grant:
        if self.limiter.closed:
            raise TransportClosed("the transport is closed", request=request)
        event = anyio.Event()
        waiter = PoolWaiter(origin, event.set)
        await self._close_all(self.pool.wait(waiter))
        budget = None if acquire_deadline is None else acquire_deadline - self._clock()
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

    async def end_exchange(
        self, conn: Connection, exchange: Exchange, exc: BaseException | None
    ) -> None:
        """The exchange ended: completed (``exc`` is ``None``) or cut by ``exc``.  The
        connection is pooled, kept (an HTTP/2 stream was reset) or closed."""
        tracer = exchange.tracer
        if tracer is not None:  # "{operation}.failed", "response_closed.started"
            await tracer.closing(exc, early=isinstance(exc, ClosedEarly))
        entry: PoolEntry = conn  # type: ignore[assignment]
        if exc is None:
            reusable, keep_alive = exchange.completed()
            reusable = reusable and not self.limiter.closed
            to_close = self.pool.release(
                entry, self._clock(), reusable=reusable, keep_alive=keep_alive
            )
        else:
            with anyio.CancelScope(shield=True):
                reason = await exchange.abandon(exc)
            if reason is None:
                to_close = self.pool.release(entry, self._clock(), reusable=True)
            else:
                to_close = self.pool.discard(entry, reason)
        await self._close_all(to_close)
        await self._close_pending()
        if tracer is not None:
            await tracer.closed()

    def end_abandoned(
        self, conn: Connection, exchange: Exchange, exc: BaseException, outcome: Outcome
    ) -> Awaitable[None] | None:
        """End an exchange nobody is awaiting (a response garbage-collected unclosed, or
        held unread past its deadline), on the loop, without awaiting: its slot is given
        back now; the returned awaitable finishes closing connections (or sends the HTTP/2
        reset)."""
        entry: PoolEntry = conn  # type: ignore[assignment]
        reason = exchange.cut(exc)
        if reason is None:
            to_close = self.pool.release(entry, self._clock(), reusable=True)
        else:
            to_close = self.pool.discard(entry, reason)
        if isinstance(exc, ClosedEarly):
            self.leaked += 1
        self.release(outcome)
        closing = self._forget(to_close)
        if reason is None:  # an HTTP/2 stream was reset: send the frame
            return self._send_reset(entry, exchange, exc, closing)
        return closing

    async def _send_reset(
        self,
        entry: PoolEntry,
        exchange: Exchange,
        exc: BaseException,
        closing: Awaitable[None] | None,
    ) -> None:
        if closing is not None:
            await closing
        with anyio.CancelScope(shield=True):
            reason = await exchange.abandon(exc)  # sends what ``cut`` queued
        if reason is not None:  # it could not be sent: the connection broke
            await self._close_all(self.pool.discard(entry, reason))

    async def _close_all(self, entries: list[PoolEntry]) -> None:
        if self.pool.next_due < self._sweep_at:
            self._arm_sweep()
        if not entries:
            return
        with anyio.CancelScope(shield=True):
            for entry in entries:
                conn: Connection = entry  # type: ignore[assignment]
                self._connections.discard(conn)
                await conn.aclose()

    async def _close_pending(self) -> None:
        if self._closing:
            closing, self._closing = self._closing, []
            await self._close_all(closing)

    def _forget(self, entries: list[PoolEntry]) -> Awaitable[None] | None:
        """Start closing ``entries`` without awaiting (from a timer or ``__del__``'s
        hand-off); returns the awaitable that finishes closing them."""
        if not entries:
            return None
        for entry in entries:
            conn: Connection = entry  # type: ignore[assignment]
            conn.abort()
        return self._close_all(entries)

    # -- idle expiry with no traffic --------------------------------------------------------
    def _arm_sweep(self) -> None:
        due = self.pool.next_due
        if self._sweep is not None:
            self._sweep.cancel()
        self._sweep_at = due
        self._sweep = None
        if due < math.inf and not self.limiter.closed:
            self._sweep = self.timers.call_later(due - self._clock(), self._run_sweep)

    def _run_sweep(self) -> Awaitable[None] | None:
        self._sweep, self._sweep_at = None, math.inf
        if self.limiter.closed:
            return None
        to_close = self.pool.sweep(self._clock())
        if self.pool.next_due < math.inf:
            self._arm_sweep()
        return self._forget(to_close)

    # -- eviction (by the router) -----------------------------------------------------------
    @property
    def uses(self) -> int:
        """Grows whenever a request arrives (the router's second-chance mark)."""
        limiter = self.limiter
        return limiter.acquired + limiter.rejected + limiter.cancelled_waiting

    def at_rest(self) -> bool:
        """Nothing in flight or waiting, no connection in use or being opened."""
        limiter, pool = self.limiter, self.pool
        return not (limiter.running or limiter.waiting or pool.waiting) and pool.total == pool.idle

    def retire(self) -> Awaitable[None] | None:
        """Evicted at rest: refuse new work, close the idle connections (the returned
        awaitable finishes closing them).  The router no longer routes to it."""
        self.retired = True
        self.limiter.close()
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        closing, _ = self.pool.close()
        return self._forget(closing)

    # -- HTTP/2 connection events (ConnectionListener) -----------------------------------
    def on_cap(self, conn: HTTP2Connection, cap: int) -> None:
        self._closing.extend(self.pool.set_cap(conn, cap))

    def on_reset(self, conn: HTTP2Connection) -> None:
        self.streams_reset += 1

    def on_goaway(self, conn: HTTP2Connection) -> None:
        self.goaways += 1
        self._closing.extend(self.pool.drain(conn))

    # -- one exchange, with the stale-connection retry and HTTP/2 replay ------------------
    async def send(
        self,
        request: httpx.Request,
        origin: Origin,
        *,
        acquire_deadline: float | None,
        timeouts: Timeouts,
        connect_timeout: float | None,
    ) -> tuple[Connection, Exchange, ResponseHead, bool, float]:
        """Check out a connection and send ``request`` on it; returns the connection, the
        exchange, the response head, whether it was sent again after a stale connection or
        refused stream, and the seconds spent waiting for a connection.

        A request that fails on a *reused* connection before any response byte arrived (the
        server closed or reset it while idle) is sent again, once, on a new connection when
        that is safe: the body can be replayed and the method is idempotent or nothing was
        written.  A request HTTP/2 refused unprocessed (GOAWAY, REFUSED_STREAM) is replayed
        on another connection.  Any other failure ends the exchange and propagates.
        """
        trace: TraceFn | None = request.extensions.get("trace")
        retried = False
        elsewhere = False  # a refused request prefers another connection
        replays = 0
        waited = 0.0
        while True:
            conn, conn_wait = await self.checkout(
                request,
                origin,
                acquire_deadline=acquire_deadline,
                connect_timeout=connect_timeout,
                timeouts=timeouts,
                fresh=retried or elsewhere,
            )
            waited += conn_wait
            exchange = conn.start_exchange()
            try:
                head = await exchange.send_request(request, timeouts, trace)
            except Refused as refused:
                await self.end_exchange(conn, exchange, None)
                elsewhere = refused.elsewhere
                sent_nothing = not exchange.wrote_any  # its body was not touched either
                if replays >= MAX_REPLAYS or not (sent_nothing or _replayable(request)):
                    raise httpx.RemoteProtocolError(
                        "the server refused the request (HTTP/2 GOAWAY or REFUSED_STREAM)",
                        request=request,
                    ) from None
                replays += 1
                self.replays += 1
                continue
            except BaseException as exc:
                await self.end_exchange(conn, exchange, exc)
                if retried or not _can_retry(exc, exchange, request):
                    raise
                retried = True
                self.stale_retries += 1
                continue
            return conn, exchange, head, retried or replays > 0, waited

    # -- lifecycle -------------------------------------------------------------------------
    async def aclose(self) -> None:
        """Wake every waiter with ``TransportClosed`` and close every connection."""
        self.limiter.close()
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        closing, waiters = self.pool.close()
        for waiter in waiters:
            waiter.wake()
        closing.extend(self._connections)  # type: ignore[arg-type]
        await self._close_all(closing)

    def statistics(self) -> CompartmentStats:
        limiter, pool = self.limiter, self.pool
        p50, p95, p99, worst = self._waits.summary()
        d = pool.discards
        h2 = [c for c in self._connections if isinstance(c, HTTP2Connection)]
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
            ping_timeouts=d[Discard.PING_TIMEOUT],
            http2_connections=len(h2),
            open_streams=sum(c.open_streams for c in h2),
            stream_caps=tuple(sorted(c.cap for c in h2)),
            goaways=self.goaways,
            streams_reset=self.streams_reset,
            leaked_responses=self.leaked,
            replays=self.replays,
            scale_outs=pool.scale_outs,
            stream_waits=pool.stream_waits,
            wait_p50=p50,
            wait_p95=p95,
            wait_p99=p99,
            wait_max=worst,
        )


def _response(
    head: ResponseHead, stream: ResponseStream, info: ExchangeInfo, network: NetworkStream
) -> httpx.Response:
    extensions: dict[str, Any] = {
        "http_version": head.http_version,
        "reason_phrase": head.reason,
        "bulkhead": info,
        "network_stream": network,
    }
    if head.stream_id is not None:
        extensions["stream_id"] = head.stream_id
    return httpx.Response(
        status_code=head.status, headers=head.headers, stream=stream, extensions=extensions
    )


def _shorter(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _replayable(request: httpx.Request) -> bool:
    return isinstance(request.stream, httpx.ByteStream)


def _can_retry(exc: BaseException, exchange: Exchange, request: httpx.Request) -> bool:
    if not went_stale(exc, exchange):
        return False
    if not _replayable(request):
        return False  # a streamed body was (partly) consumed: it cannot be sent again
    idempotent = request.method in IDEMPOTENT_METHODS or "idempotency-key" in request.headers
    return idempotent or not exchange.wrote_any
