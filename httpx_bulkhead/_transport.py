"""``BulkheadTransport``: routes each request to its compartment and maps the outcome."""

from __future__ import annotations

import random
import ssl
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterable, Mapping
from types import TracebackType
from typing import NoReturn

import anyio
import httpx

from ._compartment import Compartment
from ._config import DEFAULT_PORTS, Group, HTTPVersions, Origin, Policy
from ._events import Events, Listener
from ._exceptions import TransportClosed
from ._log import log_debug
from ._network import Connector, Network, SocketOption, set_alpn
from ._parser_choice import choose_parser, log_choice
from ._proxied import proxy_ssl_context
from ._proxy_config import ProxyKind, ProxyRoutes, ProxyValue, proxy_routes
from ._respx import MOCKS_MODULE, respx_response
from ._routing import Router
from ._stats import EVICTED, CompartmentStats, fold_evicted
from ._timers import Timers, current_loop, running_loop

__all__ = ["BulkheadTransport"]

#: ``DEFAULT_PORTS`` by raw (bytes) scheme, as the URL gives it without decoding.
_DEFAULT_PORTS = {scheme.encode("ascii"): port for scheme, port in DEFAULT_PORTS.items()}
_modules = sys.modules

_NO_LOOP = object()  # before the first request (``current_loop`` may say ``None``)

#: Compartments kept for unlisted origins before those at rest are evicted.
DEFAULT_MAX_DEFAULT_COMPARTMENTS = 1024
#: Longest ``statistics()`` waits, from another thread, for the transport's event loop.
STATISTICS_THREAD_WAIT = 1.0
# unasync: skip
#: Raised (``TypeError``) when a synchronous ``httpx.Client`` is given this transport.
SYNC_CLIENT_ERROR = (
    "BulkheadTransport is an async transport: use it with httpx.AsyncClient, not"
    " httpx.Client. For httpx.Client use httpx_bulkhead.BulkheadHTTPTransport, the same"
    " transport for threads (same arguments, policies and statistics)"
)
# unasync: end


class BulkheadTransport(httpx.AsyncBaseTransport):
    """An httpx transport for ``httpx.AsyncClient`` that gives each dependency its own bulkhead.

    Each compartment (an unlisted origin, or a key of ``hosts``) has its own slots, bounded
    FIFO wait queue, acquire timeout and connection pool, so one slow dependency cannot take
    the connections or queue places of another.

    Args:
        default: policy of the compartment each origin *not* listed in ``hosts`` gets (one
            compartment per origin).  ``None`` (default): ``Policy()``, or ``limits`` mapped.
        hosts: route key -> ``Policy``, or a name -> ``Group`` (several route keys, one
            compartment).  Keys are ``"host"``, ``"host:port"``,
            ``"scheme://host[:port]"``, with ``"*.example.com"`` for every host below a
            domain, each optionally followed by a path prefix
            (``"api.example.com/v1/generate"``); the most specific match wins and the
            longest path prefix beats a host-level key.  A key of any other shape raises
            ``ValueError``.
        limits: ``httpx.Limits`` mapped onto the default policy (per compartment); give
            either this or ``default``.
        verify, cert, trust_env: TLS settings, as for ``httpx.AsyncHTTPTransport``
            (verification is on by default).  ``trust_env`` also reads the proxy
            variables (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``, ``NO_PROXY``) as
            httpx's client does, unless ``proxy`` is given.
        proxy: a URL string, ``httpx.URL`` or ``httpx.Proxy`` (``auth``, ``headers``,
            ``ssl_context``) every request goes through: ``http://`` and ``https://``
            proxies (forwarding for ``http://`` targets, a ``CONNECT`` tunnel for
            ``https://`` ones), ``socks5://`` (we resolve the target's name) and
            ``socks5h://`` (the proxy does).  Compartments stay keyed by the target.
            ``None`` (default): the environment's, with ``trust_env``.
        http1, http2: the HTTP versions spoken, as for ``httpx.AsyncHTTPTransport``: HTTP/2
            is negotiated by ALPN on https; on http it is used (h2c, prior knowledge) only
            when ``http1=False``.
        retries: connect retries, as for ``httpx.AsyncHTTPTransport``.
        local_address, uds, socket_options: as for ``httpx.AsyncHTTPTransport``.
        http1_parser: ``"h11"`` (pure Python, the reference) or ``"httptools"`` (llhttp,
            several times cheaper per request; ``pip install 'httpx-bulkhead[fast]'``).
            ``None`` (default): the ``HTTPX_BULKHEAD_HTTP1_PARSER`` environment variable
            (``h11`` or ``httptools``; empty means unset), read here, else httptools when
            it can be imported (0.6 or later, as the ``fast`` extra), else h11.  The
            choice is the ``http1_parser`` attribute (and a DEBUG line of the
            ``httpx_bulkhead`` logger).  Both give one verdict on every request and
            response.
        network: where connections come from; ``None`` (default) means real sockets.
            Tests pass ``httpx_bulkhead.testing.MockNetwork(handler)`` to run every
            compartment rule against an in-memory server.
        max_default_compartments: compartments kept for origins not listed in ``hosts``
            (one per origin).  Beyond it, the least recently used ones *at rest* (no
            request in flight or waiting, no connection in use) are evicted: their idle
            connections closed, their counters added to the ``"(evicted)"`` entry of
            ``statistics()``.  A busy compartment is never evicted.  Default 1024;
            ``None`` means never evict.

    Raises:
        TypeError, ValueError: invalid configuration (the message names the field); an
            unknown ``http1_parser`` or ``HTTPX_BULKHEAD_HTTP1_PARSER`` value, or
            ``httptools`` asked for when it cannot be imported (or is older than 0.6), is a
            ``ValueError`` naming the argument or the variable.
        TypeError: used by a synchronous ``httpx.Client`` (``__enter__``,
            ``handle_request``, ``close``); the message says what to use instead.
    """

    def __init__(
        self,
        default: Policy | None = None,
        hosts: Mapping[str, Policy | Group] | None = None,
        *,
        limits: httpx.Limits | None = None,
        verify: ssl.SSLContext | str | bool = True,
        cert: httpx._types.CertTypes | None = None,
        trust_env: bool = True,
        proxy: ProxyValue | None = None,
        http1: bool = True,
        http2: bool = False,
        retries: int = 0,
        local_address: str | None = None,
        uds: str | None = None,
        socket_options: Iterable[SocketOption] | None = None,
        network: Network | None = None,
        http1_parser: str | None = None,
        max_default_compartments: int | None = DEFAULT_MAX_DEFAULT_COMPARTMENTS,
        _clock: Callable[[], float] = time.monotonic,
        _rng: random.Random | None = None,
    ) -> None:
        default = _default_policy(default, limits)
        _check(http1, http2, retries, max_default_compartments)
        context = httpx.create_ssl_context(verify=verify, cert=cert, trust_env=trust_env)
        set_alpn(context, (["h2"] if http2 else []) + (["http/1.1"] if http1 else []))
        choice = choose_parser(http1_parser)
        self._versions = HTTPVersions(http1=http1, http2=http2, http1_parser=choice.parser)
        proxies = _proxies(proxy, trust_env, uds, network)
        self._connector: Network = network or Connector(
            ssl_context=context,
            local_address=local_address,
            uds=uds,
            socket_options=tuple(socket_options or ()),
            retries=retries,
            proxies=proxies,
            proxy_ssl_context=_proxy_context(proxies, trust_env),
        )
        self._clock = _clock
        self._rng = _rng or random.Random()  # one for every pool: lifetime jitter
        self._timers = Timers()
        self._loop: object = _NO_LOOP  # the loop that owns the transport (``current_loop``)
        self._evicted: CompartmentStats | None = None
        self._events = Events()  # the exporters' per-event figures (``_events.py``)
        self._router: Router[Compartment] = Router(
            hosts or {},
            default,
            self._compartment,
            max_default=max_default_compartments,
            at_rest=Compartment.at_rest,
            uses=lambda compartment: compartment.uses,
        )
        self._closed = False
        log_choice(type(self).__name__, choice)

    @property
    def http1_parser(self) -> str:
        """The HTTP/1.1 parser this transport runs: ``"h11"`` or ``"httptools"`` (see
        ``http1_parser=``; read-only, fixed at construction)."""
        return self._versions.http1_parser

    def _compartment(self, name: str, policy: Policy) -> Compartment:
        compartment = Compartment(
            name,
            policy,
            self._connector,
            self._versions,
            timers=self._timers,
            clock=self._clock,
            rng=self._rng,
        )
        compartment.sink = self._events.sink(name)
        return compartment

    def _listen(self, listener: Listener, *, on: bool = True) -> None:
        """For the exporters: start (``on``) or stop feeding ``listener`` the per-event
        figures of every compartment (``_events.py``).  Done on the transport's event loop
        when it runs (so a compartment made meanwhile gets its sink), else directly."""

        def apply() -> None:
            events = self._events
            if events.attach(listener) if on else events.detach(listener):
                for name, compartment in list(self._router.compartments.items()):
                    compartment.sink = events.sink(name)

        done, _ = self._timers.run_in_loop(apply, STATISTICS_THREAD_WAIT)
        if not done:
            apply()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` through its compartment.

        Raises:
            BulkheadFull, AcquireTimeout, TransportClosed, RequestTimeout, and the httpx
            exceptions of the default transport (``ConnectError``, ``ReadTimeout``, ...).
        """
        if _modules.get(MOCKS_MODULE) is not None:  # respx is loaded: is it mocking?
            mocked = await respx_response(request)
            if mocked is not None:
                return mocked
        if self._closed:
            raise TransportClosed("the transport is closed", request=request)
        # The first request, or one from another loop (asyncio: one C call; trio: two).
        if running_loop() is not self._loop and current_loop() is not self._loop:
            await self._adopt()
        origin = _origin(request)
        router = self._router
        compartment = router.route(origin, request.url.path)
        if router.retired:
            await self._retire()
        return await compartment.handle(request, origin)

    async def _adopt(self) -> None:
        """The first request binds the transport (its timers) to the loop it runs on."""
        previous, self._loop = self._loop, current_loop()
        self._timers.bind()  # (hand-offs from other threads now come to this loop)
        # unasync: skip
        if previous is not _NO_LOOP:
            await self._abandon()
        # unasync: end

    # unasync: skip
    async def _abandon(self) -> None:
        """A request from another event loop takes the transport over.

        Theory of operation: one event loop at a time
        ---------------------------------------------
        Connections, waiters and timers belong to the event loop they were made on.  The
        transport belongs to the loop of its latest request: the first request binds it,
        and a request from another loop (a module-level client used by ``asyncio.run``
        twice, or by pytest's per-test loops; ``trio.run`` twice) hands it over before it
        is routed (``handle_async_request``: one call and one identity comparison per
        request).  The hand-over is synchronous up to the closing of sockets, so no other
        request can slip in half-way:

        * every connection of the old loop is discarded (counted as ``loop_changed``) and
          its socket closed without the old loop (a closed loop runs nothing; an open one
          that is not running finishes closing it when it runs again), HTTP/1.1 and
          HTTP/2 alike (``Connections.abandon``, ``Pool.abandon``);
        * waiters of the old loop, for a slot or a connection, leave the queues unwoken
          (waking a task of a closed loop raises), counted as ``cancelled_waiting``;
        * timers rebind to the new loop, and those armed on the old one (idle sweeps, an
          adaptive limit's headroom test) are armed again;
        * a fleet limit's own Redis client, listener and events are dropped (its sockets
          closed without the old loop) and made anew on the new loop; leases given back
          at the old loop's end are removed from Redis from the new one
          (``FleetLimiter.abandon``);
        * a request still under way on the old loop is not carried over: its connection
          is closed, and if its loop runs again it fails naming the hand-over
          (``httpx.ReadError`` or ``WriteError`` for a cut exchange, never sent again;
          ``TransportClosed`` for a dial that completes late, closed, not pooled, or for
          a connection it would need: the pool's ``epoch``); the slot it holds is held
          until it ends, as any request's.  ``asyncio.run`` and ``trio.run`` end every
          task before they return, so in their case nothing is under way by then.

        So the counters hold nothing in use, idle or waiting from the old loop.  ``aclose``
        from another loop hands over first, then closes.  Using one transport from two
        loops *at once* (threads) is not supported."""
        closings: list[Awaitable[None]] = []
        for compartment in list(self._router.compartments.values()):
            closing = compartment.abandon()
            if closing is not None:
                closings.append(closing)
            log_debug(
                "loop_changed",
                compartment.name,
                "the transport is used from another event loop: the connections and"
                " waiters of the loop it left are dropped",
                reason="loop_changed",
            )
        with anyio.CancelScope(shield=True):
            for finishing in closings:
                await finishing

    # unasync: end

    async def _retire(self) -> None:
        """Close what the router evicted and keep its counters.  The router no longer holds
        them, so nobody else would close them: every one is retired before the first await,
        and their closing is shielded from the caller's cancellation (it is bounded: the
        connections are aborted first, a fleet's Redis calls have ``redis_timeout``)."""
        retired, self._router.retired = self._router.retired, []
        closings: list[Awaitable[None]] = []
        for compartment in retired:
            closing = compartment.retire()
            # After ``retire``: the idle connections it closes count as ``closed``.
            self._evicted = fold_evicted(self._evicted, compartment.statistics())
            self._events.retire(compartment.name)
            log_debug(
                "evicted",
                compartment.name,
                "evicted (at rest, least recently used of more than max_default_compartments)",
                reason="max_default_compartments",
            )
            if closing is not None:
                closings.append(closing)
        with anyio.CancelScope(shield=True):
            for finishing in closings:
                await finishing

    def statistics(self) -> dict[str, CompartmentStats]:
        """A snapshot of every compartment, by name (see ``CompartmentStats``), plus
        ``"(evicted)"`` with the counters of evicted compartments, once there are any.

        Safe from any thread: from a thread other than the event loop's, the snapshot is
        taken on the loop between two of its steps, so it is consistent (the call waits up
        to ``STATISTICS_THREAD_WAIT`` seconds for a busy loop, then reads directly: the
        numbers are then each correct but may not agree with one another).
        """
        done, snapshot = self._timers.run_in_loop(self._snapshot, STATISTICS_THREAD_WAIT)
        return snapshot if done and snapshot is not None else self._snapshot()

    def _snapshot(self) -> dict[str, CompartmentStats]:
        compartments = list(self._router.compartments.items())  # one C-level copy
        stats = {name: c.statistics() for name, c in compartments}
        if self._evicted is not None:
            stats[EVICTED] = self._evicted
        return stats

    async def aclose(self) -> None:
        """Close every connection; waiters fail with ``TransportClosed``, and so do requests
        made afterwards.  Requests in flight fail with a read or write error.  Nothing of
        the transport runs after this returns (its timers are stopped)."""
        if self._closed:
            return
        if running_loop() is not self._loop and current_loop() is not self._loop:
            await self._adopt()  # (from another loop: what the old one holds goes first)
        self._closed = True
        for compartment in list(self._router.compartments.values()):
            await compartment.aclose()
        if self._router.retired:
            await self._retire()
        await self._timers.aclose()

    async def __aenter__(self) -> BulkheadTransport:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        await self.aclose()

    # unasync: skip
    # A synchronous client (``httpx.Client``) calls these: say what to use instead, rather
    # than an AttributeError about ``__enter__``.
    def __enter__(self) -> NoReturn:
        raise TypeError(SYNC_CLIENT_ERROR)

    def handle_request(self, request: httpx.Request) -> NoReturn:
        raise TypeError(SYNC_CLIENT_ERROR)

    def close(self) -> NoReturn:
        raise TypeError(SYNC_CLIENT_ERROR + " (to close this transport: await transport.aclose())")

    # unasync: end


def _default_policy(default: Policy | None, limits: httpx.Limits | None) -> Policy:
    if default is not None and limits is not None:
        raise TypeError("give either default= or limits=, not both")
    if default is None:
        return Policy() if limits is None else Policy.from_limits(limits)
    if not isinstance(default, Policy):
        raise TypeError(f"default must be a Policy, got {type(default).__name__}")
    return default


def _proxies(
    proxy: ProxyValue | None, trust_env: bool, uds: str | None, network: Network | None
) -> ProxyRoutes:
    """The proxy table: ``proxy=``, else the environment's with ``trust_env`` (read once,
    here, as httpx's client does).  A ``network`` (``MockNetwork``) or a Unix socket
    (``uds``) has no proxies: the environment is not read for them, and ``proxy=`` with
    either is refused."""
    if proxy is not None and network is not None:
        raise ValueError("proxy= cannot be used with network= (a MockNetwork has no proxies)")
    if proxy is not None and uds is not None:
        raise ValueError("proxy= cannot be used with uds= (give one or the other)")
    read_env = trust_env and proxy is None and network is None and uds is None
    return proxy_routes(
        proxy,
        trust_env=read_env,
        proxy_info=urllib.request.getproxies() if read_env else {},
    )


def _proxy_context(routes: ProxyRoutes, trust_env: bool) -> ssl.SSLContext | None:
    if any(spec.kind is ProxyKind.HTTPS and spec.ssl_context is None for spec in routes.proxies):
        return proxy_ssl_context(trust_env)
    return None


def _check(http1: bool, http2: bool, retries: int, bound: int | None) -> None:
    if not (http1 or http2):
        raise ValueError("http1 and http2 are both False: no HTTP version left to speak")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an int >= 0, got {retries!r}")
    if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int)):
        raise TypeError(f"max_default_compartments must be an int or None, got {bound!r}")
    if bound is not None and bound < 1:
        raise ValueError(f"max_default_compartments must be >= 1, got {bound!r}")


def _origin(request: httpx.Request) -> Origin:
    """``(scheme, host, port)`` of the request's URL, the scheme's default port filled in."""
    url = request.url
    scheme = url.raw_scheme
    if scheme not in _DEFAULT_PORTS:
        raise httpx.UnsupportedProtocol(
            f"Request URL has an unsupported protocol '{url.scheme}://'.", request=request
        )
    if not url.raw_host:
        raise httpx.UnsupportedProtocol("Request URL is missing a host.", request=request)
    return (url.scheme, url.host, url.port or _DEFAULT_PORTS[scheme])
