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
from collections.abc import AsyncIterable, Iterable
from typing import Any

import anyio
import h11
import httpx

from ._exceptions import raise_mapped
from ._exchange import ResponseHead, Timeouts, discard_reason, run_io
from ._network import TraceFn, emit
from ._pool import Discard, Origin, PoolEntry
from ._streams import NetStream

__all__ = ["HTTP11Connection", "next_connection_id"]

READ_SIZE = 65536
#: In-memory request bodies up to this size are written together with the headers.
SMALL_BODY = 64 * 1024
#: Largest response head (status line and headers) accepted, in bytes.
MAX_HEAD_SIZE = 64 * 1024
#: How long to wait for ``100 Continue`` before sending the body anyway (RFC 9110 §10.1.1).
EXPECT_CONTINUE_WAIT = 1.0

_ids = itertools.count(1)


def next_connection_id() -> int:
    """A process-wide number for a new connection (shown in logs and ExchangeInfo)."""
    return next(_ids)


class HTTP11Connection(PoolEntry):
    """An HTTP/1.1 connection in a compartment's pool."""

    __slots__ = (
        "_eof",
        "_h11",
        "_head_bytes",
        "_stream",
        "id",
        "keep_alive",
        "received_any",
        "reused",
        "wrote_any",
    )

    def __init__(self, origin: Origin, stream: NetStream) -> None:
        super().__init__(origin)
        self.id = next_connection_id()
        self.reused = False
        self._stream = stream
        self._h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_SIZE)
        self.keep_alive: float | None = None  # the server's Keep-Alive: timeout=, seconds
        self.received_any = False  # a response byte arrived in the current exchange
        self._head_bytes = 0  # bytes read while waiting for the response head
        self._eof = False  # the peer closed its side
        self.wrote_any = False  # a request byte was handed to the OS in the current exchange

    # -- the Connection protocol: one exchange at a time, the connection is the exchange ---
    def start_exchange(self) -> HTTP11Connection:
        self.reused = self.served > 1
        self.received_any = self.wrote_any = False
        self._head_bytes = 0
        return self

    async def check_reusable(self) -> Discard | None:
        """An idle connection must be silent: readable means the peer closed it or sent
        bytes nobody asked for."""
        if self._h11.trailing_data[0] or self._stream.is_readable():
            return Discard.PEER_CLOSED
        return None

    def completed(self) -> tuple[bool, float | None]:
        idle = self._h11.our_state is h11.IDLE and self._h11.their_state is h11.IDLE
        return idle and not self._eof, self.keep_alive

    def cut(self, exc: BaseException) -> Discard | None:
        """HTTP/1.1 has no way to cancel one exchange: the connection goes."""
        return discard_reason(exc, self)

    async def abandon(self, exc: BaseException) -> Discard | None:
        return self.cut(exc)

    async def aclose(self) -> None:
        await self._stream.aclose()

    def abort(self) -> None:
        self._stream.abort()

    # -- the exchange ------------------------------------------------------------------
    async def send_request(
        self, request: httpx.Request, timeouts: Timeouts, trace: TraceFn | None
    ) -> ResponseHead:
        """Write the request (streaming its body) and read the response head.

        Raises:
            httpx.WriteError, WriteTimeout, ReadError, ReadTimeout, RemoteProtocolError,
            LocalProtocolError, RequestTimeout.
        """
        target = request.extensions.get("target", request.url.raw_path)
        event = h11.Request(method=request.method, target=target, headers=request.headers.raw)
        early: h11.Response | None = None
        small = _small_body(request)
        if small is not None and trace is None and not self._expects_continue(event):
            # The common case: headers and an in-memory body in one write.
            events: list[Any] = [event, h11.Data(data=small), h11.EndOfMessage()]
            await self._send_all(events if small else [event, events[2]], request, timeouts)
        else:
            early = await self._send_streaming(event, request, timeouts, trace)
        if trace is not None:
            await emit(trace, "http11.receive_response_headers.started", {"request": request})
        response = early or await self._read_head(request, timeouts)
        self.keep_alive = _keep_alive_timeout(response.headers)
        if trace is not None:
            await emit(
                trace,
                "http11.receive_response_headers.complete",
                {"return_value": (b"HTTP/1.1", response.status_code, response.reason, [])},
            )
        return ResponseHead(
            response.status_code,
            response.headers.raw_items(),
            b"HTTP/" + response.http_version,
            response.reason,
        )

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
    def _expects_continue(self, event: h11.Request) -> bool:
        return any(
            name == b"expect" and value.lower() == b"100-continue" for name, value in event.headers
        )

    async def _send_streaming(
        self,
        event: h11.Request,
        request: httpx.Request,
        timeouts: Timeouts,
        trace: TraceFn | None,
    ) -> h11.Response | None:
        """Headers, then the body as it streams (after ``100 Continue`` if asked for).
        Returns a response that arrived before the body was sent, if any."""
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
        return early

    async def _send_all(
        self, events: list[Any], request: httpx.Request, timeouts: Timeouts
    ) -> None:
        try:
            data = b"".join([self._h11.send(e) or b"" for e in events])
        except h11.LocalProtocolError as exc:
            raise_mapped(exc, "write", request)
        await run_io(self._stream.send, data, "write", timeouts.write, request, timeouts)
        self.wrote_any = True

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
                    await self._receive(request, timeouts, head=True)
                elif isinstance(event, h11.Response):
                    return event
        return None

    async def _read_head(self, request: httpx.Request, timeouts: Timeouts) -> h11.Response:
        while True:
            event = self._next_event(request)
            if event is h11.NEED_DATA:
                await self._receive(request, timeouts, head=True)
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
        await run_io(self._stream.send, data, "write", timeouts.write, request, timeouts)
        self.wrote_any = True

    async def _receive(
        self, request: httpx.Request, timeouts: Timeouts, *, head: bool = False
    ) -> None:
        size = READ_SIZE
        if head:
            # h11 only limits an *incomplete* head; reading no more than one byte past the
            # limit makes every head longer than MAX_HEAD_SIZE incomplete when it is checked.
            size = max(1, min(READ_SIZE, MAX_HEAD_SIZE + 1 - self._head_bytes))
        data = await run_io(self._stream.receive, size, "read", timeouts.read, request, timeouts)
        if not data:
            self._eof = True  # h11 decides whether that ends the message or breaks it
        if data:
            self.received_any = True
            if head:
                self._head_bytes += len(data)
        elif not self.received_any and self._h11.their_state is h11.SEND_RESPONSE:
            # EOF before a single response byte: the server closed the connection (often
            # an idle keep-alive close racing our request).  Safe to retry, if anything is.
            raise httpx.RemoteProtocolError(
                "Server disconnected without sending a response.", request=request
            )
        self._h11.receive_data(data)


def _small_body(request: httpx.Request) -> bytes | None:
    """The request body, if it is in memory and small enough to go out with the headers."""
    stream = request.stream
    if not isinstance(stream, httpx.ByteStream):
        return None
    body = b"".join(stream)
    return body if len(body) <= SMALL_BODY else None


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
