"""Routing: most specific key wins, the per-origin cache, eviction of compartments at rest."""

from __future__ import annotations

import pytest

from httpx_bulkhead import Policy
from httpx_bulkhead._config import canonical_host
from httpx_bulkhead._routing import Router


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
    assert router.route(https, "/v1;p") == "llm.example.com/v1"
    assert router.route(https, "/v1") == "llm.example.com/v1"
    assert router.route(https, "/v") == "https://llm.example.com:8443"
    # Unlisted origins each get their own compartment, made once.
    other = ("https", "other.example", 443)
    made = len(router.compartments)
    assert router.route(other, "/") == "https://other.example:443"
    assert router.route(("http", "::1", 80), "/") == "http://[::1]:80"
    assert len(router.compartments) == made + 2
    router._cache.clear()  # even when the route is worked out again
    assert router.route(other, "/x") == "https://other.example:443"
    assert len(router.compartments) == made + 2


def test_path_prefixes_of_every_level_apply_longest_first() -> None:
    router = Router(
        {
            "https://api.example:443/a": Policy(),
            "api.example/a/b": Policy(),
            "api.example:443/a/b/c": Policy(),
        },
        Policy(),
        lambda name, policy: name,
    )
    origin = ("https", "api.example", 443)
    assert router.route(origin, "/a/b/c/d") == "api.example:443/a/b/c"
    assert router.route(origin, "/a/b/x") == "api.example/a/b"
    assert router.route(origin, "/a/x") == "https://api.example:443/a"
    assert router.route(origin, "/x") == "https://api.example:443"  # no host-level key
    assert router.route(("http", "api.example", 80), "/a/b") == "api.example/a/b"
    assert router.route(("http", "api.example", 80), "/a") == "http://api.example:80"


def test_hosts_are_compared_in_their_canonical_spelling() -> None:
    router = Router({"api.example.com": Policy(), "[::1]": Policy()}, Policy(), lambda n, p: n)
    assert router.route(("https", "API.Example.COM.", 443), "/") == "api.example.com"
    assert router.route(("http", "0:0::1", 80), "/") == "[::1]"
    assert router.route(("http", "Other.Example.", 80), "/") == "http://other.example:80"


class CountingPath(str):
    """A request path that counts the prefix comparisons made on it."""

    compared = 0

    def startswith(self, prefix: str | tuple[str, ...], *args: int) -> bool:  # type: ignore[override]
        CountingPath.compared += 1
        return super().startswith(prefix, *args)


def test_routing_is_a_cached_lookup_whatever_the_number_of_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """O(1) per request: after an origin's first request, routing does not work the route
    out again (no host canonicalisation), and compares the path only with that origin's
    own prefixes, however many keys and compartments there are."""
    import httpx_bulkhead._routing as routing

    hosts = {f"h{i}.example/p{j}": Policy() for i in range(300) for j in range(3)}
    hosts["api.example/v1"] = Policy()
    hosts["api.example"] = Policy()
    router = Router(hosts, Policy(), lambda name, policy: name)
    resolved: list[str] = []

    def counting(host: str) -> str:
        resolved.append(host)
        return canonical_host(host)

    monkeypatch.setattr(routing, "canonical_host", counting)
    origin = ("https", "api.example", 443)
    for _ in range(3):
        for path in ("/v1/x", "/other"):
            CountingPath.compared = 0
            router.route(origin, CountingPath(path))
            assert CountingPath.compared == 1  # the one prefix of api.example
    assert resolved == ["api.example"]
    for port in range(1, 51):  # unlisted origins: one resolution each, then cached
        router.route(("http", "new.example", port), "/")
        router.route(("http", "new.example", port), "/")
    assert len(resolved) == 51
    router.route(origin, "/v1")  # still cached after the others
    router.route(("http", "new.example", 1), "/")
    assert len(resolved) == 51


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
    # The per-compartment index of cached spellings is emptied with the cache.
    default = Router({}, Policy(), lambda name, policy: name)
    for i in range(100):
        host = "".join(c.upper() if (i >> n) & 1 else c for n, c in enumerate("spelling"))
        assert default.route(("http", host, 80), "/") == "http://spelling:80"
    assert sum(len(origins) for origins in default._cached_by.values()) <= 10


def test_hosts_must_map_keys_to_policies() -> None:
    with pytest.raises(TypeError, match="mapping"):
        Router([("a", Policy())], Policy(), lambda name, policy: name)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"hosts\['a'\] must be a Policy"):
        Router({"a": 3}, Policy(), lambda name, policy: name)  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="duplicates"):
        Router({"a/x": Policy(), "A/x/": Policy()}, Policy(), lambda name, policy: name)


def test_eviction_stops_at_the_bound() -> None:
    router = box_router(3)
    boxes = [router.route(("http", f"h{i}", 80), "/") for i in range(4)]
    assert router.retired == [boxes[0]]  # one out, three kept: not one more
    assert sum(name.startswith("http://") for name in router.compartments) == 3


def test_a_second_chance_is_given_once_per_use() -> None:
    router = box_router(2)
    h0, h1 = (router.route(("http", f"h{i}", 80), "/") for i in range(2))
    h0.uses = 1  # used since it was made
    h2 = router.route(("http", "h2", 80), "/")
    assert router.retired == [h1]  # h0 had its second chance
    router.route(("http", "h3", 80), "/")
    assert router.retired == [h1, h2]
    router.route(("http", "h4", 80), "/")  # h0 unused since its second chance: out
    assert router.retired == [h1, h2, h0]
