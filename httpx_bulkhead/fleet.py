"""Fleet-wide limits on Redis (the optional extra ``redis``): one limit shared by every
process of a fleet.

``RedisFleetLimit`` is the configuration, given to ``Policy(fleet=...)``: the transport
then takes a lease after each request's local slot (``_fleet_slots.py``).  ``FleetLimiter``
is one process's side of it (asyncio only), which each such compartment holds; it can
also be used on its own::

    limiter = FleetLimiter(RedisFleetLimit("redis://127.0.0.1:6379/0", key="llm", limit=50))
    lease = await limiter.acquire(budget=0.5)   # AcquireTimeout, FleetUnavailable
    try:
        ...                                      # the request
    finally:
        lease.release()                          # sync, idempotent, any thread
    limiter.statistics()                         # FleetStats
    await limiter.aclose()
"""

from ._exceptions import FleetUnavailable
from ._fleet import FleetLimiter, Lease
from ._fleet_config import FleetStats, RedisFleetLimit

__all__ = ["FleetLimiter", "FleetStats", "FleetUnavailable", "Lease", "RedisFleetLimit"]
