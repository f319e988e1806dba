"""Blocking sockets for the sync shell: the counterpart of ``_streams.py`` and ``_network.py``.

``SocketStream`` is the sync ``NetStream``: a non-blocking socket, each call waiting with
its own ``poll`` and deadline (not the socket's timeout, which is one per socket: an
HTTP/2 reader and a writer use it at once, each with its own timeout),
with TLS by our own ``TLSEngine`` (``_tls.py``) as in the async streams, so
``is_readable`` sees every unread byte the peer sent, wherever it waits.  Every socket call
is made through ``_threads.blocking``: with the loop lock released, bounded by the
operation's timeout and the enclosing deadline scopes.  The TLS engine is touched only
with the loop lock held (an ``SSLObject`` is not thread-safe); TLS writes also hold the
stream's send lock from taking the engine's output to handing it to the socket, so
records reach the socket in the order they were made.

Same contract as the async streams: a timeout is ``TimeoutError``, end of stream ``b""``,
a failure ``OSError``; ``_exceptions.raise_mapped`` turns them into httpx exceptions.

``Connector`` opens them (TCP, Unix sockets, TLS with ALPN), with the async connector's
settings, trace events, retries and error mapping.  A request its proxy table
(``proxy=``, or the environment's with ``trust_env``) routes through a proxy takes the
generated twin of the async dial path (``_sync/_proxied.py``: forwarding, ``CONNECT``,
SOCKS5, TLS in TLS), which opens its TCP connection to the proxy with ``open_tcp``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import select
import socket
import ssl
import threading
import time
from typing import Any, Protocol

import httpx

from . import _network, _streams
from ._config import DEFAULT_PORTS
from ._exceptions import raise_mapped
from ._network import SocketOption, set_alpn
from ._proxy_config import ProxyRoutes, ProxySpec
from ._threads import blocking, fail_after, getaddrinfo, sleep
from ._tls import TLSEngine

__all__ = [
    "Connector",
    "NetStream",
    "Network",
    "NetworkStream",
    "SocketOption",
    "SocketStream",
    "set_alpn",
]

TraceFn = Any  # Callable[[str, dict[str, Any]], None]: a sync trace callback

_RECV = 65536

#: What a read or write cut by ``close()`` (another thread's, or the transport's) says.
_CLOSED = "connection was closed"

#: The connect timeout for "no limit" (``create_connection`` needs a number to stay out
#: of blocking mode).
_FOREVER = 7 * 24 * 3600.0
#: A numeric address to connect to: ``(ip, port)`` (an IPv6 one's scope after ``%``).
_Address = tuple[str, int]


class NetStream(Protocol):
    """A connected byte stream (see ``_streams.NetStream``; these methods block)."""

    def receive(self, max_bytes: int, timeout: float | None) -> bytes: ...

    def send(self, data: bytes, timeout: float | None) -> None: ...

    def is_readable(self) -> bool: ...

    @property
    def alpn(self) -> str | None: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...


class SocketStream:
    """``NetStream`` over a connected socket (see the module docstring)."""

    __slots__ = ("_closed", "_send_lock", "_sock", "_tls")

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._tls: TLSEngine | None = None
        self._send_lock = threading.Lock()
        self._closed = False

    def start_tls(self, tls: TLSEngine, timeout: float | None = None) -> None:
        """Run the TLS handshake within ``timeout`` seconds (``None``: the enclosing
        deadline scopes only); from then on the stream carries plaintext.  Raises
        ``ssl.SSLError``, ``OSError``, ``TimeoutError``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._tls = tls
        while not tls.handshake():
            self._send_raw(tls.outgoing(), _left(deadline))
            data = blocking(self._recv, _left(deadline))
            if data:
                tls.feed(data)
            else:
                tls.feed_eof()  # the next handshake step raises
        self._send_raw(tls.outgoing(), _left(deadline))

    def _recv(self, limit: float | None, max_bytes: int = _RECV) -> bytes:
        sock = self._sock
        deadline = None if limit is None else time.monotonic() + limit
        while True:
            try:
                data = sock.recv(max_bytes)
            except BlockingIOError:
                self._poll(select.POLLIN, deadline)
                continue
            except OSError:
                self._raise_if_closed()
                raise
            if not data:
                self._raise_if_closed()  # woken by our own shutdown, not the peer's end
            return data

    def _poll(self, events: int, deadline: float | None) -> None:
        """Wait until the socket is ready for ``events``; ``TimeoutError`` at ``deadline``."""
        wait = -1.0 if deadline is None else (deadline - time.monotonic()) * 1000
        if deadline is not None and wait <= 0:
            raise TimeoutError
        fd = self._sock.fileno()
        if fd < 0:
            raise ConnectionAbortedError(_CLOSED)
        poller = select.poll()
        poller.register(fd, events)
        if not poller.poll(wait):
            raise TimeoutError

    def receive(self, max_bytes: int, timeout: float | None) -> bytes:
        tls = self._tls
        if tls is None:
            return blocking(lambda limit: self._recv(limit, max_bytes), timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            data = tls.read_available(max_bytes)
            outgoing = tls.outgoing()  # a key update or alert the read produced
            if outgoing:
                self._send_tls(b"", None, outgoing)
            if data is not None:
                return data
            received = blocking(self._recv, _left(deadline))
            if received:
                tls.feed(received)
            else:
                tls.feed_eof()
                return tls.read(max_bytes) or b""

    def send(self, data: bytes, timeout: float | None) -> None:
        if self._tls is None:
            self._send_raw(data, timeout)
        else:
            self._send_tls(data, timeout, b"")

    def _send_raw(self, data: bytes, timeout: float | None) -> None:
        if data:
            blocking(lambda limit: self._sendall(data, limit), timeout)

    def _sendall(self, data: bytes, limit: float | None) -> None:
        sock = self._sock
        deadline = None if limit is None else time.monotonic() + limit
        view = memoryview(data)
        while view:
            try:
                view = view[sock.send(view) :]
            except BlockingIOError:
                self._poll(select.POLLOUT, deadline)
            except OSError:
                self._raise_if_closed()
                raise

    def _raise_if_closed(self) -> None:
        """A read or write that failed (or saw the end) because ``close()`` cut the socket
        says so, instead of the errno of a descriptor that is gone or a peer's end."""
        if self._closed:
            raise ConnectionAbortedError(_CLOSED) from None

    def _send_tls(self, data: bytes, timeout: float | None, pending: bytes) -> None:
        """Encrypt ``data`` and send it after ``pending`` (already encrypted), in order."""
        tls = self._tls
        assert tls is not None
        # The send lock first (waited for without the loop lock), then the engine's output
        # (with the loop lock): records go out in the order the engine made them.
        blocking(self._take_send_lock, None)
        try:
            if data:
                tls.write(data)
            out = pending + tls.outgoing()
            if out:
                blocking(lambda limit: self._sendall(out, limit), timeout)
        finally:
            self._send_lock.release()

    def _take_send_lock(self, limit: float | None) -> None:
        if not self._send_lock.acquire(timeout=-1 if limit is None else limit):
            raise TimeoutError

    def is_readable(self) -> bool:
        tls = self._tls
        if tls is not None and tls.holds_input():
            return True
        return _streams.socket_readable(self._sock)

    @property
    def alpn(self) -> str | None:
        tls = self._tls
        return None if tls is None else tls.alpn

    @property
    def ssl_object(self) -> ssl.SSLObject | None:
        tls = self._tls
        return None if tls is None else tls.ssl_object

    @property
    def socket(self) -> socket.socket:
        return self._sock

    def abort(self) -> None:
        self.close()

    def close(self) -> None:
        """Close at once; a thread blocked reading it is woken (by the shutdown)."""
        if self._closed:
            return
        self._closed = True
        sock = self._sock
        with contextlib.suppress(OSError):  # not connected any more
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()


def _left(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


class NetworkStream:
    """``response.extensions["network_stream"]`` of the sync transport: as the async one's
    (``_streams.NetworkStream``: ``get_extra_info`` only, the rest refused; through a
    proxy, the target's TLS session and the socket to the proxy)."""

    __slots__ = ("_stream",)

    def __init__(self, stream: NetStream) -> None:
        self._stream = stream

    def get_extra_info(self, info: str) -> Any:
        stream = self._stream
        if info == "is_readable":
            return stream.is_readable()
        # Socket streams, and a TLS stream stacked inside an https proxy's (the target's
        # ``ssl_object``, the socket to the proxy), as the async ``NetworkStream`` answers.
        if info == "ssl_object":
            return getattr(stream, "ssl_object", None)
        sock = getattr(stream, "socket", None)
        if info == "socket":
            return sock
        if sock is None or info not in ("client_addr", "server_addr"):
            return None
        try:  # as the async stream answers
            address = sock.getsockname() if info == "client_addr" else sock.getpeername()
        except OSError:  # closed, or the peer is gone
            return None
        return address[:2] if isinstance(address, tuple) else address

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        raise RuntimeError(_streams._NOT_YOURS)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        raise RuntimeError(_streams._NOT_YOURS)

    def start_tls(self, *args: Any, **kwargs: Any) -> NetworkStream:
        raise RuntimeError(_streams._NOT_YOURS)

    def close(self) -> None:
        raise RuntimeError(_streams._NOT_YOURS)


class Network(Protocol):
    """Opens connections for the sync transport (a network that routes through proxies
    also has ``proxy_for``, as ``_network.Network`` says)."""

    def connect(
        self, request: httpx.Request, *, timeout: float | None, trace: TraceFn | None
    ) -> NetStream: ...


class Connector:
    """The sync transport's connections: the async ``Connector``'s settings (held, not
    copied), opened with blocking sockets.  Raises ``httpx.ConnectError`` and
    ``httpx.ConnectTimeout``."""

    __slots__ = ("_config",)

    def __init__(
        self,
        ssl_context: ssl.SSLContext,
        local_address: str | None = None,
        uds: str | None = None,
        socket_options: tuple[SocketOption, ...] = (),
        retries: int = 0,
        proxies: ProxyRoutes = _network._NO_PROXIES,
        proxy_ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._config = _network.Connector(
            ssl_context, local_address, uds, socket_options, retries, proxies, proxy_ssl_context
        )

    @property
    def ssl_context(self) -> ssl.SSLContext:
        return self._config.ssl_context

    @property
    def proxy_ssl_context(self) -> ssl.SSLContext | None:
        return self._config.proxy_ssl_context

    @property
    def local_address(self) -> str | None:
        return self._config.local_address

    @property
    def socket_options(self) -> tuple[SocketOption, ...]:
        return self._config.socket_options

    def proxy_for(self, url: httpx.URL) -> ProxySpec | None:
        """The proxy requests to ``url``'s origin go through; ``None``: direct."""
        return self._config.proxies.choose(url)

    def open_tcp(self, host: str, port: int) -> SocketStream:
        """A TCP stream to ``host:port`` (socket options applied), bounded by the enclosing
        deadline scopes (the name lookup included).  Raises ``OSError``."""
        addresses = _addresses(host, port)
        return SocketStream(blocking(lambda limit: self._tcp(addresses, limit), None))

    def connect(
        self, request: httpx.Request, *, timeout: float | None, trace: TraceFn | None
    ) -> NetStream:
        """Open a stream to the request's origin (TLS for https), directly or through its
        proxy, retrying as configured, with the async connector's trace events.  Raises
        ``httpx.ConnectError``, ``httpx.ConnectTimeout``, ``httpx.ProxyError``."""
        retries = self._config.retries
        for attempt in range(retries + 1):
            try:
                return self._connect_once(request, timeout=timeout, trace=trace)
            except (httpx.ConnectError, httpx.ConnectTimeout):
                if attempt >= retries:
                    raise
                delay = 0.0 if attempt == 0 else 0.5 * 2 ** (attempt - 1)
                if trace is not None:
                    trace("connection.retry.started", {"delay": delay})
                sleep(delay)
                if trace is not None:
                    trace("connection.retry.complete", {"return_value": None})
        raise AssertionError("unreachable")  # pragma: no cover

    def _connect_once(
        self, request: httpx.Request, *, timeout: float | None, trace: TraceFn | None
    ) -> NetStream:
        config = self._config
        url = request.url
        if config.proxies:
            spec = config.proxies.choose(url)
            if spec is not None:
                # Imported here: the generated dial path imports this module's streams.
                from ._sync._proxied import connect_via

                return connect_via(self, spec, request, timeout=timeout, trace=trace)
        host = url.raw_host.decode("ascii")
        port = url.port or DEFAULT_PORTS[url.scheme]
        sni = request.extensions.get("sni_hostname") or host
        deadline = None if timeout is None else time.monotonic() + timeout
        step = "connect_tcp" if config.uds is None else "connect_unix_socket"
        stream: SocketStream | None = None
        try:
            if trace is not None:
                trace(f"connection.{step}.started", config._connect_info(host, port, timeout))
            addresses = [] if config.uds is not None else _resolve(request, host, port, timeout)
            left = _left(deadline)
            stream = SocketStream(blocking(lambda limit: self._open(addresses, limit), left))
            if trace is not None:
                trace(f"connection.{step}.complete", {"return_value": NetworkStream(stream)})
            if url.scheme == "https":
                step = "start_tls"
                if trace is not None:
                    info = {"ssl_context": config.ssl_context, "server_hostname": sni}
                    trace("connection.start_tls.started", {**info, "timeout": timeout})
                stream.start_tls(TLSEngine(config.ssl_context, sni), _left(deadline))
                if trace is not None:
                    trace("connection.start_tls.complete", {"return_value": NetworkStream(stream)})
            return stream
        except BaseException as exc:
            if stream is not None:
                stream.close()
            if not isinstance(exc, Exception):
                raise
            try:
                raise_mapped(exc, "connect", request)
            except httpx.TransportError as mapped:
                if trace is not None:
                    trace(f"connection.{step}.failed", {"exception": mapped})
                raise

    def _open(self, addresses: list[_Address], limit: float | None) -> socket.socket:
        config = self._config
        if config.uds is None:
            return self._tcp(addresses, limit)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(_FOREVER if limit is None else limit)
            sock.connect(config.uds)
        except BaseException:
            sock.close()
            raise
        try:
            config._apply_socket_options(sock)
        except BaseException:
            sock.close()
            raise
        return sock

    def _tcp(self, addresses: list[_Address], limit: float | None) -> socket.socket:
        """A TCP socket to the first of ``addresses`` that accepts, each tried with ``limit``
        as ``socket.create_connection`` tries those it looks up; raises the last failure."""
        config = self._config
        local = None if config.local_address is None else (config.local_address, 0)
        wait = _FOREVER if limit is None else limit
        failure: OSError | None = None
        for address in addresses:  # numeric: create_connection looks nothing up
            try:
                sock = socket.create_connection(address, wait, source_address=local)
                break
            except OSError as exc:
                failure = exc
        else:
            raise failure or OSError(f"no address to connect to ({addresses})")
        try:
            config._apply_socket_options(sock)
        except BaseException:
            sock.close()
            raise
        return sock


def _addresses(host: str, port: int) -> list[_Address]:
    """Where to connect for ``host:port``: an IP literal as it is (no lookup), a name's
    addresses from the system resolver in the order it gives them, looked up with
    ``_threads.getaddrinfo``, so within the enclosing deadline scopes (a resolver that does
    not answer is abandoned at the deadline).  Raises ``OSError`` (``socket.gaierror``)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return [(host, port)]
    infos = getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found: list[_Address] = []
    for family, *_, sockaddr in infos:
        ip = str(sockaddr[0])
        if family == socket.AF_INET6 and sockaddr[3] and "%" not in ip:
            ip = f"{ip}%{sockaddr[3]}"  # a link-local address keeps its interface
        found.append((ip, port))
    return list(dict.fromkeys(found))


def _resolve(request: httpx.Request, host: str, port: int, timeout: float | None) -> list[_Address]:
    """The direct connect's lookup of ``host``, bounded by the connect's ``timeout``: past
    it, ``httpx.ConnectTimeout`` naming the lookup.  Raises ``OSError`` as ``_addresses``."""
    try:
        with fail_after(timeout):
            return _addresses(host, port)
    except TimeoutError as exc:
        message = f"connect timed out resolving {host}"
        raise httpx.ConnectTimeout(message, request=request) from exc
