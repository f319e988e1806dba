"""Connection selection, expiry and connection waiters, with a clock we drive by hand."""

from __future__ import annotations

import math
import os
import random

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from httpx_bulkhead._pool import DIAL, Discard, Pool, PoolEntry, PoolWaiter, keep_alive_deadline

#: Examples each state machine runs (CI's bound; set BULKHEAD_MACHINE_EXAMPLES for more).
MACHINE_EXAMPLES = int(os.environ.get("BULKHEAD_MACHINE_EXAMPLES") or 200)

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
    assert pool.idle == 1 and pool.total == 2 and pool.created == 2


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
    assert keep_alive_deadline(None, 1.0) == 0.5  # short hints: half of them
    assert keep_alive_deadline(None, 8.0) == 6.0  # 8 s minus max(1 s, 8/4 s)
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
    assert grant is DIAL and closing == [a] and pool.total == 1 and pool.idle == 0
    assert pool.discards[Discard.SURPLUS] == 1
    assert pool.checkout(A, 3)[0] is None  # the evicted one is gone for good


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


def test_an_expired_connection_is_never_handed_out() -> None:
    """The most recently used idle connection is past its idle deadline (the server's
    keep-alive hint shortened it) while the oldest is not, so pruning from the old end stops
    at once: the pick itself must see the expiry."""
    pool = make_pool(idle_timeout=10.0)
    old, new = dial(pool, A, 0), dial(pool, A, 0)
    pool.release(old, 0, reusable=True)  # idle until 10
    pool.release(new, 1, reusable=True, keep_alive=2.0)  # idle until 2
    grant, closing = pool.checkout(A, 5)
    assert grant is old and closing == [new]
    assert pool.discards[Discard.IDLE_EXPIRED] == 1 and not new.in_pool


def test_a_connection_past_its_lifetime_is_never_handed_out() -> None:
    pool = make_pool(max_lifetime=10.0, idle_timeout=None)
    old = dial(pool, A, 0)
    young = dial(pool, A, 8)  # lives until 18
    pool.release(young, 9, reusable=True)
    pool.release(old, 9, reusable=True)  # the most recently used: picked first
    grant, closing = pool.checkout(A, 12)
    assert grant is young and closing == [old]
    assert pool.discards[Discard.LIFETIME_EXPIRED] == 1


def test_a_multiplexed_connection_past_its_lifetime_drains_instead_of_serving() -> None:
    pool = make_pool(max_lifetime=10.0, max_connections=2, may_multiplex=lambda origin: True)
    conn = dial(pool, A, 0, multiplexed=True)
    pool.set_cap(conn, 5)
    grant, closing = pool.checkout(A, 11)  # in use past its lifetime: no new stream on it
    assert grant is DIAL and closing == [] and conn.draining and conn.active == 1
    assert pool.release(conn, 12, reusable=True) == [conn]
    assert pool.discards[Discard.LIFETIME_EXPIRED] == 1


def test_requests_batched_onto_a_failed_http2_dial_are_served_in_order() -> None:
    """Three requests wait for streams of a dial in flight; the dial fails.  Each must get
    a grant (not hang to its acquire timeout), and the first to arrive dials first."""
    pool = make_pool(max_connections=4, may_multiplex=lambda origin: True)
    woken: list[PoolWaiter] = []
    assert pool.checkout(A, 0)[0] is DIAL
    ws = [waiter(A, woken) for _ in range(3)]
    for w in ws:
        assert pool.checkout(A, 0)[0] is None
        pool.wait(w)
    assert all(w.for_streams for w in ws) and woken == []
    assert pool.dial_failed(A) == []
    assert woken == [ws[0]] and ws[0].grant is DIAL  # the next dial, to the first arrival
    assert pool.waiting == 2 and all(w.for_streams for w in ws[1:])  # they batch onto it
    assert pool.dial_failed(A) == []  # that one fails too
    assert woken == [ws[0], ws[1]] and ws[1].grant is DIAL
    conn = PoolEntry(A, None)
    pool.dialed(conn, 1, multiplexed=True)
    pool.set_cap(conn, 10)
    assert woken == ws and ws[2].grant is conn and pool.waiting == 0


def test_a_failed_dial_with_a_full_pool_hands_its_place_to_the_batched_requests() -> None:
    pool = make_pool(max_connections=1, may_multiplex=lambda origin: True)
    woken: list[PoolWaiter] = []
    assert pool.checkout(A, 0)[0] is DIAL
    ws = [waiter(A, woken) for _ in range(2)]
    for w in ws:
        pool.wait(w)
    pool.dial_failed(A)
    assert woken == [ws[0]] and ws[0].grant is DIAL and pool.total == 1


def test_a_waiter_cancelled_with_a_connection_in_hand_passes_it_on() -> None:
    pool = make_pool(max_connections=1)
    woken: list[PoolWaiter] = []
    conn = dial(pool, A, 0)
    first, second = waiter(A, woken), waiter(A, woken)
    pool.wait(first)
    pool.wait(second)
    assert pool.release(conn, 1, reusable=True) == []
    assert woken == [first] and first.grant is conn and conn.active == 1
    assert pool.cancel(first) == [] and first.grant is None
    assert woken == [first, second] and second.grant is conn and conn.active == 1
    assert pool.stream_waits == 2 and pool.waiting == 0 and pool.idle == 0
    assert pool.release(conn, 2, reusable=True) == [] and pool.idle == 1
    assert conn.idle_deadline == 12  # deadlines follow real releases, not handed-on grants


def test_a_cancelled_waiter_that_already_left_changes_nothing() -> None:
    pool = make_pool(max_connections=1)
    conn = dial(pool, A, 0)
    w = waiter(A, [])
    pool.wait(w)
    assert pool.cancel(w) == [] and pool.waiting == 0
    assert pool.cancel(w) == [] and pool.waiting == 0  # twice: nothing to undo
    assert pool.release(conn, 1, reusable=True) == [] and pool.idle == 1


def test_close_hands_back_the_waiters_then_the_idle_connections() -> None:
    pool = make_pool(max_connections=2)
    first, second = dial(pool, A, 0), dial(pool, B, 0)
    assert second.active == 1
    queued = [waiter(A, []), waiter(B, [])]
    for w in queued:
        pool.wait(w)
    assert pool.waiting == 2
    closing, waiters = pool.close()
    assert closing == [] and waiters == queued and pool.waiting == 0
    assert all(w.grant is None for w in queued)
    pool.release(first, 1, reusable=True)
    assert pool.checkout(B, 1)[0] is None  # no place after close, not even by eviction
    assert pool.idle == 1
    assert pool.close() == ([first], []) and not first.in_pool and pool.idle == 0
    assert pool.discards[Discard.CLOSED] == 1 and pool.total == 1 and second.in_pool


def test_operations_on_a_connection_already_closed_do_nothing() -> None:
    pool = make_pool(max_connections=2, may_multiplex=lambda origin: True)
    conn = dial(pool, A, 0, multiplexed=True)
    pool.set_cap(conn, 4)
    assert pool.checkout(A, 0)[0] is conn
    assert pool.discard(conn, Discard.ERROR) == [conn] and pool.total == 0
    assert pool.discard(conn, Discard.ERROR) == [conn]  # its other stream fails too
    assert pool.release(conn, 1, reusable=True) == []
    assert pool.set_cap(conn, 8) == [] and pool.drain(conn) == []
    assert pool.discards[Discard.ERROR] == 1 and pool.total == 0 and pool.idle == 0
    assert pool.checkout(A, 1)[0] is DIAL  # never handed out again
    idle = PoolEntry(A, None)
    pool.dialed(idle, 1, multiplexed=True)
    pool.release(idle, 1, reusable=True)
    assert pool.checkout(A, 99)[0] is DIAL and not idle.in_pool  # expired while idle
    assert pool.drain(idle) == [] and pool.discards[Discard.NOT_REUSABLE] == 0


def test_goaway_on_an_idle_connection_closes_it_at_once_and_only_once() -> None:
    pool = make_pool(max_connections=2, may_multiplex=lambda origin: True)
    conn = dial(pool, A, 0, multiplexed=True)
    pool.set_cap(conn, 4)
    pool.release(conn, 1, reusable=True)
    assert pool.drain(conn) == [conn] and pool.drain(conn) == []
    assert pool.discards[Discard.NOT_REUSABLE] == 1 and pool.total == 0


def test_expiry_boundaries_are_inclusive() -> None:
    """A deadline equal to the clock has passed (the server may close at that instant)."""
    pool = make_pool(idle_timeout=10.0, max_lifetime=10.0)
    conn = dial(pool, A, 0)
    assert pool.release(conn, 10, reusable=True) == [conn]  # lifetime ends exactly now
    assert pool.discards[Discard.LIFETIME_EXPIRED] == 1
    conn = dial(pool, A, 20)
    assert pool.release(conn, 21, reusable=True, keep_alive=0.0) == [conn]  # timeout=0
    assert pool.discards[Discard.IDLE_EXPIRED] == 1
    conn = dial(pool, A, 30)
    pool.release(conn, 31, reusable=True)  # idle until 41, lifetime until 40
    grant, closing = pool.checkout(A, 40)
    assert grant is DIAL and closing == [conn]
    assert pool.discards[Discard.LIFETIME_EXPIRED] == 2


def test_a_multiplexed_connection_drains_exactly_at_its_lifetime() -> None:
    pool = make_pool(max_lifetime=10.0, max_connections=2, may_multiplex=lambda origin: True)
    conn = dial(pool, A, 0, multiplexed=True)
    pool.set_cap(conn, 5)
    assert pool.checkout(A, 9.9)[0] is conn
    assert pool.checkout(A, 10)[0] is DIAL and conn.draining


def test_a_waiter_may_be_granted_when_it_queues() -> None:
    pool = make_pool(max_connections=1)
    woken: list[PoolWaiter] = []
    w = waiter(A, woken)
    assert pool.wait(w) == [] and woken == [w] and w.grant is DIAL and pool.total == 1


@pytest.mark.parametrize("tell", ["checkout", "dialed", "release", "sweep"])
def test_a_grant_handed_on_is_checked_against_the_latest_clock(tell: str) -> None:
    """The connection was granted while fresh, then its waiter gave up 11 s later without
    using it: by then its idle deadline has passed (any call since told the pool the time),
    so the next waiter gets a dial instead of a connection the server may have closed."""
    pool = make_pool(max_connections=3, idle_timeout=10.0, may_multiplex=lambda o: o == B)
    woken: list[PoolWaiter] = []
    conn = dial(pool, A, 0)
    shared = dial(pool, B, 0, multiplexed=True)
    pool.set_cap(shared, 4)
    assert pool.checkout(B, 0)[0] is shared  # two streams on it
    assert pool.checkout(B, 0, fresh=True)[0] is DIAL  # the third place: dialing
    first, second = waiter(A, woken), waiter(A, woken)
    pool.wait(first)
    pool.wait(second)
    pool.release(conn, 5, reusable=True)  # idle deadline 15; granted to ``first`` at once
    assert first.grant is conn
    if tell == "checkout":  # another request
        assert pool.checkout(A, 16) == (None, [])
    elif tell == "dialed":  # a dial completes
        assert pool.dialed(PoolEntry(B, None), 16, multiplexed=True) == []
    elif tell == "release":  # a stream ends on another connection
        assert pool.release(shared, 16, reusable=True) == []
    else:  # the expiry timer
        assert pool.sweep(16) == []
    assert pool.cancel(first) == [conn]
    assert second.grant is DIAL and pool.discards[Discard.IDLE_EXPIRED] == 1


def test_scale_outs_count_only_dials_beside_open_connections() -> None:
    pool = make_pool(max_connections=3, may_multiplex=lambda origin: True)
    conn = dial(pool, A, 0, multiplexed=True)
    pool.set_cap(conn, 1)
    assert pool.checkout(A, 0)[0] is DIAL and pool.scale_outs == 1  # conn is at its cap
    pool.dial_failed(A)
    pool.discard(conn, Discard.ERROR)
    assert pool.checkout(A, 1)[0] is DIAL and pool.scale_outs == 1  # nothing open: no
    again = PoolEntry(A, None)
    pool.dialed(again, 1, multiplexed=True)
    pool.set_cap(again, 1)
    assert pool.checkout(A, 1)[0] is DIAL and pool.scale_outs == 2


def test_the_most_recently_used_multiplexed_connection_serves_next() -> None:
    pool = make_pool(max_connections=2, may_multiplex=lambda origin: True)
    first = dial(pool, A, 0, multiplexed=True)
    pool.set_cap(first, 1)
    assert pool.checkout(A, 0)[0] is DIAL  # first is at its cap
    second = PoolEntry(A, None)
    pool.dialed(second, 0, multiplexed=True)
    pool.set_cap(second, 4)
    pool.set_cap(first, 4)  # both have room; first was indexed last
    assert pool.checkout(A, 1)[0] is first
    pool.release(second, 2, reusable=True)  # second was used last: it serves next
    assert pool.checkout(A, 3)[0] is second


def test_a_connection_past_its_lifetime_is_skipped_for_the_next_one() -> None:
    pool = make_pool(max_lifetime=10.0, max_connections=3, may_multiplex=lambda origin: True)
    old = dial(pool, A, 0, multiplexed=True)
    pool.set_cap(old, 1)
    assert pool.checkout(A, 0)[0] is DIAL
    young = PoolEntry(A, None)
    pool.dialed(young, 5, multiplexed=True)  # lives until 15
    pool.set_cap(young, 4)
    pool.set_cap(old, 4)  # old is the most recently indexed: picked first, but expired
    assert pool.checkout(A, 11)[0] is young and old.draining


def test_a_cap_change_on_an_idle_connection_keeps_it_idle_once() -> None:
    pool = make_pool(max_connections=2, may_multiplex=lambda origin: True)
    conn = dial(pool, A, 0, multiplexed=True)
    pool.release(conn, 1, reusable=True)
    assert pool.set_cap(conn, 10) == [] and pool.idle == 1
    assert pool.set_cap(conn, 20) == [] and pool.idle == 1 and pool.total == 1
    assert pool.checkout(A, 2)[0] is conn and pool.idle == 0
    assert repr(DIAL) == "DIAL"


def test_a_retry_on_a_fresh_connection_does_not_barge_past_stream_waiters() -> None:
    """A stale-connection retry asks for a new connection (``fresh``); while requests of
    its origin wait for streams of a dial in flight, it waits behind them, though the pool
    has room for another dial."""
    pool = make_pool(max_connections=4, may_multiplex=lambda origin: True)
    assert pool.checkout(A, 0)[0] is DIAL
    w = waiter(A, [])
    assert pool.checkout(A, 0)[0] is None
    pool.wait(w)
    assert w.for_streams and pool.total == 1
    assert pool.checkout(A, 0, fresh=True) == (None, [])
    assert pool.total == 1 and pool.scale_outs == 0


@pytest.mark.parametrize(("cap", "covered"), [(1, 0), (2, 1), (3, 2), (10, 9)])
def test_a_dial_in_flight_carries_its_own_request_and_cap_minus_one_more(
    cap: int, covered: int
) -> None:
    """Once the peer's stream cap is known, a dial in flight is expected to serve its own
    request and ``cap - 1`` others: those wait for it, the next request dials at once (with
    the peer allowing one stream, every request dials)."""
    pool = make_pool(max_connections=20, may_multiplex=lambda origin: True)
    conn = dial(pool, A, 0, multiplexed=True)
    pool.set_cap(conn, cap)
    for _ in range(cap - 1):
        assert pool.checkout(A, 0)[0] is conn  # conn is now at its cap
    assert pool.checkout(A, 0)[0] is DIAL and pool.scale_outs == 1
    queued = [waiter(A, []) for _ in range(covered)]
    for w in queued:
        assert pool.checkout(A, 0)[0] is None
        pool.wait(w)
    assert all(w.for_streams and w.grant is None for w in queued)
    nxt = waiter(A, [])
    if pool.checkout(A, 0)[0] is None:  # behind the queued ones, but with a place at once
        pool.wait(nxt)
        assert nxt.grant is DIAL
    assert pool.scale_outs == 2 and pool.total == 3


def test_a_fresh_request_with_no_room_shares_an_open_connection() -> None:
    pool = make_pool(max_connections=1, may_multiplex=lambda origin: True)
    conn = dial(pool, A, 0, multiplexed=True)
    pool.set_cap(conn, 4)
    assert pool.checkout(A, 1, fresh=True) == (conn, []) and conn.active == 2


def test_a_new_dial_covers_the_place_waiters_behind_it() -> None:
    """Requests that waited for a place: when one gets it, the others of its origin ride
    on that dial (the peer's cap, 3, leaves room for two) instead of waiting for places."""
    pool = make_pool(max_connections=2, may_multiplex=lambda origin: True)
    conn = dial(pool, A, 0, multiplexed=True)
    pool.set_cap(conn, 3)
    for _ in range(2):
        assert pool.checkout(A, 0)[0] is conn
    other = dial(pool, B, 0)  # the pool is full
    woken: list[PoolWaiter] = []
    places = [waiter(A, woken) for _ in range(3)]
    for w in places:
        assert pool.checkout(A, 0)[0] is None
        pool.wait(w)
    assert not any(w.for_streams for w in places) and pool.waiting == 3
    pool.discard(other, Discard.ERROR)
    assert woken == [places[0]] and places[0].grant is DIAL
    assert [w.for_streams for w in places[1:]] == [True, True] and pool.waiting == 2


def test_a_settled_connection_that_closes_leaves_the_cover_count_right() -> None:
    pool = make_pool(max_connections=4, may_multiplex=lambda origin: True)
    conn = dial(pool, A, 0, multiplexed=True)
    pool.set_cap(conn, 3)  # SETTINGS: settled
    pool.discard(conn, Discard.ERROR)
    assert pool.checkout(A, 1)[0] is DIAL
    assert pool.checkout(A, 1)[0] is None  # rides on the dial in flight (cap 3: room for 2)


def test_a_waiter_that_lost_its_cover_can_still_leave_the_queue() -> None:
    """A request waiting for streams of a dial that failed moves to the place queue; it
    must be found there when it gives up."""
    pool = make_pool(max_connections=2, may_multiplex=lambda origin: True)
    conn = dial(pool, A, 0, multiplexed=True)
    pool.set_cap(conn, 2)
    assert pool.checkout(A, 0)[0] is conn
    assert pool.checkout(A, 0)[0] is DIAL  # a scale-out dial: the pool is full
    woken: list[PoolWaiter] = []
    b1, w1, w2 = waiter(B, woken), waiter(A, woken), waiter(A, woken)
    for w in (b1, w1, w2):
        pool.wait(w)
    assert w1.for_streams and not w2.for_streams and pool.waiting == 3
    pool.dial_failed(A)  # b1 (first in line) gets the place; w1 now waits for one
    assert woken == [b1] and not w1.for_streams and pool.waiting == 2
    assert pool.cancel(w1) == [] and pool.waiting == 1
    pool.release(conn, 1, reusable=True)
    assert woken == [b1, w2] and w2.grant is conn and w1.grant is None


class CountingEntry(PoolEntry[None]):
    """Counts how often the pool looks at a connection's spare capacity."""

    __slots__ = ()
    looks = 0

    @property
    def spare(self) -> int:
        CountingEntry.looks += 1
        return 0 if self.draining else max(0, self.cap - self.active)


def work_per_request(connections: int) -> int:
    """Connections looked at for one checkout + release with ``connections`` idle and as
    many in use, and as many waiters queued for another origin."""
    pool = make_pool(max_connections=4 * connections, max_idle=4 * connections)
    for origin in (A, B):
        entries = []
        for _ in range(connections):
            assert pool.checkout(origin, 0)[0] is DIAL
            entry = CountingEntry(origin, None)
            pool.dialed(entry, 0)
            entries.append(entry)
        if origin == A:
            for entry in entries:
                pool.release(entry, 1, reusable=True)
    CountingEntry.looks = 0
    grant, closing = pool.checkout(A, 2)
    assert isinstance(grant, CountingEntry) and closing == []
    pool.release(grant, 3, reusable=True)
    return CountingEntry.looks


def test_checkout_and_release_do_bounded_work() -> None:
    """O(1) per request: the work does not grow with the connections held (no scan)."""
    assert work_per_request(1000) == work_per_request(10) <= 4


class PoolMachine(RuleBasedStateMachine):
    """Random checkouts, dials (HTTP/1.1 to A, HTTP/2 to B), cap changes, GOAWAYs,
    releases, discards, waits, grants that resume or are cancelled first, clock ticks and
    sweeps, against a model of who holds what.

    A woken waiter does not resume at once: it stays *granted* until the ``resume`` rule
    (or ``cancel_waiter``, which then passes its grant on) picks it, as a task that is
    woken but not yet scheduled.

    ``abandon`` is the transport moving to another event loop: whatever was in flight,
    dialing or waiting then belongs to the old loop, and ``stale_end`` lets each of those
    come back later (its loop ran again) without changing the pool."""

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
        self.dials: list[tuple[str, str, int]] = []  # DIAL grants being dialed
        self.waiters: list[PoolWaiter] = []  # queued, no grant yet
        self.granted: list[PoolWaiter] = []  # granted, not resumed
        self.woken: list[PoolWaiter] = []
        self.entries: list[PoolEntry[None]] = []
        self.closed: set[int] = set()  # ids of entries the pool told us to close
        self.stream_waits = 0  # waiters granted an open connection
        self.errors = 0  # connections discarded by the ``discard`` rule
        self.b_dial_grants = 0
        #: What the old loop still holds after ``abandon``: requests, dials (with their
        #: epoch) and waiters (queued or granted), each ending at most once.
        self.stale: list[tuple[str, object, int]] = []

    # -- helpers ---------------------------------------------------------------------------
    def _holders(self, entry: PoolEntry[None]) -> int:
        """Requests that hold ``entry``: in flight, or granted and not resumed."""
        held = sum(r is entry for r in self.requests)
        return held + sum(w.grant is entry for w in self.granted)

    def _closing(
        self, entries: list[PoolEntry[None]], broken: PoolEntry[None] | None = None
    ) -> None:
        """The pool closes only connections nobody uses, except ``broken`` (the one the
        caller reported failed or not reusable)."""
        for entry in entries:
            assert not entry.in_pool
            if entry is not broken:
                assert self._holders(entry) == 0, "closed while in use"
            self.closed.add(id(entry))

    def _check_grant(self, grant: object, origin: tuple[str, str, int]) -> None:
        """Whatever is handed out is usable now: never an expired or draining connection."""
        if grant is DIAL:
            if origin == B:
                self.b_dial_grants += 1
            return
        assert isinstance(grant, PoolEntry)
        assert grant.origin == origin and grant.in_pool and not grant.draining
        assert grant.active <= grant.cap  # a grant never exceeds the cap
        assert grant.expires_at > self.now, "handed out past its lifetime"
        if self._holders(grant) == 0:  # it was idle
            assert grant.idle_deadline > self.now, "handed out past its idle deadline"

    def _take(self, grant: object, origin: tuple[str, str, int]) -> None:
        if grant is DIAL:
            self.dials.append(origin)
        else:
            assert isinstance(grant, PoolEntry)
            if grant.in_pool:
                self.requests.append(grant)
            else:  # it failed while the grant waited to resume: the request fails at once
                assert self.pool.release(grant, self.now, reusable=False) == []

    def _settle(self) -> None:
        """Record what the last call granted (the woken waiters do not resume yet)."""
        for w in self.woken:
            assert w in self.waiters and w.grant is not None
            self._check_grant(w.grant, w.origin)
            if isinstance(w.grant, PoolEntry):
                self.stream_waits += 1
            self.waiters.remove(w)
            self.granted.append(w)
        self.woken.clear()

    # -- rules -----------------------------------------------------------------------------
    @rule(origin=st.sampled_from([A, B]), fresh=st.booleans())
    def checkout(self, origin: tuple[str, str, int], fresh: bool) -> None:
        queued_here = any(w.origin == origin for w in self.waiters)
        queued_place = any(not w.for_streams for w in self.waiters)
        grant, closing = self.pool.checkout(origin, self.now, fresh=fresh)
        self._closing(closing)
        if queued_here:
            assert grant is None, "barged past a waiter of its origin"
        if queued_place:
            assert grant is not DIAL, "took a place before the waiters for one"
        if grant is None:
            w = PoolWaiter(origin, lambda: self.woken.append(w))
            self.waiters.append(w)
            self._closing(self.pool.wait(w))  # may be granted at once
            self._settle()
        else:
            self._check_grant(grant, origin)
            self._take(grant, origin)

    @precondition(lambda self: bool(self.granted))
    @rule(index=st.integers(0, 20))
    def resume(self, index: int) -> None:
        w = self.granted.pop(index % len(self.granted))
        self._take(w.grant, w.origin)

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
        closing = self.pool.release(entry, self.now, reusable=reusable, keep_alive=keep_alive)
        self._closing(closing, broken=None if reusable else entry)
        if not entry.in_pool:  # its other streams fail with it
            self.requests = [r for r in self.requests if r is not entry]
        self._settle()

    @precondition(lambda self: bool(self.requests))
    @rule(index=st.integers(0, 20))
    def discard(self, index: int) -> None:
        entry = self.requests.pop(index % len(self.requests))
        if entry.in_pool:
            self.errors += 1
        self._closing(self.pool.discard(entry, Discard.ERROR), broken=entry)
        # Other requests on a broken connection fail too.
        self.requests = [r for r in self.requests if r is not entry]
        self._settle()

    @precondition(lambda self: bool(self.waiters) or bool(self.granted))
    @rule(index=st.integers(0, 20))
    def cancel_waiter(self, index: int) -> None:
        everyone = self.waiters + self.granted
        w = everyone[index % len(everyone)]
        grant = w.grant
        self._closing(self.pool.cancel(w))
        assert w.grant is None
        if grant is None:
            self.waiters.remove(w)
        else:  # granted but cancelled before it resumed: the grant is passed on
            self.granted.remove(w)
        self._settle()  # (the waiter the grant went to is a holder from here on)
        if isinstance(grant, PoolEntry) and grant.in_pool:
            assert self._holders(grant) == grant.active

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

    @rule()
    def abandon(self) -> None:
        """The transport moves to another loop: every open connection goes, in use or
        not, the places of dials in flight are freed and the queues empty (unwoken)."""
        epoch = self.pool.epoch
        live = [e for e in self.entries if e.in_pool]
        before = self.pool.discards[Discard.LOOP_CHANGED]
        closing, waiters = self.pool.abandon(live)
        assert {id(e) for e in closing} == {id(e) for e in live}
        assert self.pool.discards[Discard.LOOP_CHANGED] == before + len(live)
        assert set(waiters) == set(self.waiters) and not self.woken
        self.closed.update(id(e) for e in closing)  # (in use, too: by design)
        assert self.pool.epoch == epoch + 1
        assert (self.pool.total, self.pool.idle, self.pool.waiting) == (0, 0, 0)
        assert self.pool.next_due == math.inf
        self.stale += [("request", r, epoch) for r in self.requests]
        self.stale += [("dial", origin, epoch) for origin in self.dials]
        self.stale += [("waiter", w, epoch) for w in self.waiters + self.granted]
        self.requests, self.dials, self.waiters, self.granted = [], [], [], []

    @precondition(lambda self: bool(self.stale))
    @rule(index=st.integers(0, 20), ok=st.booleans())
    def stale_end(self, index: int, ok: bool) -> None:
        """Something of an abandoned loop ends (its loop ran again): nothing here changes,
        and a dial that succeeds hands its new connection back to be closed."""
        kind, what, epoch = self.stale.pop(index % len(self.stale))
        if kind == "request":
            assert isinstance(what, PoolEntry) and not what.in_pool
            if ok:
                assert self.pool.release(what, self.now, reusable=True) == []
            else:
                assert self.pool.discard(what, Discard.ERROR) == [what]
        elif kind == "dial":
            assert isinstance(what, tuple)
            if ok:
                entry = PoolEntry(what, None)
                self.entries.append(entry)
                closing = self.pool.dialed(entry, self.now, multiplexed=what == B, epoch=epoch)
                assert closing == [entry] and entry.reason is Discard.LOOP_CHANGED
                self.closed.add(id(entry))
            else:
                assert self.pool.dial_failed(what, epoch=epoch) == []
        else:
            assert isinstance(what, PoolWaiter)
            assert self.pool.cancel(what) == []
        assert not self.woken

    # -- invariants ------------------------------------------------------------------------
    @invariant()
    def accounting(self) -> None:
        pool = self.pool
        live = [e for e in self.entries if e.in_pool]
        # Every connection the pool let go of was handed to us to close: no socket leaks.
        assert all(id(e) in self.closed for e in self.entries if not e.in_pool)
        assert 0 <= pool.total <= pool.max_connections
        dial_grants = sum(w.grant is DIAL for w in self.granted)
        assert pool.total == len(live) + len(self.dials) + dial_grants
        for entry in live:
            assert entry.active == self._holders(entry)
        assert pool.idle == sum(e.active == 0 for e in live)
        assert pool.idle <= pool.max_idle
        assert pool.waiting == len(self.waiters)
        # Counters: one creation per dial, one discard per connection closed.
        assert pool.created == len(self.entries)
        assert sum(pool.discards.values()) == len(self.entries) - len(live)
        assert pool.discards[Discard.ERROR] == self.errors
        assert pool.stream_waits == self.stream_waits
        assert pool.scale_outs <= self.b_dial_grants

    @invariant()
    def nobody_waits_in_vain(self) -> None:
        """A waiter waits only when nothing usable is free, and something will wake it: a
        stream waiter has a dial or an unsettled connection of its origin coming; a place
        waiter waits for a full pool with nothing idle to evict."""
        live = [e for e in self.entries if e.in_pool]
        for w in self.waiters:
            assert not any(e.origin == w.origin and e.spare > 0 for e in live)
            if w.for_streams:
                coming = self.dials.count(w.origin)
                coming += sum(g.grant is DIAL and g.origin == w.origin for g in self.granted)
                coming += sum(e.origin == w.origin and not e.settled for e in live)
                assert coming > 0, "queued for streams of a connection that is not coming"
            else:
                assert self.pool.total == self.pool.max_connections and self.pool.idle == 0

    @invariant()
    def timer_never_late(self) -> None:
        """A timer armed at ``next_due`` is never late for an idle connection."""
        for entry in self.entries:
            if entry.in_pool and entry.active == 0:
                assert self.pool.next_due <= min(entry.idle_deadline, entry.expires_at)


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(
    max_examples=MACHINE_EXAMPLES, stateful_step_count=60, deadline=None
)


def test_the_pool_tells_a_connection_when_it_starts_draining() -> None:
    """``on_drain`` hears of every connection that takes no new request from now on: a
    GOAWAY (``drain``) and a lifetime ended with requests in flight, each once."""
    drained: list[object] = []
    pool: Pool[object] = Pool(
        max_connections=4,
        max_idle=4,
        idle_timeout=None,
        max_lifetime=10.0,
        lifetime_jitter=0.0,
        may_multiplex=lambda origin: True,
        on_drain=drained.append,
    )
    goaway, old = object(), object()
    for conn in (goaway, old):
        assert pool.checkout(B, 0, fresh=True)[0] is DIAL
        entry: PoolEntry[object] = PoolEntry(B, conn)
        pool.dialed(entry, 0, multiplexed=True)
        pool.set_cap(entry, 2)
        if conn is goaway:
            first = entry
        else:
            second = entry
    pool.drain(first)
    pool.drain(first)  # again: already draining
    assert drained == [goaway]
    assert pool.checkout(B, 5)[0] is second  # second carries two now
    pool.release(second, 11, reusable=True)  # past its lifetime, one still in flight
    assert drained == [goaway, old] and second.draining and second.in_pool


def test_abandon_forgets_every_connection_and_dial_of_the_old_loop() -> None:
    """The transport moved to another event loop: idle and in-use connections are
    discarded (``LOOP_CHANGED``) and the place of a dial in flight is free again; what the
    old loop does later (a dial completes or fails, a request ends) changes nothing, and
    the pool serves the new loop in full."""
    pool = make_pool(max_connections=3)
    idle, busy = dial(pool, A, 0), dial(pool, A, 0)
    pool.release(idle, 1, reusable=True)
    assert pool.checkout(B, 1)[0] is DIAL  # a dial in flight: the pool is full
    epoch = pool.epoch

    closing, waiters = pool.abandon([idle, busy])
    assert closing == [idle, busy] and waiters == []
    assert (pool.total, pool.idle, pool.waiting, pool.next_due) == (0, 0, 0, math.inf)
    assert pool.discards[Discard.LOOP_CHANGED] == 2 and pool.epoch == epoch + 1

    late = PoolEntry(B, None)  # the old loop's dial completes after all
    assert pool.dialed(late, 2, epoch=epoch) == [late]
    assert not late.in_pool and late.reason is Discard.LOOP_CHANGED
    assert pool.dial_failed(B, epoch=epoch) == []
    assert pool.release(busy, 2, reusable=True) == []
    assert (pool.total, pool.created, pool.discards[Discard.LOOP_CHANGED]) == (0, 3, 3)

    fresh = [dial(pool, origin, 3) for origin in (A, A, B)]  # the whole pool, again
    assert pool.total == 3 and all(e.in_pool for e in fresh)


def test_waiters_of_the_old_loop_leave_unwoken_and_give_back_nothing() -> None:
    """Waiters of the old loop leave the queues without being woken (their loop may be
    closed); one granted a place but not yet resumed when the loop changed frees nothing
    of the new epoch when it is cancelled later, nor does one still queued."""
    pool = make_pool(max_connections=1)
    entry = dial(pool, A, 0)
    woken: list[PoolWaiter] = []
    granted = PoolWaiter(B, lambda: woken.append(granted))
    queued = PoolWaiter(A, lambda: woken.append(queued))
    for waiter in (granted, queued):
        assert pool.checkout(waiter.origin, 0) == (None, []) and pool.wait(waiter) == []
    assert pool.discard(entry, Discard.ERROR) == [entry] and woken == [granted]
    assert granted.grant is DIAL and pool.waiting == 1

    closing, waiters = pool.abandon([])
    assert closing == [] and waiters == [queued] and woken == [granted]
    assert (pool.total, pool.waiting) == (0, 0)
    assert dial(pool, A, 1).in_pool and pool.total == 1
    assert pool.cancel(granted) == [] and pool.cancel(queued) == [] and pool.total == 1
