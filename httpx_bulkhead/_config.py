"""Policy (one compartment's numbers), route keys (which requests share a compartment) and
groups (one compartment for several route keys).

Both are immutable and validated on construction: a bad value raises ``TypeError`` or
``ValueError`` naming the field, so a typo fails at start-up rather than under load.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass
from typing import NamedTuple, TypeAlias

import httpx
import idna

from ._adaptive import AdaptiveLimit
from ._fleet_config import RedisFleetLimit

__all__ = [
    "DEFAULT_IDLE_TIMEOUT",
    "DEFAULT_MAX_PENDING",
    "DEFAULT_PORTS",
    "Group",
    "HTTPVersions",
    "Origin",
    "Policy",
    "RouteKey",
    "canonical_host",
    "parse_route_key",
]

#: Idle connections are closed after this many seconds: below Node's 5 s ``keepAliveTimeout``
#: so we, not the server, close first.
DEFAULT_IDLE_TIMEOUT = 4.0
#: Waiters a compartment queues before rejecting at once (Envoy's ``max_pending_requests``).
DEFAULT_MAX_PENDING = 1024
DEFAULT_MAX_CONCURRENCY = 100
DEFAULT_LIFETIME_JITTER = 0.1
#: HTTP/2 streams we open per connection at most (the peer's cap applies too).
DEFAULT_MAX_STREAMS = 100
DEFAULT_PING_TIMEOUT = 5.0


def _check_int(
    name: str, value: object, minimum: int, *, optional: bool = False, adaptive: bool = False
) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        kind = "an int or None" if optional else "an int"
        kind = "an int or an AdaptiveLimit" if adaptive else kind
        raise TypeError(f"Policy.{name} must be {kind}, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"Policy.{name} must be >= {minimum}, got {value}")


def _check_seconds(name: str, value: object, *, allow_zero: bool, optional: bool = True) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"Policy.{name} must be a number of seconds or None, got {value!r}")
    if math.isnan(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"Policy.{name} must be {bound} seconds, got {value!r}")


@dataclass(frozen=True, slots=True)
class Policy:
    """The numbers of one compartment.

    Args:
        max_concurrency: requests in flight at once (from slot acquired to response
            closed). Default 100. ``0 <= running <= max_concurrency`` always holds. An
            ``AdaptiveLimit`` lets an algorithm move the limit within its
            ``[min_limit, max_limit]`` as the dependency's latency and drops change.
        max_pending: requests allowed to wait for a slot; when the queue is full a new
            request fails at once with ``BulkheadFull``. Default 1024; ``None`` means
            unbounded; ``0`` means never wait.
        acquire_timeout: longest wait, in seconds, for a slot and a usable connection, then
            ``AcquireTimeout``. httpx's ``timeout.pool`` also applies and the shorter wins.
            ``None`` (default) leaves only httpx's pool timeout; ``0`` means never wait.
        request_timeout: total deadline in seconds from slot acquired to response body read
            (or response closed); when it passes the exchange is abandoned, its connection
            closed, the slot freed and ``RequestTimeout`` raised. ``None`` (default): no
            total deadline, only httpx's per-operation timeouts.
        max_connections: connections the compartment may hold open. ``None`` (default)
            means ``max_concurrency`` (an ``AdaptiveLimit``'s ``max_limit``, the most it
            may allow): HTTP/1.1 needs one connection per request in flight.
        max_idle_connections: idle connections kept for reuse; surplus ones are closed when
            released. ``None`` (default) means ``max_connections``.
        idle_timeout: seconds an idle connection is kept. Default 4.0, below Node's 5 s
            keep-alive; a server's ``Keep-Alive: timeout=N`` shortens it to below N.
            ``None`` means never expire.
        max_lifetime: seconds a connection may live, so traffic rebalances onto new servers.
            A connection past it is closed when it next becomes idle, never mid-request.
            ``None`` (default) means no limit.
        lifetime_jitter: each connection's lifetime is drawn uniformly from
            ``max_lifetime * [1 - lifetime_jitter, 1]`` so connections do not expire
            together. Default 0.1; 0 disables jitter. Must be in ``[0, 1)``.
        max_streams_per_connection: HTTP/2 only: our cap on concurrent streams per
            connection; the peer's SETTINGS_MAX_CONCURRENT_STREAMS applies too and the lower
            wins. Default 100; ``None`` means the peer's value alone.
        ping_after: HTTP/2 only: a connection silent this many seconds is checked with a
            PING before it is reused, and closed if the PING is not answered within
            ``ping_timeout``. ``None`` (default) disables the check.
        ping_timeout: seconds to wait for a PING answer. Default 5.0.
        leak_threshold: seconds a slot may be held (from acquire to response closed)
            before it is reported as a possible leak: one WARNING on the
            ``httpx_bulkhead`` logger with the stack that acquired it, counted in
            ``slot_leaks``, and a second WARNING when it is released.  ``None`` (default)
            disables it (no stack captured, no timer).  Must be finite and > 0.
        fleet: a limit shared with every process that uses the same Redis key
            (``RedisFleetLimit``; the optional extra ``redis``, asyncio only).  A request
            takes a local slot first, then a fleet lease within what is left of the acquire
            timeout; both are given back together.  ``None`` (default): no fleet limit.
            On the default policy, every unlisted origin's compartment shares the one key.
    """

    max_concurrency: int | AdaptiveLimit = DEFAULT_MAX_CONCURRENCY
    max_pending: int | None = DEFAULT_MAX_PENDING
    acquire_timeout: float | None = None
    request_timeout: float | None = None
    max_connections: int | None = None
    max_idle_connections: int | None = None
    idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT
    max_lifetime: float | None = None
    lifetime_jitter: float = DEFAULT_LIFETIME_JITTER
    max_streams_per_connection: int | None = DEFAULT_MAX_STREAMS
    ping_after: float | None = None
    ping_timeout: float = DEFAULT_PING_TIMEOUT
    leak_threshold: float | None = None
    fleet: RedisFleetLimit | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_concurrency, AdaptiveLimit):
            _check_int("max_concurrency", self.max_concurrency, 1, adaptive=True)
        _check_int("max_pending", self.max_pending, 0, optional=True)
        _check_seconds("acquire_timeout", self.acquire_timeout, allow_zero=True)
        _check_seconds("request_timeout", self.request_timeout, allow_zero=False)
        _check_int("max_connections", self.max_connections, 1, optional=True)
        _check_int("max_idle_connections", self.max_idle_connections, 0, optional=True)
        _check_seconds("idle_timeout", self.idle_timeout, allow_zero=True)
        _check_seconds("max_lifetime", self.max_lifetime, allow_zero=False)
        _check_seconds("lifetime_jitter", self.lifetime_jitter, allow_zero=True, optional=False)
        _check_int("max_streams_per_connection", self.max_streams_per_connection, 1, optional=True)
        _check_seconds("ping_after", self.ping_after, allow_zero=True)
        _check_seconds("ping_timeout", self.ping_timeout, allow_zero=False, optional=False)
        _check_seconds("leak_threshold", self.leak_threshold, allow_zero=False)
        leak = self.leak_threshold
        if leak is not None and math.isinf(leak):
            raise ValueError(
                f"Policy.leak_threshold must be finite (None disables it), got {leak!r}"
            )
        if self.lifetime_jitter >= 1:
            raise ValueError(f"Policy.lifetime_jitter must be < 1, got {self.lifetime_jitter!r}")
        if self.fleet is not None and not isinstance(self.fleet, RedisFleetLimit):
            raise TypeError(
                f"Policy.fleet must be a RedisFleetLimit or None, got {type(self.fleet).__name__}"
            )

    @property
    def connection_limit(self) -> int:
        """``max_connections``, with ``None`` resolved to ``max_concurrency`` (an
        ``AdaptiveLimit``'s ``max_limit``)."""
        if self.max_connections is not None:
            return self.max_connections
        limit = self.max_concurrency
        return limit.max_limit if isinstance(limit, AdaptiveLimit) else limit

    @property
    def initial_limit(self) -> int:
        """The slots a compartment starts with: ``max_concurrency``, or an
        ``AdaptiveLimit``'s ``initial_limit``."""
        limit = self.max_concurrency
        return limit.initial_limit if isinstance(limit, AdaptiveLimit) else limit

    @property
    def idle_limit(self) -> int:
        """``max_idle_connections``, with ``None`` resolved to the connection limit."""
        if self.max_idle_connections is None:
            return self.connection_limit
        return self.max_idle_connections

    @classmethod
    def from_limits(cls, limits: httpx.Limits) -> Policy:
        """Map ``httpx.Limits`` onto a policy (applied per compartment, not globally).

        ``max_connections`` becomes ``max_concurrency`` (``None``: the default),
        ``max_keepalive_connections`` becomes ``max_idle_connections`` and
        ``keepalive_expiry`` becomes ``idle_timeout``.
        """
        if not isinstance(limits, httpx.Limits):
            raise TypeError(f"limits must be httpx.Limits, got {type(limits).__name__}")
        concurrency = limits.max_connections or DEFAULT_MAX_CONCURRENCY
        idle = limits.max_keepalive_connections
        return cls(
            max_concurrency=concurrency,
            max_idle_connections=None if idle is None else min(idle, concurrency),
            idle_timeout=limits.keepalive_expiry,
        )


#: A connection's destination: ``(scheme, host, port)``.  Routing picks a compartment by it,
#: the pool keeps connections by it.
Origin: TypeAlias = tuple[str, str, int]


class HTTPVersions:
    """Which HTTP versions the transport speaks (its ``http1``, ``http2``, ``http1_parser``)."""

    __slots__ = ("http1", "http1_parser", "http2")

    def __init__(self, http1: bool, http2: bool, http1_parser: str = "h11") -> None:
        self.http1 = http1
        self.http2 = http2
        self.http1_parser = http1_parser

    def may_multiplex(self, origin: Origin) -> bool:
        """HTTP/2 is possible by ALPN on https, or by prior knowledge on http when HTTP/1.1
        is off (there is no h2c upgrade, as in httpx's default transport)."""
        return self.http2 and (origin[0] == "https" or not self.http1)

    def speaks_h2(self, origin: Origin, alpn: str | None) -> bool:
        """Whether a connection to ``origin`` that negotiated ``alpn`` speaks HTTP/2."""
        if origin[0] == "https":
            return alpn == "h2"
        return self.http2 and not self.http1


#: The port of each scheme we speak, when a URL or route key has none.
DEFAULT_PORTS = {"http": 80, "https": 443}
#: A host name (or IPv4 address) after IDNA encoding: letters, digits, hyphens, dots, and
#: the underscores some internal names carry.
_HOSTNAME = re.compile(r"[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?")


#: Characters a path prefix may not hold: it is compared with the request's path before any
#: query or fragment, as a plain prefix (no globbing).
_PATH_FORBIDDEN = re.compile(r"[?#*\s]")


class RouteKey(NamedTuple):
    """A parsed route key: ``host``, ``host:port``, ``scheme://host[:port]``, each with an
    optional path prefix. ``scheme``/``port`` of ``None`` match any.  With ``wildcard``,
    ``host`` is a suffix: the key matches every host below it (``*.example.com``: any
    ``<labels>.example.com``, not ``example.com`` itself)."""

    scheme: str | None
    host: str
    port: int | None
    path: str | None
    wildcard: bool = False


def parse_route_key(text: object) -> RouteKey:
    """Parse a route key string.

    ``"api.example.com"`` (any scheme and port), ``"api.example.com:8443"``,
    ``"https://api.example.com"`` (port 443 implied), ``"[::1]:8080"``,
    ``"*.example.com"`` (every host below ``example.com``), each optionally followed by a
    path prefix such as ``"/v1/generate"``.

    Raises:
        TypeError: ``text`` is not a string.
        ValueError: it cannot be parsed, or has a shape routing does not understand
            (a query, a fragment, a glob, a wildcard anywhere but as the first label);
            the message names the key.
    """
    if not isinstance(text, str):
        raise TypeError(f"hosts keys must be strings, got {type(text).__name__}")
    rest = text.strip()
    scheme: str | None = None
    if "://" in rest:
        scheme, rest = rest.split("://", 1)
        scheme = scheme.lower()
        if scheme not in DEFAULT_PORTS:
            raise ValueError(f"hosts key {text!r}: scheme must be http or https")
    authority, slash, path = rest.partition("/")
    prefix = _path_prefix(path, text) if slash else None
    authority, wildcard = _wildcard(authority, text)
    host, port = _split_authority(authority, text)
    if wildcard and (":" in host or host.replace(".", "").isdigit()):
        raise ValueError(f"hosts key {text!r}: a wildcard cannot stand for part of an IP address")
    if port is None and scheme is not None:
        port = DEFAULT_PORTS[scheme]
    return RouteKey(scheme, host, port, prefix, wildcard)


def _wildcard(authority: str, text: str) -> tuple[str, bool]:
    """The authority without a leading ``*.``, and whether it had one; a ``*`` anywhere
    else is refused."""
    if authority.startswith("*."):
        return authority[2:], True
    if "*" in authority:
        hint = (
            "for every origin not listed, use BulkheadTransport(default=...)"
            if authority.split(":")[0] == "*"
            else "a wildcard is allowed only as the whole first label, as in '*.example.com'"
        )
        raise ValueError(f"hosts key {text!r}: {hint}")
    return authority, False


def _path_prefix(path: str, text: str) -> str | None:
    bad = _PATH_FORBIDDEN.search(path)
    if bad is not None:
        what = {"?": "a query", "#": "a fragment", "*": "a glob"}.get(bad.group(), "white space")
        raise ValueError(
            f"hosts key {text!r}: a path prefix cannot hold {what} ({bad.group()!r});"
            " keys match the path by prefix, so '/v1' covers '/v1/anything'"
        )
    prefix = "/" + path.rstrip("/")
    return None if prefix == "/" else prefix


@dataclass(frozen=True, slots=True, init=False)
class Group:
    """Several route keys that share one compartment (one limit, one queue, one pool per
    origin inside it), named by its key in ``hosts``::

        hosts={"payments": Group("api.stripe.com", "*.adyen.com", policy=Policy(...))}

    Args:
        *routes: route keys, in any shape a ``hosts`` key may take (at least one).
        policy: the compartment's numbers (default ``Policy()``).

    Raises:
        TypeError, ValueError: a route or the policy is invalid (the message names it).
    """

    routes: tuple[str, ...]
    policy: Policy

    def __init__(self, *routes: str, policy: Policy | None = None) -> None:
        if not routes:
            raise ValueError("Group needs at least one route key")
        if policy is None:
            policy = Policy()
        elif not isinstance(policy, Policy):
            raise TypeError(f"Group.policy must be a Policy, got {type(policy).__name__}")
        for route in routes:
            parse_route_key(route)  # fail at construction, naming the key
        object.__setattr__(self, "routes", routes)
        object.__setattr__(self, "policy", policy)

    def __repr__(self) -> str:
        routes = ", ".join(repr(route) for route in self.routes)
        return f"Group({routes}, policy={self.policy!r})"


def _split_authority(authority: str, text: str) -> tuple[str, int | None]:
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise ValueError(f"hosts key {text!r}: unterminated IPv6 literal")
        host, tail = authority[1:end], authority[end + 1 :]
        port_text = tail[1:] if tail.startswith(":") else None
        if tail and port_text is None:
            raise ValueError(f"hosts key {text!r}: unexpected {tail!r} after the host")
    elif authority.count(":") == 1:
        host, port_text = authority.split(":")
    else:
        host, port_text = authority, None
    try:
        host = canonical_host(host)
    except ValueError as exc:
        raise ValueError(f"hosts key {text!r}: invalid host ({exc})") from None
    if ":" in host:
        if not authority.startswith("["):
            raise ValueError(f"hosts key {text!r}: an IPv6 address must be in brackets")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"hosts key {text!r}: invalid IPv6 address") from None
    elif authority.startswith("["):  # brackets hold IPv6 literals only (RFC 3986 §3.2.2)
        raise ValueError(f"hosts key {text!r}: only an IPv6 address goes in brackets")
    elif not _HOSTNAME.fullmatch(host):
        raise ValueError(f"hosts key {text!r}: invalid host")
    if port_text is None:
        return host, None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"hosts key {text!r}: invalid port {port_text!r}")
    return host, int(port_text)


def canonical_host(host: str) -> str:
    """The one spelling of a host that routing compares: lower case, an internationalized
    name as punycode (IDNA 2008, as httpx encodes it), no trailing dot (``example.com.`` is
    the same host, RFC 1034 §3.1), an IPv6 literal in its compressed form (RFC 5952).

    Raises:
        ValueError: a name IDNA cannot encode.
    """
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host).compressed
        except ValueError:
            return host.lower()
    if not host.isascii():
        try:
            host = idna.encode(host.lower().rstrip(".")).decode("ascii")
        except idna.IDNAError as exc:
            raise ValueError(f"cannot encode {host!r} with IDNA: {exc}") from None
    host = host.lower()
    stripped = host.rstrip(".")
    return stripped or host
