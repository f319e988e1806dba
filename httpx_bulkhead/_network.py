"""Opening and closing byte streams (TCP, TLS with ALPN, Unix sockets).

This is the only module that touches sockets and ``ssl``; its callers see anyio byte streams
and httpx exceptions (``ConnectError``, ``ConnectTimeout``).
"""

from __future__ import annotations

import contextlib
import select
import ssl
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeAlias

import anyio
import anyio.abc
import httpx
from anyio.streams.tls import TLSStream

from ._exceptions import raise_mapped

__all__ = ["Connector", "SocketOption", "TraceFn", "close_stream", "is_readable"]

SocketOption: TypeAlias = (
    tuple[int, int, int] | tuple[int, int, bytes | bytearray] | tuple[int, int, None, int]
)
TraceFn: TypeAlias = Callable[[str, dict[str, Any]], Awaitable[None]]


async def emit(trace: TraceFn | None, name: str, info: dict[str, Any]) -> None:
    """Call an httpx ``trace`` extension callback, if there is one."""
    if trace is not None:
        await trace(name, info)


@dataclass(frozen=True, slots=True)
class Connector:
    """How this transport opens connections: the settings shared by every compartment.

    Args:
        ssl_context: used for ``https``; its ALPN protocols are set by the transport.
        local_address: bind outgoing sockets to this address (``None``: any).
        uds: connect to this Unix socket path instead of the URL's host (``None``: TCP).
        socket_options: ``setsockopt`` arguments applied to each new socket.
        retries: extra connect attempts after a ``ConnectError``/``ConnectTimeout``,
            with exponential back-off (0 s, 0.5 s, 1 s, ...).
    """

    ssl_context: ssl.SSLContext
    local_address: str | None = None
    uds: str | None = None
    socket_options: tuple[SocketOption, ...] = ()
    retries: int = 0

    async def connect(
        self,
        request: httpx.Request,
        *,
        timeout: float | None,
        trace: TraceFn | None,
    ) -> anyio.abc.ByteStream:
        """Open a stream to the request's origin (TLS for https), retrying as configured.

        Raises:
            httpx.ConnectError, httpx.ConnectTimeout.
        """
        for attempt in range(self.retries + 1):
            try:
                return await self._connect_once(request, timeout=timeout, trace=trace)
            except (httpx.ConnectError, httpx.ConnectTimeout):
                if attempt >= self.retries:
                    raise
                await anyio.sleep(0.0 if attempt == 0 else 0.5 * 2 ** (attempt - 1))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _connect_once(
        self, request: httpx.Request, *, timeout: float | None, trace: TraceFn | None
    ) -> anyio.abc.ByteStream:
        url = request.url
        host = url.raw_host.decode("ascii")
        port = url.port or (443 if url.scheme == "https" else 80)
        stream: anyio.abc.ByteStream | None = None
        try:
            with anyio.fail_after(timeout):
                info: dict[str, Any] = {"host": host, "port": port}
                await emit(trace, "connection.connect_tcp.started", info)
                if self.uds is not None:
                    stream = await anyio.connect_unix(self.uds)
                else:
                    stream = await anyio.connect_tcp(host, port, local_host=self.local_address)
                    self._apply_socket_options(stream)
                await emit(trace, "connection.connect_tcp.complete", {"return_value": stream})
                if url.scheme == "https":
                    sni = request.extensions.get("sni_hostname") or host
                    await emit(trace, "connection.start_tls.started", {"server_hostname": sni})
                    stream = await TLSStream.wrap(
                        stream,
                        hostname=sni,
                        ssl_context=self.ssl_context,
                        standard_compatible=False,
                    )
                    await emit(trace, "connection.start_tls.complete", {"return_value": stream})
                return stream
        except BaseException as exc:
            if stream is not None:
                await close_stream(stream)
            if isinstance(exc, Exception):
                await emit(trace, "connection.connect_tcp.failed", {"exception": exc})
                raise_mapped(exc, "connect", request)
            raise

    def _apply_socket_options(self, stream: anyio.abc.ByteStream) -> None:
        if not self.socket_options:
            return
        sock = stream.extra(anyio.abc.SocketAttribute.raw_socket)
        for option in self.socket_options:
            sock.setsockopt(*option)


def is_readable(stream: anyio.abc.ByteStream) -> bool:
    """Whether an *idle* connection's socket has something to read.

    An idle HTTP/1.1 connection must be silent: readable means the peer closed it (EOF or
    reset) or sent bytes nobody asked for; either way it must not be reused.  One
    non-blocking ``select`` on the one connection about to be reused: no scan of the pool.
    """
    sock = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
    if sock is None or sock.fileno() < 0:
        return True
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


async def close_stream(stream: anyio.abc.AsyncResource) -> None:
    """Close at once, without waiting for a TLS close_notify exchange; never raises."""
    with contextlib.suppress(Exception):  # closing a broken stream may fail: nothing to do
        await anyio.aclose_forcefully(stream)


def set_alpn(context: ssl.SSLContext, protocols: Iterable[str]) -> None:
    """Advertise ``protocols`` by ALPN on ``context``."""
    context.set_alpn_protocols(list(protocols))
