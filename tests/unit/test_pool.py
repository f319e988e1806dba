"""Connection selection, expiry and connection waiters, with a clock we drive by hand."""

from __future__ import annotations

import math
import random

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from httpx_bulkhead._pool import DIAL, Discard, Pool, PoolEntry, PoolWaiter, keep_alive_deadline

A = ("http", "a", 80)
B = ("http", "b", 80)


def make_pool(**kw: object) -> Pool[None]:
    options: dict[str, object] = {
        "max_connections": 4,
        "max_idle": 4,
        "idle_timeout": 10.0,
        "max_lifetime": None,
        "lifetime_jitter": 0.0,
    }
    options.update(kw)
    return Pool(**options)  # type: ignore[arg-type]


def dial(
    pool: Pool[None], origin: tuple[str, str, int], now: float, *, multiplexed: bool = False
) -> PoolEntry[None]:
    grant, closing = pool.checkout(origin, now)
    assert grant is DIAL and closing == []
    entry = PoolEntry(origin, None)
    pool.dialed(entry, now, multiplexed=multiplexed)
    return entry


def test_reuses_most_recently_released_connection_lifo() -> None:
    pool = make_pool()
    first, second = dial(pool, A, 0), dial(pool, A, 0)
    assert pool.release(first, 1, reusable=True) == []
    assert pool.release(second, 2, reusable=True) == []
    grant, _ = pool.checkout(A, 3)
    assert grant is second and second.served == 2
    assert pool.idle == 1 and pool.total == 2


def test_idle_expiry_is_checked_at_checkout_and_pruned_oldest_first() -> None:
    pool = make_pool(idle_timeout=5.0)
    old, new = dial(pool, A, 0), dial(pool, A, 0)
    pool.release(old, 0, reusable=True)
    pool.release(new, 4, reusable=True)
    grant, closing = pool.checkout(A, 6)  # old expired at 5, new at 9
    assert closing == [old] and grant is new
    assert pool.discards[Discard.IDLE_EXPIRED] == 1 and pool.total == 1


def test_keep_alive_hint_shortens_idle_expiry_with_a_margin() -> None:
    assert keep_alive_deadline(4.0, None) == 4.0
    assert keep_alive_deadline(4.0, 5.0) == 3.75  # 5 s minus max(1 s, 5/4 s)
    assert keep_alive_deadline(None, 2.0) == 1.0
    assert keep_alive_deadline(None, 60.0) == 45.0
    assert keep_alive_deadline(4.0, 0.0) == 0.0
    pool = make_pool(idle_timeout=4.0)
    entry = dial(pool, A, 0)
    pool.release(entry, 0, reusable=True, keep_alive=2.0)  # server closes at 2 s: we at 1 s
    grant, closing = pool.checkout(A, 1.5)
    assert closing == [entry] and grant is DIAL


def test_lifetime_is_jittered_and_enforced_only_when_idle() -> None:
    pool = make_pool(max_lifetime=100.0, lifetime_jitter=0.2, rng=random.Random(7))
    entries = [dial(pool, A, 0) for _ in range(4)]
    lifetimes = sorted(e.expires_at for e in entries)
    assert all(80.0 <= t <= 100.0 for t in lifetimes)
    assert len(set(lifetimes)) == 4  # not all at once
    # In use past its lifetime: nothing happens until it is released.
    first = min(entries, key=lambda e: e.expires_at)
    assert pool.release(first, 150, reusable=True) == [first]
    assert pool.discards[Discard.LIFETIME_EXPIRED] == 1


def test_non_reusable_and_surplus_connections_are_closed() -> None:
    pool = make_pool(max_idle=1)
    a, b, c = dial(pool, A, 0), dial(pool, A, 0), dial(pool, A, 0)
    assert pool.release(a, 1, reusable=False) == [a]
    assert pool.release(b, 1, reusable=True) == []
    assert pool.release(c, 1, reusable=True) == [c]
    assert pool.discards[Discard.NOT_REUSABLE] == 1 and pool.discards[Discard.SURPLUS] == 1
    assert pool.total == 1


def test_full_pool_evicts_idle_of_another_origin_to_dial() -> None:
    pool = make_pool(max_connections=1)
    a = dial(pool, A, 0)
    pool.release(a, 1, reusable=True)
    grant, closing = pool.checkout(B, 2)
    assert grant is DIAL and closing == [a] and pool.total == 1


def test_connection_waiters_get_released_connection_or_dial_fifo() -> None:
    pool = make_pool(max_connections=1)
    a = dial(pool, A, 0)
    woken: list[PoolWaiter] = []
    grant, _ = pool.checkout(A, 1)
    assert grant is None
    w1 = PoolWaiter(A, lambda: woken.append(w1))
    w2 = PoolWaiter(B, lambda: woken.append(w2))
    pool.wait(w1)
    pool.wait(w2)
    # Nobody barges past the waiters, even with capacity about to free up.
    assert pool.checkout(A, 1)[0] is None
    assert pool.release(a, 2, reusable=True) == []
    assert woken == [w1] and w1.grant is a
    # w1's request is done; its connection's place goes to w2 (other origin) as a dial.
    assert pool.release(a, 3, reusable=True) == [a]
    assert woken == [w1, w2] and w2.grant is DIAL and pool.total == 1


def test_cancelled_waiter_passes_its_grant_on() -> None:
    pool = make_pool(max_connections=1)
    a = dial(pool, A, 0)
    woken: list[PoolWaiter] = []
    w1 = PoolWaiter(A, lambda: woken.append(w1))
    w2 = PoolWaiter(A, lambda: woken.append(w2))
    pool.wait(w1)
    pool.wait(w2)
    pool.discard(a, Discard.ERROR)
    assert w1.grant is DIAL
    assert pool.cancel(w1) == []
    assert w2.grant is DIAL and pool.total == 1
    # A waiter cancelled before any grant just leaves.
    w3 = PoolWaiter(A, lambda: None)
    pool.wait(w3)
    assert pool.cancel(w3) == [] and pool.waiting == 0


def test_dial_failure_frees_the_reserved_place() -> None:
    pool = make_pool(max_connections=1)
    assert pool.checkout(A, 0)[0] is DIAL
    assert pool.total == 1
    pool.dial_failed(A)
    assert pool.total == 0 and pool.checkout(A, 0)[0] is DIAL


def waiter(origin: tuple[str, str, int], woken: list[PoolWaiter]) -> PoolWaiter:
    w = PoolWaiter(origin, lambda: woken.append(w))
    return w


def test_http2_burst_coalesces_onto_one_dial_then_scales_out_by_cap() -> None:
    pool = make_pool(max_connections=3, may_multiplex=lambda origin: True)
    woken: list[PoolWaiter] = []
    assert pool.checkout(A, 0)[0] is DIAL
    waiters = [waiter(A, woken) for _ in range(7)]
    for w in waiters:  # the dial in flight is expected to carry them: no dial each
        assert pool.checkout(A, 0)[0] is None
        pool.wait(w)
    assert pool.total == 1 and pool.waiting == 7
    conn = PoolEntry(A, None)
    pool.dialed(conn, 0, multiplexed=True)  # one stream until the peer's SETTINGS
    assert woken == [] and conn.active == 1
    pool.set_cap(conn, 3)  # SETTINGS: 3 streams; 5 still wait, so two more dials
    assert [w.grant for w in woken[:2]] == [conn, conn] and conn.active == 3
    assert [w.grant for w in woken[2:]] == [DIAL, DIAL]
    assert pool.total == 3 and pool.scale_outs == 2 and pool.waiting == 3
    # Those two dials are expected to carry the remaining three (3 streams each).
    second = PoolEntry(A, None)
    pool.dialed(second, 1, multiplexed=True)
    pool.set_cap(second, 3)
    assert [w.grant for w in woken[4:]] == [second, second] and pool.waiting == 1


def test_http2_cap_lowered_mid_connection_admits_nothing_until_below() -> None:
    pool = make_pool(max_connections=1, may_multiplex=lambda origin: True)
    woken: list[PoolWaiter] = []
    conn = dial(pool, A, 0, multiplexed=True)
    pool.set_cap(conn, 3)
    assert pool.checkout(A, 0)[0] is conn and pool.checkout(A, 0)[0] is conn
    assert conn.active == 3
    pool.set_cap(conn, 1)  # in flight streams finish; no new one until active < 1
    w = waiter(A, woken)
    assert pool.checkout(A, 0)[0] is None
    pool.wait(w)
    pool.release(conn, 1, reusable=True)
    pool.release(conn, 1, reusable=True)
    assert woken == [] and conn.active == 1
    pool.release(conn, 1, reusable=True)
    assert woken == [w] and w.grant is conn and conn.active == 1
    # Raising wakes as many as the new room allows, at once.
    more = [waiter(A, woken) for _ in range(3)]
    for m in more:
        assert pool.checkout(A, 1)[0] is None
        pool.wait(m)
    pool.set_cap(conn, 3)
    assert woken == [w, more[0], more[1]] and conn.active == 3


def test_http2_goaway_drains_and_closes_when_idle() -> None:
    pool = make_pool(max_connections=2, may_multiplex=lambda origin: True)
    conn = dial(pool, A, 0, multiplexed=True)
    pool.set_cap(conn, 10)
    assert pool.drain(conn) == []
    grant, _ = pool.checkout(A, 0)
    assert grant is DIAL  # no new stream on a draining connection
    assert pool.release(conn, 1, reusable=True) == [conn]
    assert pool.discards[Discard.NOT_REUSABLE] == 1


def test_first_connection_turning_out_http11_releases_coalesced_waiters() -> None:
    pool = make_pool(max_connections=3, may_multiplex=lambda origin: True)
    woken: list[PoolWaiter] = []
    assert pool.checkout(A, 0)[0] is DIAL
    ws = [waiter(A, woken) for _ in range(3)]
    for w in ws:
        assert pool.checkout(A, 0)[0] is None
        pool.wait(w)
    pool.dialed(PoolEntry(A, None), 0, multiplexed=False)  # ALPN chose http/1.1
    assert [w.grant for w in woken] == [DIAL, DIAL] and pool.total == 3


def test_sweep_closes_expired_idle_connections_of_every_origin_and_re_arms() -> None:
    pool = make_pool(idle_timeout=10.0)
    a, b = dial(pool, A, 0), dial(pool, B, 0)
    assert pool.next_due == math.inf  # nothing idle: no timer needed
    pool.release(a, 1, reusable=True)
    pool.release(b, 3, reusable=True, keep_alive=4.0)  # the server closes after 4 s
    assert pool.next_due == 3 + keep_alive_deadline(10.0, 4.0)  # b expires first
    assert pool.sweep(5.9) == [] and pool.next_due == 6
    assert pool.sweep(6) == [b] and pool.next_due == 11
    assert pool.sweep(10.9) == [] and pool.next_due == 11
    assert pool.sweep(11) == [a] and pool.next_due == math.inf
    assert pool.total == 0 and pool.discards[Discard.IDLE_EXPIRED] == 2


def test_next_due_may_be_early_never_late() -> None:
    """A connection taken from idle leaves ``next_due`` early (stale); a sweep then finds
    nothing and makes it exact: one scan per deadline, no work per request."""
    pool = make_pool(idle_timeout=10.0)
    a = dial(pool, A, 0)
    pool.release(a, 0, reusable=True)
    assert pool.next_due == 10
    grant, _ = pool.checkout(A, 5)
    assert grant is a
    pool.release(a, 6, reusable=True)
    assert pool.next_due == 10  # early: a now expires at 16
    assert pool.sweep(10) == [] and pool.next_due == 16


class PoolMachine(RuleBasedStateMachine):
    """Random checkouts, dials (HTTP/1.1 to A, HTTP/2 to B), cap changes, GOAWAYs,
    releases, discards, waits, cancellations and clock ticks."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = make_pool(
            max_connections=3,
            max_idle=2,
            idle_timeout=5.0,
            max_lifetime=20.0,
            lifetime_jitter=0.5,
            rng=random.Random(1),
            may_multiplex=lambda origin: origin == B,
        )
        self.now = 0.0
        self.requests: list[PoolEntry[None]] = []  # the connection each request in flight holds
        self.dials: list[tuple[str, str, int]] = []
        self.waiters: list[PoolWaiter] = []
        self.woken: list[PoolWaiter] = []
        self.entries: list[PoolEntry[None]] = []
        self.closed: set[int] = set()  # ids of entries the pool told us to close

    def _closing(self, entries: list[PoolEntry[None]]) -> None:
        for entry in entries:
            assert not entry.in_pool
            self.closed.add(id(entry))

    def _take(self, grant: object, origin: tuple[str, str, int]) -> None:
        if grant is DIAL:
            self.dials.append(origin)
        else:
            assert isinstance(grant, PoolEntry)
            assert grant.origin == origin and grant.in_pool and not grant.draining
            assert grant.active <= grant.cap  # a grant never exceeds the cap
            self.requests.append(grant)

    def _settle(self) -> None:
        while self.woken:
            w = self.woken.pop(0)
            self.waiters.remove(w)
            self._take(w.grant, w.origin)

    @rule(origin=st.sampled_from([A, B]), fresh=st.booleans())
    def checkout(self, origin: tuple[str, str, int], fresh: bool) -> None:
        grant, closing = self.pool.checkout(origin, self.now, fresh=fresh)
        self._closing(closing)
        if grant is None:
            w = PoolWaiter(origin, lambda: self.woken.append(w))
            self.waiters.append(w)
            self._closing(self.pool.wait(w))  # may be granted at once
            self._settle()
        else:
            self._take(grant, origin)

    @precondition(lambda self: bool(self.dials))
    @rule(ok=st.booleans(), index=st.integers(0, 5))
    def finish_dial(self, ok: bool, index: int) -> None:
        origin = self.dials.pop(index % len(self.dials))
        if ok:
            entry = PoolEntry(origin, None)
            self.entries.append(entry)
            self.requests.append(entry)
            self._closing(self.pool.dialed(entry, self.now, multiplexed=origin == B))
        else:
            self._closing(self.pool.dial_failed(origin))
        self._settle()

    @rule(cap=st.integers(0, 4), index=st.integers(0, 20))
    def set_cap(self, cap: int, index: int) -> None:
        live = [e for e in self.entries if e.in_pool and e.multiplexed]
        if live:
            self._closing(self.pool.set_cap(live[index % len(live)], cap))
            self._settle()

    @rule(index=st.integers(0, 20))
    def goaway(self, index: int) -> None:
        live = [e for e in self.entries if e.in_pool and e.multiplexed]
        if live:
            self._closing(self.pool.drain(live[index % len(live)]))
            self._settle()

    @precondition(lambda self: bool(self.requests))
    @rule(
        index=st.integers(0, 20),
        reusable=st.booleans(),
        keep_alive=st.sampled_from([None, 0.5, 3.0]),
    )
    def release(self, index: int, reusable: bool, keep_alive: float | None) -> None:
        entry = self.requests.pop(index % len(self.requests))
        self._closing(self.pool.release(entry, self.now, reusable=reusable, keep_alive=keep_alive))
        self._settle()

    @precondition(lambda self: bool(self.requests))
    @rule(index=st.integers(0, 20))
    def discard(self, index: int) -> None:
        entry = self.requests.pop(index % len(self.requests))
        self._closing(self.pool.discard(entry, Discard.ERROR))
        # Other requests on a broken connection fail too.
        self.requests = [r for r in self.requests if r is not entry]
        self._settle()

    @precondition(lambda self: bool(self.waiters))
    @rule(index=st.integers(0, 20))
    def cancel_waiter(self, index: int) -> None:
        w = self.waiters[index % len(self.waiters)]
        granted = w.grant
        self._closing(self.pool.cancel(w))
        if granted is not None:  # granted but cancelled before it resumed
            self.woken.remove(w)
            self.waiters.remove(w)
        else:
            self.waiters.remove(w)
        self._settle()

    @rule(seconds=st.floats(min_value=0, max_value=8))
    def tick(self, seconds: float) -> None:
        self.now += seconds

    @rule()
    def sweep(self) -> None:
        """The shell's timer: every expired idle connection goes, ``next_due`` is exact."""
        self._closing(self.pool.sweep(self.now))
        self._settle()
        idle = [e for e in self.entries if e.in_pool and e.active == 0]
        assert all(min(e.idle_deadline, e.expires_at) > self.now for e in idle)
        exact = min((min(e.idle_deadline, e.expires_at) for e in idle), default=math.inf)
        assert self.pool.next_due == exact

    @invariant()
    def accounting(self) -> None:
        pool = self.pool
        live = [e for e in self.entries if e.in_pool]
        # Every connection the pool let go of was handed to us to close: no socket leaks.
        assert all(id(e) in self.closed for e in self.entries if not e.in_pool)
        assert 0 <= pool.total <= pool.max_connections
        assert pool.total == len(live) + len(self.dials)
        for entry in live:
            assert entry.active == sum(r is entry for r in self.requests)
        assert pool.idle == sum(e.active == 0 for e in live)
        assert pool.idle <= pool.max_idle
        assert pool.waiting == len(self.waiters) - len(self.woken)
        for w in self.waiters:
            if w.grant is None:  # a waiter waits only when nothing usable is free
                assert not any(e.origin == w.origin and e.spare > 0 for e in live)
        if any(w.grant is None and not w.for_streams for w in self.waiters):
            assert pool.total == pool.max_connections and pool.idle == 0
        # A timer armed at ``next_due`` is never late for an idle connection.
        for entry in live:
            if entry.active == 0:
                assert pool.next_due <= min(entry.idle_deadline, entry.expires_at)


TestPoolMachine = PoolMachine.TestCase
