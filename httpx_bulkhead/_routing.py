"""Which compartment serves a request, and how many compartments unlisted origins may keep.

Keys are matched from most to least specific: a path prefix (longest wins, at a segment
boundary) over a host-level key; among host-level keys ``scheme://host:port`` over
``host:port`` over ``host``.  Hosts are compared in one canonical spelling
(``_config.canonical_host``: lower case, IDNA as punycode, no trailing dot, IPv6 compressed),
for keys and request URLs alike, so ``API.example.com.`` cannot bypass the
``api.example.com`` bulkhead.  A request matching no key gets a compartment of its own
origin with the default policy.

The answer per origin (as the URL spells it) is computed once and cached, so routing is a
dict lookup plus a check of that origin's few path prefixes.  The cache is bounded: past
``MAX_CACHED_ORIGINS`` entries it starts again (amortized O(1)).

Compartments made for unlisted origins are bounded too (``max_default``): when a new one
would exceed the bound, up to ``EVICTION_PROBES`` of the oldest are looked at, CLOCK-style:
one used since it was last looked at, or not at rest, gets a second chance at the back of
the queue; one at rest and unused is evicted (``retired`` collects them for the owner to
close).  So the bound is reached with constant work per new compartment, never a scan, and
a busy compartment is never evicted (the count may then exceed the bound for a while).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

from ._config import Origin, Policy, canonical_host, parse_route_key

__all__ = ["EVICTION_PROBES", "MAX_CACHED_ORIGINS", "Router"]

C = TypeVar("C")
_HostLevel = tuple[str | None, str, int | None]

#: Origins whose route is remembered; past it the cache is emptied and refilled.
MAX_CACHED_ORIGINS = 4096
#: Oldest default compartments looked at when a new one exceeds the bound.
EVICTION_PROBES = 4


class _OriginRoutes(Generic[C]):
    __slots__ = ("fallback", "prefixes")

    def __init__(self, prefixes: list[tuple[str, C]], fallback: C) -> None:
        self.prefixes = prefixes  # longest first
        self.fallback = fallback


class Router(Generic[C]):
    """Maps ``(scheme, host, port, path)`` to a compartment.

    Args:
        hosts: route key -> policy; each key gets its own compartment named by the key.
        default: policy of the per-origin compartments made for unlisted origins.
        make: builds a compartment from ``(name, policy)``.
        max_default: compartments for unlisted origins kept at most (evicting those at
            rest beyond it); ``None`` means never evict.
        at_rest: whether a compartment may be evicted now (default: always).
        uses: a number that grows whenever a compartment is used (default: constant).
    """

    def __init__(
        self,
        hosts: Mapping[str, Policy],
        default: Policy,
        make: Callable[[str, Policy], C],
        *,
        max_default: int | None = None,
        at_rest: Callable[[C], bool] = lambda compartment: True,
        uses: Callable[[C], int] = lambda compartment: 0,
    ) -> None:
        if not isinstance(hosts, Mapping):
            raise TypeError(f"hosts must be a mapping of route key to Policy, got {hosts!r}")
        self._make = make
        self._default = default
        self._max_default = max_default
        self._at_rest = at_rest
        self._uses = uses
        self._keys: dict[_HostLevel, dict[str | None, C]] = {}
        #: Every live compartment, by name.
        self.compartments: dict[str, C] = {}
        #: Compartments evicted since the owner last emptied this list.
        self.retired: list[C] = []
        # Compartments of unlisted origins, oldest first, with their ``uses`` when last seen,
        # and the cached origins that route to each (forgotten with it).
        self._defaults: OrderedDict[str, tuple[C, int]] = OrderedDict()
        self._cached_by: dict[str, set[Origin]] = {}
        for text, policy in hosts.items():
            key = parse_route_key(text)
            if not isinstance(policy, Policy):
                raise TypeError(f"hosts[{text!r}] must be a Policy, got {type(policy).__name__}")
            level = self._keys.setdefault((key.scheme, key.host, key.port), {})
            if key.path in level:
                raise ValueError(f"hosts key {text!r} duplicates another key")
            level[key.path] = self._new(text, policy)
        self._cache: dict[Origin, _OriginRoutes[C]] = {}

    def _new(self, name: str, policy: Policy) -> C:
        compartment = self._make(name, policy)
        self.compartments[name] = compartment
        return compartment

    def route(self, origin: Origin, path: str) -> C:
        """The compartment for a request to ``origin`` with this ``path``."""
        routes = self._cache.get(origin)
        if routes is None:
            routes = self._resolve(origin)
        for prefix, compartment in routes.prefixes:
            if path.startswith(prefix) and (len(path) == len(prefix) or path[len(prefix)] in "/?;"):
                return compartment
        return routes.fallback

    def _resolve(self, origin: Origin) -> _OriginRoutes[C]:
        scheme, raw_host, port = origin
        host = canonical_host(raw_host)
        prefixes: list[tuple[str, C]] = []
        fallback: C | None = None
        for level in ((scheme, host, port), (None, host, port), (None, host, None)):
            paths = self._keys.get(level)
            if not paths:
                continue
            if fallback is None and None in paths:
                fallback = paths[None]
            # sorted() is stable: at equal length the more specific level stays first.
            prefixes.extend((p, c) for p, c in paths.items() if p is not None)
        prefixes.sort(key=lambda item: len(item[0]), reverse=True)
        default_name = None
        if fallback is None:
            default_name = f"{scheme}://{_authority(host, port)}"
            fallback = self._default_compartment(default_name)
        routes = _OriginRoutes(prefixes, fallback)
        if len(self._cache) >= MAX_CACHED_ORIGINS:
            self._cache.clear()
            self._cached_by.clear()
        self._cache[origin] = routes
        if default_name is not None:
            self._cached_by.setdefault(default_name, set()).add(origin)
        return routes

    def _default_compartment(self, name: str) -> C:
        entry = self._defaults.get(name)
        if entry is not None:
            return entry[0]
        compartment = self._new(name, self._default)
        self._defaults[name] = (compartment, self._uses(compartment))
        if self._max_default is not None and len(self._defaults) > self._max_default:
            self._evict(keep=name)
        return compartment

    def _evict(self, keep: str) -> None:
        assert self._max_default is not None
        defaults = self._defaults
        for _ in range(EVICTION_PROBES):
            if len(defaults) <= self._max_default:
                return
            name, (compartment, seen) = next(iter(defaults.items()))
            if name == keep:
                return
            uses = self._uses(compartment)
            if uses != seen or not self._at_rest(compartment):
                defaults[name] = (compartment, uses)  # second chance
                defaults.move_to_end(name)
                continue
            del defaults[name]
            del self.compartments[name]
            for origin in self._cached_by.pop(name, ()):
                self._cache.pop(origin, None)
            self.retired.append(compartment)


def _authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
