"""What only threads have, through a proxy: ``KeyboardInterrupt`` (Ctrl-C in the main
thread) landing at every step of ``BulkheadHTTPTransport``'s proxied dial (TCP to the proxy,
TLS to an https proxy, the tunnel, TLS to the target inside it, TLS in TLS).  The async
transport's cancellation at every step is ``test_proxy_adversary.py``'s; here, after every
interrupt: the slot is back, no connection is in use, the counters agree, and after the
run the next request succeeds and no descriptor is left open."""

from __future__ import annotations

import gc
from typing import Any

import httpx
import pytest

from httpx_bulkhead import BulkheadHTTPTransport
from tests.resources import FdSnapshot, assert_no_fd_growth
from tests.servers import HypercornServer, TestApp, default_server_tls
from tests.servers.proxies import FaultProxy, PProxy, ProxyEgress

EVENTS = (
    "connection.connect_tcp.started",
    "connection.connect_tcp.complete",
    "connection.start_tls.started",
    "connection.start_tls.complete",
)


def _interrupted_at_each_step(transport: BulkheadHTTPTransport, url: str, steps: int) -> None:
    """Each trace event of the dial, in turn, raises ``KeyboardInterrupt``."""
    with httpx.Client(transport=transport, timeout=10) as client:
        for at in range(steps):
            seen: list[str] = []

            def trace(
                name: str, info: dict[str, Any], at: int = at, seen: list[str] = seen
            ) -> None:
                if name.startswith("connection."):
                    seen.append(name)
                    if len(seen) == at + 1:
                        raise KeyboardInterrupt

            with pytest.raises(KeyboardInterrupt):
                client.get(url, extensions={"trace": trace})
            for name, s in transport.statistics().items():
                assert s.running == 0 and s.in_use_connections == 0, (at, seen, name, s)
                assert s.acquired == s.completed + s.failed + s.cancelled, (at, seen, s)
                assert s.connections == 0, (at, seen, s)  # the half-made tunnel is closed
        assert client.get(url).text == "hello"
        [stats] = transport.statistics().values()
        assert (stats.cancelled, stats.completed, stats.proxied_connections) == (steps, 1, 1)


def test_interrupted_at_every_step_of_a_tunnel() -> None:
    gc.collect()
    before = FdSnapshot.take()
    tls = default_server_tls()
    with HypercornServer(TestApp(), tls=tls) as secure, FaultProxy() as proxy:
        transport = BulkheadHTTPTransport(proxy=proxy.url, verify=tls.client_ssl_context())
        _interrupted_at_each_step(transport, f"{secure.url}/", len(EVENTS))
        transport.close()
    gc.collect()
    assert_no_fd_growth(before, "interrupted tunnels")


def test_interrupted_at_every_step_of_tls_in_tls() -> None:
    """Through an https proxy: TCP, TLS to the proxy, then the target's TLS inside it (six
    trace events)."""
    gc.collect()
    before = FdSnapshot.take()
    tls = default_server_tls()
    with (
        ProxyEgress() as egress,
        HypercornServer(TestApp(), tls=tls) as secure,
        PProxy("https", egress, tls=tls) as proxy,
    ):
        spec = httpx.Proxy(proxy.url, ssl_context=tls.client_ssl_context())
        transport = BulkheadHTTPTransport(proxy=spec, verify=tls.client_ssl_context())
        _interrupted_at_each_step(transport, f"{secure.url}/", len(EVENTS) + 2)
        transport.close()
    gc.collect()
    assert_no_fd_growth(before, "interrupted TLS in TLS")
