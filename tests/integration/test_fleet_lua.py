"""The fleet limit's Lua scripts on a real redis-server, against the rule they implement.

A seeded loop drives ACQUIRE / RELEASE / RENEW for a few "processes" in random order and
compares every verdict with the rule written in Python (``admits``), on an independent
model of the leases and of who stands in line.  Only the line's scores (Redis's clock, in
ms: several calls can share one) are read back from Redis, since they decide ties.

CI runs 4 seeds of 150 operations; ``BULKHEAD_FLEET_SEEDS=200`` runs more.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from httpx_bulkhead import _fleet_lua as lua
from tests.servers.redis import RedisServer, importorskip_redis_py

importorskip_redis_py()

SEEDS = int(os.environ.get("BULKHEAD_FLEET_SEEDS", "4"))
OPS = 150
LONG = 600_000  # ms: nothing expires during a run unless a test wants it to


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


class Scripts:
    def __init__(self, server: RedisServer, key: str) -> None:
        client = server.client()
        self.client = client
        self.leases, self.waiters, self.until, self.channel = lua.keys(key)
        self._acquire = client.register_script(lua.ACQUIRE)
        self._renew = client.register_script(lua.RENEW)
        self._release = client.register_script(lua.RELEASE)

    def acquire(
        self, limit: int, lease_id: str, process: str, *, more: bool, lease_ms: int = LONG,
        wait_ms: int = LONG,
    ) -> tuple[int, int, int]:  # fmt: skip
        keys = [self.leases, self.waiters, self.until]
        reply: Any = self._acquire(keys, [limit, lease_ms, lease_id, process, wait_ms, int(more)])
        return int(reply[0]), int(reply[1]), int(reply[2])

    def renew(self, pairs: list[tuple[str, bool]], lease_ms: int = LONG) -> tuple[int, set[str]]:
        args: list[Any] = [lease_ms]
        for lease_id, adopt in pairs:
            args += [lease_id, int(adopt)]
        used, lost = self._renew([self.leases], args)
        return int(used), set(lost)

    def release(self, ids: list[str]) -> int:
        return int(self._release([self.leases], [self.channel, *ids]))

    def line(self) -> dict[str, float]:
        pairs: Any = self.client.zrange(self.waiters, 0, -1, withscores=True)
        return {str(member): float(score) for member, score in pairs}


def admits(limit: int, used: int, line: dict[str, float], process: str) -> bool:
    """The rule: capacity is free, and fewer processes wait ahead than leases are free.
    A place is (since when, process id): the id orders two that began in one millisecond."""
    since = line.get(process)
    if since is None:
        ahead = len(line)
    else:
        ahead = sum(1 for p, s in line.items() if (s, p) < (since, process))
    return used < limit and ahead < limit - used


@pytest.fixture
def scripts(server: RedisServer, unique: Callable[[str], str]) -> Scripts:
    return Scripts(server, unique("lua"))


@pytest.mark.parametrize("seed", range(SEEDS))
def test_scripts_agree_with_the_rule(scripts: Scripts, seed: int) -> None:
    rng = random.Random(seed)
    limit = rng.randint(1, 4)
    processes = [f"p{i}" for i in range(rng.randint(2, 4))]
    leases: dict[str, str] = {}  # lease id -> process
    in_line: set[str] = set()
    lost_ids: set[str] = set()
    for step in range(OPS):
        op = rng.random()
        if op < 0.6 or not leases:
            process = rng.choice(processes)
            more = rng.random() < 0.5
            line = scripts.line()
            assert set(line) == in_line
            expected = admits(limit, len(leases), line, process)
            lease_id = f"{process}:{step}"
            admitted, used, soonest = scripts.acquire(limit, lease_id, process, more=more)
            assert bool(admitted) is expected, (seed, step)
            assert used == len(leases) + admitted
            if admitted:
                leases[lease_id] = process
                if more:
                    in_line.add(process)
                    others = [s for p, s in line.items() if p != process]
                    assert scripts.line()[process] >= max(others, default=0)  # the back
                else:
                    in_line.discard(process)
            else:
                in_line.add(process)
                assert soonest > 0 if leases else soonest == 0
                if process in line:  # kept its place
                    assert scripts.line()[process] == line[process]
        elif op < 0.9:
            chosen = rng.sample(sorted(leases), rng.randint(1, min(3, len(leases))))
            assert scripts.release([*chosen, "never-held"]) == len(chosen)
            for lease_id in chosen:
                del leases[lease_id]
        else:  # renew some, one of them unknown to Redis: lost unless adopted
            ghost = f"ghost:{step}"
            adopt = rng.random() < 0.5
            pairs = [(lease_id, False) for lease_id in rng.sample(sorted(leases), 1)]
            used, lost = scripts.renew([*pairs, (ghost, adopt)])
            if adopt:
                leases[ghost] = "ghost"  # counted, even past the limit
                assert lost == set()
            else:
                assert lost == {ghost}
                lost_ids.add(ghost)
            assert used == len(leases)
        assert scripts.client.zcard(scripts.leases) == len(leases)
        grown = sum(1 for owner in leases.values() if owner == "ghost")
        assert len(leases) <= limit + grown  # only adoption may pass the limit


def test_expired_leases_and_lapsed_places_are_dropped(scripts: Scripts) -> None:
    """A lease past its expiry frees its capacity; a process that stopped refreshing its
    place in line (killed while waiting) stops blocking the others."""
    assert scripts.acquire(1, "a:1", "a", more=False, lease_ms=150)[0] == 1
    refused = scripts.acquire(1, "x:1", "x", more=False, wait_ms=150)
    assert refused[0] == 0 and 0 < refused[2] <= 150  # ms until a:1 expires
    # Now x stands first in line: y is refused even once a:1 expires, until x's place
    # lapses (x never asks again), then y is admitted.
    verdicts: list[int] = []
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        admitted = scripts.acquire(1, f"y:{len(verdicts)}", "y", more=False)[0]
        verdicts.append(admitted)
        if admitted:
            break
        time.sleep(0.01)
    assert verdicts[0] == 0 and verdicts[-1] == 1
    assert scripts.line() == {}  # x lapsed, y left the line when admitted
    assert scripts.client.zcard(scripts.leases) == 1


def test_two_that_joined_in_one_millisecond_are_not_both_first(scripts: Scripts) -> None:
    """Redis's clock is in ms, so two processes can join the line with one score; the
    line is still a total order (the process id breaks the tie): with one lease free,
    exactly one of them is admitted, and the other stays first for the next."""
    assert scripts.acquire(1, "a:1", "a", more=False)[0] == 1
    assert scripts.acquire(1, "q:1", "q", more=False)[0] == 0
    assert scripts.acquire(1, "p:1", "p", more=False)[0] == 0
    since = scripts.line()["q"]
    scripts.client.zadd(scripts.waiters, {"p": since, "q": since})  # one millisecond
    scripts.release(["a:1"])
    assert scripts.acquire(1, "q:2", "q", more=False)[0] == 0  # p is ahead on the tie
    assert scripts.acquire(1, "p:2", "p", more=False)[0] == 1
    assert scripts.line() == {"q": since}
    scripts.release(["p:2"])
    assert scripts.acquire(1, "q:3", "q", more=False)[0] == 1


def test_keys_expire_with_their_last_entry(scripts: Scripts) -> None:
    scripts.acquire(2, "a:1", "a", more=False, lease_ms=5_000)
    ttl = scripts.client.pttl(scripts.leases)
    assert 0 < ttl <= 5_001
    scripts.acquire(1, "b:1", "b", more=False, wait_ms=3_000)  # refused: enters the line
    assert 0 < scripts.client.pttl(scripts.waiters) <= 3_001
    assert scripts.client.pttl(scripts.waiters) == pytest.approx(
        scripts.client.pttl(scripts.until), abs=50
    )
    scripts.release(["a:1"])
    assert scripts.client.exists(scripts.leases) == 0
