"""Which proxy a request goes through: httpx's rules for ``proxy=`` and the environment.

Pure: no I/O, no clock. The transport reads the environment once, at construction, with
``urllib.request.getproxies()`` (what httpx's client reads: the ``*_proxy`` variables, the
lower-case spelling winning, and the system settings on macOS and Windows) and hands the
result to :func:`proxy_routes`; each request's origin is then looked up with
:meth:`ProxyRoutes.choose`.

Theory of operation
-------------------
httpx's client turns its proxy configuration into *mounts*: URL patterns, each mapped to a
proxy or to "no proxy", sorted from most to least specific; a request goes through the first
pattern that matches its URL, and directly when none does. We rebuild the same table, rule
for rule, so that a client given ``BulkheadTransport`` sends every request where the same
client with httpx's default transport would (httpx itself ignores the environment as soon
as a client is given a ``transport=``, which is why the transport must read it):

1. An explicit ``proxy=`` is one pattern, ``all://``: every request goes through it and the
   environment (``NO_PROXY`` included) is not read.
2. Otherwise, with ``trust_env``, the environment gives, in this order: ``http://`` from
   ``http_proxy``, ``https://`` from ``https_proxy``, ``all://`` from ``all_proxy`` (a value
   without ``://`` gets ``http://`` prepended), then one "no proxy" pattern per ``no_proxy``
   entry (comma separated, spaces stripped): ``*`` disables every proxy; an entry with
   ``://`` is a pattern as written; an IPv4 address (anything before a ``/`` counts, so a
   CIDR ``10.0.0.0/8`` becomes the pattern ``all://10.0.0.0/8``, whose host is the network
   address alone: httpx matches no other address of the range, and neither do we); an IPv6
   address in brackets; ``localhost`` exactly; any other name as ``all://*name``, which
   matches the name and its sub-domains (``.name`` matches the sub-domains only). A later
   entry with the same pattern replaces the earlier one's target and keeps its place.
3. Patterns are sorted, stably, by (has no port, -len(host), -len(scheme)): a pattern with a
   port first, then longer hosts, then longer schemes; equal keys keep their order.
4. A pattern matches a URL when its scheme is ``all`` or equal, its host is empty, ``*`` or
   matches (``*.d``: a non-empty label sequence before ``.d``; ``*d``: ``d`` itself or
   anything ending in ``.d``; else equality), and its port is unset or equal. Host and port
   are compared as ``httpx.URL`` spells them (lower case, IDNA names decoded, a scheme's
   default port as ``None``): patterns are parsed with ``httpx.URL``, which is public API.

A choice depends only on (scheme, host, port), so a caller may cache it per origin.

Validation is stricter than httpx where httpx would fail later or guess: a proxy needs a
host and a port in 1..65535; ``ssl_context`` is only for ``https://`` proxies and
``headers`` only for HTTP proxies; credentials must fit Basic (no ``:`` in the user name,
RFC 7617 §2) and SOCKS5 (at most 255 bytes each, RFC 1929 §2); header names must be tokens
and values free of CR, LF and NUL (RFC 9110 §5.5). Everything httpx's client refuses at
construction (an unknown scheme, an unparsable URL, a ``NO_PROXY`` entry it cannot parse)
we refuse too. Every refusal is a ``ValueError`` (``TypeError`` for a wrong type) that names
the value with its credentials replaced by ``***``; no repr or message here ever shows a
user name, a password or a header value.
"""

from __future__ import annotations

import base64
import enum
import ipaddress
import re
import ssl
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import httpx

__all__ = [
    "DEFAULT_PROXY_PORTS",
    "ProxyKind",
    "ProxyRoutes",
    "ProxySpec",
    "environment_proxy_map",
    "proxy_routes",
    "redact_url",
]

#: The port of a proxy URL that names none (httpcore's table: SOCKS's registered 1080).
DEFAULT_PROXY_PORTS: Mapping[str, int] = {"http": 80, "https": 443, "socks5": 1080, "socks5h": 1080}

#: What ``proxy=`` accepts, as ``httpx.AsyncHTTPTransport(proxy=...)`` does.
ProxyValue = str | httpx.URL | httpx.Proxy

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_BAD_VALUE_BYTES = re.compile(rb"[\r\n\x00]")


class ProxyKind(enum.Enum):
    """How a proxy is spoken to."""

    HTTP = "http"
    """Plain HTTP: ``http://`` targets forwarded (absolute-form), others tunnelled."""
    HTTPS = "https"
    """HTTP inside TLS to the proxy itself, then as ``HTTP``."""
    SOCKS5 = "socks5"
    """SOCKS5 (RFC 1928); by curl's convention the client resolves the target's name."""
    SOCKS5H = "socks5h"
    """SOCKS5, the proxy resolving the target's name (the name is sent as is)."""

    @property
    def is_socks(self) -> bool:
        return self is ProxyKind.SOCKS5 or self is ProxyKind.SOCKS5H


def redact_url(value: str) -> str:
    """``value`` with any userinfo (``user:password@``) replaced by ``***@``.

    Works on strings that do not parse as URLs too: everything between ``://`` (or the
    start) and the last ``@`` goes, so a password containing ``/`` or ``@`` is hidden as
    well (at worst part of a path is hidden with it).
    """
    at = value.rfind("@")
    if at < 0:
        return value
    sep = value.find("://")
    start = sep + 3 if 0 <= sep < at else 0
    return f"{value[:start]}***{value[at:]}"


def _scrub(message: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret:
            message = message.replace(secret, "***")
    return message


def _userinfo_parts(raw: str) -> list[str]:
    """The user name and password in ``raw``, as written and decoded (to scrub them from
    messages)."""
    at = raw.rfind("@")
    if at < 0:
        return []
    sep = raw.find("://")
    userinfo = raw[sep + 3 if 0 <= sep < at else 0 : at]
    parts = [userinfo, *userinfo.split(":", 1)]
    parts += [urllib.parse.unquote(p) for p in parts]
    return sorted({p for p in parts if p}, key=len, reverse=True)


@dataclass(frozen=True, eq=False)
class ProxySpec:
    """One proxy, validated: where it is, how to speak to it, what to send it.

    Attributes:
        url: ``scheme://host[:port]`` as given, without credentials, path or query.
        kind: how to speak to it (HTTP, HTTPS, SOCKS5, SOCKS5H).
        host: the proxy's host as ``httpx.URL.raw_host`` gives it (ASCII, IPv6 without
            brackets): what to dial.
        port: the proxy's port, the scheme's default (80, 443, 1080) when the URL has none.
        auth: (user name, password) or ``None``. Never shown by ``repr``.
        headers: extra headers for the proxy, as given (raw bytes, in order). For HTTP
            proxies only; sent on ``CONNECT`` and on forwarded requests.
        ssl_context: for the TLS connection to an ``https://`` proxy; ``None``: the caller
            decides (see the design note).
        proxy_headers: ``Proxy-Authorization: Basic ...`` (when ``auth`` is set) followed
            by ``headers``, httpcore's order: what an HTTP proxy is sent.
    """

    url: httpx.URL
    kind: ProxyKind
    host: str
    port: int
    auth: tuple[str, str] | None = field(default=None, repr=False)
    headers: tuple[tuple[bytes, bytes], ...] = field(default=(), repr=False)
    ssl_context: ssl.SSLContext | None = field(default=None, repr=False)
    proxy_headers: tuple[tuple[bytes, bytes], ...] = field(default=(), repr=False, init=False)

    def __post_init__(self) -> None:
        extra: tuple[tuple[bytes, bytes], ...] = ()
        if self.auth is not None and not self.kind.is_socks:
            user, password = (part.encode("utf-8") for part in self.auth)
            token = base64.b64encode(user + b":" + password)
            extra = ((b"Proxy-Authorization", b"Basic " + token),)
        object.__setattr__(self, "proxy_headers", extra + self.headers)

    @property
    def key(self) -> tuple[object, ...]:
        """What makes two specs interchangeable: a tunnel opened for one serves the other.

        Credentials and headers are part of it (a tunnel authorised for one user is not
        another's); the ``ssl_context`` by identity.
        """
        return (self.kind, self.host, self.port, self.auth, self.headers, id(self.ssl_context))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProxySpec) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        auth = ", auth=***" if self.auth is not None else ""
        names = [name.decode("latin-1") for name, _ in self.headers]
        headers = f", headers={names!r}" if names else ""
        tls = ", ssl_context=..." if self.ssl_context is not None else ""
        return f"ProxySpec({str(self.url)!r}{auth}{headers}{tls})"

    __str__ = __repr__

    @classmethod
    def from_value(cls, value: object, *, source: str = "proxy") -> ProxySpec:
        """Validate what ``proxy=`` accepts: a URL string, ``httpx.URL`` or ``httpx.Proxy``.

        Args:
            value: the proxy; its userinfo (``user:password@``) becomes ``auth``.
            source: what to call the value in error messages (``"proxy"``,
                ``"HTTPS_PROXY"``...).

        Raises:
            TypeError: ``value`` is of another type.
            ValueError: the URL does not parse, its scheme is not ``http``, ``https``,
                ``socks5`` or ``socks5h``, it has no host or a port out of range, or an
                option does not fit the scheme (see the module docstring). The message
                names the value with its credentials as ``***``.
        """
        if isinstance(value, httpx.Proxy):
            raw = str(value.url)
            proxy = value
        elif isinstance(value, str | httpx.URL):
            raw = str(value)
            try:
                url = httpx.URL(value)
            except httpx.InvalidURL as exc:
                reason = _scrub(str(exc), _userinfo_parts(raw))
                raise ValueError(f"{source}: invalid URL {redact_url(raw)!r}: {reason}") from None
            if url.scheme not in DEFAULT_PROXY_PORTS:
                raise ValueError(
                    f"{source}: unsupported scheme {url.scheme!r} in {redact_url(raw)!r}; "
                    "use http, https, socks5 or socks5h"
                )
            proxy = httpx.Proxy(url=url)
        else:
            raise TypeError(
                f"{source} must be a URL string, httpx.URL or httpx.Proxy, "
                f"got {type(value).__name__}"
            )
        return cls._from_proxy(proxy, redact_url(raw), source)

    @classmethod
    def _from_proxy(cls, proxy: httpx.Proxy, shown: str, source: str) -> ProxySpec:
        url = proxy.url
        if url.scheme not in DEFAULT_PROXY_PORTS:  # httpx.Proxy checked it; keep the rule here
            raise ValueError(f"{source}: unsupported scheme {url.scheme!r} in {shown!r}")
        kind = ProxyKind(url.scheme)
        host = url.raw_host.decode("ascii")
        if not host:
            raise ValueError(f"{source}: no host in proxy URL {shown!r}")
        port = DEFAULT_PROXY_PORTS[url.scheme] if url.port is None else url.port
        if not 0 < port < 65536:
            raise ValueError(f"{source}: port {port} out of range in proxy URL {shown!r}")
        if proxy.ssl_context is not None and kind is not ProxyKind.HTTPS:
            raise ValueError(f"{source}: ssl_context is for https:// proxies only, not {shown!r}")
        auth = _check_auth(proxy.auth, kind, shown, source)
        headers = tuple(proxy.headers.raw)
        if headers and kind.is_socks:
            raise ValueError(f"{source}: a SOCKS proxy takes no headers ({shown!r})")
        for name, value in headers:
            if not _TOKEN.match(name) or _BAD_VALUE_BYTES.search(value):
                raise ValueError(
                    f"{source}: invalid header {name.decode('latin-1')!r} for {shown!r} "
                    f"(names are tokens, values hold no CR, LF or NUL)"
                )
            if auth is not None and name.lower() == b"proxy-authorization":
                raise ValueError(
                    f"{source}: both credentials and a Proxy-Authorization header for {shown!r}"
                )
        clean = httpx.URL(scheme=url.scheme, host=url.host, port=url.port)
        return cls(
            url=clean,
            kind=kind,
            host=host,
            port=port,
            auth=auth,
            headers=headers,
            ssl_context=proxy.ssl_context,
        )


def _check_auth(auth: object, kind: ProxyKind, shown: str, source: str) -> tuple[str, str] | None:
    if auth is None:
        return None
    if not (isinstance(auth, tuple) and len(auth) == 2 and all(isinstance(p, str) for p in auth)):
        raise TypeError(f"{source}: auth for {shown!r} must be a (username, password) tuple of str")
    user, password = auth
    if kind.is_socks:
        if not 0 < len(user.encode("utf-8")) < 256 or len(password.encode("utf-8")) > 255:
            raise ValueError(
                f"{source}: SOCKS5 credentials for {shown!r} must be 1-255 bytes "
                "(user name) and 0-255 bytes (password) (RFC 1929)"
            )
    elif ":" in user:
        raise ValueError(
            f"{source}: a proxy user name cannot contain ':' (RFC 7617), for {shown!r}"
        )
    return (user, password)


# --------------------------------------------------------------------------- patterns


@dataclass(frozen=True, slots=True)
class _Pattern:
    """One mount key of httpx's client (its ``URLPattern``), parsed with ``httpx.URL``."""

    text: str
    scheme: str  # "" for all://
    host: str  # "" for any host (empty or "*")
    port: int | None

    @classmethod
    def parse(cls, text: str) -> _Pattern:
        url = httpx.URL(text)  # raises httpx.InvalidURL as httpx's client would
        return cls(
            text=text,
            scheme="" if url.scheme == "all" else url.scheme,
            host="" if url.host == "*" else url.host,
            port=url.port,
        )

    @property
    def priority(self) -> tuple[int, int, int]:
        return (0 if self.port is not None else 1, -len(self.host), -len(self.scheme))

    def matches(self, scheme: str, host: str, port: int | None) -> bool:
        if self.scheme and self.scheme != scheme:
            return False
        if self.host and not _host_matches(self.host, host):
            return False
        return self.port is None or self.port == port


def _host_matches(pattern: str, host: str) -> bool:
    if pattern.startswith("*."):
        suffix = pattern[1:]  # ".d": at least one character before it
        return len(host) > len(suffix) and host.endswith(suffix)
    if pattern.startswith("*"):
        domain = pattern[1:]  # "d" itself, or anything ending in ".d"
        return host == domain or (len(host) > len(domain) + 1 and host.endswith("." + domain))
    return host == pattern


@dataclass(frozen=True, slots=True)
class ProxyRoutes:
    """The proxy table of one transport: ordered (pattern, proxy or ``None``) rules.

    ``ProxyRoutes.none()`` sends everything directly; :meth:`choose` costs one truth test
    then.
    """

    rules: tuple[tuple[_Pattern, ProxySpec | None], ...] = ()

    @classmethod
    def none(cls) -> ProxyRoutes:
        return cls(())

    def __bool__(self) -> bool:
        return bool(self.rules)

    def choose(self, url: httpx.URL) -> ProxySpec | None:
        """The proxy for ``url``, or ``None`` to connect directly."""
        if not self.rules:
            return None
        return self.choose_origin(url.scheme, url.host, url.port)

    def choose_origin(self, scheme: str, host: str, port: int | None) -> ProxySpec | None:
        """The proxy for an origin spelled as ``httpx.URL`` spells it (``port`` ``None``
        for the scheme's default), or ``None`` to connect directly."""
        for pattern, spec in self.rules:
            if pattern.matches(scheme, host, port):
                return spec
        return None

    @property
    def proxies(self) -> tuple[ProxySpec, ...]:
        """Every distinct proxy of the table, in rule order."""
        seen: dict[ProxySpec, None] = {}
        for _, spec in self.rules:
            if spec is not None:
                seen.setdefault(spec)
        return tuple(seen)

    def __repr__(self) -> str:
        shown = ", ".join(f"{p.text!r}: {spec!r}" for p, spec in self.rules)
        return f"ProxyRoutes({{{shown}}})"


def _is_ip(hostname: str, version: type[ipaddress.IPv4Address | ipaddress.IPv6Address]) -> bool:
    try:
        version(hostname.split("/")[0])
    except ValueError:
        return False
    return True


def environment_proxy_map(proxy_info: Mapping[str, str]) -> dict[str, str | None]:
    """httpx's mount table from ``urllib.request.getproxies()``: pattern -> proxy URL
    string, or ``None`` for "connect directly" (rule 2 of the module docstring)."""
    mounts: dict[str, str | None] = {}
    for scheme in ("http", "https", "all"):
        value = proxy_info.get(scheme)
        if value:
            mounts[f"{scheme}://"] = value if "://" in value else f"http://{value}"
    for entry in (part.strip() for part in proxy_info.get("no", "").split(",")):
        if entry == "*":
            return {}
        if not entry:
            continue
        if "://" in entry:
            mounts[entry] = None
        elif _is_ip(entry, ipaddress.IPv4Address):
            mounts[f"all://{entry}"] = None
        elif _is_ip(entry, ipaddress.IPv6Address):
            mounts[f"all://[{entry}]"] = None
        elif entry.lower() == "localhost":
            mounts[f"all://{entry}"] = None
        else:
            mounts[f"all://*{entry}"] = None
    return mounts


def _env_source(pattern: str, proxy_info: Mapping[str, str]) -> str:
    scheme = pattern[: -len("://")] if pattern.endswith("://") else ""
    if scheme in ("http", "https", "all") and proxy_info.get(scheme):
        return f"{scheme.upper()}_PROXY"
    return "NO_PROXY"


def proxy_routes(
    proxy: ProxyValue | None,
    *,
    trust_env: bool,
    proxy_info: Mapping[str, str],
) -> ProxyRoutes:
    """The proxy table httpx's client would build (module docstring, rules 1-3).

    Args:
        proxy: ``proxy=`` as given to the transport. When not ``None`` it applies to every
            request and the environment is not read.
        trust_env: read ``proxy_info`` when ``proxy`` is ``None``; ``False`` ignores it.
        proxy_info: ``urllib.request.getproxies()`` (scheme -> URL, plus ``"no"``), read
            by the caller.

    Raises:
        TypeError: ``proxy`` is of a type ``proxy=`` does not accept.
        ValueError: a proxy (explicit or from the environment) or a ``NO_PROXY`` entry is
            invalid; the message names the variable and the value, credentials hidden.
    """
    if proxy is not None:
        return ProxyRoutes(((_Pattern.parse("all://"), ProxySpec.from_value(proxy)),))
    if not trust_env:
        return ProxyRoutes.none()
    specs: dict[str, ProxySpec] = {}
    rules: list[tuple[_Pattern, ProxySpec | None]] = []
    for text, target in environment_proxy_map(proxy_info).items():
        source = _env_source(text, proxy_info)
        try:
            pattern = _Pattern.parse(text)
        except httpx.InvalidURL as exc:
            raise ValueError(
                f"{source}: cannot use the entry {redact_url(text)!r}: {exc}"
            ) from None
        spec = None
        if target is not None:
            # One spec per distinct URL: HTTP_PROXY and ALL_PROXY naming the same proxy
            # share its connections.
            spec = specs.get(target)
            if spec is None:
                spec = specs[target] = ProxySpec.from_value(target, source=source)
        rules.append((pattern, spec))
    rules.sort(key=lambda rule: rule[0].priority)  # stable: ties keep their order
    return ProxyRoutes(tuple(rules))
