"""Byte streams with per-operation timeouts: what the HTTP/1.1 and HTTP/2 code reads and
writes through.

Two implementations of one small interface (``NetStream``):

* ``AsyncioStream``, used under asyncio: an ``asyncio.Protocol`` that buffers what arrives
  and lets one reader wait on a future armed with a loop timer.  A read that finds data
  buffered does not wait at all, and takes all of it (up to its size) in one piece; a
  write goes straight to the transport and waits only when the transport asks for
  back-pressure.  No cancel scope, no extra task: this is the
  per-request hot path, and it costs a fraction of a generic stream.
* ``AnyioStream``, used under any other backend (trio): an anyio byte stream, with timeouts
  from ``anyio.fail_after``.

Both signal a timeout with ``TimeoutError``, end of stream with ``b""``, and failures with
``OSError``; ``_exceptions.raise_mapped`` turns those into httpx exceptions.  Cancelling a
``receive`` never loses data: bytes stay buffered for the next call.

TLS runs in both through our own ``TLSEngine`` (``_tls.py``), fed with the socket's bytes,
so ``is_readable`` can count every byte the peer sent that nobody read yet, wherever it
waits: in the socket, in our buffer, or in the TLS layer (which reads ahead of its
caller).  That is what keeps an idle connection holding unsolicited bytes out of reuse.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import ssl
from collections import deque
from typing import Any, Protocol, cast

import anyio
import anyio.abc

from ._tls import TLSEngine

__all__ = [
    "AnyioStream",
    "AsyncioStream",
    "NetStream",
    "NetworkStream",
    "StreamProtocol",
    "close_stranded",
    "socket_readable",
]


def socket_readable(sock: socket.socket) -> bool:
    """Whether a read on ``sock`` would not block now: bytes, EOF, an error, or closed."""
    if sock.fileno() < 0:
        return True
    poller = select.poll()  # not select(): it fails on descriptors >= 1024
    poller.register(sock, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))


#: Buffered bytes above which we stop reading from the socket (back-pressure to the peer).
_HIGH_WATER = 256 * 1024
#: Largest piece asked of the TLS engine at once (a record holds at most 16 KiB).
_TLS_READ = 65536


class NetStream(Protocol):
    """A connected byte stream."""

    async def receive(self, max_bytes: int, timeout: float | None) -> bytes:
        """Up to ``max_bytes`` bytes; ``b""`` at end of stream.  ``timeout`` in seconds
        (``None``: wait forever).  Raises ``TimeoutError`` or ``OSError``."""
        ...

    async def send(self, data: bytes, timeout: float | None) -> None:
        """Write all of ``data``.  Raises ``TimeoutError`` or ``OSError``."""
        ...

    def is_readable(self) -> bool:
        """Whether a ``receive`` would return at once (data, end of stream or an error), or
        the peer has sent bytes that are not yet readable (part of a TLS record)."""
        ...

    @property
    def alpn(self) -> str | None:
        """The protocol chosen by TLS ALPN, if any."""
        ...

    async def aclose(self) -> None:
        """Close at once (no graceful TLS shutdown); never raises."""
        ...

    def abort(self) -> None:
        """Start closing without waiting, where the backend allows it (from ``__del__``
        of a response nobody closed); ``aclose`` must still follow."""
        ...


class StreamProtocol(asyncio.Protocol):
    """The asyncio side of ``AsyncioStream``: buffers data (decrypted first, once ``tls``
    is set), tracks EOF and flow control."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.eof = False
        self.error: BaseException | None = None
        self.lost = False
        self.reading_paused = False
        self.writing_paused = False
        self.tls: TLSEngine | None = None  # set when the TLS handshake starts
        self.read_waiter: asyncio.Future[None] | None = None
        self.write_waiter: asyncio.Future[None] | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, whatever its class: uvloop's do not derive from asyncio's.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        tls = self.tls
        if tls is not None:
            tls.feed(data)
            self._decrypt(tls)
            return
        # ``_buffer``, inlined: this is the per-read hot path of plain TCP.
        self.chunks.append(data)
        self.buffered += len(data)
        if self.buffered > _HIGH_WATER and not self.reading_paused and self.transport:
            self.reading_paused = True
            self.transport.pause_reading()
        _wake(self.read_waiter)

    def _buffer(self, data: bytes) -> None:
        self.chunks.append(data)
        self.buffered += len(data)
        if self.buffered > _HIGH_WATER and not self.reading_paused and self.transport:
            self.reading_paused = True
            self.transport.pause_reading()

    def _decrypt(self, tls: TLSEngine) -> None:
        """Advance the handshake, or buffer all the plaintext the engine can give now.
        Wakes the reader only for news: plaintext, end of stream, an error, or the end of
        the handshake (not for records that carry none, such as TLS 1.3 session tickets)."""
        was_done = tls.handshake_done
        try:
            if was_done or tls.handshake():
                while data := tls.read_available(_TLS_READ):
                    self._buffer(data)
        except OSError as exc:  # ssl.SSLError: the handshake or a record failed
            self.error = exc
        if tls.eof:
            self.eof = True
        outgoing = tls.outgoing()  # handshake messages, alerts, key updates
        if outgoing and self.transport is not None and not self.transport.is_closing():
            self.transport.write(outgoing)
        if self.chunks or self.eof or self.error is not None or tls.handshake_done != was_done:
            _wake(self.read_waiter)

    def eof_received(self) -> bool:
        tls = self.tls
        if tls is not None:
            tls.feed_eof()
            self._decrypt(tls)
        self.eof = True
        _wake(self.read_waiter)
        # Keep the transport open: a request written after the peer's FIN must fail on the
        # read side ("Server disconnected"), as on every other backend, not as a write error.
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if exc is not None:
            self.error = exc
        _wake(self.read_waiter)
        _wake(self.write_waiter)
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        _wake(self.write_waiter)


def _gather(first: bytes, chunks: deque[bytes], max_bytes: int) -> bytes:
    """``first`` and the chunks after it that fit in ``max_bytes``, joined: what arrived
    while the reader was busy goes out in one ``receive`` (an HTTP/2 connection at high
    concurrency finds a few dozen small reads waiting; parsing them at once saves a read
    cycle each)."""
    parts = [first]
    size = len(first)
    while chunks and size + len(chunks[0]) <= max_bytes:
        part = chunks.popleft()
        parts.append(part)
        size += len(part)
    return b"".join(parts)


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class AsyncioStream:
    """``NetStream`` over an asyncio transport (see the module docstring)."""

    __slots__ = ("_loop", "_proto", "_sock", "_tls", "_transport")

    def __init__(self, transport: asyncio.Transport, protocol: StreamProtocol) -> None:
        self._loop = asyncio.get_running_loop()
        self._transport = transport
        self._proto = protocol
        self._sock: socket.socket | None = transport.get_extra_info("socket")
        self._tls: TLSEngine | None = None

    async def start_tls(self, tls: TLSEngine) -> None:
        """Run the TLS handshake; from then on the stream carries plaintext.  No timeout
        of its own (the caller's scope bounds it).  Raises ``ssl.SSLError``, ``OSError``."""
        proto = self._proto
        proto.tls = self._tls = tls
        tls.handshake()  # the ClientHello
        self._transport.write(tls.outgoing())
        while not tls.handshake_done:
            if proto.error is not None:
                raise proto.error
            if proto.eof or proto.lost:
                raise ConnectionResetError("the server closed the connection in the TLS handshake")
            await self._wait(None)

    async def _wait(self, timeout: float | None, *, write: bool = False) -> None:
        waiter = self._loop.create_future()
        if write:
            self._proto.write_waiter = waiter
        else:
            self._proto.read_waiter = waiter
        timer = None if timeout is None else self._loop.call_later(timeout, _expire, waiter)
        try:
            await waiter
        finally:
            if write:
                self._proto.write_waiter = None
            else:
                self._proto.read_waiter = None
            if timer is not None:
                timer.cancel()

    async def receive(self, max_bytes: int, timeout: float | None) -> bytes:
        proto = self._proto
        if not proto.chunks:
            if proto.lost or proto.eof:
                return self._end()
            await self._wait(timeout)
            if not proto.chunks:
                return self._end()
        chunks = proto.chunks
        chunk = chunks.popleft()
        if chunks and len(chunk) + len(chunks[0]) <= max_bytes:
            chunk = _gather(chunk, chunks, max_bytes)
        elif len(chunk) > max_bytes:
            chunk, rest = chunk[:max_bytes], chunk[max_bytes:]
            chunks.appendleft(rest)
        proto.buffered -= len(chunk)
        if proto.reading_paused and proto.buffered <= _HIGH_WATER // 4:
            proto.reading_paused = False
            self._transport.resume_reading()
        return chunk

    def _end(self) -> bytes:
        proto = self._proto
        if proto.error is not None:
            raise OSError(str(proto.error) or type(proto.error).__name__) from proto.error
        if proto.lost and not proto.eof:
            raise ConnectionAbortedError("the connection was closed")
        return b""

    async def send(self, data: bytes, timeout: float | None) -> None:
        proto = self._proto
        if proto.lost or self._transport.is_closing():
            if proto.eof:  # the peer closed first: let the read report it
                return
            raise ConnectionResetError("the connection is closed")
        tls = self._tls
        if tls is not None:
            tls.write(data)
            data = tls.outgoing()
        self._transport.write(data)
        while proto.writing_paused and not proto.lost:
            await self._wait(timeout, write=True)
        if proto.lost and proto.error is not None:
            raise OSError(str(proto.error)) from proto.error

    def write_nowait(self, data: bytes) -> bool:
        """Write all of ``data`` now, if that needs no wait: connected and not held back
        by the transport's back-pressure (which the next ``send`` then waits out).  False:
        nothing was written, ``send`` must (it waits, or raises what went wrong).  The
        HTTP/2 connection's write fast path: no cancel scope, lock or await."""
        proto = self._proto
        if proto.lost or proto.writing_paused or self._transport.is_closing():
            return False
        tls = self._tls
        if tls is not None:
            tls.write(data)
            data = tls.outgoing()
        self._transport.write(data)
        return True

    def is_readable(self) -> bool:
        proto = self._proto
        if proto.chunks or proto.eof or proto.lost:
            return True
        tls = self._tls
        return tls is not None and tls.holds_input()

    @property
    def alpn(self) -> str | None:
        tls = self._tls
        return None if tls is None else tls.alpn

    @property
    def ssl_object(self) -> ssl.SSLObject | None:
        tls = self._tls
        return None if tls is None else tls.ssl_object

    @property
    def socket(self) -> socket.socket | None:
        return self._sock

    def abort(self) -> None:
        if self._loop.is_closed():  # (the transport moved to a new loop: see below)
            if not self._proto.lost:
                _close_on_closed_loop(self._transport)
        else:
            self._transport.abort()

    async def aclose(self) -> None:
        # abort() closes the socket from a callback it schedules at once; one turn of the
        # loop runs it.  (Waiting for connection_lost instead could hang: during a TLS
        # handshake asyncio never calls it.)
        self.abort()
        with contextlib.suppress(BaseException):
            await asyncio.sleep(0)


def close_stranded(transport: asyncio.WriteTransport, loop: asyncio.AbstractEventLoop) -> None:
    """Close ``transport``, made on ``loop``, from another loop (the transport moved): now
    if ``loop`` is closed (``_close_on_closed_loop``), else by ``abort()``, which ``loop``
    finishes when it runs again.  Never raises."""
    if loop.is_closed():
        with contextlib.suppress(AttributeError):  # (its connection was lost already)
            _close_on_closed_loop(transport)
    else:
        with contextlib.suppress(RuntimeError):
            transport.abort()


def _close_on_closed_loop(transport: asyncio.WriteTransport) -> None:
    """Close the socket of a transport whose event loop is closed, now: a transport reused
    on a new loop discards the old loop's connections, and ``abort()`` would leave the
    socket to a callback the closed loop never runs (then a ``ResourceWarning`` and the
    descriptor held until the collector finds it).

    asyncio's own transports: ``abort()`` takes the socket off the loop and fails only in
    scheduling the last step, ``_call_connection_lost``, which we run ourselves (a private
    method, the one we use: a closed loop runs nothing, so it cannot run twice;
    ``tests/integration/test_loop_change.py`` holds it on every Python we test).  Another
    loop's transports (uvloop) get ``abort()`` only."""
    with contextlib.suppress(RuntimeError):  # "Event loop is closed"
        transport.abort()
    finish = getattr(transport, "_call_connection_lost", None)
    if finish is not None:  # (the caller checked it has not run: the protocol is not lost)
        # A task of the closed loop still waiting on this stream cannot be woken: waking it
        # raises "Event loop is closed" after the socket is closed (in a ``finally``).
        with contextlib.suppress(RuntimeError):
            finish(None)


class AnyioStream:
    """``NetStream`` over an anyio byte stream (any backend; used under trio)."""

    __slots__ = ("_sock", "_stream", "_tls")

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self._stream = stream
        self._sock: socket.socket | None = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
        self._tls: TLSEngine | None = None

    async def start_tls(self, tls: TLSEngine) -> None:
        """Run the TLS handshake; from then on the stream carries plaintext.  No timeout
        of its own (the caller's scope bounds it).  Raises ``ssl.SSLError``, anyio errors."""
        self._tls = tls
        while not tls.handshake():
            await self._flush(tls)
            if not await self._feed(tls):
                tls.feed_eof()  # the next handshake step raises
        await self._flush(tls)

    async def receive(self, max_bytes: int, timeout: float | None) -> bytes:
        try:
            with anyio.fail_after(timeout):
                if self._tls is None:
                    return await self._stream.receive(max_bytes)
                return await self._receive_tls(self._tls, max_bytes)
        except anyio.EndOfStream:
            return b""
        except anyio.BrokenResourceError as exc:
            raise OSError(str(exc.__cause__ or "connection broken")) from exc
        except anyio.ClosedResourceError as exc:
            raise ConnectionAbortedError("the connection was closed") from exc

    async def _receive_tls(self, tls: TLSEngine, max_bytes: int) -> bytes:
        while True:
            data = tls.read_available(max_bytes)
            outgoing = tls.outgoing()  # a key update or alert the read produced
            if outgoing:
                await self._stream.send(outgoing)
            if data is not None:
                return data
            if not await self._feed(tls):
                tls.feed_eof()
                return tls.read(max_bytes) or b""

    async def _feed(self, tls: TLSEngine) -> bool:
        """Give the engine what the socket has next; false at end of stream.  Cancelling
        loses nothing: the bytes go to the engine as soon as they are read."""
        try:
            tls.feed(await self._stream.receive())
        except anyio.EndOfStream:
            return False
        return True

    async def _flush(self, tls: TLSEngine) -> None:
        outgoing = tls.outgoing()
        if outgoing:
            await self._stream.send(outgoing)

    async def send(self, data: bytes, timeout: float | None) -> None:
        tls = self._tls
        if tls is not None:
            tls.write(data)
            data = tls.outgoing()
        try:
            with anyio.fail_after(timeout):
                await self._stream.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise ConnectionResetError(str(exc.__cause__ or "connection broken")) from exc

    def is_readable(self) -> bool:
        tls = self._tls
        if tls is not None and tls.holds_input():
            return True
        sock = self._sock
        return sock is None or socket_readable(sock)

    @property
    def alpn(self) -> str | None:
        tls = self._tls
        return None if tls is None else tls.alpn

    @property
    def ssl_object(self) -> ssl.SSLObject | None:
        tls = self._tls
        return None if tls is None else tls.ssl_object

    @property
    def socket(self) -> socket.socket | None:
        return self._sock

    def abort(self) -> None:
        pass  # anyio streams close only with an await: ``aclose`` follows

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await anyio.aclose_forcefully(self._stream)


class NetworkStream:
    """What ``response.extensions["network_stream"]`` is: the connection that carried the
    response, for inspection only.

    ``get_extra_info(name)`` answers as httpcore's network streams do: ``"ssl_object"``
    (``ssl.SSLObject``, ``None`` on plain TCP), ``"client_addr"`` and ``"server_addr"``
    (``(host, port)``; a path or ``""`` on a Unix socket), ``"socket"`` (the
    ``socket.socket``; under trio too, where httpcore gives trio's socket wrapper) and
    ``"is_readable"``; anything else ``None``.  Use the socket to read its options or
    addresses, never to read, write or close it.  Through a proxy, ``ssl_object`` is the
    target's TLS session, and the socket and addresses are those of the connection to the
    proxy.

    The connection belongs to the pool and may carry other requests (HTTP/2 streams,
    later HTTP/1.1 exchanges), so ``read``, ``write``, ``start_tls`` and ``aclose`` are
    refused with ``RuntimeError``: with httpcore they serve protocol upgrades (101, CONNECT),
    which BulkheadTransport does not support.
    """

    __slots__ = ("_stream",)

    def __init__(self, stream: NetStream) -> None:
        self._stream = stream

    def get_extra_info(self, info: str) -> Any:
        stream = self._stream
        if info == "is_readable":
            return stream.is_readable()
        # Socket streams, and a TLS stream stacked inside an https proxy's (its
        # ``ssl_object`` is the target's session, its ``socket`` the one to the proxy);
        # testing.MockNetwork's has neither.
        if info == "ssl_object":
            return getattr(stream, "ssl_object", None)
        sock = getattr(stream, "socket", None)
        if info == "socket":
            return sock
        if sock is None or info not in ("client_addr", "server_addr"):
            return None
        try:
            address = sock.getsockname() if info == "client_addr" else sock.getpeername()
        except OSError:  # closed, or the peer is gone
            return None
        if isinstance(address, tuple):
            return address[:2]  # IPv6 (host, port, flowinfo, scope_id): as anyio, (host, port)
        return address

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        raise RuntimeError(_NOT_YOURS)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        raise RuntimeError(_NOT_YOURS)

    async def start_tls(self, *args: Any, **kwargs: Any) -> NetworkStream:
        raise RuntimeError(_NOT_YOURS)

    async def aclose(self) -> None:
        raise RuntimeError(_NOT_YOURS)


_NOT_YOURS = (
    "the network_stream of BulkheadTransport is for get_extra_info() only: the connection "
    "belongs to the pool (protocol upgrades, 101 and CONNECT, are not supported)"
)
