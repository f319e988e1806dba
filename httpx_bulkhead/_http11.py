"""One HTTP/1.1 connection, driven by h11 over an anyio byte stream.

A connection serves one exchange at a time.  Its state is *known* only between exchanges
(h11 has both sides at ``IDLE`` after ``start_next_cycle``); if an exchange is cut anywhere
in the middle (timeout, cancellation, error, response closed before its body was read) the
caller must close the connection: a late response would otherwise be read by the next
borrower (RFC 9112 §9.3, §9.6).  ``reusable`` is true only after a complete exchange that
both sides agreed to keep alive.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterable, Iterable
from typing import Any

import anyio
import anyio.abc
import h11
import httpx

from ._exceptions import Phase, RequestTimeout, raise_mapped
from ._network import TraceFn, close_stream, emit, is_readable
from ._pool import Origin, PoolEntry

__all__ = ["HTTP11Connection", "Timeouts"]

READ_SIZE = 65536
#: Largest response head (status line and headers) accepted, in bytes.
MAX_HEAD_SIZE = 64 * 1024
#: How long to wait for ``100 Continue`` before sending the body anyway (RFC 9110 §10.1.1).
EXPECT_CONTINUE_WAIT = 1.0

_ids = itertools.count(1)


class Timeouts:
    """Per-operation timeouts (httpx's ``read``/``write``) and the total deadline.

    ``deadline`` is a ``time.monotonic()`` instant (``None``: none) set by
    ``Policy.request_timeout``; each operation waits at most until the earlier of the two.
    """

    __slots__ = ("deadline", "read", "write")

    def __init__(self, read: float | None, write: float | None, deadline: float | None) -> None:
        self.read = read
        self.write = write
        self.deadline = deadline

    def budget(self, op: float | None) -> tuple[float | None, bool]:
        """``(seconds, is_deadline)``: how long the next operation may take, and whether the
        total deadline (rather than the operation's own timeout) is what bounds it."""
        if self.deadline is None:
            return op, False
        left = self.deadline - time.monotonic()
        if op is None or left <= op:
            return max(left, 0.0), True
        return op, False


class HTTP11Connection(PoolEntry):
    """An HTTP/1.1 connection in a compartment's pool."""

    __slots__ = ("_h11", "_stream", "id", "keep_alive", "received_any", "wrote_any")

    def __init__(self, origin: Origin, stream: anyio.abc.ByteStream) -> None:
        super().__init__(origin)
        self.id = next(_ids)
        self._stream = stream
        self._h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_SIZE)
        self.keep_alive: float | None = None  # the server's Keep-Alive: timeout=, seconds
        self.received_any = False  # a response byte arrived in the current exchange
        self.wrote_any = False  # a request byte was handed to the OS in the current exchange

    # -- health ------------------------------------------------------------------------
    def is_stale(self) -> bool:
        """An idle connection that must not be reused: the peer closed it or sent data."""
        return bool(self._h11.trailing_data[0]) or is_readable(self._stream)

    @property
    def reusable(self) -> bool:
        return self._h11.our_state is h11.IDLE and self._h11.their_state is h11.IDLE

    async def aclose(self) -> None:
        await close_stream(self._stream)

    # -- the exchange ------------------------------------------------------------------
    async def send_request(
        self, request: httpx.Request, timeouts: Timeouts, trace: TraceFn | None
    ) -> h11.Response:
        """Write the request (streaming its body) and read the response head.

        Raises:
            httpx.WriteError, WriteTimeout, ReadError, ReadTimeout, RemoteProtocolError,
            LocalProtocolError, RequestTimeout.
        """
        self.received_any = self.wrote_any = False
        target = request.extensions.get("target", request.url.raw_path)
        event = h11.Request(method=request.method, target=target, headers=request.headers.raw)
        await emit(trace, "http11.send_request_headers.started", {"request": request})
        await self._send(event, request, timeouts)
        await emit(trace, "http11.send_request_headers.complete", {"return_value": None})

        early: h11.Response | None = None
        if self._h11.client_is_waiting_for_100_continue:
            early = await self._await_continue(request, timeouts)
        if early is None:
            await emit(trace, "http11.send_request_body.started", {"request": request})
            try:
                await self._send_body(request, timeouts)
            except httpx.WriteError:
                # The server may have answered and stopped reading (e.g. 413): prefer its
                # response to our write error, as a browser would.
                if self._h11.their_state is not h11.SEND_RESPONSE:
                    raise
                early = await self._read_head_or_none(request, timeouts)
                if early is None:
                    raise
            await emit(trace, "http11.send_request_body.complete", {"return_value": None})

        await emit(trace, "http11.receive_response_headers.started", {"request": request})
        response = early or await self._read_head(request, timeouts)
        self.keep_alive = _keep_alive_timeout(response.headers)
        await emit(
            trace,
            "http11.receive_response_headers.complete",
            {"return_value": (b"HTTP/1.1", response.status_code, response.reason, [])},
        )
        return response

    async def receive_body(self, request: httpx.Request, timeouts: Timeouts) -> bytes | None:
        """The next chunk of the response body; ``None`` once the body is complete (the
        connection is then ``reusable`` if both sides keep it alive)."""
        while True:
            event = self._next_event(request)
            if event is h11.NEED_DATA:
                await self._receive(request, timeouts)
                continue
            if isinstance(event, h11.Data):
                return bytes(event.data)
            if isinstance(event, h11.EndOfMessage):
                if self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE:
                    self._h11.start_next_cycle()
                return None
            raise httpx.RemoteProtocolError(f"unexpected {type(event).__name__}", request=request)

    def finish_buffered(self) -> bool:
        """Consume what is left of the response body *without I/O*; true if that reached its
        end (so a response closed early, e.g. an unread empty body, keeps its connection)."""
        while True:
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError:
                return False
            if isinstance(event, h11.Data):
                continue
            if isinstance(event, h11.EndOfMessage) and self._h11.our_state is h11.DONE:
                if self._h11.their_state is h11.DONE:
                    self._h11.start_next_cycle()
                return True
            return False

    # -- internals ---------------------------------------------------------------------
    async def _send_body(self, request: httpx.Request, timeouts: Timeouts) -> None:
        stream = request.stream
        if not isinstance(stream, AsyncIterable):
            raise RuntimeError("BulkheadTransport needs an async request stream")
        async for chunk in stream:
            if chunk:
                await self._send(h11.Data(data=chunk), request, timeouts)
        await self._send(h11.EndOfMessage(), request, timeouts)

    async def _await_continue(
        self, request: httpx.Request, timeouts: Timeouts
    ) -> h11.Response | None:
        """Wait briefly for ``100 Continue``; a final response instead means: skip the body."""
        wait = (
            EXPECT_CONTINUE_WAIT
            if timeouts.read is None
            else min(timeouts.read, EXPECT_CONTINUE_WAIT)
        )
        with anyio.move_on_after(wait):
            while self._h11.client_is_waiting_for_100_continue:
                event = self._next_event(request)
                if event is h11.NEED_DATA:
                    await self._receive(request, timeouts)
                elif isinstance(event, h11.Response):
                    return event
        return None

    async def _read_head(self, request: httpx.Request, timeouts: Timeouts) -> h11.Response:
        while True:
            event = self._next_event(request)
            if event is h11.NEED_DATA:
                await self._receive(request, timeouts)
            elif isinstance(event, h11.Response):
                return event
            elif isinstance(event, h11.ConnectionClosed):
                raise httpx.RemoteProtocolError(
                    "Server disconnected without sending a response.", request=request
                )
            # InformationalResponse (1xx other than 101): skip, keep reading.

    async def _read_head_or_none(
        self, request: httpx.Request, timeouts: Timeouts
    ) -> h11.Response | None:
        try:
            return await self._read_head(request, timeouts)
        except httpx.TransportError:
            return None

    def _next_event(self, request: httpx.Request) -> Any:
        try:
            event = self._h11.next_event()
        except h11.RemoteProtocolError as exc:
            raise_mapped(exc, "read", request)
        if event is h11.PAUSED:  # 101 Switching Protocols or CONNECT: not an HTTP exchange
            raise httpx.RemoteProtocolError(
                "protocol switch (101/CONNECT) is not supported by BulkheadTransport",
                request=request,
            )
        return event

    async def _send(self, event: Any, request: httpx.Request, timeouts: Timeouts) -> None:
        try:
            data = self._h11.send(event)
        except h11.LocalProtocolError as exc:
            raise_mapped(exc, "write", request)
        if not data:
            return
        await self._io(self._stream.send(data), "write", timeouts.write, request, timeouts)
        self.wrote_any = True

    async def _receive(self, request: httpx.Request, timeouts: Timeouts) -> None:
        try:
            data = await self._io(
                self._stream.receive(READ_SIZE), "read", timeouts.read, request, timeouts
            )
        except httpx.ReadError as exc:
            if not isinstance(exc.__cause__, anyio.EndOfStream):
                raise
            data = b""  # EOF: h11 decides whether that ends the message or breaks it
        if data:
            self.received_any = True
        elif not self.received_any and self._h11.their_state is h11.SEND_RESPONSE:
            # EOF before a single response byte: the server closed the connection (often
            # an idle keep-alive close racing our request).  Safe to retry, if anything is.
            raise httpx.RemoteProtocolError(
                "Server disconnected without sending a response.", request=request
            )
        self._h11.receive_data(data)

    async def _io(
        self,
        awaitable: Any,
        phase: Phase,
        op_timeout: float | None,
        request: httpx.Request,
        timeouts: Timeouts,
    ) -> Any:
        limit, by_deadline = timeouts.budget(op_timeout)
        try:
            if limit is None:
                return await awaitable
            with anyio.fail_after(limit):
                return await awaitable
        except TimeoutError as exc:
            if by_deadline:
                raise RequestTimeout("request_timeout passed", request=request) from exc
            raise_mapped(exc, phase, request)
        except Exception as exc:
            raise_mapped(exc, phase, request)


def _keep_alive_timeout(headers: Iterable[tuple[bytes, bytes]]) -> float | None:
    """The ``timeout=`` parameter of a ``Keep-Alive`` response header, in seconds."""
    for name, value in headers:
        if name == b"keep-alive":
            for part in value.split(b","):
                key, _, number = part.strip().partition(b"=")
                if key.strip().lower() == b"timeout":
                    try:
                        seconds = float(number.strip())
                    except ValueError:
                        return None
                    return seconds if seconds >= 0 else None
    return None
