"""The response body stream: reads the body from the connection, then gives it all back.

The slot (and the connection) is held until the body has been read to the end, reading it
failed, or the response was closed, whichever comes first; then, exactly once, the
connection is pooled (complete exchange) or closed (anything else: its state is unknown)
and the slot is released.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx

from ._compartment import Compartment, Outcome, discard_reason
from ._http11 import HTTP11Connection, Timeouts
from ._pool import Discard

__all__ = ["ResponseStream"]


class ResponseStream(httpx.AsyncByteStream):
    """Streams one response body; returns the connection and slot when done or closed."""

    def __init__(
        self,
        compartment: Compartment,
        conn: HTTP11Connection,
        request: httpx.Request,
        timeouts: Timeouts,
    ) -> None:
        self._compartment = compartment
        self._conn = conn
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
            chunk = await self._conn.receive_body(self._request, self._timeouts)
        except BaseException as exc:
            await self._finish(exc)
            raise
        if chunk is None:
            await self._finish(None)
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        """Close the response: a body not read to the end leaves the connection in an
        unknown state, so it is closed rather than pooled."""
        if not self._finished:
            await self._finish(None if self._conn.finish_buffered() else _ClosedEarly())

    async def _finish(self, exc: BaseException | None) -> None:
        if self._finished:
            return
        self._finished = True
        compartment = self._compartment
        try:
            if exc is None:
                await compartment.checkin(self._conn)
            elif isinstance(exc, _ClosedEarly):
                await compartment.discard(self._conn, Discard.UNKNOWN_STATE)
            else:
                await compartment.discard(self._conn, discard_reason(exc, self._conn))
        finally:
            if exc is None:
                outcome = Outcome.COMPLETED
            elif isinstance(exc, Exception) and not isinstance(exc, _ClosedEarly):
                outcome = Outcome.FAILED
            else:
                outcome = Outcome.CANCELLED
            compartment.release(outcome)


class _ClosedEarly(Exception):
    """Marker: the response was closed before its body was read to the end."""
