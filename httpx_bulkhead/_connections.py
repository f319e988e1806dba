"""The async shell of a compartment's ``Pool``: checking connections out, dialing, ending
exchanges, closing what the pool says to close.

``Pool`` decides which connection serves and which must close; this module sleeps on its
verdicts, does the I/O they call for (connect, reuse check, close, HTTP/2 reset) and hears
the HTTP/2 connections' events (``ConnectionListener``).

Connection accounting: every exchange started on a connection ends exactly once, through
``end_exchange()`` (or ``end_abandoned()``, for a response nobody awaits), which pools,
keeps (HTTP/2 stream reset) or closes the connection.

One loop at a time: every connection here belongs to the loop that opened it; when the
transport changes hands (``abandon``, asyncio and trio only) a dial still under way on the
old loop is closed when it completes (the pool's ``epoch``).

Idle expiry with no traffic: whenever the pool's ``next_due`` moves earlier than the sweep
already armed, a timer (``Timers``) is armed for it; the sweep closes what expired and
re-arms for the next deadline.  So at most one timer per compartment is pending, and it
fires about once per idle deadline, not per request.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Awaitable, Callable
from typing import NoReturn, TypeAlias

import anyio
import httpx

from ._config import HTTPVersions, Origin, Policy
from ._events import Recorder, protocol_of
from ._exceptions import TransportClosed
from ._exchange import ClosedEarly, Connection, Exchange, Timeouts, Verdict
from ._http2 import ConnectionListener, HTTP2Connection
from ._http11 import HTTP11Connection
from ._log import debug, log_debug, log_warning
from ._network import Network
from ._pool import Discard, Grant, Pool, PoolEntry, PoolWaiter
from ._proxied import forwards
from ._slots import acquire_timeout
from ._streams import NetStream
from ._timers import TimerHandle, Timers
from ._trace import TraceFn

__all__ = ["LOOP_LEFT", "Connections", "Lease"]

#: Why a request still under way on a loop the transport has left is refused.
LOOP_LEFT = (
    "the transport was taken over by another loop (asyncio or trio run) while this request"
    " was under way: it cannot go on here (one loop uses a transport at a time; the"
    " connections of this one were closed)"
)

#: A connection as the pool holds it: ``lease.conn`` is the connection, the rest is the
#: pool's record of it.  A request holds one from checkout to the end of its exchange.
Lease: TypeAlias = PoolEntry[Connection]

#: The pool's discard reason for each verdict of a connection's protocol.
DISCARDS = {
    Verdict.UNKNOWN_STATE: Discard.UNKNOWN_STATE,
    Verdict.PEER_CLOSED: Discard.PEER_CLOSED,
    Verdict.BROKEN: Discard.ERROR,
    Verdict.NOT_REUSABLE: Discard.NOT_REUSABLE,
    Verdict.PING_TIMEOUT: Discard.PING_TIMEOUT,
}


class Connections(ConnectionListener):
    """One compartment's connections: its ``Pool``, awaited."""

    def __init__(
        self,
        name: str,
        policy: Policy,
        connector: Network,
        versions: HTTPVersions,
        *,
        timers: Timers,
        clock: Callable[[], float],
        rng: random.Random | None,
    ) -> None:
        self._name = name
        self._policy = policy
        self._connector = connector
        #: ``Network.proxy_for``, when the network routes through proxies.
        self._proxy_for = getattr(connector, "proxy_for", None)
        self._versions = versions
        self._clock = clock
        self._timers = timers
        self._sweep_at = math.inf  # when the armed sweep fires (our clock); inf: none
        self._sweep: TimerHandle | None = None
        self.closed = False  # the compartment was closed or retired: no more connections
        self.pool: Pool[Connection] = Pool(
            max_connections=policy.connection_limit,
            max_idle=policy.idle_limit,
            idle_timeout=policy.idle_timeout,
            max_lifetime=policy.max_lifetime,
            lifetime_jitter=policy.lifetime_jitter,
            may_multiplex=versions.may_multiplex,
            rng=rng,
            on_drain=_drained,
        )
        self.open: dict[Connection, Lease] = {}  # open, idle or in use
        self._closing: list[Lease] = []  # decided by pool callbacks, closed soon
        self.timeouts = 0  # waits for a connection that timed out
        self.goaways = 0
        self.streams_reset = 0
        #: Where closed connections' durations go (``_events.py``); ``None``: nowhere.
        self.sink: Recorder | None = None

    async def checkout(
        self,
        request: httpx.Request,
        origin: Origin,
        acquire_deadline: float | None,
        connect_timeout: float | None,
        timeouts: Timeouts | None = None,
        fresh: bool = False,
        epoch: int | None = None,
    ) -> tuple[Lease, float]:
        """A connection for ``request``: one with spare capacity (most recently used first),
        a new one, or, when ``max_connections`` is reached, the next one freed (FIFO).  Also
        returns the seconds spent waiting for it (not counting the connect).  ``epoch``: the
        pool's when the request began (``None``: now); a request that outlived it (its loop
        left the transport to another) gets nothing.

        Raises:
            AcquireTimeout, TransportClosed, httpx.ConnectError, httpx.ConnectTimeout.
        """
        waited = 0.0
        if epoch is None:
            epoch = self.pool.epoch
        while True:
            if epoch != self.pool.epoch:  # another loop took the transport over meanwhile
                raise TransportClosed(LOOP_LEFT, request=request)
            grant, to_close = self.pool.checkout(origin, self._clock(), fresh=fresh)
            try:  # (``grant`` is ours until returned, handed to ``_dial`` or given back)
                if to_close or self.pool.next_due < self._sweep_at:  # (else it does nothing)
                    await self._close_all(to_close)
                if grant is None:
                    started = self._clock()
                    grant = await self._wait_for_connection(request, origin, acquire_deadline)
                    waited += self._clock() - started
                if isinstance(grant, PoolEntry):
                    if grant.active == 1:  # idle until now: check before sending on it
                        verdict = await grant.conn.check_reusable()
                        if verdict is not None:
                            to_close = self.pool.discard(grant, DISCARDS[verdict])
                            grant = None
                            await self._close_all(to_close)
                            continue
                    return grant, waited
            except BaseException:
                if grant is not None:  # (an interrupt, or the reuse check failed)
                    await self._give_back(grant, origin, epoch)
                raise
            return await self._dial(request, origin, connect_timeout, timeouts, epoch), waited

    async def _give_back(self, grant: Grant, origin: Origin, epoch: int) -> None:
        """Return a grant that will not be used: a connection as it was, or a dial's place."""
        if isinstance(grant, PoolEntry):
            to_close = self.pool.release(grant, self._clock(), reusable=True)
        else:
            to_close = self.pool.dial_failed(origin, epoch=epoch)
        with anyio.CancelScope(shield=True):
            await self._close_all(to_close)

    async def _dial(
        self,
        request: httpx.Request,
        origin: Origin,
        connect_timeout: float | None,
        timeouts: Timeouts | None,
        epoch: int,
    ) -> Lease:
        trace: TraceFn | None = request.extensions.get("trace")
        by_deadline = False
        if timeouts is not None:  # the request's deadline bounds the connect too
            connect_timeout, by_deadline = timeouts.budget(connect_timeout)
        try:
            stream = await self._connector.connect(request, timeout=connect_timeout, trace=trace)
            conn = await self._speak(request, origin, stream, connect_timeout)
        except BaseException as exc:
            await self._close_all(self.pool.dial_failed(origin, epoch=epoch))
            if by_deadline and isinstance(exc, httpx.ConnectTimeout) and timeouts is not None:
                raise timeouts.expired("while connecting", request) from exc
            raise
        lease = self.open[conn] = PoolEntry(origin, conn)
        multiplexed = isinstance(conn, HTTP2Connection)
        now = self._clock()
        await self._close_all(self.pool.dialed(lease, now, multiplexed=multiplexed, epoch=epoch))
        await self._close_pending()
        if not lease.in_pool:  # opened on a loop the transport has left (``abandon``)
            raise TransportClosed(LOOP_LEFT, request=request)
        return lease

    async def _speak(
        self, request: httpx.Request, origin: Origin, stream: NetStream, timeout: float | None
    ) -> HTTP11Connection | HTTP2Connection:
        """The connection over a new ``stream``: HTTP/2 (its preface sent) or HTTP/1.1.
        Through a proxy it is marked with it; forwarded through an HTTP proxy, it speaks
        HTTP/1.1 to the proxy (as httpcore does)."""
        proxy = None if self._proxy_for is None else self._proxy_for(request.url)
        if proxy is not None and forwards(proxy.kind, origin[0]):
            h1 = HTTP11Connection(origin, stream, self._versions.http1_parser)
            h1.proxy, h1.forward = str(proxy.url), proxy.proxy_headers
            return h1
        if not self._versions.speaks_h2(origin, stream.alpn):
            h1 = HTTP11Connection(origin, stream, self._versions.http1_parser)
            h1.proxy = None if proxy is None else str(proxy.url)
            return h1
        policy = self._policy
        conn = HTTP2Connection(
            origin,
            stream,
            listener=self,
            max_streams=policy.max_streams_per_connection,
            ping_after=policy.ping_after,
            ping_timeout=policy.ping_timeout,
        )
        conn.proxy = None if proxy is None else str(proxy.url)
        try:
            await conn.start(request, timeout)
        except BaseException:
            await conn.aclose()
            raise
        return conn

    async def _wait_for_connection(
        self, request: httpx.Request, origin: Origin, acquire_deadline: float | None
    ) -> Grant:
        if self.closed:
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
                self._timed_out(request)
            raise
        if waiter.grant is None:
            raise TransportClosed("the transport was closed", request=request)
        return waiter.grant

    async def end_exchange(
        self, lease: Lease, exchange: Exchange, exc: BaseException | None
    ) -> None:
        """The exchange ended: completed (``exc`` is ``None``) or cut by ``exc``.  The
        connection is pooled, kept (an HTTP/2 stream was reset) or closed.

        Cut short before the pool's answer (in the sync shell, an interrupt landing
        anywhere up to that answer, this method's first step included; a cancellation the
        shields cannot hold off, in ``abandon``'s write), the exchange still holds its
        connection: a caller that sees this raise calls ``reclaim``.  ``exchange.releasing``
        is set in the step right before the pool's call and ``exchange.settled`` in the
        step right after its answer (no call in between: no interrupt lands there)."""
        tracer = exchange.tracer
        if tracer is not None:  # "{operation}.failed", "response_closed.started"
            await tracer.closing(exc, early=isinstance(exc, ClosedEarly))
        if exc is None:
            reusable, keep_alive = exchange.completed()
            reusable = reusable and not self.closed
            now = self._clock()
            exchange.releasing = True
            to_close = self.pool.release(lease, now, reusable=reusable, keep_alive=keep_alive)
        else:
            with anyio.CancelScope(shield=True):
                verdict = await exchange.abandon(exc)
            now = self._clock()
            exchange.releasing = True
            if verdict is None:
                to_close = self.pool.release(lease, now, reusable=True)
            else:
                to_close = self.pool.discard(lease, DISCARDS[verdict])
        exchange.settled = True
        # Both calls do nothing (and never yield) when there is nothing to close or arm:
        # the common case is not charged two coroutines per request.
        if to_close or self.pool.next_due < self._sweep_at:
            await self._close_all(to_close)
        if self._closing:
            await self._close_pending()
        if tracer is not None:
            await tracer.closed()

    async def reclaim(self, lease: Lease, exchange: Exchange, cut: BaseException) -> None:
        """Take back the connection of an exchange whose end ``cut`` cut short before the
        pool's answer (``end_exchange``; nothing to do if it was not).  Were it left, the
        pool would count it in use for ever.

        It is ended as ``end_abandoned`` ends one: an HTTP/2 stream is reset and its
        connection stays, with the other streams it carries, unless it is broken (a write
        left part-way breaks it: ``HTTP2Connection.flush``); an HTTP/1.1 connection is
        closed.  Cut short inside the pool's answer (``exchange.releasing``), the pool's
        record of the connection is unknown: it is discarded (``UNKNOWN_STATE``) whatever
        the pool had done of the release, with the streams it carries.  Closes and the
        reset are shielded (the caller is being cancelled)."""
        if exchange.settled:
            return
        verdict = Verdict.UNKNOWN_STATE if exchange.releasing else exchange.cut(cut)
        if verdict is None:
            to_close = self.pool.release(lease, self._clock(), reusable=True)
        else:
            to_close = self.pool.discard(lease, DISCARDS[verdict])
        exchange.settled = True
        with anyio.CancelScope(shield=True):
            await self._close_all(to_close)
            if verdict is None:  # an HTTP/2 stream was reset: send the frame
                await self._send_reset(lease, exchange, cut, None)

    async def unused(self, lease: Lease) -> None:
        """Give back a connection checked out for an exchange that never began (an
        interrupt landed between the checkout's answer and the exchange's start)."""
        to_close = self.pool.release(lease, self._clock(), reusable=True)
        if to_close or self.pool.next_due < self._sweep_at:
            with anyio.CancelScope(shield=True):
                await self._close_all(to_close)

    def end_abandoned(
        self, lease: Lease, exchange: Exchange, exc: BaseException
    ) -> Awaitable[None] | None:
        """End an exchange nobody is awaiting (a response garbage-collected unclosed, or
        held unread past its deadline), on the loop, without awaiting: its slot is given
        back now; the returned awaitable finishes closing connections (or sends the HTTP/2
        reset)."""
        verdict = exchange.cut(exc)
        if verdict is None:
            to_close = self.pool.release(lease, self._clock(), reusable=True)
        else:
            to_close = self.pool.discard(lease, DISCARDS[verdict])
        exchange.settled = True
        closing = self._forget(to_close)
        if verdict is None:  # an HTTP/2 stream was reset: send the frame
            return self._send_reset(lease, exchange, exc, closing)
        return closing

    async def _send_reset(
        self,
        lease: Lease,
        exchange: Exchange,
        exc: BaseException,
        closing: Awaitable[None] | None,
    ) -> None:
        if closing is not None:
            await closing
        try:
            with anyio.CancelScope(shield=True):
                verdict = await exchange.abandon(exc)  # sends what ``cut`` queued
        except BaseException:
            # Cut short itself (an interrupt): the write broke the connection if it left a
            # frame part-way, and the protocol says so.
            verdict = exchange.cut(exc)
            if verdict is not None:
                await self._close_all(self.pool.discard(lease, DISCARDS[verdict]))
            raise
        if verdict is not None:  # it could not be sent: the connection broke
            await self._close_all(self.pool.discard(lease, DISCARDS[verdict]))

    async def _close_all(self, leases: list[Lease]) -> None:
        if self.pool.next_due < self._sweep_at:
            self._arm_sweep()
        if not leases:
            return
        with anyio.CancelScope(shield=True):
            for lease in leases:
                # (the first close of a connection: ``aclose`` may list one twice)
                if self.open.pop(lease.conn, None) is not None and (
                    self.sink is not None or debug()
                ):
                    self._report_closed(lease)
                await lease.conn.aclose()

    def _report_closed(self, lease: Lease) -> None:
        """Tell the sink and the DEBUG log how long ``lease`` was open and why it closes."""
        seconds = self._clock() - lease.opened_at
        reason = "closed" if lease.reason is None else lease.reason.value
        sink = self.sink
        if sink is not None:
            sink.connection_closed(seconds, protocol_of(lease.multiplexed), reason)
        log_debug(
            "connection_closed",
            self._name,
            "connection %d to %s://%s:%d closed (%s) after %.3f s, %d requests served",
            lease.conn.id,
            *lease.origin,
            reason,
            seconds,
            lease.served,
            reason=reason,
        )

    async def _close_pending(self) -> None:
        if self._closing:
            closing, self._closing = self._closing, []
            await self._close_all(closing)

    def _forget(self, leases: list[Lease]) -> Awaitable[None] | None:
        """Start closing ``leases`` without awaiting (from a timer or ``__del__``'s
        hand-off); returns the awaitable that finishes closing them."""
        if not leases:
            return None
        for lease in leases:
            lease.conn.abort()
        return self._close_all(leases)

    # -- idle expiry with no traffic --------------------------------------------------------
    def _arm_sweep(self) -> None:
        due = self.pool.next_due
        if self._sweep is not None:
            self._sweep.cancel()
        self._sweep_at = due
        self._sweep = None
        if due < math.inf and not self.closed:
            self._sweep = self._timers.call_later(due - self._clock(), self._run_sweep)

    def _run_sweep(self) -> Awaitable[None] | None:
        self._sweep, self._sweep_at = None, math.inf
        if self.closed:
            return None
        to_close = self.pool.sweep(self._clock())
        if self.pool.next_due < math.inf:
            self._arm_sweep()
        return self._forget(to_close)

    # -- HTTP/2 connection events (ConnectionListener) -----------------------------------
    def on_cap(self, conn: HTTP2Connection, cap: int) -> None:
        lease = self.open.get(conn)
        if lease is not None:
            self._closing.extend(self.pool.set_cap(lease, cap))

    def on_reset(self, conn: HTTP2Connection) -> None:
        self.streams_reset += 1

    def on_refused_below_cap(self, conn: HTTP2Connection, opened_as: int, cap: int) -> None:
        log_warning(
            "stream_cap_violation",
            self._name,
            "the HTTP/2 server %s://%s:%d refused a stream (REFUSED_STREAM) that was open"
            " stream %d of the %d it allows (SETTINGS_MAX_CONCURRENT_STREAMS): it accepts"
            " fewer than it advertises; the request is replayed (further refusals on"
            " connection %d are not logged)",
            *conn.origin,
            opened_as,
            cap,
            conn.id,
            reason="refused_below_cap",
        )

    def on_goaway(self, conn: HTTP2Connection) -> None:
        self.goaways += 1
        lease = self.open.get(conn)
        if lease is not None:
            self._closing.extend(self.pool.drain(lease))

    def proxied(self) -> int:
        """Open connections that go through a proxy (for statistics)."""
        return sum(1 for c, lease in self.open.items() if lease.in_pool and c.proxy is not None)

    def http2(self) -> list[HTTP2Connection]:
        """The open HTTP/2 connections (for statistics)."""
        return [c for c in self.open if isinstance(c, HTTP2Connection)]

    # -- closing ---------------------------------------------------------------------------
    def _timed_out(self, request: httpx.Request) -> NoReturn:
        self.timeouts += 1
        pool = self.pool
        load = (
            f"{pool.total} connections, {pool.total - pool.idle} in use,"
            f" max_connections={pool.max_connections}"
        )
        log_debug(
            "acquire_timeout", self._name, "no connection in time (%s)", load, reason="connection"
        )
        raise acquire_timeout(self._name, "connection", self._policy, request, load)

    # unasync: skip
    def abandon(self) -> Awaitable[None] | None:
        """The transport moved to another event loop: everything here belongs to the old
        one.  Every connection is discarded (``loop_changed``) and aborted now, without the
        old loop (``NetStream.abort``); the returned awaitable, awaited on the new loop,
        finishes closing them.  Waiters of the old loop leave the queues unwoken, and the
        sweep armed there is forgotten (the next is armed on the new loop)."""
        self.pool.abandon(list(self.open.values()))
        self._closing = []  # (discarded already: they are in ``open`` until closed)
        if self._sweep is not None:
            self._sweep.cancel()
        self._sweep, self._sweep_at = None, math.inf
        stranded = list(self.open.values())
        for lease in stranded:
            # A task of a closed loop still waiting on the connection cannot be woken:
            # waking it raises "Event loop is closed" (the socket is closed first).
            with contextlib.suppress(RuntimeError):
                lease.conn.abort()
        return self._close_all(stranded) if stranded else None

    # unasync: end
    def retire(self) -> Awaitable[None] | None:
        """No more connections: close the idle ones (the returned awaitable finishes)."""
        self._stop()
        closing, _ = self.pool.close()
        return self._forget(closing)

    async def aclose(self) -> None:
        """Wake every waiter with ``TransportClosed`` and close every connection."""
        self._stop()
        closing, waiters = self.pool.close()
        for waiter in waiters:
            waiter.wake()
        closing.extend(self.open.values())
        await self._close_all(closing)

    def _stop(self) -> None:
        self.closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None


def _drained(conn: Connection) -> None:
    """The pool's ``on_drain``: an HTTP/2 connection opens no new stream from now on."""
    if isinstance(conn, HTTP2Connection):
        conn.draining = True
