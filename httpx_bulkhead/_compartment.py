"""One compartment: a request's whole life in one bulkhead.

``handle`` takes a slot (``_slots.py``), checks out or dials a connection
(``_connections.py``), sends the request, with the stale-connection retry and the HTTP/2
replay, and returns the response, whose stream (``_response.py``) then owns the slot and
the exchange.  The decisions are taken by ``Limiter`` (who holds a slot) and ``Pool``
(which connection serves); the shells around them only sleep on their verdicts and do the
I/O.  Nothing here is shared with another compartment, so a saturated compartment cannot
delay another one: there is no lock held across I/O and no shared queue.

One clock (injected; ``time.monotonic`` by default) drives the request deadline, the
acquire waits and the pool's expiry.

With ``Policy.fleet`` the slots are ``FleetSlots`` (``_fleet_slots.py``): a local slot, then
a fleet lease, given back together by the one ``release``; the compartment closes its
``FleetLimiter`` when it is closed or retired.

A compartment made for an unlisted origin may be *retired* by the router when there are
too many of them and it is at rest (no slot held, nobody waiting, no connection in use):
its idle connections are closed and its counters folded into the transport's totals.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx

from ._adaptive import AdaptiveController, AdaptiveLimit
from ._config import HTTPVersions, Origin, Policy
from ._connections import LOOP_LEFT, Connections, Lease
from ._events import Recorder, protocol_of
from ._exceptions import AcquireTimeout
from ._exchange import (
    ClosedEarly,
    Connection,
    Exchange,
    Refused,
    ResponseHead,
    Timeouts,
    went_stale,
)

# unasync: skip
from ._fleet import FleetLimiter
from ._fleet_slots import FleetSlots

# unasync: end
from ._leaks import LeakDetector, LeakWatch
from ._log import log_debug
from ._network import Network
from ._pool import Discard
from ._response import ResponseStream
from ._slots import Slots
from ._stats import (
    CANCELLED,
    FAILED,
    CompartmentStats,
    ExchangeInfo,
    Outcome,
    compartment_stats,
    fleet_fields,
)
from ._timers import Timers
from ._trace import TraceFn

__all__ = ["Compartment"]

Clock = Callable[[], float]

#: Methods a request may be replayed with after a stale connection failed it (RFC 9110 §9.2.2).
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
#: Times a request refused by HTTP/2 (GOAWAY, REFUSED_STREAM) is sent again.
MAX_REPLAYS = 3


class Compartment:
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
        self._clock = clock
        self.timers = timers
        #: Set by the router when it evicted this compartment (see the module docstring).
        self.retired = False
        self.slots = Slots(name, policy, clock)
        #: The fleet limit's process side (``Policy.fleet``), or ``None``.
        # unasync: skip
        self.fleet: FleetLimiter | None = None
        if policy.fleet is not None:
            self.slots = fleet_slots = FleetSlots(name, policy, clock, timers)
            self.fleet = fleet_slots.fleet
        # unasync: end
        # unasync: use self.fleet = None  # (asyncio only: _sync_transport.ASYNC_ONLY_FIELDS)
        self.connections = Connections(
            name, policy, connector, versions, timers=timers, clock=clock, rng=rng
        )
        self.stale_retries = 0
        self.replays = 0
        self.leaked = 0
        self._sink: Recorder | None = None
        threshold = policy.leak_threshold
        self._leaks = None if threshold is None else LeakDetector(name, threshold, timers, clock)
        #: Moves the limit when ``max_concurrency`` is an ``AdaptiveLimit`` (else ``None``).
        self.adaptive: AdaptiveController | None = None
        if isinstance(policy.max_concurrency, AdaptiveLimit):
            limiter = self.slots.limiter
            self.adaptive = AdaptiveController(
                policy.max_concurrency,
                limiter.set_limit,
                lambda: limiter.running,
                clock,
                rng,
                timers.call_later,
                name,
            )

    @property
    def sink(self) -> Recorder | None:
        """Where this compartment's per-event figures go (``_events.py``); ``None``
        (default): nowhere, at the cost of one attribute check per request."""
        return self._sink

    @sink.setter
    def sink(self, sink: Recorder | None) -> None:
        self._sink = self.connections.sink = sink

    # -- a request's whole life ----------------------------------------------------------
    async def handle(self, request: httpx.Request, origin: Origin) -> httpx.Response:
        """Hold a slot, send ``request`` and return its response.  From then on the
        response stream owns the slot and the exchange (see ``_response.py``).

        Raises:
            BulkheadFull, AcquireTimeout, TransportClosed, RequestTimeout, and the httpx
            exceptions of an exchange (``ConnectError``, ``ReadTimeout``, ...).
        """
        timeout = request.extensions.get("timeout") or {}
        epoch = self.connections.pool.epoch  # (the loop's: see ``Connections.abandon``)
        started = self._clock()
        budget = _shorter(timeout.get("pool"), self.policy.acquire_timeout)
        try:
            waited = await self.slots.acquire(budget, request)
        except AcquireTimeout:
            self._waited(self._clock() - started, None)  # failed waits count too
            raise
        watch: LeakWatch | None = None
        sent_on: tuple[Lease, Exchange] | None = None  # what ``send`` returned, until handed over
        try:
            if self._leaks is not None:
                watch = self._leaks.watch()
            timeouts = self._timeouts(timeout)
            acquire_deadline = None if budget is None else started + budget
            lease, exchange, head, retried, conn_wait, sent = await self.send(
                request, origin, timeouts, acquire_deadline, timeout.get("connect"), epoch
            )
            sent_on = lease, exchange
            stream = ResponseStream(self, lease, exchange, request, timeouts, watch)
            stream.hold()  # the last step here: from its end the stream gives both back
        except BaseException as exc:
            try:  # (an interrupt landing in the bookkeeping must not keep the slot)
                if isinstance(exc, AcquireTimeout):
                    self._waited(self._clock() - started, None)
                if self.adaptive is not None:
                    self.adaptive.failed(started + waited, exc)
                if sent_on is not None:  # interrupted between ``send`` and the hand-over
                    await self._end(*sent_on, exc)
            finally:
                # ``Slots.give_back`` takes the slot back in one step or not at all: a
                # second interrupt landing before it did is followed by another try.
                waiter = None
                try:
                    waiter = self.slots.give_back(
                        FAILED if isinstance(exc, Exception) else CANCELLED
                    )
                except BaseException:
                    waiter = self.slots.give_back(CANCELLED)
                    raise
                finally:
                    if waiter is not None:
                        waiter.wake()
                    if watch is not None:
                        watch.release()
            raise
        if self.adaptive is not None:  # the sample: from sent (after our queues) to the head
            stream.adaptive_sample = (sent, self._clock() - sent, head.status)
        try:  # from here the response stream owns the slot and the exchange
            queue_wait = waited + conn_wait
            self.slots.waits.record(queue_wait)
            sink = self._sink
            if sink is not None:
                sink.queue_time(queue_wait, protocol_of(lease.multiplexed))
            return _response(head, stream, self.name, queue_wait, exchange, retried, lease.conn)
        except BaseException as exc:
            await stream.fail(exc)
            raise

    def _waited(self, seconds: float, protocol: str | None) -> None:
        """Record an acquire wait (the quantiles' window, and the sink's histogram)."""
        self.slots.waits.record(seconds)
        sink = self._sink
        if sink is not None:
            sink.queue_time(seconds, protocol)

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

    async def _end(self, lease: Lease, exchange: Exchange, exc: BaseException | None) -> None:
        """End an exchange that failed before its response was handed over (or was
        refused): the connection is taken back even when an interrupt cuts that short."""
        connections = self.connections
        try:
            await connections.end_exchange(lease, exchange, exc)
        except BaseException as cut:
            await connections.reclaim(lease, exchange, cut)
            raise

    def end_abandoned(
        self, lease: Lease, exchange: Exchange, exc: BaseException, outcome: Outcome
    ) -> Awaitable[None] | None:
        """End an exchange nobody is awaiting (a response garbage-collected unclosed, or
        held unread past its deadline), on the loop, without awaiting: its slot is given
        back now; the returned awaitable finishes closing connections (or sends the HTTP/2
        reset)."""
        closing = self.connections.end_abandoned(lease, exchange, exc)
        if isinstance(exc, ClosedEarly):
            self.leaked += 1
        self.slots.release(outcome)
        return closing

    # -- one exchange, with the stale-connection retry and HTTP/2 replay ------------------
    async def send(
        self,
        request: httpx.Request,
        origin: Origin,
        timeouts: Timeouts,
        acquire_by: float | None,
        connect: float | None,
        epoch: int | None = None,
    ) -> tuple[Lease, Exchange, ResponseHead, bool, float, float]:
        """Check out a connection and send ``request``; returns the connection, exchange,
        response head, whether it was sent again, the seconds waited for a connection, and
        (for an adaptive limit's sample; else 0.0) when the request was handed to it.

        A request that fails on a *reused* connection before any response byte (the server
        closed it while idle) is sent again, once, on a new connection when ``_can_retry``.
        A request HTTP/2 refused unprocessed (GOAWAY, REFUSED_STREAM) is replayed elsewhere.
        ``epoch``: the pool's when the request began (``Connections.checkout``).
        """
        trace: TraceFn | None = request.extensions.get("trace")
        checkout = self.connections.checkout
        retried = elsewhere = False  # (a refused request prefers another connection)
        replays, waited = 0, 0.0
        while True:
            fresh = retried or elsewhere
            lease, wait = await checkout(
                request, origin, acquire_by, connect, timeouts, fresh, epoch
            )
            waited += wait
            exchange: Exchange | None = None
            try:  # (from the checkout's answer: an interrupt must not keep the connection)
                exchange = lease.conn.start_exchange(lease.served > 1)
                sent = 0.0 if self.adaptive is None else self._clock()  # connected: no dial
                head = await exchange.send_request(request, timeouts, trace)
            except Refused as refused:
                assert exchange is not None  # (raised by ``send_request``)
                await self._end(lease, exchange, None)
                _raise_if_left(lease, request, refused)
                self._replay(request, exchange, replays)
                elsewhere = refused.elsewhere
                replays += 1
                log_debug(
                    "replay",
                    self.name,
                    "HTTP/2 refused the request unprocessed (%s) on connection %d: sent again"
                    " (replay %d of at most %d)",
                    "REFUSED_STREAM" if elsewhere else "GOAWAY or draining",
                    lease.conn.id,
                    replays,
                    MAX_REPLAYS,
                    reason="refused_stream" if elsewhere else "goaway",
                )
                continue
            except BaseException as exc:
                if exchange is None:  # interrupted before the exchange began: unused
                    await self.connections.unused(lease)
                    raise
                await self._end(lease, exchange, exc)
                _raise_if_left(lease, request, exc)
                if retried or not _can_retry(exc, exchange, request):
                    raise
                retried = True
                self.stale_retries += 1
                log_debug(
                    "stale_retry",
                    self.name,
                    "reused connection %d failed before any response byte (%s: %s): the"
                    " request is sent again on a new connection",
                    lease.conn.id,
                    type(exc).__name__,
                    exc,
                    reason=type(exc).__name__,
                )
                continue
            return lease, exchange, head, retried or replays > 0, waited, sent

    def _replay(self, request: httpx.Request, exchange: Exchange, replays: int) -> None:
        """Count a replay of a refused request, or raise when it may not be sent again."""
        sent_nothing = not exchange.wrote_any  # its body was not touched either
        if replays >= MAX_REPLAYS or not (sent_nothing or _replayable(request)):
            raise httpx.RemoteProtocolError(
                "the server refused the request (HTTP/2 GOAWAY or REFUSED_STREAM)",
                request=request,
            ) from None
        self.replays += 1

    # -- eviction (by the router) and lifecycle ----------------------------------------------
    @property
    def uses(self) -> int:
        """Grows whenever a request arrives (the router's second-chance mark)."""
        limiter = self.slots.limiter
        return limiter.acquired + limiter.rejected + limiter.cancelled_waiting

    def at_rest(self) -> bool:
        """Nothing in flight or waiting, no connection in use or being opened."""
        limiter, pool = self.slots.limiter, self.connections.pool
        return not (limiter.running or limiter.waiting or pool.waiting) and pool.total == pool.idle

    # unasync: skip
    def abandon(self) -> Awaitable[None] | None:
        """The transport moved to another event loop: the old loop's connections are
        discarded and its waiters (for a slot, for a connection) leave the queues unwoken
        (``Connections.abandon``); slots held by requests still under way there stay held
        until those requests end.  The returned awaitable finishes closing connections."""
        self.slots.limiter.abandon()
        if self.adaptive is not None:
            self.adaptive.rearm()
        if self.fleet is not None:
            self.fleet.abandon()
        return self.connections.abandon()

    # unasync: end
    def retire(self) -> Awaitable[None] | None:
        """Evicted at rest: refuse new work, close the idle connections (the returned
        awaitable finishes closing them).  The router no longer routes to it."""
        self.retired = True
        self.slots.limiter.close()
        if self.adaptive is not None:
            self.adaptive.close()
        closing = self.connections.retire()
        # unasync: skip
        if self.fleet is not None:
            return _then_close(closing, self.fleet)
        # unasync: end
        return closing

    async def aclose(self) -> None:
        """Wake every waiter with ``TransportClosed`` and close every connection."""
        self.slots.limiter.close()
        if self.adaptive is not None:
            self.adaptive.close()
        await self.connections.aclose()
        # unasync: skip
        if self.fleet is not None:
            await self.fleet.aclose()  # its renewal and listener, before the transport's timers
        # unasync: end

    def statistics(self) -> CompartmentStats:
        adaptive: dict[str, Any] = {}
        if self.adaptive is not None:
            adaptive["no_load_latency"] = self.adaptive.algorithm.no_load
            adaptive["limit_history"] = tuple(self.adaptive.history)
        return compartment_stats(
            self.name,
            self.slots,
            self.connections,
            stale_retries=self.stale_retries,
            replays=self.replays,
            leaked_responses=self.leaked,
            slot_leaks=0 if self._leaks is None else self._leaks.detected,
            # unasync: skip
            **fleet_fields(None if self.fleet is None else self.fleet.statistics()),
            # unasync: end
            # unasync: use **fleet_fields(None),
            **adaptive,
        )


# unasync: skip
async def _then_close(closing: Awaitable[None] | None, fleet: FleetLimiter) -> None:
    if closing is not None:
        await closing
    await fleet.aclose()


# unasync: end


def _response(
    head: ResponseHead,
    stream: ResponseStream,
    compartment: str,
    queue_wait: float,
    exchange: Exchange,
    retried: bool,
    conn: Connection,
) -> httpx.Response:
    info = ExchangeInfo(
        compartment=compartment,
        queue_wait=queue_wait,
        reused=exchange.reused,
        retried=retried,
        connection_id=conn.id,
        proxy=conn.proxy,
    )
    extensions: dict[str, Any] = {
        "http_version": head.http_version,
        "reason_phrase": head.reason,
        "bulkhead": info,
        "network_stream": conn.network_stream,
    }
    if head.stream_id is not None:
        extensions["stream_id"] = head.stream_id
    return httpx.Response(
        status_code=head.status, headers=head.headers, stream=stream, extensions=extensions
    )


def _raise_if_left(lease: Lease, request: httpx.Request, exc: BaseException) -> None:
    """A request whose connection the transport closed when another loop took it over
    (``Connections.abandon``) fails naming that, with the error type it had (a refusal
    reads as a ``ReadError``), and is never sent again: that would take connections of the
    loop that took over.  Only on the error path."""
    if lease.reason is not Discard.LOOP_CHANGED:
        return
    kind: type[httpx.TransportError] = httpx.ReadError
    if isinstance(exc, httpx.WriteError | httpx.RemoteProtocolError):
        kind = type(exc)
    elif not isinstance(exc, Refused | httpx.ReadError):
        return  # (a timeout, a cancellation: the request's own end)
    raise kind(f"connection closed: {LOOP_LEFT}", request=request) from exc


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
