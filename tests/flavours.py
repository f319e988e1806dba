"""The integration tests, run against the async transport and the sync one.

A test that takes the ``flavour`` fixture builds its transport with ``make_transport`` and
its client with ``client_for``: ``"async"`` is ``BulkheadTransport`` under
``httpx.AsyncClient``; ``"sync"`` is ``BulkheadHTTPTransport`` under ``httpx.Client``, each
call made from a worker thread (up to ``THREADS`` at once), so the test's body, its task
groups and its gates stay as they are while threads are the transport's callers.
``httpx_client`` is httpx's own client of a flavour (its default transport), for tests that
compare with it side by side.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator
from typing import Any, Literal, TypeAlias

import anyio
import anyio.to_thread
import httpx

from httpx_bulkhead import BulkheadHTTPTransport, BulkheadTransport

__all__ = [
    "FLAVOURS",
    "THREADS",
    "Client",
    "Flavour",
    "ThreadedClient",
    "Transport",
    "client_for",
    "httpx_client",
    "make_transport",
]

Flavour: TypeAlias = Literal["async", "sync"]
FLAVOURS: tuple[Flavour, ...] = ("async", "sync")
#: Worker threads calling the sync transport at most at once.
THREADS = 64

Transport: TypeAlias = BulkheadTransport | BulkheadHTTPTransport


def make_transport(flavour: Flavour, *args: Any, **kwargs: Any) -> Transport:
    """The transport of ``flavour``, with the same arguments."""
    if flavour == "sync":
        return BulkheadHTTPTransport(*args, **kwargs)
    return BulkheadTransport(*args, **kwargs)


class ThreadedClient:
    """``httpx.Client`` called from async test code: each call runs in a worker thread."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client
        self._limiter: anyio.CapacityLimiter | None = None

    async def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(THREADS)
        call = functools.partial(self.client.request, method, url, **kwargs)
        return await anyio.to_thread.run_sync(call, limiter=self._limiter)

    async def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return await self.request("GET", url, **kwargs)

    async def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return await self.request("POST", url, **kwargs)

    async def put(self, url: str, **kwargs: Any) -> httpx.Response:
        return await self.request("PUT", url, **kwargs)


Client: TypeAlias = httpx.AsyncClient | ThreadedClient


@contextlib.asynccontextmanager
async def client_for(
    transport: Transport | httpx.BaseTransport | httpx.AsyncBaseTransport, **kwargs: Any
) -> AsyncIterator[Client]:
    """A client over ``transport`` (``kwargs`` as for ``httpx.AsyncClient``), closed after:
    ``httpx.Client`` called from worker threads for a sync transport (ours or httpx's)."""
    if isinstance(transport, httpx.BaseTransport):
        async with _threaded(httpx.Client(transport=transport, **kwargs)) as client:
            yield client
    else:
        async with httpx.AsyncClient(transport=transport, **kwargs) as async_client:
            yield async_client


@contextlib.asynccontextmanager
async def httpx_client(flavour: Flavour, **kwargs: Any) -> AsyncIterator[Client]:
    """httpx's own client of ``flavour`` with its default transport (``kwargs`` as for
    ``httpx.AsyncClient``: with ``trust_env`` it mounts the environment's proxies)."""
    if flavour == "sync":
        async with _threaded(httpx.Client(**kwargs)) as client:
            yield client
    else:
        async with httpx.AsyncClient(**kwargs) as async_client:
            yield async_client


@contextlib.asynccontextmanager
async def _threaded(client: httpx.Client) -> AsyncIterator[ThreadedClient]:
    try:
        yield ThreadedClient(client)
    finally:
        await anyio.to_thread.run_sync(client.close)
