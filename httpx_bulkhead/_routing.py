"""Which compartment serves a request.

Keys are matched from most to least specific: a path prefix (longest wins, at a segment
boundary) over a host-level key; among host-level keys ``scheme://host:port`` over
``host:port`` over ``host``.  A request matching no key gets a compartment of its own origin
with the default policy.  The answer per origin is computed once and cached, so routing is a
dict lookup plus a check of that origin's few path prefixes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

from ._config import Policy, parse_route_key
from ._pool import Origin

__all__ = ["Router"]

C = TypeVar("C")
_HostLevel = tuple[str | None, str, int | None]


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
    """

    def __init__(
        self, hosts: Mapping[str, Policy], default: Policy, make: Callable[[str, Policy], C]
    ) -> None:
        if not isinstance(hosts, Mapping):
            raise TypeError(f"hosts must be a mapping of route key to Policy, got {hosts!r}")
        self._make = make
        self._default = default
        self._keys: dict[_HostLevel, dict[str | None, C]] = {}
        self.compartments: dict[str, C] = {}
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
            routes = self._cache[origin] = self._resolve(origin)
        for prefix, compartment in routes.prefixes:
            if path.startswith(prefix) and (len(path) == len(prefix) or path[len(prefix)] in "/?;"):
                return compartment
        return routes.fallback

    def _resolve(self, origin: Origin) -> _OriginRoutes[C]:
        scheme, host, port = origin
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
        if fallback is None:
            name = f"{scheme}://{_authority(host, port)}"
            fallback = self.compartments.get(name) or self._new(name, self._default)
        return _OriginRoutes(prefixes, fallback)


def _authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
