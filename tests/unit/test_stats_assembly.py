"""``compartment_stats``: the snapshot assembled from a compartment's slots and connections
(the integration tests read it through ``statistics()``; this pins each field's source)."""

from __future__ import annotations

import random
from typing import Any

from httpx_bulkhead._config import Policy
from httpx_bulkhead._pool import Discard, Pool, PoolEntry
from httpx_bulkhead._slots import Slots
from httpx_bulkhead._stats import FAILED, compartment_stats


class _H2:
    def __init__(self, open_streams: int, cap: int) -> None:
        self.open_streams = open_streams
        self.cap = cap


class _Connections:
    """The fields ``compartment_stats`` reads of ``Connections`` (its pool is a real one)."""

    def __init__(self) -> None:
        self.pool: Pool[None] = Pool(
            max_connections=8, max_idle=8, idle_timeout=None, max_lifetime=None,
            lifetime_jitter=0.0, rng=random.Random(0),
        )  # fmt: skip
        self.timeouts = 2
        self.goaways = 3
        self.streams_reset = 4

    def http2(self) -> list[_H2]:
        return [_H2(5, 100), _H2(1, 10)]

    def proxied(self) -> int:
        return 11


def test_each_field_comes_from_its_source() -> None:
    slots = Slots("c", Policy(max_concurrency=3), lambda: 0.0)
    assert slots.limiter.try_acquire()
    slots.release(FAILED)
    slots.timeouts = 7
    conns = _Connections()
    pool = conns.pool
    pool.checkout(("http", "a", 80), 0)  # a place to dial
    entry: PoolEntry[None] = PoolEntry(("http", "a", 80), None)
    pool.dialed(entry, 0)
    pool.release(entry, 1, reusable=True)  # idle now
    pool.total, pool.created = 6, 9
    for i, reason in enumerate(Discard):
        pool.discards[reason] = 10 + i
    conn_fields: Any = conns
    stats = compartment_stats(
        "c", slots, conn_fields, stale_retries=1, replays=2, leaked_responses=3
    )
    assert stats.acquire_timeouts == 9  # slot waits and connection waits
    assert (stats.connections, stats.idle_connections, stats.in_use_connections) == (6, 1, 5)
    assert (stats.acquired, stats.failed, stats.completed) == (1, 1, 0)
    assert stats.connections_created == 9
    for i, reason in enumerate(Discard):
        name = "ping_timeouts" if reason is Discard.PING_TIMEOUT else reason.value
        assert getattr(stats, name) == 10 + i, name
    assert (stats.http2_connections, stats.open_streams, stats.stream_caps) == (2, 6, (10, 100))
    assert (stats.goaways, stats.streams_reset) == (3, 4)
    assert stats.proxied_connections == 11
    assert (stats.stale_retries, stats.replays, stats.leaked_responses) == (1, 2, 3)
