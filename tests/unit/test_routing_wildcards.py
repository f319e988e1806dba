"""Wildcard route keys, groups, and the key shapes routing refuses."""

from __future__ import annotations

from typing import Any

import pytest

from httpx_bulkhead import Group, Policy
from httpx_bulkhead._config import RouteKey, parse_route_key
from httpx_bulkhead._routing import Router


class CountingDict(dict[Any, Any]):
    """A wildcard table that counts the lookups routing makes in it."""

    lookups = 0

    def get(self, key: Any, default: Any = None) -> Any:
        CountingDict.lookups += 1
        return super().get(key, default)


def router(hosts: dict[str, Any]) -> Router[str]:
    return Router(hosts, Policy(), lambda name, policy: name)


def route(r: Router[str], url_host: str, path: str = "/", scheme: str = "https") -> str:
    port = 443 if scheme == "https" else 80
    return r.route((scheme, url_host, port), path)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("*.example.com", RouteKey(None, "example.com", None, None, True)),
        ("https://*.Example.COM.", RouteKey("https", "example.com", 443, None, True)),
        ("*.example.com:8443/v1/", RouteKey(None, "example.com", 8443, "/v1", True)),
        ("*.bücher.de", RouteKey(None, "xn--bcher-kva.de", None, None, True)),
        ("*.com", RouteKey(None, "com", None, None, True)),
    ],
)
def test_wildcard_keys_parse(text: str, key: RouteKey) -> None:
    assert parse_route_key(text) == key


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("*", "BulkheadTransport(default=...)"),
        ("*:8080", "BulkheadTransport(default=...)"),
        ("https://*", "BulkheadTransport(default=...)"),
        ("api.*.com", "only as the whole first label"),
        ("*example.com", "only as the whole first label"),
        ("a*.example.com", "only as the whole first label"),
        ("*.*.example.com", "invalid host"),
        ("*.", "invalid host"),
        ("*.10.0.0.1", "IP address"),
        ("*.[::1]", "IP address"),
        ("example.com/v1?x=1", "a query"),
        ("example.com/v1#top", "a fragment"),
        ("example.com/v1/*", "a glob"),
        ("example.com/v1 beta", "white space"),
        ("user@example.com", "invalid host"),
    ],
)
def test_key_shapes_routing_does_not_understand_are_refused(text: str, says: str) -> None:
    with pytest.raises(ValueError, match="hosts key") as info:
        parse_route_key(text)
    assert repr(text) in str(info.value)
    assert says in str(info.value)


def test_a_wildcard_matches_every_host_below_its_domain_and_not_the_domain() -> None:
    r = router({"*.example.com": Policy()})
    assert route(r, "a.example.com") == "*.example.com"
    assert route(r, "a.b.example.com") == "*.example.com"
    assert route(r, "A.Example.COM.") == "*.example.com"  # the canonical spelling
    assert route(r, "example.com") == "https://example.com:443"
    assert route(r, "notexample.com") == "https://notexample.com:443"
    assert route(r, "example.com.evil.net") == "https://example.com.evil.net:443"


def test_the_most_specific_key_wins_over_wildcards() -> None:
    r = router(
        {
            "*.example.com": Policy(),
            "*.eu.example.com": Policy(),
            "api.eu.example.com": Policy(),
            "https://*.example.com:8443": Policy(),
            "*.example.com/v1": Policy(),
        }
    )
    assert route(r, "api.eu.example.com") == "api.eu.example.com"  # exact over wildcards
    assert route(r, "x.eu.example.com") == "*.eu.example.com"  # the longer suffix
    assert route(r, "x.us.example.com") == "*.example.com"
    assert r.route(("https", "x.example.com", 8443), "/") == "https://*.example.com:8443"
    assert r.route(("http", "x.example.com", 8443), "/") == "*.example.com"
    # A path prefix beats every host-level key, exact ones included.
    assert route(r, "api.eu.example.com", "/v1/x") == "*.example.com/v1"
    assert route(r, "api.eu.example.com", "/v10") == "api.eu.example.com"


def test_ip_literals_never_match_a_wildcard() -> None:
    r = router({"*.example.com": Policy()})
    assert route(r, "127.0.0.1") == "https://127.0.0.1:443"
    assert route(r, "::1") == "https://[::1]:443"


def test_a_group_is_one_compartment_for_all_its_routes() -> None:
    made: list[tuple[str, Policy]] = []
    policy = Policy(max_concurrency=3)

    def make(name: str, p: Policy) -> str:
        made.append((name, p))
        return name

    r = Router(
        {
            "llm": Group("api.a.com", "api.b.com/v1", "*.c.com", policy=policy),
            "api.b.com": Policy(),
        },
        Policy(),
        make,
    )
    assert made == [("llm", policy), ("api.b.com", Policy())]
    assert route(r, "api.a.com") == "llm"
    assert route(r, "api.b.com", "/v1/generate") == "llm"
    assert route(r, "api.b.com", "/v2") == "api.b.com"
    assert route(r, "x.c.com") == "llm"
    assert route(r, "other.com") == "https://other.com:443"
    assert set(r.compartments) == {"llm", "api.b.com", "https://other.com:443"}


def test_a_group_defaults_to_the_default_numbers_and_reads_back() -> None:
    group = Group("a.com", "b.com")
    assert group.routes == ("a.com", "b.com")
    assert group.policy == Policy()
    assert repr(group) == f"Group('a.com', 'b.com', policy={Policy()!r})"
    with pytest.raises(AttributeError):
        group.policy = Policy(max_concurrency=1)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("make", "error", "says"),
    [
        (lambda: Group(), ValueError, "at least one route key"),
        (lambda: Group("a.com", policy=4), TypeError, "Group.policy must be a Policy"),  # type: ignore[arg-type]
        (lambda: Group("a.com", "*.x"), None, None),
        (lambda: Group("a.com", "api.*.com"), ValueError, "'api.*.com'"),
        (lambda: Group("a.com", 7), TypeError, "hosts keys must be strings"),  # type: ignore[arg-type]
    ],
)
def test_groups_are_validated_when_made(
    make: Any, error: type[Exception] | None, says: str
) -> None:
    if error is None:
        make()
        return
    with pytest.raises(error, match=says.replace("(", r"\(").replace("*", r"\*")):
        make()


@pytest.mark.parametrize(
    ("hosts", "error", "says"),
    [
        ({"a": Group("x.com", "x.com")}, ValueError, "'x.com' .'a'. duplicates another route"),
        ({"x.com": Policy(), "a": Group("X.com.")}, ValueError, "duplicates key 'x.com'"),
        ({"a": Group("*.x.com"), "b": Group("*.X.com")}, ValueError, "duplicates key 'a'"),
        ({"https://x.com:9": Policy(), "b": Group("https://x.com:9")}, ValueError, "duplicates"),
        ({"": Group("x.com")}, TypeError, "non-empty name"),
        ({"https://x.com:443": Group("y.com")}, ValueError, "cannot contain '://'"),
        ({"x.com": 3}, TypeError, r"hosts\['x.com'\] must be a Policy or a Group, got int"),
    ],
)
def test_conflicting_routes_and_bad_group_names_are_refused(
    hosts: dict[str, Any], error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says):
        router(hosts)


def test_distinct_shapes_of_one_host_are_not_duplicates() -> None:
    r = router(
        {
            "x.com": Policy(),
            "*.x.com": Policy(),
            "x.com:8443": Policy(),
            "https://x.com": Policy(),
            "x.com/v1": Policy(),
        }
    )
    assert len(r.compartments) == 5


def test_a_path_prefix_key_makes_no_host_compartment() -> None:
    """Only the key's compartment exists until a request outside the prefix arrives; that
    request goes to its origin's default compartment, as for any unlisted origin."""
    r = router({"api.x.com/v1": Policy()})
    assert list(r.compartments) == ["api.x.com/v1"]
    assert route(r, "api.x.com", "/v1/a") == "api.x.com/v1"
    assert route(r, "api.x.com", "/v2") == "https://api.x.com:443"


def test_wildcards_cost_a_lookup_per_label_and_only_when_an_origin_is_new() -> None:
    r = router({"*.example.com": Policy()})
    CountingDict.lookups = 0
    r._wild = CountingDict(r._wild)
    assert route(r, "a.b.c.example.com") == "*.example.com"
    # Four suffixes (b.c.example.com ... com), three levels each.
    assert CountingDict.lookups == 4 * 3
    for _ in range(100):
        route(r, "a.b.c.example.com")
    assert CountingDict.lookups == 4 * 3


def test_without_wildcard_keys_no_wildcard_table_is_consulted() -> None:
    """Wildcards cost nothing when none is configured."""

    r = router({"api.example.com": Policy()})
    CountingDict.lookups = 0
    r._wild = CountingDict()
    assert route(r, "a.b.c.example.com") == "https://a.b.c.example.com:443"
    assert route(r, "api.example.com") == "api.example.com"
    assert CountingDict.lookups == 0
