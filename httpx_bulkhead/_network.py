"""Opening and closing byte streams (TCP, TLS with ALPN, Unix sockets).

This is the only module that touches sockets and ``ssl``; its callers see anyio byte streams
and httpx exceptions (``ConnectError``, ``ConnectTimeout``).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

import anyio
import anyio.abc
import httpx

from ._config import DEFAULT_PORTS
from ._exceptions import raise_mapped
from ._proxied import connect_via
from ._proxy_config import ProxyRoutes, ProxySpec
from ._streams import AnyioStream, AsyncioStream, NetStream, NetworkStream, StreamProtocol
from ._tls import TLSEngine
from ._trace import TraceFn, emit

__all__ = ["Connector", "Network", "SocketOption", "set_alpn"]

SocketOption: TypeAlias = (
    tuple[int, int, int] | tuple[int, int, bytes | bytearray] | tuple[int, int, None, int]
)

_TCP_FAMILIES = (socket.AF_INET, socket.AF_INET6)
_NO_PROXIES = ProxyRoutes.none()


class Network(Protocol):
    """Opens connections: ``Connector`` (sockets), or ``testing.MockNetwork`` in tests.

    A network that routes through proxies also has ``proxy_for(url) -> ProxySpec | None``
    (``Connector`` does): the compartment reads it to mark each new connection with its
    proxy (forwarding, statistics).  Without it, connections are direct.
    """

    async def connect(
        self, request: httpx.Request, *, timeout: float | None, trace: TraceFn | None
    ) -> NetStream: ...


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
        proxies: which proxy each origin goes through (``_proxy_config``); empty: none.
        proxy_ssl_context: for ``https://`` proxies given without an ``ssl_context``.
    """

    ssl_context: ssl.SSLContext
    local_address: str | None = None
    uds: str | None = None
    socket_options: tuple[SocketOption, ...] = ()
    retries: int = 0
    proxies: ProxyRoutes = _NO_PROXIES
    proxy_ssl_context: ssl.SSLContext | None = None

    def proxy_for(self, url: httpx.URL) -> ProxySpec | None:
        """The proxy requests to ``url``'s origin go through; ``None``: direct."""
        return self.proxies.choose(url)

    async def open_tcp(self, host: str, port: int) -> AsyncioStream | AnyioStream:
        """A TCP stream to ``host:port`` (socket options applied).  Raises ``OSError``."""
        if _on_asyncio():
            return await self._open_asyncio(host, port)
        return await self._open_anyio(host, port)

    async def connect(
        self,
        request: httpx.Request,
        *,
        timeout: float | None,
        trace: TraceFn | None,
    ) -> NetStream:
        """Open a stream to the request's origin (TLS for https), retrying as configured.

        Trace events (httpcore's): ``connection.connect_tcp`` (``connect_unix_socket``
        with ``uds``), ``connection.start_tls`` for https, ``connection.retry`` around
        the pause before another attempt.

        Raises:
            httpx.ConnectError, httpx.ConnectTimeout.
        """
        for attempt in range(self.retries + 1):
            try:
                return await self._connect_once(request, timeout=timeout, trace=trace)
            except (httpx.ConnectError, httpx.ConnectTimeout):
                if attempt >= self.retries:
                    raise
                delay = 0.0 if attempt == 0 else 0.5 * 2 ** (attempt - 1)
                await emit(trace, "connection.retry.started", {"delay": delay})
                await anyio.sleep(delay)
                await emit(trace, "connection.retry.complete", {"return_value": None})
        raise AssertionError("unreachable")  # pragma: no cover

    async def _connect_once(
        self, request: httpx.Request, *, timeout: float | None, trace: TraceFn | None
    ) -> NetStream:
        url = request.url
        if self.proxies:
            spec = self.proxies.choose(url)
            if spec is not None:
                return await connect_via(self, spec, request, timeout=timeout, trace=trace)
        host = url.raw_host.decode("ascii")
        port = url.port or DEFAULT_PORTS[url.scheme]
        sni = request.extensions.get("sni_hostname") or host
        asyncio_loop = _on_asyncio()
        stream: NetStream | None = None
        step = "connect_tcp" if self.uds is None else "connect_unix_socket"
        try:
            with anyio.fail_after(timeout):
                if trace is not None:
                    await trace(
                        f"connection.{step}.started", self._connect_info(host, port, timeout)
                    )
                if asyncio_loop:
                    stream = await self._open_asyncio(host, port)
                else:
                    stream = await self._open_anyio(host, port)
                if trace is not None:
                    await trace(
                        f"connection.{step}.complete", {"return_value": NetworkStream(stream)}
                    )
                if url.scheme == "https":
                    step = "start_tls"
                    if trace is not None:
                        info = {
                            "ssl_context": self.ssl_context,
                            "server_hostname": sni,
                            "timeout": timeout,
                        }
                        await trace("connection.start_tls.started", info)
                    assert isinstance(stream, AsyncioStream | AnyioStream)
                    await stream.start_tls(TLSEngine(self.ssl_context, sni))
                    if trace is not None:
                        await trace(
                            "connection.start_tls.complete", {"return_value": NetworkStream(stream)}
                        )
                return stream
        except BaseException as exc:
            if stream is not None:
                await stream.aclose()
            if not isinstance(exc, Exception):
                raise
            try:
                raise_mapped(exc, "connect", request)
            except httpx.TransportError as mapped:
                await emit(trace, f"connection.{step}.failed", {"exception": mapped})
                raise

    def _connect_info(self, host: str, port: int, timeout: float | None) -> dict[str, Any]:
        options = list(self.socket_options)
        if self.uds is not None:
            return {"path": self.uds, "timeout": timeout, "socket_options": options}
        return {
            "host": host,
            "port": port,
            "local_address": self.local_address,
            "timeout": timeout,
            "socket_options": options,
        }

    async def _open_asyncio(self, host: str, port: int) -> AsyncioStream:
        loop = asyncio.get_running_loop()
        transport: asyncio.BaseTransport
        if self.uds is not None:
            transport, protocol = await loop.create_unix_connection(StreamProtocol, self.uds)
        else:
            local = None if self.local_address is None else (self.local_address, 0)
            # No happy_eyeballs_delay: asyncio's staggered race (3.11) can drop an already
            # connected socket, unclosed, when the caller is cancelled at that moment.
            transport, protocol = await loop.create_connection(
                StreamProtocol, host, port, local_addr=local
            )
        # (no ``isinstance(transport, asyncio.Transport)``: uvloop's transports are not)
        stream = AsyncioStream(transport, protocol)
        try:
            self._apply_socket_options(stream.socket)
        except BaseException:
            transport.abort()  # the socket is closed on the next turn of the loop
            raise
        return stream

    async def _open_anyio(self, host: str, port: int) -> AnyioStream:
        if self.uds is not None:
            raw: anyio.abc.ByteStream = await anyio.connect_unix(self.uds)
        else:
            raw = await anyio.connect_tcp(host, port, local_host=self.local_address)
        stream = AnyioStream(raw)
        try:
            self._apply_socket_options(stream.socket)
        except BaseException:
            await stream.aclose()
            raise
        return stream

    def _apply_socket_options(self, sock: socket.socket | None) -> None:
        """TCP_NODELAY (TCP only: a Unix socket refuses it), then the user's options.
        Raises ``OSError``; the caller closes the socket."""
        if sock is None:
            return
        if sock.family in _TCP_FAMILIES:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for option in self.socket_options:
            sock.setsockopt(*option)


def _on_asyncio() -> bool:
    """Whether we run on an asyncio event loop (then the fast asyncio stream is used)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def set_alpn(context: ssl.SSLContext, protocols: Iterable[str]) -> None:
    """Advertise ``protocols`` by ALPN on ``context``."""
    context.set_alpn_protocols(list(protocols))
