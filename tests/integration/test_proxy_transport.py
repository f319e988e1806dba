"""``BulkheadTransport(proxy=...)`` and ``BulkheadHTTPTransport(proxy=...)`` (the
``flavour`` fixture: threads call the sync one) through real proxies on 127.0.0.1
(tinyproxy, pproxy HTTP/HTTPS/SOCKS5, our SOCKS5 egress) and our scripted ``FaultProxy``:
forwarding, ``CONNECT`` tunnels with the target's certificate checked and HTTP/2 inside,
TLS inside an https proxy's TLS, SOCKS5 with and without remote DNS, the errors,
credentials kept out of every message, and the bulkheads still keyed by the target."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable

import anyio
import httpx
import pytest

from httpx_bulkhead import Policy, RequestTimeout
from tests.conftest import (
    SLOW_NAME,
    UNKNOWN_NAME,
    HungResolver,
    lookup_deadline,
    resolving,
    until,
)
from tests.flavours import Flavour, Transport, client_for, make_transport
from tests.servers import HypercornServer, TestApp, default_server_tls
from tests.servers.proxies import (
    ESTABLISHED,
    FaultProxy,
    PProxy,
    ProxyEgress,
    ProxyRequest,
    Send,
    TinyProxy,
    close_mid_connect,
    garbage,
    never_answer,
    refuse,
)
from tests.servers.tls import wrong_host_server_tls

pytestmark = pytest.mark.anyio
SECRET = "s3cr3t-pa55"
TIMEOUT = 10.0


def trusting(flavour: Flavour, **kwargs: object) -> Transport:
    """A transport of ``flavour`` that trusts the test CA for targets."""
    return make_transport(flavour, verify=default_server_tls().client_ssl_context(), **kwargs)


def agree(transport: Transport) -> None:
    """The statistics' request counters add up in every compartment."""
    for name, s in transport.statistics().items():
        assert s.acquired == s.running + s.completed + s.failed + s.cancelled, (name, s)


def no_secret(*texts: object) -> None:
    for text in texts:
        assert SECRET not in str(text), text
        assert SECRET not in repr(text), text


# --------------------------------------------------------------------------- forwarding


async def test_http_is_forwarded_with_the_proxy_headers(
    target: HypercornServer, flavour: Flavour
) -> None:
    """An http:// target through an HTTP proxy: absolute-form target, Proxy-Authorization
    and the proxy's headers first (a header the request has itself wins), Host the
    target's; the proxy connection is kept alive and reused."""
    with FaultProxy(auth=("user", SECRET)) as proxy:
        url = f"http://user:{SECRET}@127.0.0.1:{proxy.port}"
        spec = httpx.Proxy(url, headers={"X-Via-Test": "1", "X-Both": "proxy"})
        transport = make_transport(flavour, proxy=spec)
        async with client_for(transport) as client:
            first = await client.get(f"{target.url}/headers?q=1", headers={"X-Both": "mine"})
            second = await client.get(f"{target.url}/headers")
            stats = transport.statistics()[f"http://127.0.0.1:{target.port}"]
            assert stats.proxied_connections == stats.connections == 1
        assert first.status_code == second.status_code == 200
        seen = json.loads(first.text)
        assert seen["host"] == f"127.0.0.1:{target.port}"
        assert seen["x-both"] == "mine" and seen["x-via-test"] == "1"
        request = proxy.ledger.requests[0]
        assert request.target == f"{target.url}/headers?q=1"
        assert request.header("proxy-authorization") is not None
        names = [name.lower() for name, _ in request.headers]
        assert names[:3] == ["host", "proxy-authorization", "x-via-test"], names
        info = second.extensions["bulkhead"]
        assert info.proxy == f"http://127.0.0.1:{proxy.port}" and info.reused
        assert proxy.connections == 1
        no_secret(info, stats, transport.statistics(), first.request.headers)


async def test_http_through_tinyproxy_which_closes_after_each(
    egress: ProxyEgress, target: HypercornServer, flavour: Flavour
) -> None:
    """tinyproxy closes the client connection after each forwarded request: the next one
    sees it closed while idle, discards it and dials again; nothing fails."""
    with TinyProxy(egress, auth=("user", SECRET)) as proxy:
        port = int(proxy.url.rsplit(":", 1)[1])
        transport = make_transport(flavour, proxy=f"http://user:{SECRET}@127.0.0.1:{port}")
        async with client_for(transport) as client:
            for _ in range(3):
                assert (await client.get(f"{target.url}/")).text == "hello"
        assert proxy.requests().count(("GET", f"{target.url}/")) == 3
        stats = transport.statistics()[f"http://127.0.0.1:{target.port}"]
        assert stats.completed == 3 and stats.failed == 0
        agree(transport)


async def test_forwarding_speaks_http11_to_the_proxy_even_with_http1_off(
    target: HypercornServer,
    flavour: Flavour,
) -> None:
    """With ``http1=False`` an http:// target is HTTP/2 by prior knowledge when direct;
    forwarded through an HTTP proxy it is HTTP/1.1 to the proxy, as with httpcore."""
    with FaultProxy() as proxy:
        transport = make_transport(flavour, proxy=proxy.url, http1=False, http2=True)
        async with client_for(transport) as client:
            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(client.get, f"{target.url}/")
            response = await client.get(f"{target.url}/")
        assert response.http_version == "HTTP/1.1" and response.text == "hello"
        assert [r.method for r in proxy.ledger.requests] == ["GET"] * 4
        agree(transport)


# --------------------------------------------------------------------------- tunnels


async def test_trace_events_through_a_tunnel(
    egress: ProxyEgress, tls_target: HypercornServer, flavour: Flavour
) -> None:
    events: list[tuple[str, dict[str, object]]] = []

    def record(name: str, info: dict[str, object]) -> None:
        events.append((name, info))

    async def trace(name: str, info: dict[str, object]) -> None:
        record(name, info)

    with TinyProxy(egress) as proxy:
        async with client_for(trusting(flavour, proxy=proxy.url)) as client:
            hook = record if flavour == "sync" else trace
            await client.get(f"{tls_target.url}/", extensions={"trace": hook})
    names = [name for name, _ in events if name.startswith("connection.")]
    assert names == [
        "connection.connect_tcp.started",
        "connection.connect_tcp.complete",
        "connection.start_tls.started",
        "connection.start_tls.complete",
    ]
    assert events[0][1]["port"] == int(proxy.url.rsplit(":", 1)[1])  # TCP to the proxy
    assert events[2][1]["server_hostname"] == "127.0.0.1"  # TLS to the target


async def test_https_through_connect_verifies_the_target_and_speaks_h2(
    egress: ProxyEgress, tls_target: HypercornServer, flavour: Flavour
) -> None:
    with TinyProxy(egress) as proxy:
        transport = trusting(
            flavour, proxy=proxy.url, http2=True, default=Policy(max_streams_per_connection=3)
        )
        async with client_for(transport) as client:
            url = f"https://localhost:{tls_target.port}/"
            responses = [await client.get(url) for _ in range(2)]
            assert {r.http_version for r in responses} == {"HTTP/2"}
            stream = responses[0].extensions["network_stream"]
            assert stream.get_extra_info("ssl_object").server_hostname == "localhost"
            assert stream.get_extra_info("server_addr")[1] == int(proxy.url.rsplit(":", 1)[1])
            stats = transport.statistics()[f"https://localhost:{tls_target.port}"]
            assert stats.connections_created == 1 and stats.proxied_connections == 1
            assert stats.stream_caps == (3,)  # our cap holds inside the tunnel
        assert proxy.requests() == [("CONNECT", f"localhost:{tls_target.port}")]

        # The default context (certifi) does not trust the test CA: the target's
        # certificate is what is checked, not the proxy's.
        async with client_for(make_transport(flavour, proxy=proxy.url)) as client:
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await client.get(f"https://127.0.0.1:{tls_target.port}/")


async def test_a_wrong_host_certificate_fails_inside_the_tunnel(
    egress: ProxyEgress, flavour: Flavour
) -> None:
    with (
        HypercornServer(TestApp(), tls=wrong_host_server_tls()) as wrong,
        TinyProxy(egress) as proxy,
    ):
        transport = trusting(flavour, proxy=proxy.url)
        async with client_for(transport) as client:
            with pytest.raises(httpx.ConnectError, match=r"mismatch|doesn't match|not valid"):
                await client.get(f"https://127.0.0.1:{wrong.port}/")
        stats = transport.statistics()[f"https://127.0.0.1:{wrong.port}"]
        assert (stats.failed, stats.connections, stats.proxied_connections) == (1, 0, 0)


async def test_tls_inside_an_https_proxy(
    egress: ProxyEgress, tls_target: HypercornServer, target: HypercornServer, flavour: Flavour
) -> None:
    tls = default_server_tls()
    with PProxy("https", egress, tls=tls) as proxy:
        spec = httpx.Proxy(proxy.url, ssl_context=tls.client_ssl_context())
        transport = trusting(flavour, proxy=spec, http2=True)
        async with client_for(transport) as client:
            response = await client.get(f"{tls_target.url}/")
            again = await client.get(f"{tls_target.url}/")
            stream = response.extensions["network_stream"]
            assert stream.get_extra_info("is_readable") is False  # idle, nothing pending
            forwarded = await client.get(f"{target.url}/")  # http://: forwarded over TLS
            assert forwarded.text == "hello"
            assert forwarded.extensions["bulkhead"].proxy == proxy.url
            proxy_port = int(proxy.url.rsplit(":", 1)[1])
            assert stream.get_extra_info("server_addr") == ("127.0.0.1", proxy_port)
        assert response.text == "hello" and response.http_version == "HTTP/2"
        assert again.extensions["bulkhead"].reused
        assert stream.get_extra_info("ssl_object").server_hostname == "127.0.0.1"

        # An https proxy without its own context is checked with the default one
        # (certifi), which does not trust the test CA: a ConnectError naming the proxy.
        async with client_for(trusting(flavour, proxy=proxy.url)) as client:
            with pytest.raises(httpx.ConnectError, match=f"proxy {proxy.url}"):
                await client.get(f"{tls_target.url}/")


@pytest.mark.parametrize("scheme", ["socks5", "socks5h"])
async def test_socks5_with_and_without_remote_dns(
    egress: ProxyEgress,
    tls_target: HypercornServer,
    target: HypercornServer,
    scheme: str,
    flavour: Flavour,
) -> None:
    """socks5:// resolves the name here and sends the address; socks5h:// sends the name."""
    with PProxy("socks5", egress) as proxy:
        url = proxy.url.replace("socks5://", f"{scheme}://")
        transport = trusting(flavour, proxy=url)
        async with client_for(transport) as client:
            assert (await client.get(f"https://localhost:{tls_target.port}/")).text == "hello"
            assert (await client.get(f"http://localhost:{target.port}/")).text == "hello"
        host = "localhost" if scheme == "socks5h" else "127.0.0.1"
        assert proxy.requests() == [
            ("socks5", f"{host}:{tls_target.port}"),
            ("socks5", f"{host}:{target.port}"),
        ]


@pytest.mark.parametrize("bound", ["connect_timeout", "request_timeout"])
async def test_a_slow_socks5_name_lookup_is_cut_by_the_connect_deadline(
    target: HypercornServer, flavour: Flavour, bound: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """socks5:// resolves the target's name here, inside the connect's deadline: a resolver
    that does not answer is cut by the connect timeout (or the request's budget) like the
    proxy itself, with an error naming the lookup; the abandoned lookup ends when the
    resolver answers."""
    resolver = HungResolver().install(monkeypatch)
    timeout, policy, expected = lookup_deadline(bound)
    with ProxyEgress() as socks:
        proxy = f"socks5://127.0.0.1:{socks.port}"
        transport = make_transport(flavour, proxy=proxy, default=policy)
        url = f"http://{SLOW_NAME}:{target.port}/"
        error, cut_while_hung = await resolver.cut(transport, timeout, expected, url)
        assert isinstance(error, httpx.ConnectTimeout), repr(error)
        assert str(error) == f"connect timed out resolving {SLOW_NAME} (through proxy {proxy})"
        assert cut_while_hung  # after the error's check, which says what the deadline cut instead
        stats = transport.statistics()[f"http://{SLOW_NAME}:{target.port}"]
        assert (stats.connections, stats.running, stats.failed) == (0, 0, 1)
        await resolver.ended()
        assert socks.ledger.targets() == {} and socks.ledger.refused == []  # nothing asked


async def test_a_socks5_name_the_resolver_refuses_is_a_connect_error(
    target: HypercornServer, flavour: Flavour, monkeypatch: pytest.MonkeyPatch
) -> None:
    """socks5://: the resolver's failure (raised in its thread, for the sync transport) is
    an ``httpx.ConnectError`` naming the name, and no tunnel is asked for."""

    def refuse_name() -> None:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", resolving(UNKNOWN_NAME, refuse_name))
    with ProxyEgress() as socks:
        proxy = f"socks5://127.0.0.1:{socks.port}"
        transport = make_transport(flavour, proxy=proxy)
        async with client_for(transport, timeout=5) as client:
            with pytest.raises(
                httpx.ConnectError, match=f"^cannot resolve {UNKNOWN_NAME}: "
            ) as info:
                await client.get(f"http://{UNKNOWN_NAME}:{target.port}/")
            assert isinstance(info.value.__cause__, socket.gaierror), repr(info.value.__cause__)
            # the same transport reaches a name the resolver knows through the same proxy
            assert (await client.get(f"http://localhost:{target.port}/")).text == "hello"
        assert socks.ledger.targets().keys() == {f"127.0.0.1:{target.port}"}


async def test_socks5_credentials(target: HypercornServer, flavour: Flavour) -> None:
    with ProxyEgress(auth=("user", SECRET)) as socks:
        good = trusting(flavour, proxy=f"socks5://user:{SECRET}@127.0.0.1:{socks.port}")
        async with client_for(good) as client:
            response = await client.get(f"{target.url}/")
        assert response.extensions["bulkhead"].proxy == f"socks5://127.0.0.1:{socks.port}"
        bad = make_transport(
            flavour,
            proxy=httpx.Proxy(f"socks5://127.0.0.1:{socks.port}", auth=("user", "x" + SECRET)),
        )
        async with client_for(bad) as client:
            with pytest.raises(
                httpx.ProxyError, match="refused the user name and password"
            ) as info:
                await client.get(f"{target.url}/")
        no_secret(info.value, bad.statistics(), good.statistics(), bad._connector)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("fault", "says"),
    [
        (refuse(407, "Proxy Authentication Required"), r": 407 Proxy Authentication Required$"),
        (refuse(403, "Forbidden"), r": 403 Forbidden$"),
        (refuse(502, "Bad Gateway"), r": 502 Bad Gateway$"),
        (garbage(), "sent an invalid answer to CONNECT"),
        (close_mid_connect(), "closed the connection before answering CONNECT"),
        (Send(ESTABLISHED + b"\x16\x03\x01extra", "hang"), "sent bytes after opening the tunnel"),
    ],
    ids=["407", "403", "502", "garbage", "mid-head", "leftover"],
)
async def test_tunnel_faults_are_proxy_errors(
    tls_target: HypercornServer, fault: object, says: str, flavour: Flavour
) -> None:
    script: Callable[[object], object] = lambda request: fault  # noqa: E731
    with FaultProxy(script=script) as proxy:  # type: ignore[arg-type]
        url = f"http://user:{SECRET}@127.0.0.1:{proxy.port}"
        transport = trusting(flavour, proxy=url)
        async with client_for(transport) as client:
            with pytest.raises(httpx.ProxyError, match=says) as info:
                await client.get(f"{tls_target.url}/")
            assert str(info.value).startswith(f"proxy http://127.0.0.1:{proxy.port} ")
            no_secret(info.value, info.value.__cause__, info.value.__context__)
            assert info.value.request.url == f"{tls_target.url}/"
            stats = transport.statistics()[f"https://127.0.0.1:{tls_target.port}"]
            assert (stats.connections, stats.failed, stats.error) == (0, 1, 0)
            proxy.script = None  # the proxy behaves: the next request goes through
            assert (await client.get(f"{tls_target.url}/")).text == "hello"
        agree(transport)


async def test_an_unreachable_proxy_is_a_connect_error_naming_it(
    target: HypercornServer, flavour: Flavour
) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    transport = make_transport(flavour, proxy=f"http://user:{SECRET}@127.0.0.1:{port}")
    async with client_for(transport) as client:
        with pytest.raises(
            httpx.ConnectError, match=f"cannot connect to proxy http://127.0.0.1:{port}"
        ) as info:
            await client.get(f"{target.url}/")
    no_secret(info.value)


async def test_a_silent_proxy_is_cut_by_the_connect_timeout(
    tls_target: HypercornServer, flavour: Flavour
) -> None:
    with FaultProxy(script=lambda request: never_answer()) as proxy:
        transport = trusting(flavour, proxy=proxy.url)
        async with client_for(transport, timeout=httpx.Timeout(5, connect=0.2)) as client:
            started = time.monotonic()
            with anyio.fail_after(3):  # the connect timeout, not the read timeout, cuts it
                with pytest.raises(httpx.ConnectTimeout, match="through proxy"):
                    await client.get(f"{tls_target.url}/")
            # (a worker thread is not cancelled by fail_after: the sync flavour's bound)
            assert time.monotonic() - started < 3
        stats = transport.statistics()[f"https://127.0.0.1:{tls_target.port}"]
        assert (stats.connections, stats.failed) == (0, 1)


async def test_credentials_stay_out_of_logs_and_reprs(
    tls_target: HypercornServer, caplog: pytest.LogCaptureFixture, flavour: Flavour
) -> None:
    caplog.set_level(logging.DEBUG)
    with FaultProxy(script=lambda request: refuse(407, "Proxy Authentication Required")) as proxy:
        transport = trusting(
            flavour, proxy=httpx.Proxy(f"http://127.0.0.1:{proxy.port}", auth=("u", SECRET))
        )
        async with client_for(transport) as client:
            with pytest.raises(httpx.ProxyError) as info:
                await client.get(f"{tls_target.url}/")
        no_secret(
            info.value,
            transport._connector,
            transport.statistics(),
            *(r.getMessage() for r in caplog.records),
        )


# --------------------------------------------------------------------------- bulkheads


@pytest.mark.parametrize("kind", ["forward", "tunnel"])
async def test_a_slow_target_behind_the_proxy_does_not_starve_another(
    target_app: TestApp,
    egress: ProxyEgress,
    kind: str,
    unique: Callable[[str], str],
    flavour: Flavour,
) -> None:
    """Two targets through one proxy, one slow (its requests parked): the fast one is
    served throughout, and the proxy never holds more connections to a target than its
    compartment's limit."""
    gate = target_app.gate(unique("slow"))
    tls = default_server_tls() if kind == "tunnel" else None
    with (
        HypercornServer(target_app, tls=tls) as slow,
        HypercornServer(target_app, tls=tls) as fast,
        FaultProxy() as proxy,
    ):
        slow_key = f"127.0.0.1:{slow.port}"
        transport = trusting(
            flavour,
            proxy=proxy.url,
            hosts={slow_key: Policy(max_concurrency=2, max_pending=10)},
            default=Policy(max_concurrency=3),
        )
        stats = transport.statistics
        async with client_for(transport, timeout=TIMEOUT) as client:
            async with anyio.create_task_group() as tg:
                for _ in range(6):
                    tg.start_soon(client.get, f"{slow.url}/gate/{gate.name}")
                await gate.until_entered(2)
                await until(lambda: stats()[slow_key].waiting == 4)
                for _ in range(10):
                    assert (await client.get(f"{fast.url}/")).text == "hello"
                assert gate.entered == 2 and stats()[slow_key].running == 2
                gate.open()
        assert proxy.ledger.stats(slow_key).peak <= 2
        assert proxy.ledger.stats(f"127.0.0.1:{fast.port}").peak <= 1
        assert stats()[slow_key].completed == 6
        agree(transport)


@pytest.mark.parametrize("kind", ["forward", "tunnel"])
async def test_32_callers_on_each_of_two_targets_behind_one_proxy(
    target_app: TestApp, kind: str, unique: Callable[[str], str], flavour: Flavour
) -> None:
    """Where concurrency matters (sync: 64 worker threads): 32 callers on a slow target
    (parked at a gate) and 32 on a fast one, through one proxy.  All the fast ones complete
    while the slow ones are parked; the proxy never holds more connections to a target
    than its compartment's limit; once the gate opens, the slow ones complete too."""
    gate = target_app.gate(unique("slow32"))
    tls = default_server_tls() if kind == "tunnel" else None
    with (
        HypercornServer(target_app, tls=tls) as slow,
        HypercornServer(target_app, tls=tls) as fast,
        FaultProxy() as proxy,
    ):
        slow_key, fast_key = f"127.0.0.1:{slow.port}", f"127.0.0.1:{fast.port}"
        limits = Policy(max_concurrency=4, max_pending=32)
        transport = trusting(flavour, proxy=proxy.url, hosts={slow_key: limits, fast_key: limits})
        stats = transport.statistics
        answers: list[str] = []

        async def fast_call() -> None:
            answers.append((await client.get(f"{fast.url}/")).text)

        async with client_for(transport, timeout=TIMEOUT) as client:
            async with anyio.create_task_group() as tg:
                for _ in range(32):
                    tg.start_soon(client.get, f"{slow.url}/gate/{gate.name}")
                await gate.until_entered(4)
                await until(lambda: stats()[slow_key].waiting == 28)
                async with anyio.create_task_group() as fast_tg:
                    for _ in range(32):
                        fast_tg.start_soon(fast_call)
                assert answers == ["hello"] * 32
                assert gate.entered == 4 and stats()[slow_key].running == 4
                gate.open()
        assert proxy.ledger.stats(slow_key).peak <= 4
        assert 1 <= proxy.ledger.stats(fast_key).peak <= 4
        s = stats()
        assert (s[slow_key].completed, s[fast_key].completed) == (32, 32)
        assert (s[slow_key].failed, s[fast_key].failed) == (0, 0)
        assert (s[fast_key].rejected, s[fast_key].acquire_timeouts) == (0, 0)
        agree(transport)


async def test_request_timeout_through_a_tunnel_discards_the_connection(
    target_app: TestApp,
    egress: ProxyEgress,
    tls_target: HypercornServer,
    unique: Callable[[str], str],
    flavour: Flavour,
) -> None:
    gate = target_app.gate(unique("rt"))
    with TinyProxy(egress) as proxy:
        # The budget covers the next request too: a new tunnel and a TLS handshake, which
        # took over 0.3 s once on a loaded CI machine.
        transport = trusting(flavour, proxy=proxy.url, default=Policy(request_timeout=2.0))
        async with client_for(transport) as client:
            with pytest.raises(RequestTimeout):
                await client.get(f"{tls_target.url}/gate/{gate.name}")
            gate.open()
            assert (await client.get(f"{tls_target.url}/")).text == "hello"
        s = transport.statistics()[f"https://127.0.0.1:{tls_target.port}"]
        assert (s.unknown_state, s.connections_created, s.completed, s.failed) == (1, 2, 1, 1)


async def test_idle_tunnels_expire(
    egress: ProxyEgress, tls_target: HypercornServer, flavour: Flavour
) -> None:
    with TinyProxy(egress) as proxy:
        transport = trusting(flavour, proxy=proxy.url, default=Policy(idle_timeout=0.05))
        async with client_for(transport) as client:
            assert (await client.get(f"{tls_target.url}/")).text == "hello"
            key = f"https://127.0.0.1:{tls_target.port}"
            await until(lambda: transport.statistics()[key].idle_expired == 1)
            assert transport.statistics()[key].proxied_connections == 0
            target = f"127.0.0.1:{tls_target.port}"
            await egress.ledger.until(lambda led: led.stats(target).open_now == 0)


async def test_stale_retry_through_a_forwarding_proxy(
    target: HypercornServer, flavour: Flavour
) -> None:
    """The proxy closes a kept-alive connection when the next request arrives, before any
    response byte: the request is sent again on a new connection, as without a proxy."""
    seen: list[int] = []

    def script(request: ProxyRequest) -> Send | None:
        seen.append(request.conn)
        return Send(b"", "close") if len(seen) == 2 else None

    with FaultProxy(script=script) as proxy:
        transport = make_transport(flavour, proxy=proxy.url)
        async with client_for(transport) as client:
            assert (await client.get(f"{target.url}/")).text == "hello"
            again = await client.get(f"{target.url}/")
        assert again.text == "hello" and again.extensions["bulkhead"].retried
        s = transport.statistics()[f"http://127.0.0.1:{target.port}"]
        assert (s.stale_retries, s.connections_created, s.completed, s.failed) == (1, 2, 2, 0)
        assert seen[0] == seen[1] != seen[2]  # the retry went out on a new connection


async def test_tunnels_expire_at_their_lifetime(
    egress: ProxyEgress, tls_target: HypercornServer, flavour: Flavour
) -> None:
    now = [0.0]
    with TinyProxy(egress) as proxy:
        transport = trusting(
            flavour,
            proxy=proxy.url,
            default=Policy(max_lifetime=10.0, lifetime_jitter=0.0),
            _clock=lambda: now[0],
        )
        async with client_for(transport) as client:
            first = await client.get(f"{tls_target.url}/")
            now[0] = 11.0
            second = await client.get(f"{tls_target.url}/")
        assert (
            first.extensions["bulkhead"].connection_id
            != second.extensions["bulkhead"].connection_id
        )
        s = transport.statistics()[f"https://127.0.0.1:{tls_target.port}"]
        assert (s.lifetime_expired, s.connections_created) == (1, 2)
        assert proxy.requests().count(("CONNECT", f"127.0.0.1:{tls_target.port}")) == 2


async def test_many_origins_through_one_proxy_stay_bounded(flavour: Flavour) -> None:
    """Distinct origins through one proxy: compartments (and their pools) are evicted as
    without a proxy; nothing per origin is kept beyond them."""
    with FaultProxy() as proxy:
        transport = make_transport(flavour, proxy=proxy.url, max_default_compartments=4)
        async with client_for(transport) as client:
            for port in range(1, 41):  # closed ports: the proxy answers 502 for each
                response = await client.get(f"http://127.0.0.1:{port}/")
                assert response.status_code == 502
        stats = transport.statistics()
        assert len(stats) <= 5  # 4 compartments and "(evicted)"
        total = sum(s.acquired for s in stats.values())
        assert total == 40
