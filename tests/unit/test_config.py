"""Policy validation, route key parsing and routing."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from httpx_bulkhead import BulkheadTransport, Policy
from httpx_bulkhead._config import RouteKey, canonical_host, parse_route_key
from httpx_bulkhead._routing import Router


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
        ("lifetime_jitter", None, TypeError),
    ],
)
def test_invalid_policy_names_the_field(field: str, value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match=f"Policy.{field}"):
        Policy(**{field: value})


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
    "text", ["ftp://x", "x:99999", "x:abc", "", "[::1", "a b", "[::1]x", "https://:443"]
)
def test_bad_route_keys_are_named(text: str) -> None:
    with pytest.raises(ValueError, match="hosts key"):
        parse_route_key(text)


def test_router_most_specific_wins_and_longest_prefix() -> None:
    router = Router(
        {
            "llm.example.com": Policy(),
            "llm.example.com:8443": Policy(),
            "https://llm.example.com:8443": Policy(),
            "llm.example.com/v1": Policy(),
            "llm.example.com/v1/generate": Policy(),
        },
        Policy(),
        lambda name, policy: name,
    )
    https = ("https", "llm.example.com", 8443)
    assert router.route(https, "/other") == "https://llm.example.com:8443"
    assert router.route(("http", "llm.example.com", 8443), "/") == "llm.example.com:8443"
    assert router.route(("https", "llm.example.com", 443), "/") == "llm.example.com"
    assert router.route(https, "/v1/generate") == "llm.example.com/v1/generate"
    assert router.route(https, "/v1/generate/stream") == "llm.example.com/v1/generate"
    assert router.route(https, "/v1/generated") == "llm.example.com/v1"
    assert router.route(https, "/v1?x=1") == "llm.example.com/v1"
    # Unlisted origins each get their own compartment, made once.
    assert router.route(("https", "other.example", 443), "/") == "https://other.example:443"
    assert router.route(("http", "::1", 80), "/") == "http://[::1]:80"
    assert list(router.compartments).count("https://other.example:443") == 1


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


class Box:
    """A stand-in compartment: the router only asks whether it is at rest and how used."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.busy = False
        self.uses = 0


def box_router(bound: int) -> Router[Box]:
    return Router(
        {"listed.example": Policy()},
        Policy(),
        lambda name, policy: Box(name),
        max_default=bound,
        at_rest=lambda box: not box.busy,
        uses=lambda box: box.uses,
    )


def test_router_evicts_unused_compartments_at_rest_clock_style() -> None:
    router = box_router(3)
    boxes = [router.route(("http", f"h{i}", 80), "/") for i in range(3)]
    boxes[0].busy = True  # in use: never evicted
    boxes[1].uses = 5  # used since it was made: a second chance
    router.route(("http", "h3", 80), "/")
    # h0 is busy and h1 was used: both move to the back; h2 is at rest and unused: out.
    assert router.retired == [boxes[2]]
    assert set(router.compartments) == {
        "listed.example",
        "http://h0:80",
        "http://h1:80",
        "http://h3:80",
    }
    # A route to an evicted origin makes a new compartment (the cache forgot the old one).
    again = router.route(("http", "h2", 80), "/")
    assert again is not boxes[2] and router.compartments["http://h2:80"] is again


def test_router_never_evicts_listed_or_busy_compartments() -> None:
    router = box_router(1)
    first = router.route(("http", "a", 80), "/")
    first.busy = True
    for i in range(20):
        router.route(("http", f"b{i}", 80), "/").busy = True
    assert router.retired == [] and "listed.example" in router.compartments
    assert len(router.compartments) == 22  # over the bound while everything is busy


def test_router_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx_bulkhead._routing as routing

    monkeypatch.setattr(routing, "MAX_CACHED_ORIGINS", 10)
    router = Router({"listed.example": Policy()}, Policy(), lambda name, policy: name)
    for port in range(1, 100):  # one key, any port: each port is an origin of its own
        assert router.route(("http", "listed.example", port), "/") == "listed.example"
    assert len(router._cache) <= 10


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
