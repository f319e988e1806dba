"""Routing: most specific key wins, the per-origin cache, eviction of compartments at rest."""

from __future__ import annotations

import pytest

from httpx_bulkhead import Policy
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
    # Unlisted origins each get their own compartment, made once.
    assert router.route(("https", "other.example", 443), "/") == "https://other.example:443"
    assert router.route(("http", "::1", 80), "/") == "http://[::1]:80"
    assert list(router.compartments).count("https://other.example:443") == 1


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
