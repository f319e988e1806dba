"""``RedisFleetLimit``: the numbers of one fleet-wide limit, and ``FleetStats``, its snapshot.

Frozen and validated on construction, like ``Policy``: a bad value raises ``TypeError`` or
``ValueError`` naming the field.  A Redis URL may carry a password: neither ``repr`` nor an
error message ever shows it (the userinfo part is replaced by ``***``).
"""

from __future__ import annotations

import math
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = [
    "DEFAULT_LEASE",
    "DEFAULT_POLL_INTERVAL",
    "DEFAULT_REDIS_TIMEOUT",
    "DEFAULT_RETRY_INTERVAL",
    "FleetStats",
    "OnUnavailable",
    "RedisFleetLimit",
    "redact_url",
]

OnUnavailable = Literal["local", "reject"]

#: Seconds a lease lives in Redis unless renewed (renewed every third of it).
DEFAULT_LEASE = 30.0
#: Longest wait for one Redis round trip (the acquire budget left cuts it shorter).
DEFAULT_REDIS_TIMEOUT = 0.5
#: Seconds between two tries of a waiter when no release is announced (jittered by ±50%).
DEFAULT_POLL_INTERVAL = 0.5
#: While Redis is unavailable, requests do not ask it again for this many seconds.
DEFAULT_RETRY_INTERVAL = 1.0
#: Seconds a waiting process keeps its place in the fleet's line without trying again.
DEFAULT_WAIT_TTL = 2.0

_SCHEMES = ("redis", "rediss", "unix")


def redact_url(url: str) -> str:
    """``url`` with its userinfo (user and password) replaced by ``***``."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"***@{host}"))


def _check_seconds(name: str, value: object, *, minimum: float = 0.0) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"RedisFleetLimit.{name} must be a number of seconds, got {value!r}")
    if math.isnan(value) or math.isinf(value) or value <= minimum:
        raise ValueError(f"RedisFleetLimit.{name} must be > {minimum:g} seconds, got {value!r}")


@dataclass(frozen=True, slots=True)
class RedisFleetLimit:
    """A concurrency limit shared by every process that uses the same Redis ``key``.

    Args:
        url_or_client: a Redis URL (``redis://``, ``rediss://``, ``unix://``; the limiter
            makes and closes its own client, with ``redis_timeout`` as socket timeouts and
            no retries of its own), or a ``redis.asyncio.Redis`` you own (it is not closed).
            One Redis server (or a Sentinel-managed primary); Redis Cluster is not supported.
        key: the name shared by the fleet; the limiter uses ``{key}:leases``,
            ``{key}:waiters``, ``{key}:waiting-until`` and the channel ``{key}:free``.
        limit: leases held at once across the fleet; at least 1.
        lease: seconds a lease lives unless renewed. Default 30. A process killed while
            holding leases gives them back after at most this long. Held leases are renewed
            every ``lease / 3`` by one task per process. Every process of the fleet should
            use the same value.
        on_unavailable: when Redis does not answer (refused, reset, or no reply within
            ``redis_timeout``): ``"local"`` (default) admits on the local limit alone and
            counts a fallback; ``"reject"`` raises ``FleetUnavailable``. Either way the
            limiter asks Redis again after ``retry_interval`` and recovers by itself.
        redis_timeout: longest wait for one Redis round trip, in seconds. Default 0.5.
            The acquire budget left cuts it shorter; keep it well below the acquire timeout.
        poll_interval: seconds between two tries of a waiting process when no release is
            announced (announcements come over pub/sub), jittered by ±50%. Default 0.5.
        retry_interval: while Redis is unavailable, seconds before a request asks it again
            (requests in between fall back or are rejected at once). Default 1.0.
    """

    url_or_client: str | Redis
    key: str
    limit: int
    lease: float = DEFAULT_LEASE
    on_unavailable: OnUnavailable = "local"
    redis_timeout: float = DEFAULT_REDIS_TIMEOUT
    poll_interval: float = DEFAULT_POLL_INTERVAL
    retry_interval: float = DEFAULT_RETRY_INTERVAL

    def __post_init__(self) -> None:
        _check_target(self.url_or_client)
        if not isinstance(self.key, str):
            raise TypeError(f"RedisFleetLimit.key must be a str, got {type(self.key).__name__}")
        if not self.key or self.key != self.key.strip():
            raise ValueError(
                f"RedisFleetLimit.key must be non-empty, without surrounding white space,"
                f" got {self.key!r}"
            )
        if isinstance(self.limit, bool) or not isinstance(self.limit, int):
            raise TypeError(f"RedisFleetLimit.limit must be an int, got {self.limit!r}")
        if self.limit < 1:
            raise ValueError(f"RedisFleetLimit.limit must be >= 1, got {self.limit}")
        _check_seconds("lease", self.lease, minimum=0.0)
        if self.lease < 0.01:
            raise ValueError(f"RedisFleetLimit.lease must be >= 0.01 seconds, got {self.lease!r}")
        if self.on_unavailable not in ("local", "reject"):
            raise ValueError(
                "RedisFleetLimit.on_unavailable must be 'local' or 'reject',"
                f" got {self.on_unavailable!r}"
            )
        _check_seconds("redis_timeout", self.redis_timeout)
        _check_seconds("poll_interval", self.poll_interval)
        _check_seconds("retry_interval", self.retry_interval)

    def __repr__(self) -> str:
        target = self.url_or_client
        shown = redact_url(target) if isinstance(target, str) else f"<{type(target).__name__}>"
        return (
            f"RedisFleetLimit({shown!r}, key={self.key!r}, limit={self.limit},"
            f" lease={self.lease!r}, on_unavailable={self.on_unavailable!r},"
            f" redis_timeout={self.redis_timeout!r}, poll_interval={self.poll_interval!r},"
            f" retry_interval={self.retry_interval!r})"
        )


def _check_target(target: object) -> None:
    try:
        import redis.asyncio
    except ImportError as exc:  # the optional extra is missing
        raise ImportError(
            "RedisFleetLimit needs redis-py: pip install 'httpx-bulkhead[redis]'"
        ) from exc
    if isinstance(target, str):
        scheme = target.partition("://")[0].lower() if "://" in target else ""
        if scheme not in _SCHEMES:
            raise ValueError(
                "RedisFleetLimit.url_or_client must be a redis://, rediss:// or unix:// URL,"
                f" got {redact_url(target)!r}"
            )
        return
    if isinstance(target, redis.Redis):
        raise TypeError(
            "RedisFleetLimit.url_or_client must be a redis.asyncio.Redis, got the synchronous"
            " redis.Redis"
        )
    if not isinstance(target, redis.asyncio.Redis):
        raise TypeError(
            "RedisFleetLimit.url_or_client must be a Redis URL or a redis.asyncio.Redis,"
            f" got {type(target).__name__}"
        )


@dataclass(frozen=True, slots=True)
class FleetStats:
    """A snapshot of one process's side of a fleet limit (debugging information).

    Attributes:
        limit: the configured fleet-wide limit.
        held: leases this process holds in Redis now.
        held_local: requests admitted on the local limit alone (Redis was unavailable, or
            their lease was lost) that are still running; they are re-registered in Redis
            (even past the limit) once it answers again, so the fleet count is honest.
        waiting: requests of this process waiting for a lease.
        fleet_in_use: leases held across the fleet as Redis last reported; ``None`` before
            the first answer.
        available: whether Redis answered the last time it was asked.
        subscribed: whether release announcements are being received (pub/sub); without
            them waiters still poll.
        acquired: leases granted by Redis.
        round_trips: Redis calls made (acquire, release, renewal), answered or not.
        fallbacks: requests admitted without a lease because Redis was unavailable.
        outages: transitions from available to unavailable.
        rejected: requests refused with ``FleetUnavailable``.
        timeouts: requests that got no lease within their budget.
        renewals: leases renewed (each lease of a renewal round counts once).
        lost: leases found gone at renewal (expired, or Redis lost its data); the request
            went on.
    """

    limit: int
    held: int
    held_local: int
    waiting: int
    fleet_in_use: int | None
    available: bool
    subscribed: bool
    acquired: int
    round_trips: int
    fallbacks: int
    outages: int
    rejected: int
    timeouts: int
    renewals: int
    lost: int
