"""Policy validation, route key parsing and host spellings."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from httpx_bulkhead import BulkheadTransport, Policy
from httpx_bulkhead._config import RouteKey, canonical_host, parse_route_key


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("max_concurrency", 0, ValueError),
        ("max_concurrency", True, TypeError),
        ("max_concurrency", 1.5, TypeError),
        ("max_pending", -1, ValueError),
        ("acquire_timeout", -0.1, ValueError),
        ("acquire_timeout", "1", TypeError),
        ("request_timeout", 0, ValueError),
        ("request_timeout", float("nan"), ValueError),
        ("max_connections", 0, ValueError),
        ("max_idle_connections", -1, ValueError),
        ("idle_timeout", -1, ValueError),
        ("max_lifetime", 0, ValueError),
        ("lifetime_jitter", 1.0, ValueError),
        ("lifetime_jitter", -0.1, ValueError),
        ("lifetime_jitter", None, TypeError),
        ("max_streams_per_connection", 0, ValueError),
        ("max_streams_per_connection", 2.0, TypeError),
        ("ping_after", -1, ValueError),
        ("ping_timeout", 0, ValueError),
        ("ping_timeout", None, TypeError),
        ("idle_timeout", True, TypeError),
        ("max_pending", "5", TypeError),
        ("fleet", "redis://127.0.0.1:6379/0", TypeError),
        ("fleet", {"key": "llm", "limit": 5}, TypeError),
    ],
)
def test_invalid_policy_names_the_field(field: str, value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match=f"Policy.{field}"):
        Policy(**{field: value})


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_concurrency", 1.5, "must be an int or an AdaptiveLimit, got float"),
        ("max_pending", 1.5, "must be an int or None, got float"),
        ("max_concurrency", 0, "must be >= 1, got 0"),
        ("max_pending", -1, "must be >= 0, got -1"),
        ("acquire_timeout", -1, "must be >= 0 seconds"),
        ("request_timeout", 0, "must be > 0 seconds"),
        ("acquire_timeout", "1", "must be a number of seconds or None"),
        ("lifetime_jitter", 1.5, "must be < 1"),
        ("fleet", "redis://x", "must be a RedisFleetLimit or None, got str"),
    ],
)
def test_policy_errors_say_what_is_allowed(field: str, value: Any, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        Policy(**{field: value})


def test_the_smallest_valid_values_are_accepted() -> None:
    policy = Policy(
        max_concurrency=1,
        max_pending=0,
        acquire_timeout=0,
        request_timeout=0.001,
        max_connections=1,
        max_idle_connections=0,
        idle_timeout=0,
        max_lifetime=0.001,
        lifetime_jitter=0,
        max_streams_per_connection=1,
        ping_after=0,
        ping_timeout=0.001,
    )
    assert (policy.connection_limit, policy.idle_limit) == (1, 0)
    unbounded = Policy(
        max_pending=None,
        idle_timeout=None,
        max_streams_per_connection=None,
        ping_after=None,
        lifetime_jitter=0.999,
    )
    assert unbounded.max_pending is None and unbounded.max_streams_per_connection is None


def test_policy_defaults_and_derived_limits() -> None:
    policy = Policy(max_concurrency=7)
    assert policy.connection_limit == 7 and policy.idle_limit == 7
    assert policy.idle_timeout == 4.0 and policy.max_pending == 1024
    assert Policy(max_concurrency=7, max_connections=3, max_idle_connections=1).idle_limit == 1
    with pytest.raises(AttributeError):
        policy.max_concurrency = 3  # type: ignore[misc]


def test_policy_from_httpx_limits() -> None:
    policy = Policy.from_limits(
        httpx.Limits(max_connections=10, max_keepalive_connections=4, keepalive_expiry=2.0)
    )
    assert (policy.max_concurrency, policy.idle_limit, policy.idle_timeout) == (10, 4, 2.0)
    assert Policy.from_limits(httpx.Limits(max_connections=None)).max_concurrency == 100
    more_idle = Policy.from_limits(httpx.Limits(max_connections=3, max_keepalive_connections=9))
    assert more_idle.idle_limit == 3  # never more idle connections than connections
    unbounded = Policy.from_limits(httpx.Limits(max_keepalive_connections=None))
    assert unbounded.max_idle_connections is None and unbounded.idle_limit == 100
    with pytest.raises(TypeError, match=r"httpx\.Limits"):
        Policy.from_limits({"max_connections": 3})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("API.example.com", RouteKey(None, "api.example.com", None, None)),
        ("api.example.com:8443", RouteKey(None, "api.example.com", 8443, None)),
        ("https://api.example.com", RouteKey("https", "api.example.com", 443, None)),
        ("http://api.example.com:81/v1/gen/", RouteKey("http", "api.example.com", 81, "/v1/gen")),
        ("[::1]:8080", RouteKey(None, "::1", 8080, None)),
        ("api.example.com/v1", RouteKey(None, "api.example.com", None, "/v1")),
    ],
)
def test_route_keys_parse(text: str, key: RouteKey) -> None:
    assert parse_route_key(text) == key


@pytest.mark.parametrize(
    "text",
    [
        "ftp://x",
        "x:99999",
        "x:65536",
        "x:0",
        "x:abc",
        "x:",
        "",
        "[::1",
        "a b",
        "[::1]x",
        "https://:443",
        "::1",  # an IPv6 address without brackets
        "[::1::2]",  # not an IPv6 address
        "[example.com]",
        "-bad-.example",
        "bad..ex\u00e4mple",  # IDNA cannot encode it
    ],
)
def test_bad_route_keys_are_named(text: str) -> None:
    with pytest.raises(ValueError, match="hosts key"):
        parse_route_key(text)


@pytest.mark.parametrize("text", [3, None, b"host"])
def test_route_keys_must_be_strings(text: object) -> None:
    with pytest.raises(TypeError, match="hosts keys must be strings"):
        parse_route_key(text)


def test_route_key_edge_spellings() -> None:
    assert parse_route_key("  api.example  ") == RouteKey(None, "api.example", None, None)
    assert parse_route_key("api.example/") == RouteKey(None, "api.example", None, None)
    assert parse_route_key("HTTP://api.example") == RouteKey("http", "api.example", 80, None)
    assert parse_route_key("[::1]") == RouteKey(None, "::1", None, None)
    assert parse_route_key("api.example:65535").port == 65535
    assert parse_route_key("internal_host:1") == RouteKey(None, "internal_host", 1, None)
    assert parse_route_key("http://x/a://b") == RouteKey("http", "x", 80, "/a://b")


def test_transport_rejects_bad_configuration() -> None:
    with pytest.raises(TypeError, match="Policy"):
        BulkheadTransport(hosts={"a": 3})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="default"):
        BulkheadTransport(default=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="limits"):
        BulkheadTransport(default=Policy(), limits=httpx.Limits())
    with pytest.raises(ValueError, match="retries"):
        BulkheadTransport(retries=-1)
    with pytest.raises(ValueError, match="hosts key"):
        BulkheadTransport(hosts={"ftp://x": Policy()})
    with pytest.raises(ValueError, match="duplicates"):
        BulkheadTransport(hosts={"x": Policy(), "X": Policy()})
    with pytest.raises(ValueError, match="no HTTP version left"):
        BulkheadTransport(http1=False, http2=False)
    with pytest.raises(ValueError, match="must be 'h11' or 'httptools', got 'llhttp'"):
        BulkheadTransport(http1_parser="llhttp")


@pytest.mark.parametrize(
    ("host", "canonical"),
    [
        ("API.Example.COM.", "api.example.com"),
        ("bücher.example", "xn--bcher-kva.example"),
        ("XN--BCHER-KVA.example", "xn--bcher-kva.example"),
        ("0:0:0::1", "::1"),
        ("2001:DB8:0:0:0:0:0:1", "2001:db8::1"),
        ("127.0.0.1", "127.0.0.1"),
    ],
)
def test_canonical_host(host: str, canonical: str) -> None:
    assert canonical_host(host) == canonical


def test_route_keys_use_the_canonical_host() -> None:
    assert parse_route_key("Bücher.Example.:8080").host == "xn--bcher-kva.example"
    assert parse_route_key("[0:0::1]").host == "::1"
    with pytest.raises(ValueError, match="hosts key"):
        parse_route_key("xn--a.example\u0000")


@pytest.mark.parametrize("bound", [0, -1, 1.5, True, "10"])
def test_max_default_compartments_is_validated(bound: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="max_default_compartments"):
        BulkheadTransport(max_default_compartments=bound)
