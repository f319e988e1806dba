"""Events for httpx's ``trace`` request extension, named and ordered as httpcore emits them.

A request with ``extensions={"trace": callback}`` has ``await callback(name, info)`` called
as it goes, with names ``{prefix}.{operation}.started|complete|failed``: ``connection.*``
for opening a connection (``connect_tcp``, ``connect_unix_socket``, ``start_tls``,
``retry``), ``http11.*`` or ``http2.*`` for one exchange (``send_connection_init``,
``send_request_headers``, ``send_request_body``, ``receive_response_headers``,
``receive_response_body``, ``response_closed``).  ``info`` holds what httpcore puts there:
``request`` on ``started``, ``return_value`` on ``complete``, ``exception`` on ``failed``.

An exchange cut by a failure ends with ``{operation}.failed`` for the operation it was in,
then ``response_closed``.  A body closed before its end (``client.stream`` left early) ends
with ``response_closed``, then ``receive_response_body.failed`` with a ``GeneratorExit``:
httpcore's body generator is finalized then, and tools pairing ``started`` with
``complete``/``failed`` see the operation end.

Where httpcore has an operation we do not, there is no event: ``http2.receive_remote_settings``
(httpcore waits for the server's SETTINGS as a step of the first request; we handle them
whenever they arrive, with no request to report them to).  The ``request`` in ``info`` is
the ``httpx.Request`` (httpcore's is its own request type).

Nothing here runs unless the request has a trace callback: the exchanges build a
``Tracer`` only then, and every call site is guarded by ``if tracer is not None``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

import anyio

__all__ = ["TraceFn", "Tracer", "emit"]

TraceFn: TypeAlias = Callable[[str, dict[str, Any]], Awaitable[None]]


async def emit(trace: TraceFn | None, name: str, info: dict[str, Any]) -> None:
    """Call an httpx ``trace`` extension callback, if there is one."""
    if trace is not None:
        await trace(name, info)


class Tracer:
    """The trace events of one exchange (request and response) on a connection.

    ``started``/``complete`` bracket each operation; the operation still open when the
    exchange is cut gets its ``failed`` event from ``closing``, which the compartment
    calls when the exchange ends, followed by ``response_closed``.
    """

    __slots__ = ("_abandoned", "_error", "_fn", "_open", "_prefix", "stream_id")

    def __init__(self, fn: TraceFn, prefix: str) -> None:
        self._fn = fn
        self._prefix = prefix
        self._open: str | None = None  # the operation started and not yet complete
        self._abandoned: str | None = None  # left open by an early close: failed at the end
        self._error: BaseException | None = None  # raised by the callback while closing
        self.stream_id: int | None = None  # HTTP/2: shown in ``response_closed``

    @property
    def current(self) -> str | None:
        """The operation started and not yet complete, if any."""
        return self._open

    async def started(self, operation: str, info: dict[str, Any]) -> None:
        self._open = operation
        await self._fn(f"{self._prefix}.{operation}.started", info)

    async def complete(self, operation: str, return_value: Any = None) -> None:
        self._open = None
        await self._fn(f"{self._prefix}.{operation}.complete", {"return_value": return_value})

    async def closing(self, exc: BaseException | None, *, early: bool = False) -> None:
        """The exchange ends: ``{operation}.failed`` if ``exc`` cut an operation (``early``:
        the response was closed before its end, reported after ``response_closed``), then
        ``response_closed.started``.  Shielded, as httpcore's (the connection must be
        settled whatever happens); what the callback raises is kept for ``closed`` to raise
        once the exchange has been settled: any exception, a cancellation the shield cannot
        hold off (a native asyncio one, as ``asyncio.timeout`` delivers) and an interrupt
        included (cut short here, the exchange would end without the pool's answer)."""
        operation, self._open = self._open, None
        if early:
            self._abandoned, operation = operation, None
        with anyio.CancelScope(shield=True):
            try:
                if exc is not None and operation is not None:
                    await self._fn(f"{self._prefix}.{operation}.failed", {"exception": exc})
                info = {} if self.stream_id is None else {"stream_id": self.stream_id}
                await self._fn(f"{self._prefix}.response_closed.started", info)
            except GeneratorExit:  # (the coroutine is being closed: it may not await)
                raise
            except BaseException as error:
                self._error = error

    async def closed(self) -> None:
        """``response_closed.complete``; raises what the callback raised in ``closing``."""
        error, self._error = self._error, None
        if error is not None:
            raise error
        with anyio.CancelScope(shield=True):
            await self._fn(f"{self._prefix}.response_closed.complete", {"return_value": None})
            if self._abandoned is not None:
                info = {"exception": GeneratorExit()}
                await self._fn(f"{self._prefix}.{self._abandoned}.failed", info)
