"""The public API contract: names, exception tree, typing marker, immutability."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

import httpx_bulkhead
from httpx_bulkhead import (
    AcquireTimeout,
    BulkheadError,
    BulkheadFull,
    BulkheadTransport,
    CompartmentStats,
    ExchangeInfo,
    Policy,
    RequestTimeout,
    TransportClosed,
)

PUBLIC = {
    "AcquireTimeout",
    "BulkheadError",
    "BulkheadFull",
    "BulkheadTransport",
    "CompartmentStats",
    "ExchangeInfo",
    "Group",
    "Policy",
    "RequestTimeout",
    "TransportClosed",
}
EXCEPTIONS = [AcquireTimeout, BulkheadError, BulkheadFull, RequestTimeout, TransportClosed]


def test_all_lists_exactly_the_public_names() -> None:
    assert sorted(httpx_bulkhead.__all__) == sorted(PUBLIC)
    assert len(httpx_bulkhead.__all__) == len(set(httpx_bulkhead.__all__))
    namespace: dict[str, Any] = {}
    exec("from httpx_bulkhead import *", namespace)
    assert set(namespace) - {"__builtins__"} == PUBLIC


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_each_public_name_is_importable_and_public(name: str) -> None:
    module = importlib.import_module("httpx_bulkhead")
    obj = getattr(module, name)
    assert inspect.isclass(obj)
    assert obj.__name__ == name
    assert obj.__doc__, f"{name} has no docstring"


def test_no_other_public_attributes() -> None:
    """Everything else at the top level is private (underscored) or the version."""
    extra = {
        name
        for name in vars(httpx_bulkhead)
        if not name.startswith("_") and not inspect.ismodule(getattr(httpx_bulkhead, name))
    }
    assert extra == PUBLIC
    assert isinstance(httpx_bulkhead.__version__, str)


@pytest.mark.parametrize("exc", EXCEPTIONS, ids=lambda e: e.__name__)
def test_every_exception_is_an_httpx_transport_error(exc: type[Exception]) -> None:
    assert issubclass(exc, httpx.TransportError)
    request = httpx.Request("GET", "http://127.0.0.1/")
    instance = exc("message", request=request)  # httpx's constructor signature
    assert instance.request is request
    assert str(instance) == "message"


def test_exception_tree() -> None:
    assert issubclass(AcquireTimeout, httpx.PoolTimeout)
    assert issubclass(AcquireTimeout, httpx.TimeoutException)
    assert issubclass(AcquireTimeout, BulkheadError)
    assert issubclass(RequestTimeout, httpx.TimeoutException)
    assert issubclass(RequestTimeout, BulkheadError)  # one except for every bulkhead rule
    for refused in (BulkheadFull, TransportClosed):
        assert issubclass(refused, BulkheadError)
        assert not issubclass(refused, httpx.TimeoutException)
    assert not issubclass(BulkheadFull, httpx.PoolTimeout)
    assert issubclass(BulkheadError, httpx.TransportError)


def test_py_typed_is_shipped() -> None:
    package_dir = Path(httpx_bulkhead.__file__).parent
    assert (package_dir / "py.typed").is_file()


def test_policy_is_frozen() -> None:
    policy = Policy(max_concurrency=3)
    assert dataclasses.is_dataclass(policy)
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.max_concurrency = 4  # type: ignore[misc]
    assert policy.max_concurrency == 3
    assert policy == Policy(max_concurrency=3) and hash(policy) == hash(Policy(max_concurrency=3))


def test_compartment_stats_and_exchange_info_are_frozen() -> None:
    values: dict[str, Any] = {f.name: 0 for f in dataclasses.fields(CompartmentStats)}
    stats = CompartmentStats(**{**values, "name": "c"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.running = 1  # type: ignore[misc]
    exchange = ExchangeInfo(
        compartment="c", queue_wait=0.0, reused=False, retried=False, connection_id=1
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        exchange.reused = True  # type: ignore[misc]


def test_compartment_stats_fields_documented_in_readme() -> None:
    names = {f.name for f in dataclasses.fields(CompartmentStats)}
    gauges = {"running", "waiting", "limit", "connections", "idle_connections"}
    gauges |= {"in_use_connections"}
    counters = {"acquired", "completed", "failed", "cancelled", "rejected", "acquire_timeouts"}
    counters |= {"cancelled_waiting", "connections_created", "stale_retries"}
    discards = {"idle_expired", "lifetime_expired", "unknown_state", "peer_closed", "error"}
    discards |= {"not_reusable", "surplus", "closed"}
    quantiles = {"wait_p50", "wait_p95", "wait_p99", "wait_max"}
    assert gauges | counters | discards | quantiles <= names


def test_bulkhead_transport_is_an_httpx_async_transport() -> None:
    assert issubclass(BulkheadTransport, httpx.AsyncBaseTransport)
    transport = BulkheadTransport()
    assert isinstance(transport, httpx.AsyncBaseTransport)
    assert transport.statistics() == {}
    anyio.run(transport.aclose)
