"""Proxy resolution (``_proxy_config``) against httpx's own client, in the same process.

The oracle is what ``httpx.AsyncClient(trust_env=..., proxy=...)`` mounts for a URL: its
``_transport_for_url(url)`` is either the client's own transport (direct) or the transport
built for one ``httpx.Proxy``. ``_RecordingClient`` replaces the two transport factories
(private, stable from httpx 0.27 to 0.28) with records, so no SSL context or pool is built;
the routing (``_get_proxy_map``, ``get_environment_proxies``, ``URLPattern``, the sort) is
httpx's, untouched.

A table of cases pins the rules (each checked against httpx and against the expected
answer, so a change in httpx shows), then Hypothesis generates environments
(``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY``/``NO_PROXY`` in both cases, CGI's
``REQUEST_METHOD``), explicit proxies and URLs, and compares verdicts: the same proxy (URL,
credentials, headers) or direct, and an error exactly when httpx's client refuses to start,
except where we are deliberately stricter (``STRICTER``). ``BULKHEAD_PROXY_EXAMPLES`` sets
the number of generated cases (default 300, about 3 s).
"""

from __future__ import annotations

import base64
import contextlib
import os
import ssl
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from httpx_bulkhead._proxy_config import (
    DEFAULT_PROXY_PORTS,
    ProxyKind,
    ProxyRoutes,
    ProxySpec,
    proxy_routes,
    redact_url,
)

EXAMPLES = int(os.environ.get("BULKHEAD_PROXY_EXAMPLES") or 300)

# A verdict: ("direct",), ("proxy", scheme, host, port, auth, headers) or ("error",).
Verdict = tuple[Any, ...]
DIRECT: Verdict = ("direct",)
ERROR: Verdict = ("error",)


class _Recorded(httpx.AsyncBaseTransport):
    def __init__(self, proxy: httpx.Proxy | None) -> None:
        self.proxy = proxy


class _RecordingClient(httpx.AsyncClient):
    """httpx's client with its transports replaced by records of what they were for."""

    def _init_transport(self, *args: Any, **kwargs: Any) -> httpx.AsyncBaseTransport:
        return _Recorded(None)

    def _init_proxy_transport(
        self, proxy: httpx.Proxy, *args: Any, **kwargs: Any
    ) -> httpx.AsyncBaseTransport:
        return _Recorded(proxy)


@contextlib.contextmanager
def environment(env: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with every ``*_proxy`` variable and ``REQUEST_METHOD`` replaced by
    ``env``, restored afterwards."""
    saved = {
        k: v for k, v in os.environ.items() if k.lower().endswith("_proxy") or k == "REQUEST_METHOD"
    }
    for key in saved:
        del os.environ[key]
    os.environ.update(env)
    try:
        yield
    finally:
        for key in [k for k in os.environ if k.lower().endswith("_proxy")]:
            del os.environ[key]
        os.environ.pop("REQUEST_METHOD", None)
        os.environ.update(saved)


def _proxy_verdict(proxy: httpx.Proxy) -> Verdict:
    url = proxy.url
    port = url.port if url.port is not None else DEFAULT_PROXY_PORTS[url.scheme]
    headers = tuple(proxy.headers.raw)
    return ("proxy", url.scheme, url.raw_host.decode("ascii"), port, proxy.auth, headers)


def httpx_verdicts(urls: list[str], *, proxy: Any = None, trust_env: bool = True) -> list[Verdict]:
    """What httpx's client does with each URL, in the current environment."""
    try:
        client = _RecordingClient(proxy=proxy, trust_env=trust_env)
    except (ValueError, httpx.InvalidURL):
        return [ERROR] * len(urls)
    verdicts = []
    for url in urls:
        transport = client._transport_for_url(httpx.URL(url))
        assert isinstance(transport, _Recorded)
        verdicts.append(DIRECT if transport.proxy is None else _proxy_verdict(transport.proxy))
    return verdicts


def spec_verdict(spec: ProxySpec | None) -> Verdict:
    if spec is None:
        return DIRECT
    return ("proxy", spec.kind.value, spec.host, spec.port, spec.auth, spec.headers)


def our_verdicts(urls: list[str], *, proxy: Any = None, trust_env: bool = True) -> list[Verdict]:
    """What ``_proxy_config`` decides, reading the environment as the transport will."""
    try:
        routes = proxy_routes(proxy, trust_env=trust_env, proxy_info=urllib.request.getproxies())
    except ValueError:
        return [ERROR] * len(urls)
    return [spec_verdict(routes.choose(httpx.URL(url))) for url in urls]


def stricter(env: Mapping[str, str], proxy: Any) -> bool:
    """Inputs we refuse where httpx's client starts (and fails or guesses later): a proxy
    without a host, with a port out of range, or a user name with ``:`` for Basic."""
    values = [proxy] if proxy is not None else list(env.values())
    for value in values:
        if not isinstance(value, str) or not value:
            continue
        with contextlib.suppress(httpx.InvalidURL, ValueError):
            url = httpx.URL(value if "://" in value else f"http://{value}")
            if url.scheme in DEFAULT_PROXY_PORTS and (
                not url.host
                or (url.port is not None and not 0 < url.port < 65536)
                or (url.scheme in ("http", "https") and ":" in url.username)
            ):
                return True
    return False


# --------------------------------------------------------------------------- the table

P = "http://proxy.test:3128"
PV: Verdict = ("proxy", "http", "proxy.test", 3128, None, ())
S = "https://secure.test"
SV: Verdict = ("proxy", "https", "secure.test", 443, None, ())
A = "socks5h://socks.test"
AV: Verdict = ("proxy", "socks5h", "socks.test", 1080, None, ())

CASES: list[tuple[str, dict[str, str], str, Verdict]] = [
    ("no environment", {}, "http://example.com", DIRECT),
    ("HTTP_PROXY for http", {"HTTP_PROXY": P}, "http://example.com", PV),
    ("HTTP_PROXY not for https", {"HTTP_PROXY": P}, "https://example.com", DIRECT),
    ("HTTPS_PROXY for https", {"HTTPS_PROXY": S}, "https://example.com", SV),
    ("ALL_PROXY for both", {"ALL_PROXY": A}, "http://example.com:8080", AV),
    ("scheme proxy beats ALL_PROXY", {"ALL_PROXY": A, "HTTPS_PROXY": S}, "https://x.org", SV),
    ("ALL_PROXY when scheme one is unset", {"ALL_PROXY": A, "HTTPS_PROXY": S}, "http://x", AV),
    ("no scheme: http:// prepended", {"HTTP_PROXY": "proxy.test:3128"}, "http://x", PV),
    ("lower case wins", {"HTTP_PROXY": S, "http_proxy": P}, "http://x", PV),
    ("empty lower case hides upper", {"HTTP_PROXY": P, "http_proxy": ""}, "http://x", DIRECT),
    ("CGI: HTTP_PROXY ignored", {"HTTP_PROXY": P, "REQUEST_METHOD": "GET"}, "http://x", DIRECT),
    ("CGI: http_proxy kept", {"http_proxy": P, "REQUEST_METHOD": "GET"}, "http://x", PV),
    (
        "userinfo becomes auth",
        {"HTTP_PROXY": "http://us%40r:p%3Ass@proxy.test:3128"},
        "http://x",
        ("proxy", "http", "proxy.test", 3128, ("us@r", "p:ss"), ()),
    ),
    ("NO_PROXY domain", {"ALL_PROXY": P, "NO_PROXY": "example.com"}, "http://example.com", DIRECT),
    (
        "NO_PROXY sub-domain",
        {"ALL_PROXY": P, "NO_PROXY": "example.com"},
        "http://a.example.com",
        DIRECT,
    ),
    (
        "NO_PROXY no prefix match",
        {"ALL_PROXY": P, "NO_PROXY": "example.com"},
        "http://wwwexample.com",
        PV,
    ),
    (
        "NO_PROXY no suffix of label",
        {"ALL_PROXY": P, "NO_PROXY": "ample.com"},
        "http://example.com",
        PV,
    ),
    (
        "NO_PROXY .domain: subs only",
        {"ALL_PROXY": P, "NO_PROXY": ".example.com"},
        "http://example.com",
        PV,
    ),
    (
        "NO_PROXY .domain: sub",
        {"ALL_PROXY": P, "NO_PROXY": ".example.com"},
        "http://w.example.com",
        DIRECT,
    ),
    (
        "NO_PROXY list with spaces",
        {"ALL_PROXY": P, "NO_PROXY": "a.org, example.com "},
        "http://example.com",
        DIRECT,
    ),
    ("NO_PROXY *", {"ALL_PROXY": P, "NO_PROXY": "a.org,*"}, "http://example.com", DIRECT),
    ("NO_PROXY empty", {"ALL_PROXY": P, "NO_PROXY": ""}, "http://example.com", PV),
    ("NO_PROXY IPv4", {"ALL_PROXY": P, "NO_PROXY": "127.0.0.1"}, "http://127.0.0.1:8000", DIRECT),
    ("NO_PROXY other IPv4", {"ALL_PROXY": P, "NO_PROXY": "127.0.0.2"}, "http://127.0.0.1", PV),
    # httpx reads a CIDR as its network address alone: 10.0.0.0 bypasses, 10.1.2.3 does not.
    (
        "NO_PROXY CIDR: network address",
        {"ALL_PROXY": P, "NO_PROXY": "10.0.0.0/8"},
        "http://10.0.0.0",
        DIRECT,
    ),
    (
        "NO_PROXY CIDR: other address",
        {"ALL_PROXY": P, "NO_PROXY": "10.0.0.0/8"},
        "http://10.1.2.3",
        PV,
    ),
    ("NO_PROXY IPv6", {"ALL_PROXY": P, "NO_PROXY": "::1"}, "http://[::1]:8080", DIRECT),
    ("NO_PROXY localhost", {"ALL_PROXY": P, "NO_PROXY": "localhost"}, "http://localhost:1", DIRECT),
    (
        "NO_PROXY localhost exact",
        {"ALL_PROXY": P, "NO_PROXY": "localhost"},
        "http://a.localhost",
        PV,
    ),
    (
        "NO_PROXY host:port",
        {"ALL_PROXY": P, "NO_PROXY": "example.com:8080"},
        "http://example.com:8080",
        DIRECT,
    ),
    (
        "NO_PROXY host:port other port",
        {"ALL_PROXY": P, "NO_PROXY": "example.com:8080"},
        "http://example.com",
        PV,
    ),
    (
        "NO_PROXY with scheme",
        {"ALL_PROXY": P, "NO_PROXY": "https://example.com"},
        "https://example.com",
        DIRECT,
    ),
    (
        "NO_PROXY other scheme",
        {"ALL_PROXY": P, "NO_PROXY": "https://example.com"},
        "http://example.com",
        PV,
    ),
    (
        "NO_PROXY http:// replaces HTTP_PROXY",
        {"HTTP_PROXY": P, "NO_PROXY": "http://"},
        "http://a",
        DIRECT,
    ),
    ("NO_PROXY case", {"ALL_PROXY": P, "NO_PROXY": "EXAMPLE.com"}, "http://Example.COM", DIRECT),
    # httpx compares the decoded name with the entry as written: punycode never matches.
    ("NO_PROXY IDNA", {"ALL_PROXY": P, "NO_PROXY": "xn--bcher-kva.de"}, "http://bücher.de", PV),
    (
        "NO_PROXY default port spelled",
        {"ALL_PROXY": P, "NO_PROXY": "example.com"},
        "https://example.com:443",
        DIRECT,
    ),
    ("NO_PROXY unparsable IPv6 CIDR", {"ALL_PROXY": P, "NO_PROXY": "fe80::/10"}, "http://x", ERROR),
    ("NO_PROXY non-ASCII name", {"ALL_PROXY": P, "NO_PROXY": "bücher.de"}, "http://x", ERROR),
    ("unknown proxy scheme", {"HTTP_PROXY": "ftp://proxy.test"}, "http://x", ERROR),
    ("unknown scheme used nowhere", {"HTTPS_PROXY": "ftp://proxy.test"}, "http://x", ERROR),
    ("unknown *_proxy ignored", {"FTP_PROXY": "ftp://proxy.test"}, "http://x", DIRECT),
]


@pytest.mark.parametrize(
    ("env", "url", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_environment_table(env: dict[str, str], url: str, expected: Verdict) -> None:
    with environment(env):
        assert httpx_verdicts([url]) == [expected], "httpx itself changed"
        assert our_verdicts([url]) == [expected]
        assert our_verdicts([url], trust_env=False) == [DIRECT]


def test_explicit_proxy_wins_and_ignores_no_proxy() -> None:
    with environment({"HTTP_PROXY": S, "NO_PROXY": "*"}):
        for url in ("http://example.com", "https://localhost:1"):
            for trust_env in (True, False):
                assert httpx_verdicts([url], proxy=P, trust_env=trust_env) == [PV]
                assert our_verdicts([url], proxy=P, trust_env=trust_env) == [PV]


def test_explicit_proxy_forms() -> None:
    context = ssl.create_default_context()
    given = httpx.Proxy(
        "https://u:pw@secure.test:8443", headers={"X-Tenant": "a"}, ssl_context=context
    )
    spec = ProxySpec.from_value(given)
    assert spec_verdict(spec) == httpx_verdicts(["https://t"], proxy=given)[0]
    assert spec.ssl_context is context
    assert spec.proxy_headers == (
        (b"Proxy-Authorization", b"Basic " + base64.b64encode(b"u:pw")),
        (b"X-Tenant", b"a"),
    )
    assert ProxySpec.from_value(httpx.URL(P)) == ProxySpec.from_value(P)
    assert ProxySpec.from_value(P + "/") == ProxySpec.from_value(P)
    assert str(ProxySpec.from_value("http://[::1]:8080/").url) == "http://[::1]:8080"
    with_auth = httpx.Proxy(P, auth=("ü", "päss"))
    assert ProxySpec.from_value(with_auth).proxy_headers == (
        (b"Proxy-Authorization", b"Basic " + base64.b64encode("ü:päss".encode())),
    )
    socks = ProxySpec.from_value("socks5://u:p@127.0.0.1")
    assert (socks.kind, socks.port, socks.auth, socks.proxy_headers) == (
        ProxyKind.SOCKS5,
        1080,
        ("u", "p"),
        (),
    )


def test_specs_compare_by_what_they_connect_to() -> None:
    assert ProxySpec.from_value("http://u:a@p:1") != ProxySpec.from_value("http://u:b@p:1")
    assert ProxySpec.from_value("http://p:80") == ProxySpec.from_value("http://p")
    assert len({ProxySpec.from_value("http://p"), ProxySpec.from_value("http://P:80/")}) == 1
    one, two = ssl.create_default_context(), ssl.create_default_context()
    assert ProxySpec.from_value(httpx.Proxy(S, ssl_context=one)) != ProxySpec.from_value(
        httpx.Proxy(S, ssl_context=two)
    )


def test_environment_proxies_shared_between_schemes() -> None:
    routes = proxy_routes(None, trust_env=True, proxy_info={"http": P, "https": P})
    assert routes.choose(httpx.URL("http://a")) is routes.choose(httpx.URL("https://a"))
    assert routes.proxies == (ProxySpec.from_value(P),)
    assert not proxy_routes(None, trust_env=False, proxy_info={"http": P})
    assert ProxyRoutes.none().choose(httpx.URL("http://a")) is None


SECRET_INPUTS = [
    "ftp://alice:s3cr3t@proxy.test",
    "http://alice:s3cr3t@proxy.test:x",
    "http://alice:s3cr3t@",
    "http://alice:s3cr3t@proxy.test:70000",
    "https://alice:s3cr3t@[::1",
    httpx.URL("ftp://alice:s3cr3t@proxy.test"),
    httpx.Proxy("http://alice:s3cr3t@proxy.test", ssl_context=ssl.create_default_context()),
    httpx.Proxy("socks5://proxy.test", auth=("alice", "s3cr3t"), headers={"X": "1"}),
    httpx.Proxy("http://proxy.test", auth=("ali:ce", "s3cr3t")),
    httpx.Proxy("http://alice:s3cr3t@proxy.test", headers={"Proxy-Authorization": "Basic x"}),
    httpx.Proxy("http://proxy.test", headers={"X-Key": "s3cr3t\r\nInjected: 1"}),
]


@pytest.mark.parametrize("value", SECRET_INPUTS, ids=range(len(SECRET_INPUTS)))
def test_invalid_proxies_are_named_without_credentials(value: object) -> None:
    with pytest.raises(ValueError, match=r"^proxy: ") as info:
        ProxySpec.from_value(value)
    message = str(info.value)
    assert "s3cr3t" not in message and "alice" not in message
    named = redact_url(str(value)) if isinstance(value, str | httpx.URL) else "proxy.test"
    assert named in message


def test_environment_errors_name_the_variable() -> None:
    with pytest.raises(ValueError, match=r"^HTTPS_PROXY: .*'ftp://\*\*\*@p'") as info:
        proxy_routes(None, trust_env=True, proxy_info={"https": "ftp://bob:pw@p"})
    assert "bob" not in str(info.value)
    with pytest.raises(ValueError, match=r"^NO_PROXY: .*fe80"):
        proxy_routes(None, trust_env=True, proxy_info={"all": P, "no": "fe80::/10"})
    with pytest.raises(TypeError, match="got int"):
        proxy_routes(3128, trust_env=True, proxy_info={})  # type: ignore[arg-type]


def test_reprs_never_show_credentials() -> None:
    spec = ProxySpec.from_value(
        httpx.Proxy("http://alice:s3cr3t@proxy.test:1", headers={"X-Token": "t0ken"})
    )
    routes = proxy_routes(
        spec_value := "http://alice:s3cr3t@proxy.test:1", trust_env=False, proxy_info={}
    )
    for text in (repr(spec), str(spec), repr(routes), repr(routes.proxies)):
        assert "s3cr3t" not in text and "alice" not in text and "t0ken" not in text
        assert "proxy.test:1" in text
    assert "X-Token" in repr(spec) and "auth=***" in repr(spec)
    assert redact_url(spec_value) == "http://***@proxy.test:1"
    assert redact_url("alice:pw@p:1") == "***@p:1"
    assert redact_url("http://a:p/w@x@host/") == "http://***@host/"
    assert redact_url("http://host/") == "http://host/"


# --------------------------------------------------------------------- generated cases

PROXIES = [
    "http://p1.test:3128",
    "p2.test:8080",
    "https://p3.test",
    "socks5://s.test:1080",
    "socks5h://u:pw@s5.test",
    "http://us%3Aer:pa%40ss@p4.test:1",
    "http://[::1]:9",
    "HTTP://P5.TEST:80/",
    "ftp://bad.test",
    "http://p6.test:99999",
    "http://",
    "http://p7.test:x",
    "",
]
HOSTS = [
    "example.com",
    "www.example.com",
    "wwwexample.com",
    "a.b.example.com",
    "example.com.evil.test",
    "localhost",
    "a.localhost",
    "127.0.0.1",
    "10.0.0.0",
    "10.1.2.3",
    "[::1]",
    "[2001:db8::1]",
    "xn--bcher-kva.de",
    "EXAMPLE.com",
    "corp",
    "api.corp",
]
NO_PROXY_ENTRIES = [
    "*",
    "example.com",
    ".example.com",
    "*.example.com",
    "ample.com",
    "localhost",
    "LOCALHOST",
    "127.0.0.1",
    "10.0.0.0/8",
    "::1",
    "2001:db8::1",
    "[::1]",
    "http://example.com",
    "https://",
    "http://",
    "all://*.corp",
    "corp",
    " api.corp ",
    "",
    "example.com:8080",
    "all://example.com:8080",
    "https://example.com:443",
    "bücher.de",
    "xn--bcher-kva.de",
    "fe80::/10",
    "example.com.",
]
VARIABLES = ["HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"]

urls = st.builds(
    lambda scheme, host, port: f"{scheme}://{host}{'' if port is None else f':{port}'}/p",
    st.sampled_from(["http", "https"]),
    st.sampled_from(HOSTS),
    st.sampled_from([None, 80, 443, 8080]),
)
environments = st.builds(
    lambda proxies, no_proxy, no_name, cgi: {
        **proxies,
        **({} if no_proxy is None else {no_name: ",".join(no_proxy)}),
        **({"REQUEST_METHOD": "GET"} if cgi else {}),
    },
    st.dictionaries(st.sampled_from(VARIABLES), st.sampled_from(PROXIES), max_size=3),
    st.none() | st.lists(st.sampled_from(NO_PROXY_ENTRIES), max_size=4),
    st.sampled_from(["NO_PROXY", "no_proxy"]),
    st.booleans(),
)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    env=environments,
    url_list=st.lists(urls, min_size=1, max_size=6),
    proxy=st.none() | st.none() | st.sampled_from(PROXIES),
    trust_env=st.booleans(),
)
def test_routing_matches_httpx(
    env: dict[str, str], url_list: list[str], proxy: str | None, trust_env: bool
) -> None:
    with environment(env):
        ours = our_verdicts(url_list, proxy=proxy, trust_env=trust_env)
        theirs = httpx_verdicts(url_list, proxy=proxy, trust_env=trust_env)
    if ours != theirs and ours[0] == ERROR and stricter(env, proxy):
        return  # refused at once where httpx would fail on first use
    assert ours == theirs
