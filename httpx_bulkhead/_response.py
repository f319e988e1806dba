"""The response body stream: reads the body from the exchange, then gives everything back.

The slot (and the connection, or HTTP/2 stream) is held until the body has been read to the
end, reading it failed, or the response was closed, whichever comes first; then, exactly
once, the exchange is ended (the connection pooled, kept after a stream reset, or closed)
and the slot is released.
"""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator

import httpx

from ._compartment import Compartment, Outcome
from ._exchange import ClosedEarly, Connection, Exchange, Timeouts

__all__ = ["ResponseStream"]


class ResponseStream(httpx.AsyncByteStream):
    """Streams one response body; returns the connection and slot when done or closed."""

    def __init__(
        self,
        compartment: Compartment,
        conn: Connection,
        exchange: Exchange,
        request: httpx.Request,
        timeouts: Timeouts,
    ) -> None:
        self._compartment = compartment
        self._conn = conn
        self._exchange = exchange
        self._request = request
        self._timeouts = timeouts
        self._finished = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        # An iterator object rather than an async generator: nothing to finalize if the
        # caller stops early (the slot is returned by ``aclose``).
        if self._finished:
            raise httpx.StreamClosed()
        return self

    async def __anext__(self) -> bytes:
        if self._finished:
            raise StopAsyncIteration
        try:
            chunk = await self._exchange.receive_body(self._request, self._timeouts)
        except BaseException as exc:
            await self._finish(exc)
            raise
        if chunk is None:
            await self._finish(None)
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        """Close the response.  A body not read to the end leaves an HTTP/1.1 connection in
        an unknown state (it is closed) and an HTTP/2 stream open (it is reset)."""
        if not self._finished:
            await self._finish(None if self._exchange.finish_buffered() else ClosedEarly())

    async def fail(self, exc: BaseException) -> None:
        """The response could not be handed over: end the exchange as cut by ``exc``."""
        await self._finish(exc)

    def __del__(self) -> None:
        # A response nobody closed would hold its slot for ever (the classic way to exhaust
        # a pool): say so, and give the slot and connection back.
        if self._finished:
            return
        self._finished = True
        try:
            self._compartment.end_leaked(self._conn, self._exchange)
        except Exception:
            return
        warnings.warn(
            f"a response from compartment {self._compartment.name!r} was never closed; its "
            "slot has been returned. Use `async with client.stream(...)` or `await "
            "response.aclose()`.",
            ResourceWarning,
            stacklevel=1,
            source=self,
        )

    async def _finish(self, exc: BaseException | None) -> None:
        if self._finished:
            return
        self._finished = True
        try:
            await self._compartment.end_exchange(self._conn, self._exchange, exc)
        finally:
            if exc is None:
                outcome = Outcome.COMPLETED
            elif isinstance(exc, Exception) and not isinstance(exc, ClosedEarly):
                outcome = Outcome.FAILED
            else:
                outcome = Outcome.CANCELLED
            self._compartment.release(outcome)
