"""``BulkheadHTTPTransport``: the bulkheads for ``httpx.Client`` (threads as callers).

The transport itself is generated from the async one (``_sync/_transport.py``, by
``scripts/unasync.py``); this class adds what only threads need: every entry into the
transport (a request, reading or closing a response body, ``close``) holds the transport's
loop lock (``_threads.py``), which the shell releases whenever it waits, and settings that
only exist on an event loop are refused.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import httpx

from ._config import Policy
from ._sync import _transport
from ._sync._compartment import Compartment
from ._threads import LoopLock

__all__ = ["ASYNC_ONLY_FIELDS", "BulkheadHTTPTransport"]

#: ``Policy`` fields a sync transport cannot honour, with why (refused with a TypeError
#: naming the field, when a policy sets them).
ASYNC_ONLY_FIELDS: dict[str, str] = {
    "fleet": "the fleet-wide limit's Redis client runs on asyncio only",
}


class BulkheadHTTPTransport(_transport.BulkheadHTTPTransport):
    """An httpx transport for ``httpx.Client`` that gives each dependency its own bulkhead:
    ``BulkheadTransport`` (``AsyncBulkheadHTTPTransport``) for threads, with the same
    arguments, policies, routing, statistics, ``extensions["bulkhead"]`` and exceptions.

    Threads waiting for a slot or a connection are served first come, first served; a
    wait interrupted (timeout, ``KeyboardInterrupt``) leaves the queue and gives back any
    slot it was granted.  No lock is held while a thread does network I/O, so a thread
    blocked on a slow dependency delays no other compartment.  Idle connections are
    closed on time by a timer thread that exists only while something is scheduled and
    is stopped by ``close()``.

    Proxies (``proxy=``, or the environment's with ``trust_env``) work as in the async
    transport: the dial path is generated from the same source (``_sync/_proxied.py``).

    Raises:
        TypeError, ValueError: invalid configuration (the message names the field, as the
            async transport's: ``proxy=`` with ``uds=`` or ``network=`` among them), or a
            ``Policy`` setting that needs an event loop (see ``ASYNC_ONLY_FIELDS``), or an
            async ``network=`` (``testing.MockNetwork``).
    """

    def _compartment(self, name: str, policy: Policy) -> Compartment:
        _check_sync(name, policy)
        if inspect.iscoroutinefunction(getattr(self._connector, "connect", None)):
            raise TypeError(
                "network= is an async network (e.g. httpx_bulkhead.testing.MockNetwork); "
                "BulkheadHTTPTransport needs one whose connect() blocks"
            )
        return super()._compartment(name, policy)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` through its compartment (see ``BulkheadTransport``)."""
        lock = self._timers.lock
        response = lock.run(super().handle_request, request)
        stream = response.stream
        if not isinstance(stream, httpx.ByteStream):  # ours, not a mocked response's
            response.stream = _Locked(stream, lock)
        return response

    def close(self) -> None:
        """Close every connection (see ``BulkheadTransport.aclose``); the timer thread is
        stopped before this returns."""
        self._timers.lock.run(super().close)


def _check_sync(name: str, policy: Policy) -> None:
    for field, why in ASYNC_ONLY_FIELDS.items():
        if getattr(policy, field, None) is not None:
            raise TypeError(
                f"Policy.{field} (compartment {name!r}) is not supported by"
                f" BulkheadHTTPTransport: {why}; use BulkheadTransport with httpx.AsyncClient"
            )


class _Locked(httpx.SyncByteStream):
    """A response body whose reads and close hold the transport's loop lock."""

    __slots__ = ("_inner", "_lock")

    def __init__(self, inner: Any, lock: LoopLock) -> None:
        self._inner = inner
        self._lock = lock

    def __iter__(self) -> Iterator[bytes]:
        self._lock.run(iter, self._inner)
        return self

    def __next__(self) -> bytes:
        chunk: bytes = self._lock.run(next, self._inner)
        return chunk

    def close(self) -> None:
        self._lock.run(self._inner.close)
