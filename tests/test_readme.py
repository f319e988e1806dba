"""Every ```python block of README.md runs, as written, in a fresh namespace (so each has
its own imports, and a top-level ``await`` is a syntax error, as it would be for a reader).

The blocks name example hosts (``stt.example.com``, ...).  While they run, every
``BulkheadTransport`` they build that does not bring its own ``network`` connects to a
local hypercorn server instead (TLS with a certificate for ``*.example.com`` from the test
CA, so https and verification are real), and name resolution refuses every name but
loopback, so a block can never reach the internet, even if interception broke.  A block
that builds a ``RedisFleetLimit`` gets a local redis-server (``tests/servers/redis.py``) in
place of the URL it names.
"""

from __future__ import annotations

import logging
import re
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import httpx_bulkhead
from httpx_bulkhead import _blocking as blocking
from httpx_bulkhead._network import Connector, set_alpn
from httpx_bulkhead._streams import NetStream
from httpx_bulkhead._trace import TraceFn
from tests.servers import HypercornServer, ServerTLS, session_ca
from tests.servers.asgi import Receive, Scope, Send
from tests.servers.redis import RedisServer

README = Path(__file__).resolve().parent.parent / "README.md"
FENCE = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def python_blocks() -> list[tuple[int, str]]:
    """``(line number, code)`` of each ```python block."""
    text = README.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 2, m.group(1)) for m in FENCE.finditer(text)]


BLOCKS = python_blocks()


def test_the_readme_has_its_python_blocks() -> None:
    """The extractor found the blocks (a broken pattern would make the tests below vacuous)."""
    assert len(BLOCKS) >= 6
    assert README.read_text(encoding="utf-8").count("```python") == len(BLOCKS)


async def example_app(scope: Scope, receive: Receive, send: Send) -> None:
    """Any path of any example host: 200 with a small JSON body."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    body = b'{"summary": "a summary", "items": [1, 2]}'
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class ExampleHosts:
    """A ``Network`` that connects every origin to the local servers (http or https),
    keeping the host name for SNI and certificate verification."""

    def __init__(self, plain: HypercornServer, tls: HypercornServer, context: ssl.SSLContext):
        self._ports = {"http": plain.port, "https": tls.port}
        self._connector = Connector(ssl_context=context)

    async def connect(
        self, request: httpx.Request, *, timeout: float | None, trace: TraceFn | None
    ) -> NetStream:
        url = request.url
        local = httpx.Request(
            request.method,
            url.copy_with(host="127.0.0.1", port=self._ports[url.scheme]),
            extensions={**request.extensions, "sni_hostname": url.host},
        )
        return await self._connector.connect(local, timeout=timeout, trace=trace)


class ExampleHostsBlocking:
    """``ExampleHosts`` for ``BulkheadHTTPTransport`` (its network's ``connect`` blocks)."""

    def __init__(self, hosts: ExampleHosts) -> None:
        self._ports = hosts._ports
        self._connector = blocking.Connector(ssl_context=hosts._connector.ssl_context)

    def connect(
        self, request: httpx.Request, *, timeout: float | None, trace: Any
    ) -> blocking.NetStream:
        url = request.url
        local = httpx.Request(
            request.method,
            url.copy_with(host="127.0.0.1", port=self._ports[url.scheme]),
            extensions={**request.extensions, "sni_hostname": url.host},
        )
        return self._connector.connect(local, timeout=timeout, trace=trace)


@pytest.fixture(scope="module")
def example_hosts() -> Iterator[ExampleHosts]:
    tls = ServerTLS(session_ca(), hosts=("*.example.com", "example.com"))
    context = tls.client_ssl_context()
    set_alpn(context, ["http/1.1"])
    with HypercornServer(example_app) as plain, HypercornServer(example_app, tls=tls) as secure:
        yield ExampleHosts(plain, secure, context)


@pytest.fixture
def local_network(example_hosts: ExampleHosts, monkeypatch: pytest.MonkeyPatch) -> None:
    real = httpx_bulkhead.BulkheadTransport

    class LocalBulkheadTransport(real):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if "proxy" not in kwargs:  # (a block with a proxy sends nothing: it only builds)
                kwargs.setdefault("network", example_hosts)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(httpx_bulkhead, "BulkheadTransport", LocalBulkheadTransport)
    blocking_hosts = ExampleHostsBlocking(example_hosts)
    real_sync = httpx_bulkhead.BulkheadHTTPTransport

    class LocalBulkheadHTTPTransport(real_sync):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("network", blocking_hosts)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(httpx_bulkhead, "BulkheadHTTPTransport", LocalBulkheadHTTPTransport)
    resolve = socket.getaddrinfo

    def loopback_only(host: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        if name not in LOOPBACK:
            raise OSError(f"README blocks may not resolve {name!r}: only loopback here")
        return resolve(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", loopback_only)


@pytest.fixture(autouse=True)
def _library_logging_as_it_was() -> Iterator[None]:
    """A block may turn the library's loggers on, as a reader would: undone after it."""
    loggers = [logging.getLogger(name) for name in ("httpx_bulkhead", "httpx_bulkhead.adaptive")]
    saved = [(logger.level, logger.propagate, list(logger.handlers)) for logger in loggers]
    yield
    for logger, (level, propagate, handlers) in zip(loggers, saved, strict=True):
        logger.setLevel(level)
        logger.propagate = propagate
        logger.handlers[:] = handlers


@pytest.fixture(scope="module")
def readme_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def local_redis(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ``RedisFleetLimit`` the block builds talks to a local redis-server (started on
    first need: skipped, or failed under ``BULKHEAD_REQUIRE_REDIS=1``, without one)."""
    server: RedisServer = request.getfixturevalue("readme_redis")
    real = httpx_bulkhead.RedisFleetLimit

    def on_loopback(url_or_client: Any, *args: Any, **kwargs: Any) -> Any:
        return real(server.url, *args, **kwargs)

    monkeypatch.setattr(httpx_bulkhead, "RedisFleetLimit", on_loopback)


@pytest.mark.usefixtures("local_network")
@pytest.mark.parametrize("line,code", BLOCKS, ids=[f"README.md:{line}" for line, _ in BLOCKS])
def test_readme_block_runs(
    line: int,
    code: str,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if "RedisFleetLimit(" in code:
        local_redis(request, monkeypatch)
    compiled = compile(code, f"README.md:{line}", "exec")  # top-level await: SyntaxError
    exec(compiled, {"__name__": "__readme__"})
    capsys.readouterr()  # what the blocks print is for the reader
