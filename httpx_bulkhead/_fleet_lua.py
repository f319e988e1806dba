"""The fleet limit's decisions, as Lua scripts Redis runs atomically: one round trip each.

Theory of operation
-------------------
Keys (``K`` is ``RedisFleetLimit.key``)::

    K:leases         sorted set  lease id -> expiry (ms, Redis clock)
    K:waiters        sorted set  process id -> since when it waits (ms), its place in line
    K:waiting-until  sorted set  process id -> when that place lapses (ms)
    K:free           pub/sub channel: a message each time leases are released

Every script reads the time from Redis itself (``TIME``), so the hosts' clocks never
matter, and first drops what has expired: leases past their expiry (a killed worker's
capacity comes back within one lease time), and waiting processes that stopped refreshing
their place (a killed waiter cannot block the line).

**ACQUIRE** admits a lease when ``used < limit`` *and* fewer processes wait ahead of the
caller than there are free leases.  A process's place is the time its wait began (two
that began in the same millisecond are ordered by process id, so the line is a total
order and exactly one of them is first): a
refused process enters the line (or keeps its place, refreshing its lapse time); an
admitted one leaves it, or, if it has more requests waiting, re-enters at the back.  So
free capacity goes round-robin to the processes waiting longest, one lease per turn: a
process with 25 waiters cannot starve one with a single waiter (fairness *between*
processes; within a process the waiters are FIFO, see ``_fleet.py``).  Refused, it returns
the milliseconds until the earliest lease expires, so a waiter need not sleep past it.

**RENEW** pushes the expiry of this process's live leases to ``now + lease``; a lease
already gone (expired and dropped, or Redis restarted empty) is reported lost.  Leases
marked *adopt* are added whatever the count: requests admitted while Redis was unreachable
(or whose lease was lost) are still running, and counting them, even past the limit, is
what makes the limit hold again after an outage.

**RELEASE** removes leases and, if any was there, publishes on ``K:free``.

Each key's TTL follows its latest entry (``PEXPIREAT`` at the largest score; the line's two
sets share the lapse times' TTL), so an unused limit leaves nothing behind.
"""

from __future__ import annotations

__all__ = ["ACQUIRE", "RELEASE", "RENEW", "keys"]


def keys(key: str) -> tuple[str, str, str, str]:
    """``(leases, waiters, waiting_until, channel)`` for the configured key."""
    return f"{key}:leases", f"{key}:waiters", f"{key}:waiting-until", f"{key}:free"


_PRELUDE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function keep(key, also)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then
    local at = math.ceil(tonumber(last[2])) + 1
    redis.call('PEXPIREAT', key, at)
    if also then redis.call('PEXPIREAT', also, at) end
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
"""

# KEYS: leases, waiters, waiting-until
# ARGV: limit, lease_ms, lease id, process id, wait_ttl_ms (how long a place in line
#       lasts unrefreshed), more ('1': the process has
#       other requests waiting)
# Returns {admitted (0/1), leases in use, ms until the earliest lease expires (0 if none)}
ACQUIRE = (
    _PRELUDE
    + """
local since = false
local ahead = 0
if redis.call('EXISTS', KEYS[3]) == 1 then  -- somebody waits (the usual case: nobody)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
  for i = 1, #gone do
    redis.call('ZREM', KEYS[2], gone[i])
    redis.call('ZREM', KEYS[3], gone[i])
  end
  since = redis.call('ZRANK', KEYS[2], ARGV[4])  -- ties (one ms) go by process id
  if since then
    ahead = since
  else
    ahead = redis.call('ZCARD', KEYS[2])
  end
end
local limit = tonumber(ARGV[1])
local used = redis.call('ZCARD', KEYS[1])
local wait_until = now + tonumber(ARGV[5])
if used < limit and ahead < limit - used then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
  keep(KEYS[1])
  if ARGV[6] == '1' then
    redis.call('ZADD', KEYS[2], now, ARGV[4])
    redis.call('ZADD', KEYS[3], wait_until, ARGV[4])
    keep(KEYS[3], KEYS[2])
  elseif since then
    redis.call('ZREM', KEYS[2], ARGV[4])
    redis.call('ZREM', KEYS[3], ARGV[4])
  end
  return {1, used + 1, 0}
end
if not since then redis.call('ZADD', KEYS[2], now, ARGV[4]) end
redis.call('ZADD', KEYS[3], wait_until, ARGV[4])
keep(KEYS[3], KEYS[2])
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local soonest = 0
if first[2] then soonest = math.max(1, tonumber(first[2]) - now) end
return {0, used, soonest}
"""
)

# KEYS: leases
# ARGV: lease_ms, then pairs (lease id, '1' to adopt it whatever the count, else '0')
# Returns {leases in use, {ids of leases found gone}}
RENEW = (
    _PRELUDE
    + """
local expiry = now + tonumber(ARGV[1])
local lost = {}
for i = 2, #ARGV, 2 do
  local id = ARGV[i]
  if ARGV[i + 1] == '1' or redis.call('ZSCORE', KEYS[1], id) then
    redis.call('ZADD', KEYS[1], expiry, id)
  else
    lost[#lost + 1] = id
  end
end
keep(KEYS[1])
return {redis.call('ZCARD', KEYS[1]), lost}
"""
)

# KEYS: leases
# ARGV: channel, then lease ids
# Returns the number of leases removed.
RELEASE = """
local removed = 0
for i = 2, #ARGV do
  removed = removed + redis.call('ZREM', KEYS[1], ARGV[i])
end
if removed > 0 then redis.call('PUBLISH', ARGV[1], removed) end
return removed
"""
