"""Which compartment serves a request, and how many compartments unlisted origins may keep.

Keys are matched from most to least specific: a path prefix (longest wins, at a segment
boundary) over a host-level key; among host-level keys ``scheme://host:port`` over
``host:port`` over ``host``, and an exact host over a wildcard (``*.example.com``), a longer
wildcard suffix over a shorter.  A ``Group`` gives several keys one compartment: the keys
still match one by one as above, and all lead to the group's.

Hosts are compared in one canonical spelling (``_config.canonical_host``: lower case, IDNA
as punycode, no trailing dot, IPv6 compressed), for keys and request URLs alike, so
``API.example.com.`` cannot bypass the ``api.example.com`` bulkhead.  A request matching
no key gets a compartment of its own origin with the default policy.

The answer per origin (as the URL spells it) is computed once and cached, so routing is a
dict lookup plus a check of that origin's few path prefixes; wildcards cost a lookup per label
of the host, and only when the origin is first seen.  The cache is bounded: past
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

from ._config import Group, Origin, Policy, RouteKey, canonical_host, parse_route_key

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
        hosts: route key -> policy (a compartment named by the key), or name -> ``Group``
            (one compartment, named by the key, for all the group's route keys).
        default: policy of the per-origin compartments made for unlisted origins.
        make: builds a compartment from ``(name, policy)``.
        max_default: compartments for unlisted origins kept at most (evicting those at
            rest beyond it); ``None`` means never evict.
        at_rest: whether a compartment may be evicted now (default: always).
        uses: a number that grows whenever a compartment is used (default: constant).
    """

    def __init__(
        self,
        hosts: Mapping[str, Policy | Group],
        default: Policy,
        make: Callable[[str, Policy], C],
        *,
        max_default: int | None = None,
        at_rest: Callable[[C], bool] = lambda compartment: True,
        uses: Callable[[C], int] = lambda compartment: 0,
    ) -> None:
        if not isinstance(hosts, Mapping):
            raise TypeError(
                f"hosts must be a mapping of route key to Policy (or name to Group), got {hosts!r}"
            )
        self._make = make
        self._default = default
        self._max_default = max_default
        self._at_rest = at_rest
        self._uses = uses
        self._keys: dict[_HostLevel, dict[str | None, C]] = {}
        #: Wildcard keys, by the suffix they stand below (``*.example.com``: ``example.com``).
        self._wild: dict[_HostLevel, dict[str | None, C]] = {}
        #: Every live compartment, by name.
        self.compartments: dict[str, C] = {}
        #: Compartments evicted since the owner last emptied this list.
        self.retired: list[C] = []
        # Compartments of unlisted origins, oldest first, with their ``uses`` when last seen,
        # and the cached origins that route to each (forgotten with it).
        self._defaults: OrderedDict[str, tuple[C, int]] = OrderedDict()
        self._cached_by: dict[str, set[Origin]] = {}
        self._add_keys(hosts)
        self._cache: dict[Origin, _OriginRoutes[C]] = {}

    def _add_keys(self, hosts: Mapping[str, Policy | Group]) -> None:
        """A compartment per key (or per group, for all its routes); no two routes alike."""
        owners: dict[RouteKey, str] = {}
        for name, value in hosts.items():
            if isinstance(value, Group):
                _check_group_name(name)
                keys = [(route, parse_route_key(route)) for route in value.routes]
                policy = value.policy
            elif isinstance(value, Policy):
                keys = [(name, parse_route_key(name))]
                policy = value
            else:
                raise TypeError(
                    f"hosts[{name!r}] must be a Policy or a Group, got {type(value).__name__}"
                )
            compartment = self._new(name, policy)
            for route, key in keys:
                other = owners.get(key)
                if other is not None:
                    where = "another route of the group" if other == name else f"key {other!r}"
                    raise ValueError(f"hosts key {route!r} ({name!r}) duplicates {where}")
                owners[key] = name
                table = self._wild if key.wildcard else self._keys
                table.setdefault((key.scheme, key.host, key.port), {})[key.path] = compartment

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
        # Most specific first; sorted() below is stable, so at equal prefix length the
        # earlier (more specific) level stays first.
        for table, name in self._candidates(host):
            for level in ((scheme, name, port), (None, name, port), (None, name, None)):
                paths = table.get(level)
                if not paths:
                    continue
                if fallback is None and None in paths:
                    fallback = paths[None]
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

    def _candidates(self, host: str) -> list[tuple[dict[_HostLevel, dict[str | None, C]], str]]:
        """The tables and host names to look ``host`` up under, most specific first: the
        exact host, then each wildcard suffix from the longest (IP literals: exact only)."""
        found = [(self._keys, host)]
        if self._wild and ":" not in host:
            labels = host.split(".")
            found.extend((self._wild, ".".join(labels[i:])) for i in range(1, len(labels)))
        return found

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


def _check_group_name(name: object) -> None:
    if not isinstance(name, str) or not name.strip():
        raise TypeError(f"hosts: a Group's key must be a non-empty name, got {name!r}")
    if "://" in name:
        # Compartments made for unlisted origins are named "scheme://host:port".
        raise ValueError(f"hosts: Group name {name!r} cannot contain '://'")


def _authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
