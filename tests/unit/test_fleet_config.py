"""RedisFleetLimit validation and repr; FleetStats; the exception's place in the tree."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from httpx_bulkhead import BulkheadError
from httpx_bulkhead.fleet import FleetUnavailable, RedisFleetLimit
from tests.servers.redis import importorskip_redis_py

importorskip_redis_py()
import redis  # noqa: E402
import redis.asyncio  # noqa: E402

URL = "redis://127.0.0.1:6399/0"


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("key", "", ValueError),
        ("key", " k", ValueError),
        ("key", 5, TypeError),
        ("limit", 0, ValueError),
        ("limit", True, TypeError),
        ("limit", 2.0, TypeError),
        ("lease", 0, ValueError),
        ("lease", 0.001, ValueError),
        ("lease", float("inf"), ValueError),
        ("lease", "30", TypeError),
        ("on_unavailable", "fail", ValueError),
        ("on_unavailable", None, ValueError),
        ("redis_timeout", 0, ValueError),
        ("redis_timeout", float("nan"), ValueError),
        ("poll_interval", -1, ValueError),
        ("retry_interval", False, TypeError),
    ],
)
def test_invalid_values_name_the_field_and_value(field: str, value: Any, error: type) -> None:
    kwargs: dict[str, Any] = {"key": "k", "limit": 3, field: value}
    with pytest.raises(error, match=f"RedisFleetLimit.{field}") as info:
        RedisFleetLimit(URL, **kwargs)
    if error is ValueError:
        assert repr(value) in str(info.value) or str(value) in str(info.value)


def test_url_or_client_is_checked_and_credentials_never_shown() -> None:
    secret = "redis://user:s3cr3t@127.0.0.1:6399/0"
    limit = RedisFleetLimit(secret, key="llm", limit=50)
    assert "s3cr3t" not in repr(limit) and "user" not in repr(limit)
    assert "***@127.0.0.1:6399" in repr(limit)
    assert "limit=50" in repr(limit) and "on_unavailable='local'" in repr(limit)
    with pytest.raises(ValueError, match="redis://, rediss:// or unix://") as info:
        RedisFleetLimit("http://user:s3cr3t@127.0.0.1/", key="k", limit=1)
    assert "s3cr3t" not in str(info.value)
    with pytest.raises(TypeError, match=r"synchronous redis\.Redis"):
        RedisFleetLimit(redis.Redis(), key="k", limit=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got int"):
        RedisFleetLimit(6379, key="k", limit=1)  # type: ignore[arg-type]
    client = redis.asyncio.Redis(password="s3cr3t")
    shown = repr(RedisFleetLimit(client, key="k", limit=1))
    assert "s3cr3t" not in shown and "<Redis>" in shown


def test_frozen_with_documented_defaults() -> None:
    limit = RedisFleetLimit(URL, key="k", limit=2)
    assert (limit.lease, limit.on_unavailable) == (30.0, "local")
    assert (limit.redis_timeout, limit.poll_interval, limit.retry_interval) == (0.5, 0.5, 1.0)
    with pytest.raises(AttributeError):
        limit.limit = 3  # type: ignore[misc]
    assert limit == RedisFleetLimit(URL, key="k", limit=2)


def test_fleet_unavailable_is_a_bulkhead_error_not_a_timeout() -> None:
    assert issubclass(FleetUnavailable, BulkheadError)
    assert issubclass(FleetUnavailable, httpx.TransportError)
    assert not issubclass(FleetUnavailable, httpx.TimeoutException)


def test_the_extra_stays_optional() -> None:
    """``import httpx_bulkhead`` (and ``httpx_bulkhead.fleet``) never imports redis-py."""
    import subprocess
    import sys

    code = (
        "import sys, httpx_bulkhead, httpx_bulkhead.fleet as f;"
        " assert 'redis' not in sys.modules, 'redis imported';"
        " assert sorted(f.__all__) == ['FleetLimiter', 'FleetStats', 'FleetUnavailable',"
        " 'Lease', 'RedisFleetLimit']"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
