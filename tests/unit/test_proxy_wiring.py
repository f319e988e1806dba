"""The pure parts of the proxy wiring: the forwarded request head, which requests are
forwarded rather than tunnelled, and what ``BulkheadTransport`` accepts and refuses."""

from __future__ import annotations

import httpx
import pytest

from httpx_bulkhead import BulkheadTransport
from httpx_bulkhead._proxied import forwards
from httpx_bulkhead._proxy import forwarded_head
from httpx_bulkhead._proxy_config import ProxyKind
from httpx_bulkhead.testing import MockNetwork

AUTH = (b"Proxy-Authorization", b"Basic dTpw")


@pytest.mark.parametrize(
    ("url", "target"),
    [
        ("http://example.com/a/b?c=d#frag", b"http://example.com/a/b?c=d"),
        ("http://user:pw@example.com/", b"http://example.com/"),
        ("http://example.com:80/", b"http://example.com/"),
        ("http://example.com:8080", b"http://example.com:8080/"),
        ("http://[::1]:8080/x", b"http://[::1]:8080/x"),
        ("http://B\u00fccher.example/", b"http://xn--bcher-kva.example/"),
        ("http://example.com/a b", b"http://example.com/a%20b"),
    ],
)
def test_the_forwarded_target_is_the_absolute_form(url: str, target: bytes) -> None:
    """No userinfo, no fragment, the default port left out, IPv6 in brackets, IDNA."""
    got, headers = forwarded_head(httpx.URL(url), None, [(b"Host", b"h")], ())
    assert got == target
    assert headers == [(b"Host", b"h")]


def test_the_target_extension_replaces_the_path() -> None:
    got, _ = forwarded_head(httpx.URL("http://example.com/a"), b"/other?x", [], ())
    assert got == b"http://example.com/other?x"


def test_proxy_headers_come_first_unless_the_request_has_them() -> None:
    request = [(b"Host", b"h"), (b"x-both", b"mine")]
    proxy = (AUTH, (b"X-Both", b"proxy"), (b"X-Only", b"1"))
    _, headers = forwarded_head(httpx.URL("http://h/"), None, request, proxy)
    assert headers == [AUTH, (b"X-Only", b"1"), (b"Host", b"h"), (b"x-both", b"mine")]
    # The request's own Proxy-Authorization wins over the configured credentials.
    mine = [(b"proxy-authorization", b"Basic other")]
    _, headers = forwarded_head(httpx.URL("http://h/"), None, mine, (AUTH,))
    assert headers == mine


@pytest.mark.parametrize(
    ("kind", "scheme", "forwarded"),
    [
        (ProxyKind.HTTP, "http", True),
        (ProxyKind.HTTPS, "http", True),
        (ProxyKind.HTTP, "https", False),
        (ProxyKind.HTTPS, "https", False),
        (ProxyKind.SOCKS5, "http", False),
        (ProxyKind.SOCKS5H, "https", False),
    ],
)
def test_only_http_targets_through_http_proxies_are_forwarded(
    kind: ProxyKind, scheme: str, forwarded: bool
) -> None:
    assert forwards(kind, scheme) is forwarded


def test_the_transport_refuses_what_it_cannot_do() -> None:
    with pytest.raises(ValueError, match="proxy= cannot be used with uds="):
        BulkheadTransport(proxy="http://127.0.0.1:3128", uds="/tmp/socket")
    with pytest.raises(ValueError, match="proxy= cannot be used with network="):
        BulkheadTransport(proxy="http://127.0.0.1:3128", network=MockNetwork(lambda r: None))  # type: ignore[arg-type,return-value]
    with pytest.raises(ValueError, match="unsupported scheme 'ftp'") as info:
        BulkheadTransport(proxy="ftp://user:hunter2@127.0.0.1")
    assert "hunter2" not in str(info.value)
    with pytest.raises(TypeError, match="proxy must be a URL string"):
        BulkheadTransport(proxy=3128)  # type: ignore[arg-type]


def test_an_invalid_environment_proxy_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "ftp://user:hunter2@127.0.0.1")
    with pytest.raises(ValueError, match="HTTPS_PROXY") as info:
        BulkheadTransport()
    assert "hunter2" not in str(info.value)
    # Not read: trust_env=False, an explicit proxy, a Unix socket, a MockNetwork.
    BulkheadTransport(trust_env=False)
    BulkheadTransport(proxy="http://127.0.0.1:3128")
    BulkheadTransport(uds="/tmp/socket")
    BulkheadTransport(network=MockNetwork(lambda request: httpx.Response(200)))


@pytest.mark.parametrize(
    "env", [{"HTTP_PROXY": "http://127.0.0.1:9"}, {"ALL_PROXY": "socks5://127.0.0.1:9"}]
)
def test_the_environment_is_routed_per_origin(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NO_PROXY", "internal.example")
    connector = BulkheadTransport()._connector
    proxy_for = connector.proxy_for  # type: ignore[attr-defined]
    assert proxy_for(httpx.URL("http://internal.example/")) is None
    assert proxy_for(httpx.URL("http://api.internal.example/")) is None
    spec = proxy_for(httpx.URL("http://other.example/"))
    assert spec is not None and str(spec.url) == next(iter(env.values()))
