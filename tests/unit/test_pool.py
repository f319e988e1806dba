"""Connection selection, expiry and connection waiters, with a clock we drive by hand."""

from __future__ import annotations

import random

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from httpx_bulkhead._pool import DIAL, Discard, Pool, PoolEntry, PoolWaiter, keep_alive_deadline

A = ("http", "a", 80)
B = ("http", "b", 80)


def make_pool(**kw: object) -> Pool:
    options: dict[str, object] = {
        "max_connections": 4,
        "max_idle": 4,
        "idle_timeout": 10.0,
        "max_lifetime": None,
        "lifetime_jitter": 0.0,
    }
    options.update(kw)
    return Pool(**options)  # type: ignore[arg-type]


def dial(pool: Pool, origin: tuple[str, str, int], now: float) -> PoolEntry:
    grant, closing = pool.checkout(origin, now)
    assert grant is DIAL and closing == []
    entry = PoolEntry(origin)
    pool.dialed(entry, now)
    return entry


def test_reuses_most_recently_released_connection_lifo() -> None:
    pool = make_pool()
    first, second = dial(pool, A, 0), dial(pool, A, 0)
    assert pool.checkin(first, 1, reusable=True) == []
    assert pool.checkin(second, 2, reusable=True) == []
    grant, _ = pool.checkout(A, 3)
    assert grant is second and second.reused
    assert pool.idle == 1 and pool.total == 2


def test_idle_expiry_is_checked_at_checkout_and_pruned_oldest_first() -> None:
    pool = make_pool(idle_timeout=5.0)
    old, new = dial(pool, A, 0), dial(pool, A, 0)
    pool.checkin(old, 0, reusable=True)
    pool.checkin(new, 4, reusable=True)
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
    pool.checkin(entry, 0, reusable=True, keep_alive=2.0)  # server closes at 2 s: we at 1 s
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
    assert pool.checkin(first, 150, reusable=True) == [first]
    assert pool.discards[Discard.LIFETIME_EXPIRED] == 1


def test_non_reusable_and_surplus_connections_are_closed() -> None:
    pool = make_pool(max_idle=1)
    a, b, c = dial(pool, A, 0), dial(pool, A, 0), dial(pool, A, 0)
    assert pool.checkin(a, 1, reusable=False) == [a]
    assert pool.checkin(b, 1, reusable=True) == []
    assert pool.checkin(c, 1, reusable=True) == [c]
    assert pool.discards[Discard.NOT_REUSABLE] == 1 and pool.discards[Discard.SURPLUS] == 1
    assert pool.total == 1


def test_full_pool_evicts_idle_of_another_origin_to_dial() -> None:
    pool = make_pool(max_connections=1)
    a = dial(pool, A, 0)
    pool.checkin(a, 1, reusable=True)
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
    assert pool.checkin(a, 2, reusable=True) == []
    assert woken == [w1] and w1.grant is a
    # w1's request is done; its connection's place goes to w2 (other origin) as a dial.
    assert pool.checkin(a, 3, reusable=True) == [a]
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
    pool.dial_failed()
    assert pool.total == 0 and pool.checkout(A, 0)[0] is DIAL


class PoolMachine(RuleBasedStateMachine):
    """Random checkouts, releases, discards, waits and cancellations: ``total`` never
    exceeds ``max_connections`` and always equals idle + in use + reserved dials."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = make_pool(
            max_connections=3,
            max_idle=2,
            idle_timeout=5.0,
            max_lifetime=20.0,
            lifetime_jitter=0.5,
            rng=random.Random(1),
        )
        self.now = 0.0
        self.in_use: list[PoolEntry] = []
        self.dialing = 0
        self.waiters: list[PoolWaiter] = []
        self.woken: list[PoolWaiter] = []

    def _take(self, grant: object, origin: tuple[str, str, int]) -> None:
        if grant is DIAL:
            self.dialing += 1
        elif isinstance(grant, PoolEntry):
            assert grant.origin == origin and grant.in_pool
            self.in_use.append(grant)

    def _settle(self) -> None:
        while self.woken:
            w = self.woken.pop(0)
            assert self.waiters[0] is w  # FIFO
            self.waiters.pop(0)
            self._take(w.grant, w.origin)

    @rule(origin=st.sampled_from([A, B]))
    def checkout(self, origin: tuple[str, str, int]) -> None:
        grant, closing = self.pool.checkout(origin, self.now)
        assert all(not e.in_pool for e in closing)
        if grant is None:
            w = PoolWaiter(origin, lambda: self.woken.append(w))
            self.pool.wait(w)
            self.waiters.append(w)
        else:
            self._take(grant, origin)

    @precondition(lambda self: self.dialing > 0)
    @rule(ok=st.booleans(), origin=st.sampled_from([A, B]))
    def finish_dial(self, ok: bool, origin: tuple[str, str, int]) -> None:
        self.dialing -= 1
        if ok:
            entry = PoolEntry(origin)
            self.pool.dialed(entry, self.now)
            self.in_use.append(entry)
        else:
            self.pool.dial_failed()
        self._settle()

    @precondition(lambda self: bool(self.in_use))
    @rule(reusable=st.booleans(), keep_alive=st.sampled_from([None, 0.5, 3.0]))
    def checkin(self, reusable: bool, keep_alive: float | None) -> None:
        entry = self.in_use.pop(0)
        self.pool.checkin(entry, self.now, reusable=reusable, keep_alive=keep_alive)
        self._settle()

    @precondition(lambda self: bool(self.in_use))
    @rule()
    def discard(self) -> None:
        entry = self.in_use.pop()
        assert self.pool.discard(entry, Discard.ERROR) == [entry]
        self._settle()

    @precondition(lambda self: bool(self.waiters))
    @rule()
    def cancel_waiter(self) -> None:
        w = self.waiters.pop()
        self.pool.cancel(w)
        self._settle()

    @rule(seconds=st.floats(min_value=0, max_value=8))
    def tick(self, seconds: float) -> None:
        self.now += seconds

    @invariant()
    def accounting(self) -> None:
        pool = self.pool
        assert 0 <= pool.total <= pool.max_connections
        assert pool.total == pool.idle + len(self.in_use) + self.dialing
        assert pool.idle <= pool.max_idle
        assert pool.waiting == len(self.waiters)
        if self.waiters:  # someone waits only while there is truly no capacity
            assert pool.total == pool.max_connections
            assert pool.idle == 0


TestPoolMachine = PoolMachine.TestCase
