"""TLS inside another stream: the target's TLS carried through an ``https://`` proxy's.

An ``https://`` proxy is reached over TLS; a tunnel through it to an ``https://`` target
needs a second TLS session inside the first.  ``StackedTLSStream`` is a ``NetStream`` whose
bytes go through its own ``TLSEngine`` and then through the outer stream (which encrypts
them again for the proxy).  Socket-level streams keep their own, cheaper, TLS path
(``start_tls``); this one is used only when TLS is stacked.

Invariants: ``is_readable`` is true when either layer holds bytes from the peer nobody read
(the inner engine's buffers or anything the outer stream holds), so the stale-byte check
of an idle connection holds through the proxy too.  Cancelling a ``receive`` loses
nothing: bytes read from the outer stream are fed to the engine before the next await.
"""

from __future__ import annotations

import socket
import ssl

from ._streams import NetStream
from ._tls import TLSEngine

__all__ = ["StackedTLSStream"]

_READ = 65536


class StackedTLSStream:
    """A ``NetStream``: TLS over ``outer``, another ``NetStream``."""

    __slots__ = ("_outer", "_tls")

    def __init__(self, outer: NetStream, tls: TLSEngine) -> None:
        self._outer = outer
        self._tls = tls

    async def handshake(self, timeout: float | None) -> None:
        """Run the inner handshake.  Raises ``ssl.SSLError``, ``TimeoutError``,
        ``OSError``."""
        tls = self._tls
        while not tls.handshake():
            await self._flush(timeout)
            data = await self._outer.receive(_READ, timeout)
            if data:
                tls.feed(data)
            else:
                tls.feed_eof()  # the next handshake step raises
        await self._flush(timeout)

    async def receive(self, max_bytes: int, timeout: float | None) -> bytes:
        tls = self._tls
        while True:
            data = tls.read_available(max_bytes)
            await self._flush(timeout)  # a key update or alert the read produced
            if data is not None:
                return data
            chunk = await self._outer.receive(_READ, timeout)
            if not chunk:
                tls.feed_eof()
                return tls.read(max_bytes) or b""
            tls.feed(chunk)

    async def send(self, data: bytes, timeout: float | None) -> None:
        self._tls.write(data)
        await self._flush(timeout)

    async def _flush(self, timeout: float | None) -> None:
        outgoing = self._tls.outgoing()
        if outgoing:
            await self._outer.send(outgoing, timeout)

    def is_readable(self) -> bool:
        return self._tls.holds_input() or self._outer.is_readable()

    @property
    def alpn(self) -> str | None:
        return self._tls.alpn

    @property
    def ssl_object(self) -> ssl.SSLObject:
        """The target's TLS session (not the proxy's)."""
        return self._tls.ssl_object

    @property
    def socket(self) -> socket.socket | None:
        """The socket to the proxy."""
        return getattr(self._outer, "socket", None)

    def abort(self) -> None:
        self._outer.abort()

    async def aclose(self) -> None:
        await self._outer.aclose()
