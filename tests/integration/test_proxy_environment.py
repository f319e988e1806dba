"""The proxy environment variables route requests exactly as httpx's default transport
routes them: a table of ``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY``/``NO_PROXY`` cases,
each URL sent by a client with ``BulkheadTransport()`` and by a client with httpx's own
transport (``httpx.AsyncClient()`` reading the environment, or
``httpx.AsyncHTTPTransport(proxy=...)``), side by side; which real proxy's ledger saw the
request (or neither: direct) must agree, and match the table.  The ``flavour`` fixture
runs each case for the sync transport too: ``BulkheadHTTPTransport()`` beside
``httpx.Client()`` and ``httpx.HTTPTransport(proxy=...)``, called from threads.

The proxies are two ``FaultProxy`` instances (well-behaved here) on 127.0.0.1; the targets
one plain and one TLS hypercorn server, each named both ``127.0.0.1`` and ``localhost`` so
``NO_PROXY`` entries can tell them apart.  The pure routing rules are also checked against
httpx's client without any I/O in ``tests/unit/test_proxy_config.py``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import httpx
import pytest

from tests.flavours import Client, Flavour, client_for, httpx_client, make_transport
from tests.servers import HypercornServer, TestApp, default_server_tls
from tests.servers.proxies import FaultProxy

pytestmark = pytest.mark.anyio

_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "REQUEST_METHOD")
#: The URLs of each case, in the order of the expected strings below.
_URLS = ("http://127.0.0.1", "http://localhost", "https://127.0.0.1", "https://localhost")

#: (environment, expected route for each of _URLS: "1"/"2" = proxy one/two, "-" = direct).
#: In values, {one}/{two} are the proxies' URLs, {p1}/{tls} the proxy's and TLS target's ports.
CASES: list[tuple[dict[str, str], str]] = [
    ({}, "- - - -"),
    ({"HTTP_PROXY": "{one}"}, "1 1 - -"),
    ({"HTTPS_PROXY": "{two}"}, "- - 2 2"),
    ({"ALL_PROXY": "{one}"}, "1 1 1 1"),
    ({"ALL_PROXY": "{one}", "HTTPS_PROXY": "{two}"}, "1 1 2 2"),
    ({"HTTP_PROXY": "{one}", "HTTPS_PROXY": "{two}", "NO_PROXY": "localhost"}, "1 - 2 -"),
    ({"ALL_PROXY": "{one}", "NO_PROXY": "127.0.0.1"}, "- 1 - 1"),
    ({"ALL_PROXY": "{one}", "NO_PROXY": "*"}, "- - - -"),
    ({"ALL_PROXY": "{one}", "NO_PROXY": "foo.example, *"}, "- - - -"),
    ({"ALL_PROXY": "{one}", "NO_PROXY": ".localhost"}, "1 1 1 1"),
    ({"ALL_PROXY": "{one}", "NO_PROXY": "http://127.0.0.1"}, "- 1 1 1"),
    ({"ALL_PROXY": "{one}", "NO_PROXY": "localhost:{tls}"}, "1 1 1 -"),
    ({"ALL_PROXY": "{one}", "NO_PROXY": "127.0.0.0/8"}, "1 1 1 1"),  # httpx: network address only
    ({"ALL_PROXY": "127.0.0.1:{p1}"}, "1 1 1 1"),  # no scheme: http:// prepended
    ({"HTTP_PROXY": "{one}", "http_proxy": "{two}"}, "2 2 - -"),  # lower case wins
    ({"HTTP_PROXY": "{one}", "REQUEST_METHOD": "GET"}, "- - - -"),  # CGI: HTTP_PROXY unsafe
    ({"HTTPS_PROXY": "{one}", "REQUEST_METHOD": "GET"}, "- - 1 1"),
]


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[HypercornServer, HypercornServer, FaultProxy, FaultProxy]]:
    app = TestApp()
    with (
        HypercornServer(app) as plain,
        HypercornServer(app, tls=default_server_tls()) as tls,
        FaultProxy() as one,
        FaultProxy() as two,
    ):
        yield plain, tls, one, two


def _url(base: str, plain: HypercornServer, tls: HypercornServer) -> str:
    port = tls.port if base.startswith("https") else plain.port
    return f"{base}:{port}/"


def _httpx_transport(flavour: Flavour, **kwargs: object) -> httpx.BaseTransport:
    """httpx's own transport of ``flavour`` (``kwargs`` as for ``httpx.HTTPTransport``)."""
    kind = httpx.HTTPTransport if flavour == "sync" else httpx.AsyncHTTPTransport
    return kind(**kwargs)  # type: ignore[arg-type, return-value]


async def _route(client: Client, url: str, one: FaultProxy, two: FaultProxy) -> str:
    """Send ``url``; which proxy saw it: "1", "2" or "-" (neither)."""
    before = (len(one.ledger.requests), len(two.ledger.requests))
    response = await client.get(url)
    assert response.text == "hello", url
    after = (len(one.ledger.requests), len(two.ledger.requests))
    seen = [name for name, b, a in zip("12", before, after, strict=True) if a > b]
    assert len(seen) <= 1, (url, seen)
    return seen[0] if seen else "-"


def _set_env(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], values: Mapping[str, object]
) -> None:
    for name in _VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value.format(**values))


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # routing does not depend on it
@pytest.mark.parametrize(("env", "expected"), CASES, ids=[str(c[0]) for c in CASES])
async def test_environment_routes_as_httpx_does(
    servers: tuple[HypercornServer, HypercornServer, FaultProxy, FaultProxy],
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    expected: str,
    flavour: Flavour,
) -> None:
    plain, tls, one, two = servers
    values = {"one": one.url, "two": two.url, "p1": one.port, "tls": tls.port}
    _set_env(monkeypatch, env, values)
    context = default_server_tls().client_ssl_context()
    async with (
        client_for(make_transport(flavour, verify=context)) as ours,
        httpx_client(flavour, verify=context) as theirs,  # httpx's, mounted from the env
    ):
        urls = [_url(base, plain, tls) for base in _URLS]
        got_ours = " ".join([await _route(ours, url, one, two) for url in urls])
        got_theirs = " ".join([await _route(theirs, url, one, two) for url in urls])
    assert got_ours == got_theirs, (env, got_ours, got_theirs)
    assert got_ours == expected


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_explicit_proxy_wins_and_trust_env_false_ignores_the_environment(
    servers: tuple[HypercornServer, HypercornServer, FaultProxy, FaultProxy],
    monkeypatch: pytest.MonkeyPatch,
    flavour: Flavour,
) -> None:
    plain, tls, one, two = servers
    values = {"one": one.url, "two": two.url}
    _set_env(monkeypatch, {"ALL_PROXY": "{one}", "NO_PROXY": "localhost"}, values)
    context = default_server_tls().client_ssl_context()
    urls = [_url(base, plain, tls) for base in _URLS]
    pairs = [
        # proxy= given: every request through it, NO_PROXY not read (as httpx does).
        (
            make_transport(flavour, verify=context, proxy=two.url),
            _httpx_transport(flavour, verify=context, proxy=two.url),
            "2 2 2 2",
        ),
        # trust_env=False: the environment is not read.
        (
            make_transport(flavour, verify=context, trust_env=False),
            _httpx_transport(flavour, verify=context, trust_env=False),
            "- - - -",
        ),
    ]
    for ours_transport, theirs_transport, expected in pairs:
        async with (
            client_for(ours_transport) as ours,
            client_for(theirs_transport) as theirs,
        ):
            got_ours = " ".join([await _route(ours, url, one, two) for url in urls])
            got_theirs = " ".join([await _route(theirs, url, one, two) for url in urls])
        assert got_ours == got_theirs == expected
    # httpx's client with trust_env=False and no transport: direct too.
    async with httpx_client(flavour, verify=context, trust_env=False) as plain_client:
        assert [await _route(plain_client, url, one, two) for url in urls] == ["-"] * 4
