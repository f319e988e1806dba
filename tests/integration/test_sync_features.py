"""The features merged beside the sync transport, on ``BulkheadHTTPTransport``: leak
detection, the exporters' histograms and adaptive limits come through the generated shell;
the fleet limit is refused by name, and an environment proxy is used, never bypassed
(the proxy tests themselves run for both transports: ``test_proxy_*.py``)."""

from __future__ import annotations

import logging
import threading

import httpx
import pytest

from httpx_bulkhead import AdaptiveLimit, BulkheadHTTPTransport, Policy, RedisFleetLimit
from httpx_bulkhead._adaptive import FIRST_PROBE_SAMPLES
from tests.servers import HypercornServer


def test_a_slot_held_past_leak_threshold_is_reported_once(
    server: HypercornServer, caplog: pytest.LogCaptureFixture
) -> None:
    transport = BulkheadHTTPTransport(default=Policy(leak_threshold=0.05))
    reported = threading.Event()

    class _Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "leak_threshold" in record.getMessage() and "still held" in record.getMessage():
                reported.set()

    seen = _Seen()
    logging.getLogger("httpx_bulkhead").addHandler(seen)
    try:
        with (
            caplog.at_level(logging.WARNING, logger="httpx_bulkhead"),
            httpx.Client(transport=transport) as client,
        ):
            with client.stream("GET", f"{server.url}/") as response:
                assert reported.wait(10), "no leak warning from the timer thread"
                response.read()
            [stats] = transport.statistics().values()
            assert stats.slot_leaks == 1
            assert client.get(f"{server.url}/").text == "hello"  # the slot came back
            [stats] = transport.statistics().values()
            assert (stats.acquired, stats.completed, stats.running) == (2, 2, 0)
            assert stats.slot_leaks == 1
    finally:
        logging.getLogger("httpx_bulkhead").removeHandler(seen)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("still held" in m for m in messages) == 1
    assert sum("was released after" in m for m in messages) == 1


def test_prometheus_histograms_record_the_sync_transport(server: HypercornServer) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from httpx_bulkhead.prometheus import BulkheadCollector

    transport = BulkheadHTTPTransport(default=Policy(max_concurrency=2))
    registry = CollectorRegistry()
    collector = BulkheadCollector(transport, histograms=True)
    registry.register(collector)
    with httpx.Client(transport=transport) as client:
        for _ in range(3):
            assert client.get(f"{server.url}/").status_code == 200
    text = generate_latest(registry).decode()
    compartment = f'compartment="http://127.0.0.1:{server.port}"'
    count = [
        line
        for line in text.splitlines()
        if line.startswith("httpx_bulkhead_request_time_in_queue_seconds_count")
        and compartment in line
    ]
    assert len(count) == 1 and float(count[0].rsplit(" ", 1)[1]) == 3.0, count
    collector.close()


def test_an_adaptive_limit_moves_the_sync_transport_limit(server: HypercornServer) -> None:
    limit = AdaptiveLimit(initial_limit=4, min_limit=1, max_limit=8, algorithm="aimd")
    transport = BulkheadHTTPTransport(default=Policy(max_concurrency=limit))
    with httpx.Client(transport=transport) as client:
        for _ in range(20):
            assert client.get(f"{server.url}/").status_code == 200
    [stats] = transport.statistics().values()
    assert stats.completed == 20
    assert stats.limit_history and stats.limit_history[0][1] == 4


def test_the_fleet_limit_is_refused_by_name() -> None:
    fleet = RedisFleetLimit("redis://127.0.0.1:1", key="k", limit=2)
    with pytest.raises(TypeError, match=r"Policy\.fleet \(compartment 'a\.example'\)"):
        BulkheadHTTPTransport(hosts={"a.example": Policy(fleet=fleet)})
    transport = BulkheadHTTPTransport(default=Policy(fleet=fleet))
    with pytest.raises(TypeError, match=r"Policy\.fleet"):
        transport.handle_request(httpx.Request("GET", "http://127.0.0.1:9/"))


def test_proxy_with_uds_or_network_is_refused_as_by_the_async_transport() -> None:
    with pytest.raises(ValueError, match=r"proxy= cannot be used with uds="):
        BulkheadHTTPTransport(proxy="http://127.0.0.1:9", uds="/tmp/nowhere.sock")


def test_an_environment_proxy_is_used_never_bypassed(
    server: HypercornServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # the discard port: nobody there
    transport = BulkheadHTTPTransport()
    url = f"{server.url}/"
    # Through the (absent) proxy, so a ConnectError naming it: never a direct request.
    with pytest.raises(httpx.ConnectError, match=r"proxy http://127\.0\.0\.1:9"):
        transport.handle_request(httpx.Request("GET", url))
    [stats] = transport.statistics().values()
    assert (stats.connections_created, stats.running, stats.failed) == (0, 0, 1)
    transport.close()
    # NO_PROXY exempts the host (read at construction), and trust_env=False reads nothing.
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with httpx.Client(transport=BulkheadHTTPTransport(), trust_env=False) as c:
        assert c.get(url).text == "hello"
    monkeypatch.delenv("NO_PROXY")
    with httpx.Client(transport=BulkheadHTTPTransport(trust_env=False), trust_env=False) as c:
        assert c.get(url).text == "hello"


def test_the_sync_transport_logs_why_its_adaptive_limit_moved(
    server: HypercornServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="httpx_bulkhead.adaptive")
    transport = BulkheadHTTPTransport(
        default=Policy(max_concurrency=AdaptiveLimit(initial_limit=6, probe_interval=None))
    )
    with httpx.Client(transport=transport) as client:
        for _ in range(FIRST_PROBE_SAMPLES):  # the first probe, at one slot
            assert client.get(f"{server.url}/").status_code == 200
    [stats] = transport.statistics().values()
    [record] = [r for r in caplog.records if r.name == "httpx_bulkhead.adaptive"]
    fields = record.__dict__
    assert (fields["previous"], fields["limit"], fields["reason"]) == (1, 6, "probed")
    assert fields["compartment"] == stats.name and stats.limit == 6
    assert "adaptive limit 1 -> 6 (probed: no-load latency " in record.getMessage()
