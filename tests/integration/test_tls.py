"""TLS against hypercorn on 127.0.0.1 with trustme certificates (HTTP/1.1 by ALPN)."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from httpx_bulkhead import BulkheadTransport, CompartmentStats, ExchangeInfo
from tests.servers import HypercornServer, TestApp, default_server_tls, wrong_host_server_tls

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("http1_parser")]

TIMEOUT = 10.0


@pytest.fixture(scope="module")
def tls_app() -> TestApp:
    return TestApp()


@pytest.fixture(scope="module")
def tls_server(tls_app: TestApp) -> Iterator[HypercornServer]:
    """HTTP/1.1-only hypercorn over TLS, certificate for 127.0.0.1 and localhost."""
    with HypercornServer(tls_app, tls=default_server_tls(), alpn=("http/1.1",)) as srv:
        yield srv


@pytest.fixture(scope="module")
def wrong_host_server() -> Iterator[HypercornServer]:
    """The same CA, but a certificate for ``wrong.example`` only."""
    with HypercornServer(TestApp(), tls=wrong_host_server_tls(), alpn=("http/1.1",)) as srv:
        yield srv


def trusting() -> ssl.SSLContext:
    """A client context trusting the session CA (fresh: the transport sets its ALPN)."""
    return default_server_tls().client_ssl_context()


def info(response: httpx.Response) -> ExchangeInfo:
    value = response.extensions["bulkhead"]
    assert isinstance(value, ExchangeInfo)
    return value


def verification_error(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate verification failure in ``exc``'s cause chain, if any."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def assert_clean(stats: CompartmentStats) -> None:
    assert (stats.running, stats.connections, stats.in_use_connections) == (0, 0, 0), stats
    assert (stats.failed, stats.connections_created) == (1, 0), stats


class Trace:
    def __init__(self) -> None:
        self.events: list[str] = []

    async def __call__(self, name: str, info: dict[str, Any]) -> None:
        self.events.append(name)


async def test_verified_https_round_trip(tls_server: HypercornServer, tls_app: TestApp) -> None:
    assert tls_server.url.startswith("https://127.0.0.1:")
    trace = Trace()
    body = b"secret" * 50_000
    async with httpx.AsyncClient(
        transport=BulkheadTransport(verify=trusting()), timeout=TIMEOUT
    ) as client:
        response = await client.get(f"{tls_server.url}/", extensions={"trace": trace})
        assert (response.status_code, response.text) == (200, "hello")
        assert response.http_version == "HTTP/1.1"
        assert response.headers["x-http-version"] == "1.1"
        assert info(response).compartment == f"https://127.0.0.1:{tls_server.port}"
        echoed = await client.post(f"{tls_server.url}/echo", content=body)
        assert echoed.content == body
        async with client.stream("GET", f"{tls_server.url}/bytes/1000000") as streamed:
            total = sum([len(chunk) async for chunk in streamed.aiter_bytes()])
        assert total == 1_000_000
    assert tls_app.records()[-1].scheme == "https"
    tls_events = ["connection.start_tls.started", "connection.start_tls.complete"]
    assert [e for e in trace.events if "start_tls" in e] == tls_events
    assert trace.events.index("connection.start_tls.complete") < trace.events.index(
        "http11.send_request_headers.started"
    )


async def test_connection_reuse_over_tls(tls_server: HypercornServer) -> None:
    transport = BulkheadTransport(verify=trusting())
    async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
        responses = [await client.get(f"{tls_server.url}/") for _ in range(3)]
        stats = transport.statistics()[tls_server.url]
    assert [info(r).reused for r in responses] == [False, True, True]
    assert len({r.headers["x-conn"] for r in responses}) == 1
    assert (stats.connections_created, stats.completed, stats.peer_closed) == (1, 3, 0)


async def test_default_verification_rejects_the_trustme_certificate(
    tls_server: HypercornServer,
) -> None:
    transport = BulkheadTransport()  # system CAs only
    async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
        with pytest.raises(httpx.TransportError) as caught:
            await client.get(f"{tls_server.url}/")
        assert type(caught.value) is httpx.ConnectError
        error = verification_error(caught.value)
        assert error is not None and error.verify_code != 0, repr(caught.value)
        assert_clean(transport.statistics()[tls_server.url])


async def test_wrong_host_certificate_is_rejected(wrong_host_server: HypercornServer) -> None:
    transport = BulkheadTransport(verify=trusting())  # the CA *is* trusted
    async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
        with pytest.raises(httpx.TransportError) as caught:
            await client.get(f"{wrong_host_server.url}/")
        assert type(caught.value) is httpx.ConnectError
        error = verification_error(caught.value)
        assert error is not None and "mismatch" in str(error), repr(caught.value)
        assert_clean(transport.statistics()[wrong_host_server.url])


async def test_sni_hostname_extension(
    tls_server: HypercornServer, wrong_host_server: HypercornServer
) -> None:
    async with httpx.AsyncClient(
        transport=BulkheadTransport(verify=trusting()), timeout=TIMEOUT
    ) as client:
        # The certificate also covers "localhost": verified against that name.
        response = await client.get(f"{tls_server.url}/", extensions={"sni_hostname": "localhost"})
        assert response.text == "hello"
        # The wrong-host certificate is valid for the name given by the extension only:
        # success proves the extension, not the URL's host, is what is verified.
        named = await client.get(
            f"{wrong_host_server.url}/", extensions={"sni_hostname": "wrong.example"}
        )
        assert named.text == "hello"
    transport = BulkheadTransport(verify=trusting())
    async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"{wrong_host_server.url}/", extensions={"sni_hostname": "other.test"})


async def test_default_transport_agrees(
    tls_server: HypercornServer, wrong_host_server: HypercornServer
) -> None:
    """The default transport fails (and succeeds) in the same cases."""
    async with httpx.AsyncClient(verify=trusting(), timeout=TIMEOUT) as client:
        assert (await client.get(f"{tls_server.url}/")).http_version == "HTTP/1.1"
        with pytest.raises(httpx.ConnectError):
            await client.get(f"{wrong_host_server.url}/")
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"{tls_server.url}/")
