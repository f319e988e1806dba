"""Contestants beside httpx's default transport: the httptools floor and the aiohttp clients.

* ``httptools-floor``: httptools driven over a bare asyncio ``Protocol``, one keep-alive
  connection per worker, opened before the clock starts, no pool, no limits: the least an
  httptools-based client can do (``harness.H11FloorDriver`` is the same for h11).  The
  request bytes are built once, with the headers ``httpx.AsyncClient`` sends.
* ``httpx-aiohttp``: httpx with the ``AiohttpTransport`` of the ``httpx-aiohttp`` package
  (aiohttp's C parser and connection pool under httpx's models), what users pick today when
  they want speed from httpx.
* ``aiohttp``: an ``aiohttp.ClientSession`` alone (``session.get`` + ``read``), the
  reference speed of an asyncio client; it has no transport level, so it is the same driver
  at both levels.

aiohttp, httpx-aiohttp and uvloop are optional (``pip install -e '.[bench]'``); the report
leaves a row out when its package is missing (``available``).
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Sequence
from typing import Any, cast

import httpx

__all__ = [
    "AIOHTTP",
    "HTTPTOOLS_FLOOR",
    "HTTPX_AIOHTTP",
    "AiohttpDriver",
    "HttptoolsFloorDriver",
    "aiohttp_transport",
    "available",
    "floor_headers",
]

HTTPTOOLS_FLOOR = "httptools-floor"
HTTPX_AIOHTTP = "httpx-aiohttp"
AIOHTTP = "aiohttp"

#: The package each optional contestant needs.
NEEDS = {HTTPTOOLS_FLOOR: "httptools", HTTPX_AIOHTTP: "httpx_aiohttp", AIOHTTP: "aiohttp"}


def available(contestant: str) -> bool:
    """Whether ``contestant``'s package is installed (contestants without one: always)."""
    package = NEEDS.get(contestant)
    return package is None or importlib.util.find_spec(package) is not None


def floor_headers(host: str, port: int) -> list[tuple[bytes, bytes]]:
    """The request headers ``httpx.AsyncClient`` sends on a plain GET, in its order."""
    return [
        (b"host", f"{host}:{port}".encode()),
        (b"accept", b"*/*"),
        (b"accept-encoding", b"gzip, deflate"),
        (b"connection", b"keep-alive"),
        (b"user-agent", f"python-httpx/{httpx.__version__}".encode()),
    ]


class _HttptoolsConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection: httptools' response parser on a bare Protocol.

    The parser keeps its state from one response to the next on a keep-alive connection.
    What any client must hand its caller is collected (the header fields and the body
    chunks, as h11's events carry them in the h11 floor); ``on_message_complete`` resolves
    the waiting request with the status code."""

    def __init__(self) -> None:
        import httptools

        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[int] | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []

    # httptools callbacks (the parser calls the ones its protocol object has)
    def on_message_begin(self) -> None:
        self.headers = []
        self.body = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(self._parser.get_status_code())

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # (uvloop's: not a subclass)

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionError("connection lost"))

    async def get(self, request: bytes) -> int:
        assert self._transport is not None
        self._waiter = asyncio.get_running_loop().create_future()
        self._transport.write(request)
        return await self._waiter

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class HttptoolsFloorDriver:
    """The httptools floor: one connection per worker, opened in ``start``."""

    def __init__(self, url: str, concurrency: int) -> None:
        self.name = HTTPTOOLS_FLOOR
        parsed = httpx.URL(url)
        self._host, self._port = parsed.host, parsed.port or 80
        head = b"GET " + parsed.raw_path + b" HTTP/1.1\r\n"
        fields = b"".join(k + b": " + v + b"\r\n" for k, v in floor_headers(self._host, self._port))
        self._request = head + fields + b"\r\n"
        self._concurrency = concurrency
        self._conns: list[_HttptoolsConnection] = []

    async def start(self) -> HttptoolsFloorDriver:
        loop = asyncio.get_running_loop()
        for _ in range(self._concurrency):
            _, protocol = await loop.create_connection(_HttptoolsConnection, self._host, self._port)
            self._conns.append(protocol)
        return self

    async def __call__(self, worker: int, i: int) -> None:
        status = await self._conns[worker].get(self._request)
        if status != 200:
            raise RuntimeError(f"unexpected status {status}")

    async def aclose(self) -> None:
        for conn in self._conns:
            conn.close()
        self._conns.clear()
        await asyncio.sleep(0)  # let the loop run the transports' close callbacks


def aiohttp_transport(max_connections: int | None, keepalive: float) -> httpx.AsyncBaseTransport:
    """``httpx_aiohttp.AiohttpTransport`` with one pool of ``max_connections`` (``None``:
    unlimited), idle connections kept ``keepalive`` seconds (environment proxies ignored,
    as the other contestants do)."""
    from httpx_aiohttp import AiohttpTransport

    limits = httpx.Limits(
        max_connections=max_connections,
        max_keepalive_connections=max_connections,
        keepalive_expiry=keepalive,
    )
    transport: httpx.AsyncBaseTransport = AiohttpTransport(limits=limits, trust_env=False)
    return transport


class AiohttpDriver:
    """``aiohttp.ClientSession.get`` and ``read``, cycling over ``urls``; the session (and
    its connector: ``limit`` connections, ``keepalive`` seconds idle) is made on the first
    call, inside the running loop, as aiohttp wants."""

    def __init__(self, urls: Sequence[str], max_connections: int | None, keepalive: float) -> None:
        self.name = AIOHTTP
        self._urls = list(urls)
        self._limit = 0 if max_connections is None else max_connections  # 0: no limit
        self._keepalive = keepalive
        self._session: Any = None

    def _open(self) -> Any:
        import aiohttp

        connector = aiohttp.TCPConnector(limit=self._limit, keepalive_timeout=self._keepalive)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        return self._session

    async def __call__(self, worker: int, i: int) -> None:
        session = self._session or self._open()
        async with session.get(self._urls[i % len(self._urls)]) as response:
            await response.read()
            if response.status != 200:
                raise RuntimeError(f"unexpected status {response.status}")

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
