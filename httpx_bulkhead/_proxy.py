"""Opening a tunnel through a proxy: HTTP ``CONNECT`` and SOCKS5, sans I/O.

Theory of operation
-------------------
A handshake is a small state machine that knows what to say to the proxy and how to read
its answers; it does no I/O, reads no clock and never awaits, so both shells share it.
The connector drives it with ``_proxied.run_handshake`` (async, and its generated sync
twin): send what ``outgoing()`` returns, feed what the proxy sends to ``receive()``, until
``receive`` says the tunnel is open.  Then ``leftover`` holds the bytes
the proxy sent after its answer: they already belong to the tunnel (the start of the
target's TLS handshake, say) and must reach whoever reads the tunnel next.

Invariants:

1. Any split of the proxy's bytes gives the same outcome: one byte per ``receive`` call
   (a trickling proxy) reads as the whole answer in one.
2. What a proxy can make us buffer is bounded: a ``CONNECT`` answer still incomplete past
   ``MAX_CONNECT_HEAD`` bytes is refused, and a SOCKS5 reply is at most 262 bytes (beyond
   that, one read's worth: ``run_handshake`` reads ``HANDSHAKE_READ`` bytes at most).  Past the
   bound, on bytes that cannot be an answer, or at end of stream before the answer is
   whole, ``receive`` raises ``httpx.ProxyError`` saying which proxy and what it did.
   No h11 error ever escapes.
3. A refusal (``CONNECT`` answered with a status outside 2xx, a SOCKS5 reply other than
   "succeeded", an authentication failure) raises ``httpx.ProxyError`` with the status and
   reason, or the reply's name.  The caller closes the stream: a failed tunnel is never
   pooled.
4. Messages name the proxy by its credential-free URL and never hold user names,
   passwords or header values.
5. After ``receive`` returned ``True``, the handshake is done: calling it again is a bug
   (``RuntimeError``).
"""

from __future__ import annotations

import enum
import ipaddress
import re
from typing import Protocol

import h11
import httpx

__all__ = [
    "HANDSHAKE_READ",
    "MAX_CONNECT_HEAD",
    "ConnectHandshake",
    "Handshake",
    "Socks5Handshake",
    "forwarded_head",
    "tunnel_authority",
]

#: Largest answer head to ``CONNECT`` we read (status line and headers).
MAX_CONNECT_HEAD = 64 * 1024
#: Most bytes ``run_handshake`` asks of the stream at once.
HANDSHAKE_READ = 65536
#: Most characters of a proxy's (escaped) reason phrase shown in ``ProxyError``.
REASON_SHOWN = 200
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([1-9][0-9]{2}) ")


class Handshake(Protocol):
    """What ``run_handshake`` drives."""

    leftover: bytes

    def outgoing(self) -> bytes:
        """Bytes to send the proxy now (``b""``: nothing)."""
        ...

    def receive(self, data: bytes) -> bool:
        """Feed what the proxy sent (``b""``: end of stream).  ``True`` once the tunnel is
        open.  Raises ``httpx.ProxyError``."""
        ...


def forwarded_head(
    url: httpx.URL,
    target: bytes | None,
    headers: list[tuple[bytes, bytes]],
    proxy_headers: tuple[tuple[bytes, bytes], ...],
) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The request target and headers of a request *forwarded* by an HTTP proxy (an
    ``http://`` target, no tunnel): the absolute form ``scheme://host[:port]/path?query``
    (RFC 9112 §3.2.2; no userinfo, no fragment; ``target``, the ``"target"`` extension,
    replaces the path and query when given) and ``proxy_headers`` first, except those whose
    name the request also has (httpcore's order and rule), then the request's own."""
    absolute = url.raw_scheme + b"://" + url.netloc + (url.raw_path if target is None else target)
    if not proxy_headers:
        return absolute, headers
    names = {name.lower() for name, _ in headers}
    merged = [(name, value) for name, value in proxy_headers if name.lower() not in names]
    return absolute, merged + headers


def tunnel_authority(host: str, port: int) -> str:
    """``host:port`` as a ``CONNECT`` request target: an IPv6 literal in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class ConnectHandshake:
    """``CONNECT host:port`` to an HTTP proxy (RFC 9110 §9.3.6).

    Args:
        proxy: the proxy's URL without credentials, for messages.
        authority: ``tunnel_authority(host, port)`` of the target.
        headers: sent after ``Host`` (``Proxy-Authorization``, the user's proxy headers).
    """

    def __init__(
        self, proxy: str, authority: str, headers: tuple[tuple[bytes, bytes], ...] = ()
    ) -> None:
        self._proxy = proxy
        self._authority = authority
        self._h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_CONNECT_HEAD)
        target = authority.encode("ascii")
        request = h11.Request(
            method=b"CONNECT", target=target, headers=[(b"Host", target), *headers]
        )
        self._out = (self._h11.send(request) or b"") + (self._h11.send(h11.EndOfMessage()) or b"")
        self._open = False
        self._start = b""  # the answer's first bytes: its status, should its head be too long
        self.leftover = b""
        #: The proxy's answer, once read: status code and reason phrase.
        self.status = 0
        self.reason = ""

    def outgoing(self) -> bytes:
        data, self._out = self._out, b""
        return data

    def receive(self, data: bytes) -> bool:
        if self._open:
            raise RuntimeError("the tunnel is already open")
        if len(self._start) < 16:
            self._start += data[: 16 - len(self._start)]
        self._h11.receive_data(data)
        while True:
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as exc:
                if not data:
                    raise self._closed() from None
                too_long = exc.error_status_hint == 431  # (h11: "Receive buffer too long")
                raise self._invalid(self._too_long() if too_long else str(exc)) from None
            if event is h11.NEED_DATA:
                if not data:
                    raise self._closed()
                return False
            if isinstance(event, h11.InformationalResponse):
                continue  # 1xx before the answer: allowed, ignored
            if not isinstance(event, h11.Response):  # pragma: no cover - h11 gives no other
                raise self._invalid(f"unexpected {type(event).__name__}")
            return self._answered(event)

    def _answered(self, event: h11.Response) -> bool:
        self.status = event.status_code
        # The proxy's own bytes: control characters escaped (they reach logs and terminals),
        # and cut to REASON_SHOWN characters (a hostile proxy's reason can be 100 kB).
        reason = event.reason.decode("latin-1").encode("unicode_escape").decode("ascii")
        if len(reason) > REASON_SHOWN:
            reason = reason[:REASON_SHOWN] + "..."
        self.reason = reason
        if not 200 <= self.status < 300:
            raise httpx.ProxyError(
                f"proxy {self._proxy} refused the tunnel to {self._authority}:"
                f" {self.status} {self.reason}".rstrip()
            )
        self._open = True
        self.leftover = self._h11.trailing_data[0]
        return True

    def _too_long(self) -> str:
        """An answer whose head outgrew ``MAX_CONNECT_HEAD``, with its status when it began
        with one: whether the head came in one read or several must not change the message
        (h11 parses a head it received whole, however long)."""
        status = _STATUS_LINE.match(self._start)
        shown = "" if status is None else f"status {status[1].decode()}, "
        return f"{shown}answer head too long (over {MAX_CONNECT_HEAD} bytes)"

    def _invalid(self, what: str) -> httpx.ProxyError:
        return httpx.ProxyError(
            f"proxy {self._proxy} sent an invalid answer to CONNECT {self._authority}: {what}"
        )

    def _closed(self) -> httpx.ProxyError:
        return httpx.ProxyError(
            f"proxy {self._proxy} closed the connection before answering CONNECT {self._authority}"
        )


class _Stage(enum.Enum):
    METHOD = enum.auto()  # greeting sent, waiting for the chosen method
    AUTH = enum.auto()  # user name and password sent (RFC 1929)
    CONNECT = enum.auto()  # CONNECT sent
    OPEN = enum.auto()


_NO_AUTH, _USER_PASSWORD, _NO_ACCEPTABLE = 0x00, 0x02, 0xFF
#: RFC 1928 §6 reply codes.
SOCKS5_REPLIES = {
    0x01: "general SOCKS server failure",
    0x02: "connection not allowed by ruleset",
    0x03: "network unreachable",
    0x04: "host unreachable",
    0x05: "connection refused",
    0x06: "TTL expired",
    0x07: "command not supported",
    0x08: "address type not supported",
}
_ADDRESS_LENGTHS = {0x01: 4, 0x04: 16}  # IPv4, IPv6; 0x03 (a name) carries its own length


class Socks5Handshake:
    """SOCKS5 ``CONNECT`` (RFC 1928), with user name and password (RFC 1929) when given.

    Args:
        proxy: the proxy's URL without credentials, for messages.
        host: the target: an IP address literal is sent as an address, anything else as a
            name for the proxy to resolve (``socks5h``; for ``socks5`` the caller resolves
            the name first and passes the address).
        port: the target's port.
        auth: (user name, password), each at most 255 bytes in UTF-8, or ``None``.
    """

    def __init__(self, proxy: str, host: str, port: int, auth: tuple[str, str] | None) -> None:
        self._proxy = proxy
        self._target = tunnel_authority(host, port)
        self._auth = None if auth is None else tuple(part.encode("utf-8") for part in auth)
        methods = bytes([_NO_AUTH]) if auth is None else bytes([_NO_AUTH, _USER_PASSWORD])
        self._out = bytes([5, len(methods)]) + methods
        self._connect = b"\x05\x01\x00" + _socks_address(host) + port.to_bytes(2, "big")
        self._stage = _Stage.METHOD
        self._buffer = b""
        self.leftover = b""

    def outgoing(self) -> bytes:
        data, self._out = self._out, b""
        return data

    def receive(self, data: bytes) -> bool:
        if self._stage is _Stage.OPEN:
            raise RuntimeError("the tunnel is already open")
        if not data:
            raise httpx.ProxyError(
                f"SOCKS5 proxy {self._proxy} closed the connection during the handshake"
                f" for {self._target}"
            )
        self._buffer += data
        while True:
            size = self._reply_size()
            if size is None or len(self._buffer) < size:
                return False
            reply, self._buffer = self._buffer[:size], self._buffer[size:]
            if self._step(reply):
                self.leftover, self._buffer = self._buffer, b""
                return True

    def _reply_size(self) -> int | None:
        """Bytes of the reply expected now; ``None`` until enough is known to tell.  A
        refusal is reported as soon as its code arrives (some proxies close right after)."""
        if self._stage is not _Stage.CONNECT:
            return 2
        head = self._buffer
        if len(head) >= 2:
            if head[0] != 5:
                raise self._invalid(f"version {head[0]}")
            if head[1] != 0:
                name = SOCKS5_REPLIES.get(head[1], f"reply {head[1]:#04x}")
                raise httpx.ProxyError(
                    f"SOCKS5 proxy {self._proxy} refused the tunnel to {self._target}: {name}"
                )
        if len(head) >= 3 and head[2] != 0:
            raise self._invalid(f"reserved byte {head[2]:#04x}")  # RFC 1928 §6: X'00'
        if len(head) < 5:
            return None
        kind = head[3]
        if kind == 0x03:
            if head[4] == 0:
                raise self._invalid("an empty bound address name")
            return 4 + 1 + head[4] + 2
        if kind not in _ADDRESS_LENGTHS:
            raise self._invalid(f"address type {kind:#04x}")
        return 4 + _ADDRESS_LENGTHS[kind] + 2

    def _step(self, reply: bytes) -> bool:
        """Act on one whole reply; ``True`` when the tunnel is open."""
        if self._stage is _Stage.METHOD:
            self._chose(reply)
        elif self._stage is _Stage.AUTH:
            if reply[0] != 1:
                raise self._invalid(f"authentication reply version {reply[0]}")
            if reply[1] != 0:
                raise httpx.ProxyError(
                    f"SOCKS5 proxy {self._proxy} refused the user name and password"
                )
            self._send_connect()
        else:  # CONNECT: version and code were checked by _reply_size
            self._stage = _Stage.OPEN
            return True
        return False

    def _chose(self, reply: bytes) -> None:
        if reply[0] != 5:
            raise self._invalid(f"version {reply[0]}")
        method = reply[1]
        if method == _NO_AUTH:
            self._send_connect()
        elif method == _USER_PASSWORD and self._auth is not None:
            user, password = self._auth
            self._out = bytes([1, len(user)]) + user + bytes([len(password)]) + password
            self._stage = _Stage.AUTH
        elif method in (_NO_ACCEPTABLE, _USER_PASSWORD):
            wanted = "credentials" if self._auth is None else "other credentials"
            raise httpx.ProxyError(
                f"SOCKS5 proxy {self._proxy} accepts none of our authentication methods"
                f" (it wants {wanted})"
            )
        else:
            raise self._invalid(f"authentication method {method:#04x}, which we did not offer")

    def _send_connect(self) -> None:
        self._out = self._connect
        self._stage = _Stage.CONNECT

    def _invalid(self, what: str) -> httpx.ProxyError:
        return httpx.ProxyError(
            f"SOCKS5 proxy {self._proxy} sent an invalid reply during the handshake for"
            f" {self._target}: {what}"
        )


def _socks_address(host: str) -> bytes:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if not host.isascii() or not 0 < len(host) <= 255:
            raise ValueError(
                f"a SOCKS5 target name must be 1 to 255 ASCII bytes, got {host!r}"
            ) from None
        return bytes([0x03, len(host)]) + host.encode("ascii")
    kind = 0x01 if address.version == 4 else 0x04
    return bytes([kind]) + address.packed
