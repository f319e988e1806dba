"""An independent review's attack on ``BulkheadHTTPTransport``'s proxies from threads: 16
threads at once through one hostile HTTP proxy (``FaultProxy``) or SOCKS5 proxy
(``ProxyEgress``), for each of: ``CONNECT`` answered 200 then closed, a trickled answer, a
100 kB reason, a 407 with a huge header block, silence mid-answer, a SOCKS5 reply cut at a
seeded random byte; ``close()`` of the transport while threads are mid-handshake; and an
exception raised in threads (``PyThreadState_SetAsyncExc``) mid-handshake.

After each: every thread ends in the matching httpx error within its deadline (no thread
hangs), the counters agree (``statistics()``), nothing is pooled or proxied, no
descriptor is left open, and the next request through a good proxy succeeds.  The
proxy's credentials appear in no message, repr or log record.  ``close()`` returns at once
and does not abort handshakes in flight (they end at the connect timeout, or complete and
are closed, not pooled).  ``BULKHEAD_ADVERSARY_SYNC_PROXY_SEED`` picks another seed for the
SOCKS5 cut points, ``BULKHEAD_ADVERSARY_SYNC_PROXY_THREADS`` (default 16) the thread count.
"""

from __future__ import annotations

import base64
import ctypes
import gc
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from httpx_bulkhead import BulkheadHTTPTransport
from tests.resources import FdSnapshot, assert_no_fd_growth
from tests.servers import HypercornServer, RawServer, TestApp, default_server_tls
from tests.servers.proxy_scripted import (
    ESTABLISHED,
    FaultProxy,
    ProxyEgress,
    ProxyRequest,
    Refuse,
    Send,
    SocksStage,
)
from tests.servers.raw import keepalive_ok

from .threads import left_behind, transport_threads

THREADS = int(os.environ.get("BULKHEAD_ADVERSARY_SYNC_PROXY_THREADS", "16"))
CONNECT_TIMEOUT = 0.5
#: Longest a failed request may take: the connect timeout plus slack for a loaded machine.
DEADLINE = CONNECT_TIMEOUT + 4.0
SEED = int(os.environ.get("BULKHEAD_ADVERSARY_SYNC_PROXY_SEED", "4"))
USER, PASSWORD = "reviewer", "s3cret-pw-sync"
#: An https:// target that is never reached is enough for CONNECT: the proxy fails first.
TLS_TARGET = "https://127.0.0.1:9/"


@pytest.fixture
def fds() -> Iterator[None]:
    gc.collect()
    before = FdSnapshot.take()
    threads_before = transport_threads()
    yield
    gc.collect()
    assert not left_behind(threads_before)
    assert_no_fd_growth(before, "after the attack")


def storm(
    client: httpx.Client, url: str, n: int = THREADS
) -> list[tuple[BaseException | None, float]]:
    """``n`` threads request ``url`` at once; each one's outcome and duration."""
    results: list[tuple[BaseException | None, float] | None] = [None] * n
    gate = threading.Barrier(n)

    def worker(i: int) -> None:
        gate.wait()
        started = time.monotonic()
        try:
            client.get(url)
            results[i] = (None, time.monotonic() - started)
        except BaseException as exc:
            results[i] = (exc, time.monotonic() - started)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE + 5)
    assert not any(t.is_alive() for t in threads), "a thread hangs"
    return [r for r in results if r is not None]


def check_quiet(transport: BulkheadHTTPTransport, failed: int) -> None:
    [stats] = transport.statistics().values()
    assert (stats.running, stats.in_use_connections, stats.waiting) == (0, 0, 0), stats
    assert (stats.connections, stats.proxied_connections) == (0, 0), stats  # nothing pooled
    assert stats.acquired == stats.completed + stats.failed + stats.cancelled, stats
    assert stats.failed == failed, stats


def attack_http(
    fault: Callable[[ProxyRequest], Refuse | Send | None],
    expected: type[Exception] | tuple[type[Exception], ...],
    says: str = "",
) -> None:
    """16 threads through a FaultProxy whose every CONNECT gets ``fault``; then a transport
    through a good proxy."""
    allowed = expected if isinstance(expected, tuple) else (expected,)
    proxy_auth = f"http://{USER}:{PASSWORD}@"
    with FaultProxy(fault) as hostile:
        url = hostile.url.replace("http://", proxy_auth)
        transport = BulkheadHTTPTransport(proxy=url)
        # A short connect timeout where silence is the attack; elsewhere room for 16
        # handshakes on a loaded machine (a 100 kB answer each).
        connect = CONNECT_TIMEOUT if httpx.ConnectTimeout in allowed else 3.0
        timeout = httpx.Timeout(DEADLINE, connect=connect)
        with httpx.Client(transport=transport, timeout=timeout) as client:
            outcomes = storm(client, TLS_TARGET)
            assert len(outcomes) == THREADS
            for exc, took in outcomes:
                assert type(exc) in allowed, repr(exc)
                assert says in str(exc), str(exc)[:300]
                assert PASSWORD not in str(exc) and PASSWORD not in repr(exc)
                assert took < DEADLINE, took
            check_quiet(transport, THREADS)
            assert PASSWORD not in repr(transport)
            assert PASSWORD not in repr(transport.statistics())
    good_next(proxy_auth)


def good_next(proxy_auth: str) -> None:
    """A fresh transport through a good proxy: a plain-HTTP target, forwarded, works."""
    with RawServer(keepalive_ok()) as target, FaultProxy() as good:
        transport = BulkheadHTTPTransport(proxy=good.url.replace("http://", proxy_auth))
        with httpx.Client(transport=transport, timeout=5) as client:
            assert client.get(target.url + "/").status_code == 200


def on_connect(fault: Refuse | Send) -> Callable[[ProxyRequest], Refuse | Send | None]:
    return lambda request: fault if request.method == "CONNECT" else None


HOSTILE: dict[str, tuple[Refuse | Send, type[Exception] | tuple[type[Exception], ...], str]] = {
    # 200, then the proxy closes: the tunnel is dead before TLS: a connect failure.
    # 200, then the proxy closes: ProxyError if the close is seen before the target's TLS
    # starts, ConnectError (reset in the TLS handshake) if after: a race, both are right.
    "200 then close": (Send(ESTABLISHED, "close"), (httpx.ProxyError, httpx.ConnectError), ""),
    # Bytes after the 200 (the target never spoke first): ProxyError.
    "bytes after the answer": (
        Send(ESTABLISHED + b"\x16\x03junk", "hang"),
        httpx.ProxyError,
        "",
    ),
    "trickled then silent": (
        Send(ESTABLISHED[:20], "hang", byte_delay=0.01),
        httpx.ConnectTimeout,
        "",
    ),
    "100 kB reason": (
        Send(b"HTTP/1.1 502 " + b"r" * 100_000 + b"\r\n\r\n", "hang"),
        httpx.ProxyError,
        "",
    ),
    "407 with a huge header block": (
        Send(
            b"HTTP/1.1 407 Proxy Authentication Required\r\n"
            + b"".join(b"X-Pad-%d: %s\r\n" % (i, b"p" * 1000) for i in range(200))
            + b"\r\n",
            "hang",
        ),
        httpx.ProxyError,
        "",
    ),
    "silent mid-answer": (Send(b"HTTP/1.1 200 Conn", "hang"), httpx.ConnectTimeout, ""),
    "closed mid-answer": (Send(b"HTTP/1.1 200 Conn", "close"), httpx.ProxyError, ""),
    "garbage": (Send(b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "close"), httpx.ProxyError, ""),
    "407 refusal": (
        Refuse(407, "Proxy Authentication Required", headers=(("Proxy-Authenticate", "Basic"),)),
        httpx.ProxyError,
        "407",
    ),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_sixteen_threads_through_a_hostile_http_proxy(
    name: str, fds: None, caplog: pytest.LogCaptureFixture
) -> None:
    fault, expected, says = HOSTILE[name]
    with caplog.at_level(logging.DEBUG):
        attack_http(on_connect(fault), expected, says)
    secret = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    for record in caplog.records:
        assert PASSWORD not in record.getMessage() and secret not in record.getMessage()


def test_a_huge_reason_phrase_gives_a_bounded_message(fds: None) -> None:
    fault = Send(b"HTTP/1.1 502 " + b"\xff" * 100_000 + b"\r\n\r\n", "hang")
    with FaultProxy(on_connect(fault)) as hostile:
        transport = BulkheadHTTPTransport(proxy=hostile.url)
        with httpx.Client(transport=transport, timeout=httpx.Timeout(5, connect=2)) as client:
            with pytest.raises(httpx.ProxyError) as info:
                client.get(TLS_TARGET)
    assert "502" in str(info.value)
    assert len(str(info.value)) <= 8192, len(str(info.value))


def test_sixteen_threads_to_an_unreachable_proxy(fds: None) -> None:
    """Nothing listens on the proxy's port: ConnectError naming the proxy, fast."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    transport = BulkheadHTTPTransport(proxy=f"http://{USER}:{PASSWORD}@127.0.0.1:{port}")
    timeout = httpx.Timeout(DEADLINE, connect=CONNECT_TIMEOUT)
    with httpx.Client(transport=transport, timeout=timeout) as client:
        outcomes = storm(client, TLS_TARGET)
        for exc, took in outcomes:
            assert type(exc) is httpx.ConnectError, repr(exc)
            assert f"127.0.0.1:{port}" in str(exc) and PASSWORD not in str(exc)
            assert took < DEADLINE
        check_quiet(transport, THREADS)
    good_next("http://")


# --------------------------------------------------------------------------- SOCKS5


def socks_cut(rng: random.Random) -> Callable[[SocksStage, str], Send | int | None]:
    """Every connection's reply is cut at a seeded random byte of a seeded stage, then
    closed (each connection draws its own)."""
    replies = {
        "greeting": b"\x05\x02",
        "auth": b"\x01\x00",
        "connect": b"\x05\x00\x00\x01\x7f\x00\x00\x01\x00\x50",
    }
    lock = threading.Lock()
    chosen: dict[int, tuple[str, int]] = {}

    def script(stage: SocksStage, target: str) -> Send | int | None:
        ident = threading.get_ident()
        with lock:
            if stage == "greeting":
                where = rng.choice(list(replies))
                chosen[ident] = (where, rng.randrange(len(replies[where])))
            where, at = chosen[ident]
        if stage != where:
            return None
        return Send(replies[where][:at], "close")

    return script


def test_sixteen_threads_through_a_socks5_proxy_that_cuts_its_reply(fds: None) -> None:
    rng = random.Random(SEED)
    auth = f"{USER}:{PASSWORD}@"
    with (
        RawServer(keepalive_ok()) as target,
        ProxyEgress(auth=(USER, PASSWORD), script=socks_cut(rng)) as hostile,
    ):
        transport = BulkheadHTTPTransport(proxy=hostile.url.replace("://", f"://{auth}"))
        timeout = httpx.Timeout(DEADLINE, connect=CONNECT_TIMEOUT)
        with httpx.Client(transport=transport, timeout=timeout) as client:
            outcomes = storm(client, target.url + "/")
            assert len(outcomes) == THREADS
            for exc, took in outcomes:
                assert type(exc) is httpx.ProxyError, f"seed {SEED}: {exc!r}"
                assert PASSWORD not in str(exc) and USER not in str(exc)
                assert took < DEADLINE, took
            check_quiet(transport, THREADS)
        with ProxyEgress(auth=(USER, PASSWORD)) as good:
            transport = BulkheadHTTPTransport(proxy=good.url.replace("://", f"://{auth}"))
            with httpx.Client(transport=transport, timeout=5) as client:
                assert client.get(target.url + "/").status_code == 200


# --------------------------------------------------------------------------- close, interrupts


class Interrupt(Exception):
    """Raised in a worker thread from outside."""


def test_close_while_sixteen_threads_are_mid_handshake(fds: None) -> None:
    """The proxy reads every CONNECT and answers half a status line; ``close()`` returns at
    once, and the threads mid-handshake end in ``ConnectTimeout`` within the connect
    timeout (close does not abort them, as with httpx's own transport)."""
    with FaultProxy(on_connect(Send(b"HTTP/1.1 200 Con", "hang"))) as hostile:
        transport = BulkheadHTTPTransport(proxy=hostile.url)
        client = httpx.Client(transport=transport, timeout=httpx.Timeout(30, connect=1.0))
        outcomes: list[tuple[BaseException | None, float]] = []
        runner = threading.Thread(
            target=lambda: outcomes.extend(storm(client, TLS_TARGET)), daemon=True
        )
        runner.start()
        hostile.ledger.wait_for(lambda ledger: len(ledger.connects) == THREADS)
        closed_at = time.monotonic()
        transport.close()
        assert time.monotonic() - closed_at < 0.5  # close() does not wait for them
        runner.join(DEADLINE + 10)
        assert not runner.is_alive()
        assert len(outcomes) == THREADS
        for exc, took in outcomes:
            assert type(exc) is httpx.ConnectTimeout, repr(exc)
            assert took < 1.0 + 4.0, took
        check_quiet(transport, THREADS)
        with pytest.raises(httpx.TransportError):
            client.get(TLS_TARGET)
    good_next("http://")


def test_tunnels_finished_after_close_are_not_pooled(fds: None) -> None:
    """16 threads wait for the proxy's 200; the transport is closed; then the proxy answers:
    the requests complete, and their connections are closed, not pooled."""
    tls = default_server_tls()
    with (
        HypercornServer(TestApp(), tls=tls) as secure,
        FaultProxy(on_connect(Send(ESTABLISHED, "proceed", wait_for="go"))) as hostile,
    ):
        transport = BulkheadHTTPTransport(proxy=hostile.url, verify=tls.client_ssl_context())
        client = httpx.Client(transport=transport, timeout=httpx.Timeout(30, connect=10))
        outcomes: list[tuple[BaseException | None, float]] = []
        runner = threading.Thread(
            target=lambda: outcomes.extend(storm(client, secure.url + "/")), daemon=True
        )
        runner.start()
        hostile.ledger.wait_for(lambda ledger: len(ledger.connects) == THREADS)
        transport.close()
        hostile.set_event("go")
        runner.join(DEADLINE + 10)
        assert not runner.is_alive()
        assert [exc for exc, _ in outcomes] == [None] * THREADS
        [stats] = transport.statistics().values()
        assert (stats.running, stats.connections, stats.proxied_connections) == (0, 0, 0)
        assert stats.completed == THREADS, stats
        hostile.ledger.wait_for(lambda ledger: ledger.stats(secure_authority(secure)).open_now == 0)


def secure_authority(server: HypercornServer) -> str:
    return server.url.removeprefix("https://").rstrip("/")


def test_sixteen_threads_through_a_trickling_proxy(fds: None) -> None:
    """The 200 arrives a byte at a time: every tunnel opens, TLS inside it works."""
    tls = default_server_tls()
    with (
        HypercornServer(TestApp(), tls=tls) as secure,
        FaultProxy(on_connect(Send(ESTABLISHED, "proceed", byte_delay=0.003))) as hostile,
    ):
        transport = BulkheadHTTPTransport(proxy=hostile.url, verify=tls.client_ssl_context())
        with httpx.Client(transport=transport, timeout=10) as client:
            outcomes = storm(client, secure.url + "/")
            assert [exc for exc, _ in outcomes] == [None] * THREADS
            [stats] = transport.statistics().values()
            assert stats.completed == THREADS and stats.running == 0, stats
            assert stats.proxied_connections == stats.connections > 0, stats


def test_threads_interrupted_mid_handshake(fds: None) -> None:
    """The proxy trickles a never-ending answer a byte at a time; an exception raised in
    each thread from outside lands in the handshake and leaves nothing behind."""
    answer = b"HTTP/1.1 200 " + b"x" * 4000
    with FaultProxy(on_connect(Send(answer, "hang", byte_delay=0.002))) as hostile:
        transport = BulkheadHTTPTransport(proxy=hostile.url)
        client = httpx.Client(transport=transport, timeout=httpx.Timeout(30, connect=20))
        results: list[BaseException | None] = [None] * THREADS

        def worker(i: int) -> None:
            try:
                client.get(TLS_TARGET)
            except BaseException as exc:
                results[i] = exc

        threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(THREADS)]
        for t in threads:
            t.start()
        hostile.ledger.wait_for(lambda ledger: len(ledger.connects) == THREADS)
        started = time.monotonic()
        for t in threads:
            assert t.ident is not None
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(t.ident), ctypes.py_object(Interrupt)
            )
        for t in threads:
            t.join(DEADLINE + 5)
        assert not any(t.is_alive() for t in threads), "a thread hangs"
        assert time.monotonic() - started < DEADLINE
        assert all(type(r) is Interrupt for r in results), results
        [stats] = transport.statistics().values()
        assert (stats.running, stats.in_use_connections, stats.connections) == (0, 0, 0), stats
        assert stats.acquired == stats.completed + stats.failed + stats.cancelled, stats
        assert stats.failed + stats.cancelled == THREADS, stats
        client.close()
    good_next("http://")
