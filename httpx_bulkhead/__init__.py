"""httpx-bulkhead: an httpx transport for ``httpx.AsyncClient`` with a bulkhead per dependency.

Each dependency (a host, ``host:port``, or a path prefix) gets its own compartment: its own
concurrency limit, bounded FIFO wait queue, acquire timeout and connection pool, so a slow
dependency stays slow inside its own wall::

    transport = BulkheadTransport(
        default=Policy(max_concurrency=20),
        hosts={"llm.example.com": Policy(max_concurrency=4, acquire_timeout=0.5)},
    )
    async with httpx.AsyncClient(transport=transport) as client:
        ...
    transport.statistics()  # {compartment name: CompartmentStats}
"""

from ._adaptive import AdaptiveLimit
from ._config import Group, Policy
from ._exceptions import (
    AcquireTimeout,
    BulkheadError,
    BulkheadFull,
    FleetUnavailable,
    RequestTimeout,
    TransportClosed,
)
from ._fleet_config import RedisFleetLimit
from ._stats import CompartmentStats, ExchangeInfo
from ._sync_transport import BulkheadHTTPTransport
from ._transport import BulkheadTransport

#: The async transport, named as httpx's ``AsyncHTTPTransport`` is (``BulkheadTransport``).
AsyncBulkheadHTTPTransport = BulkheadTransport

__all__ = [
    "AcquireTimeout",
    "AdaptiveLimit",
    "AsyncBulkheadHTTPTransport",
    "BulkheadError",
    "BulkheadFull",
    "BulkheadHTTPTransport",
    "BulkheadTransport",
    "CompartmentStats",
    "ExchangeInfo",
    "FleetUnavailable",
    "Group",
    "Policy",
    "RedisFleetLimit",
    "RequestTimeout",
    "TransportClosed",
]

__version__ = "0.1.0.dev0"
