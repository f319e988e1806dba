"""One HTTP/1.1 connection: a codec (h11 by default, see ``_codec.py``) over a byte stream.

A connection serves one exchange at a time.  Its state is *known* only between exchanges
(both sides finished and agreed to keep alive); if an exchange is cut anywhere
in the middle (timeout, cancellation, error, response closed before its body was read) the
caller must close the connection: a late response would otherwise be read by the next
borrower (RFC 9112 §9.3, §9.6).  ``reusable`` is true only after a complete exchange that
both sides agreed to keep alive.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Iterable
from typing import Any

import anyio
import httpx

from ._codec import (
    CLOSED,
    END,
    NEED_DATA,
    PAUSED,
    Codec,
    CodecError,
    Event,
    Head,
    LocalCodecError,
    make_codec,
)
from ._config import Origin
from ._exchange import (
    ResponseHead,
    Timeouts,
    Verdict,
    body_chunks,
    cut_verdict,
    io_failed,
    next_connection_id,
)
from ._proxy import forwarded_head
from ._streams import NetStream, NetworkStream
from ._trace import TraceFn, Tracer

__all__ = ["HTTP11Connection"]

READ_SIZE = 65536
#: In-memory request bodies up to this size are written together with the headers.
SMALL_BODY = 64 * 1024
#: Largest response head (status line and headers) accepted, in bytes.
MAX_HEAD_SIZE = 64 * 1024
#: How long to wait for ``100 Continue`` before sending the body anyway (RFC 9110 §10.1.1).
EXPECT_CONTINUE_WAIT = 1.0


class HTTP11Connection:
    """An HTTP/1.1 connection in a compartment's pool."""

    __slots__ = (
        "_codec",
        "_head_bytes",
        "_reusable",
        "_stream",
        "forward",
        "id",
        "keep_alive",
        "network_stream",
        "origin",
        "proxy",
        "received_any",
        "releasing",
        "reused",
        "settled",
        "tracer",
        "wrote_any",
    )

    def __init__(self, origin: Origin, stream: NetStream, parser: str = "h11") -> None:
        self.origin = origin
        self.id = next_connection_id()
        self.reused = False
        self._stream = stream
        self._codec: Codec = make_codec(parser, MAX_HEAD_SIZE)
        self.keep_alive: float | None = None  # the server's Keep-Alive: timeout=, seconds
        self.received_any = False  # a response byte arrived in the current exchange
        self._head_bytes = 0  # bytes read while waiting for the response head
        self._reusable = False  # the last exchange ended cleanly and both keep alive
        self.wrote_any = False  # a request byte was handed to the OS in the current exchange
        self.network_stream = NetworkStream(stream)  # the response extension
        self.tracer: Tracer | None = None  # the current exchange's, when it is traced
        self.settled = True  # the pool has had the current exchange's end (``Exchange``)
        self.releasing = False  # its answer was asked for (``Exchange``)
        #: The proxy this connection goes through (its credential-free URL), or ``None``.
        self.proxy: str | None = None
        #: Set when the connection is to an HTTP proxy that *forwards* each request (an
        #: ``http://`` target): the headers for the proxy (``Proxy-Authorization``...),
        #: sent with an absolute-form request target.  ``None``: a direct connection or a
        #: tunnel, where requests go out as they are.
        self.forward: tuple[tuple[bytes, bytes], ...] | None = None

    # -- the Connection protocol: one exchange at a time, the connection is the exchange ---
    def start_exchange(self, reused: bool) -> HTTP11Connection:
        self.reused = reused
        self.received_any = self.wrote_any = self._reusable = self.settled = False
        self.releasing = False
        self._head_bytes = 0
        return self

    async def check_reusable(self) -> Verdict | None:
        """An idle connection must be silent: readable means the peer closed it or sent
        bytes nobody asked for."""
        if self._codec.has_trailing_data or self._stream.is_readable():
            return Verdict.PEER_CLOSED
        return None

    def completed(self) -> tuple[bool, float | None]:
        return self._reusable, self.keep_alive

    def cut(self, exc: BaseException) -> Verdict | None:
        """HTTP/1.1 has no way to cancel one exchange: the connection goes."""
        return cut_verdict(exc, self)

    async def abandon(self, exc: BaseException) -> Verdict | None:
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
        self.tracer = tracer = None if trace is None else Tracer(trace, "http11")
        target = request.extensions.get("target", request.url.raw_path)
        method = request.method.encode("ascii")
        headers = request.headers.raw
        if self.forward is not None:
            target, headers = forwarded_head(
                request.url, request.extensions.get("target"), headers, self.forward
            )
        early: Head | None = None
        small = _small_body(request)
        if small is not None and tracer is None and not _expects_continue(headers):
            # The common case: headers and an in-memory body in one write.
            codec = self._codec
            try:
                data = codec.request(method, target, headers)
                if small:
                    data += codec.data(small)
                data += codec.end()
            except LocalCodecError as exc:
                raise httpx.LocalProtocolError(str(exc), request=request) from exc
            await self._write(data, request, timeouts)
            # Nothing was read in this exchange and the codec starts each one empty (a
            # connection is reused only with no byte after its last response): the head
            # cannot be there yet, so read before asking the codec (h11's ``next_event`` on
            # an empty buffer runs its whole reader for nothing).
            head = await self._read_head(request, timeouts, empty=True)
        else:
            early = await self._send_streaming(method, target, headers, request, timeouts, tracer)
            if tracer is not None:
                await tracer.started("receive_response_headers", {"request": request})
            head = early or await self._read_head(request, timeouts)
        self.keep_alive = _keep_alive_timeout(head.headers)
        version = _VERSIONS.get(head.http_version) or b"HTTP/" + head.http_version
        if tracer is not None:
            await tracer.complete(
                "receive_response_headers", (version, head.status, head.reason, head.headers)
            )
        return ResponseHead(head.status, head.headers, version, head.reason)

    async def receive_body(self, request: httpx.Request, timeouts: Timeouts) -> bytes | None:
        """The next chunk of the response body; ``None`` once the body is complete."""
        tracer = self.tracer
        if tracer is not None and tracer.current != "receive_response_body":
            await tracer.started("receive_response_body", {"request": request})
        while True:
            event = self._next_event(request)
            if event is NEED_DATA:
                await self._receive(request, timeouts)
            elif type(event) is bytes:
                return event
            elif event is END:
                self._reusable = self._codec.reuse()
                if tracer is not None:
                    await tracer.complete("receive_response_body")
                return None
            else:
                raise httpx.RemoteProtocolError(f"unexpected {event!r}", request=request)

    def finish_buffered(self) -> bool:
        """Consume what is left of the response body *without I/O*; true if that reached its
        end (so a response closed early, e.g. an unread empty body, keeps its connection)."""
        while True:
            try:
                event = self._codec.next_event()
            except CodecError:
                return False
            if type(event) is bytes:
                continue
            if event is END:
                self._reusable = self._codec.reuse()
                return True
            return False

    # -- internals ---------------------------------------------------------------------
    async def _send_streaming(
        self,
        method: bytes,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        request: httpx.Request,
        timeouts: Timeouts,
        tracer: Tracer | None,
    ) -> Head | None:
        """Headers, then the body as it streams (after ``100 Continue`` if asked for).
        Returns a response that arrived before the body was sent, if any."""
        codec = self._codec
        if tracer is not None:
            await tracer.started("send_request_headers", {"request": request})
        await self._write(
            self._encode(codec.request, method, target, headers, request=request), request, timeouts
        )
        if tracer is not None:
            await tracer.complete("send_request_headers")
        early: Head | None = None
        if codec.waiting_for_continue:
            early = await self._await_continue(request, timeouts)
        if early is None:
            if tracer is not None:
                await tracer.started("send_request_body", {"request": request})
            try:
                await self._send_body(request, timeouts)
            except httpx.WriteError:
                # The server may have answered and stopped reading (e.g. 413): prefer its
                # response to our write error, as a browser would.
                if not codec.awaiting_response:
                    raise
                early = await self._read_head_or_none(request, timeouts)
                if early is None:
                    raise
            if tracer is not None:
                await tracer.complete("send_request_body")
        return early

    def _encode(self, encode: Any, *args: Any, request: httpx.Request) -> bytes:
        try:
            data: bytes = encode(*args)
        except LocalCodecError as exc:
            raise httpx.LocalProtocolError(str(exc), request=request) from exc
        return data

    async def _write(self, data: bytes, request: httpx.Request, timeouts: Timeouts) -> None:
        if not data:
            return
        # ``run_io`` inlined (one coroutine fewer per write): the same budget and mapping.
        limit, by_deadline = timeouts.budget(timeouts.write)
        try:
            await self._stream.send(data, limit)
        except Exception as exc:
            io_failed(exc, by_deadline, "write", request, timeouts)
        self.wrote_any = True

    async def _send_body(self, request: httpx.Request, timeouts: Timeouts) -> None:
        stream = request.stream
        if not isinstance(stream, AsyncIterable):
            raise RuntimeError("BulkheadTransport needs an async request stream")
        codec = self._codec
        async with body_chunks(stream) as chunks:
            async for chunk in chunks:
                if chunk:
                    data = self._encode(codec.data, chunk, request=request)
                    await self._write(data, request, timeouts)
        await self._write(self._encode(codec.end, request=request), request, timeouts)

    async def _await_continue(self, request: httpx.Request, timeouts: Timeouts) -> Head | None:
        """Wait briefly for ``100 Continue``; a final response instead means: skip the body."""
        wait = (
            EXPECT_CONTINUE_WAIT
            if timeouts.read is None
            else min(timeouts.read, EXPECT_CONTINUE_WAIT)
        )
        with anyio.move_on_after(wait):
            while self._codec.waiting_for_continue:
                event = self._next_event(request)
                if event is NEED_DATA:
                    await self._receive(request, timeouts, head=True)
                elif type(event) is Head:
                    return event
        return None

    async def _read_head(
        self, request: httpx.Request, timeouts: Timeouts, *, empty: bool = False
    ) -> Head:
        """The response head (1xx skipped).  ``empty``: the codec holds no response byte
        yet, so the first step is a read."""
        if empty:
            await self._receive(request, timeouts, head=True)
        while True:
            event = self._next_event(request)
            if event is NEED_DATA:
                await self._receive(request, timeouts, head=True)
            elif type(event) is Head:
                return event
            elif event is CLOSED:
                raise httpx.RemoteProtocolError(
                    "Server disconnected without sending a response.", request=request
                )
            # Informational (1xx other than 101): skip, keep reading.

    async def _read_head_or_none(self, request: httpx.Request, timeouts: Timeouts) -> Head | None:
        try:
            return await self._read_head(request, timeouts)
        except httpx.TransportError:
            return None

    def _next_event(self, request: httpx.Request) -> Event:
        try:
            event = self._codec.next_event()
        except CodecError as exc:
            raise httpx.RemoteProtocolError(str(exc), request=request) from exc
        if event is PAUSED:  # 101 Switching Protocols or CONNECT: not an HTTP exchange
            raise httpx.RemoteProtocolError(
                "protocol switch (101/CONNECT) is not supported by BulkheadTransport",
                request=request,
            )
        return event

    async def _receive(
        self, request: httpx.Request, timeouts: Timeouts, *, head: bool = False
    ) -> None:
        size = READ_SIZE
        if head:
            # A codec may only limit an *incomplete* head; reading no more than one byte past
            # the limit makes every head longer than MAX_HEAD_SIZE incomplete when checked.
            size = max(1, min(READ_SIZE, MAX_HEAD_SIZE + 1 - self._head_bytes))
        # ``run_io`` inlined (one coroutine fewer per read): the same budget and mapping.
        limit, by_deadline = timeouts.budget(timeouts.read)
        try:
            data = await self._stream.receive(size, limit)
        except Exception as exc:
            io_failed(exc, by_deadline, "read", request, timeouts)
        if data:
            self.received_any = True
            if head:
                self._head_bytes += len(data)
        elif not self.received_any and self._codec.awaiting_response:
            # EOF before a single response byte: the server closed the connection (often an
            # idle keep-alive close racing our request).  Safe to retry, if anything is.
            raise httpx.RemoteProtocolError(
                "Server disconnected without sending a response.", request=request
            )
        try:
            self._codec.feed(data)
        except CodecError as exc:
            raise httpx.RemoteProtocolError(str(exc), request=request) from exc


def _expects_continue(headers: list[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:  # (a loop, lengths first: no generator, few lower())
        if len(name) == 6 and name.lower() == b"expect" and value.lower() == b"100-continue":
            return True
    return False


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
        if len(name) == 10 and name.lower() == b"keep-alive":  # (most names: length only)
            # A server sends the same value on every response: parsed once (a bounded cache).
            try:
                return _KEEP_ALIVE_PARSED[value]
            except KeyError:
                pass
            if len(value) > _KEEP_ALIVE_LONGEST:  # not kept: the cache stays small in bytes
                return _parse_keep_alive(value)
            if len(_KEEP_ALIVE_PARSED) >= _KEEP_ALIVE_CACHE:
                _KEEP_ALIVE_PARSED.clear()
            seconds = _KEEP_ALIVE_PARSED[value] = _parse_keep_alive(value)
            return seconds
    return None


def _parse_keep_alive(value: bytes) -> float | None:
    for part in value.split(b","):
        key, _, number = part.strip().partition(b"=")
        if key.strip().lower() == b"timeout":
            try:
                seconds = float(number.strip())
            except ValueError:
                return None
            return seconds if seconds >= 0 else None
    return None


#: ``Keep-Alive`` values already parsed (few distinct ones: one or two per server), bounded.
_KEEP_ALIVE_PARSED: dict[bytes, float | None] = {}
_KEEP_ALIVE_CACHE = 64
#: Longest value kept (a hostile server's 64 KiB values would otherwise pin 4 MiB).
_KEEP_ALIVE_LONGEST = 64
#: ``ResponseHead.http_version`` for the versions a codec reports, without a new bytes
#: object per response.
_VERSIONS = {b"1.1": b"HTTP/1.1", b"1.0": b"HTTP/1.0"}
