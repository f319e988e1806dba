"""The fixtures of the proxy tests: targets behind the proxies, the SOCKS5 egress every
real proxy is chained to, a tinyproxy (see ``proxies.py`` for the proxies themselves).

A pytest plugin (``tests/conftest.py`` names it in ``pytest_plugins``), so every test
module may ask for them; a module defining a fixture of the same name (an adversary's
``target``) keeps its own.  The servers are module-scoped, as each module had them: a
module's tests share one set, started on the first request and stopped after its last
test; ``egress`` hands each test a quiet ledger.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .asgi import HypercornServer, TestApp
from .proxies import ProxyEgress, TinyProxy
from .tls import default_server_tls

__all__ = ["egress", "target", "target_app", "tinyproxy", "tls_target"]


@pytest.fixture(scope="module")
def target_app() -> TestApp:
    """The app behind ``target`` and ``tls_target`` (and a test's own servers behind a
    proxy: its gates hold their requests)."""
    return TestApp()


@pytest.fixture(scope="module")
def target(target_app: TestApp) -> Iterator[HypercornServer]:
    """A plain-HTTP hypercorn target on 127.0.0.1."""
    with HypercornServer(target_app) as srv:
        yield srv


@pytest.fixture(scope="module")
def tls_target(target_app: TestApp) -> Iterator[HypercornServer]:
    """A TLS hypercorn target (the test CA's certificate for 127.0.0.1 and localhost; ALPN
    h2 and http/1.1)."""
    with HypercornServer(target_app, tls=default_server_tls()) as srv:
        yield srv


@pytest.fixture(scope="module")
def _egress() -> Iterator[ProxyEgress]:
    with ProxyEgress() as egress:
        yield egress


@pytest.fixture
def egress(_egress: ProxyEgress, target_app: TestApp) -> ProxyEgress:
    """The module's SOCKS5 egress, its ledger forgotten and ``target_app``'s counters reset
    for this test, once the connections of an earlier test have ended (their proxy closes
    them after that test: they are let end, not counted here)."""
    target_app.reset()
    _egress.ledger.wait_for(lambda led: not any(s.open_now for s in led.targets().values()))
    _egress.ledger.reset()
    return _egress


@pytest.fixture(scope="module")
def tinyproxy(_egress: ProxyEgress) -> Iterator[TinyProxy]:
    """A tinyproxy chained to the module's egress (no credentials); skipped when tinyproxy
    is missing (``proxies.require_program``)."""
    with TinyProxy(_egress) as proxy:
        yield proxy
