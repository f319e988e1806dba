"""Connecting through a proxy: the connector's path when ``ProxyRoutes`` names one.

One dial path for both transports: ``scripts/unasync.py`` generates the sync twin
(``_sync/_proxied.py``) from the async module, as it does ``_stacked``; the handshakes
themselves are sans-I/O (``_proxy``), shared as they are.

Theory of operation
-------------------
``connect_via`` turns a request and the ``ProxySpec`` chosen for its origin into one byte
stream that carries HTTP to the *target*, or, for forwarding, to the proxy:

1. TCP to the proxy (the transport's ``local_address`` and ``socket_options``); a refusal
   is an ``httpx.ConnectError`` naming the proxy.
2. ``https://`` proxy: TLS to the proxy (its ``ssl_context``, else the transport's
   default proxy context: verification on, ALPN ``http/1.1`` only).
3. Then, by ``forwards(kind, scheme)``:
   * an ``http://`` target through an HTTP(S) proxy is *forwarded*: the stream is the
     connection to the proxy, and the HTTP/1.1 connection sends absolute-form request
     targets with the proxy's headers (``_http11``, ``_proxy.forwarded_head``);
   * anything else is a *tunnel*: ``CONNECT`` (HTTP proxies) or the SOCKS5 handshake
     (``_proxy``), after which the stream reaches the target.  ``socks5://`` resolves the
     target's name here and sends the address; ``socks5h://`` sends the name.
4. ``https://`` target: TLS to the target inside the tunnel, with the transport's context
   (SNI and certificate checks for the target's name, ALPN ``h2`` when HTTP/2 is on).
   Through an ``https://`` proxy this TLS is stacked on the proxy's (``_stacked``).

Invariants:

* One deadline, the connect timeout, bounds all of it (``anyio.fail_after`` around the
  whole, the ``socks5://`` name lookup included): a proxy that trickles or never answers,
  or a resolver that does not, costs at most the connect timeout, then
  ``httpx.ConnectTimeout`` naming the step it cut.
* Whatever fails or is cancelled, the stream is closed before the exception leaves: a
  half-open tunnel never reaches the pool.  No raw ``OSError``, ``ssl`` or anyio error
  leaves: refusals and malformed answers are ``httpx.ProxyError``, the rest
  ``httpx.ConnectError`` / ``ConnectTimeout``, each naming the proxy by its
  credential-free URL.
* After the proxy's answer the tunnel must be silent: a byte already there (neither TLS
  nor HTTP/1.1 servers speak first) is a ``ProxyError``, not data for the target.
"""

from __future__ import annotations

import socket
import ssl
from typing import TYPE_CHECKING, Any

import anyio
import httpx

from ._config import DEFAULT_PORTS
from ._exceptions import describe_error
from ._proxy import (
    HANDSHAKE_READ,
    ConnectHandshake,
    Handshake,
    Socks5Handshake,
    tunnel_authority,
)
from ._proxy_config import ProxyKind, ProxySpec
from ._stacked import StackedTLSStream

# unasync: skip
from ._streams import AnyioStream, AsyncioStream, NetStream, NetworkStream

# unasync: end
# unasync: use from .._blocking import NetStream, NetworkStream, SocketStream
from ._tls import TLSEngine
from ._trace import TraceFn, emit

if TYPE_CHECKING:
    from ._network import Connector

__all__ = ["connect_via", "forwards", "proxy_ssl_context", "run_handshake"]

_HTTP_KINDS = (ProxyKind.HTTP, ProxyKind.HTTPS)
#: What the connect was doing when its deadline passed, by step (``{host}``: the target's).
_TIMED_OUT = {
    "connect_tcp": "opening the connection",
    "start_tls": "in the TLS handshake",
    "resolve": "resolving {host}",
    "proxy_handshake": "in the proxy's handshake",
}
#: Where a stream or TLS failure happened, by step.
_FAILED = {
    "connect_tcp": "connecting to",
    "resolve": "resolving the target's name for",
    "start_tls": "in the TLS handshake through",
    "proxy_handshake": "in the handshake with",
}
# unasync: skip
#: The stream failures anyio raises besides ``OSError`` (the sync streams raise none).
_STREAM_ERRORS: tuple[type[Exception], ...] = (anyio.BrokenResourceError, anyio.EndOfStream)
_CLOSED_ERRORS: tuple[type[Exception], ...] = (anyio.ClosedResourceError,)
# unasync: end
# unasync: use _STREAM_ERRORS: tuple[type[Exception], ...] = ()
# unasync: use _CLOSED_ERRORS: tuple[type[Exception], ...] = ()


def forwards(kind: ProxyKind, scheme: str) -> bool:
    """Whether a request of ``scheme`` through a proxy of ``kind`` is forwarded (sent to
    the proxy in absolute form) rather than tunnelled."""
    return scheme == "http" and kind in _HTTP_KINDS


def proxy_ssl_context(trust_env: bool) -> ssl.SSLContext:
    """The context for ``https://`` proxies given without their own: verification on
    (certifi, or ``SSL_CERT_FILE``/``SSL_CERT_DIR`` with ``trust_env``), ALPN
    ``http/1.1`` (a proxy connection never speaks HTTP/2, as in httpcore)."""
    context = httpx.create_ssl_context(trust_env=trust_env)
    context.set_alpn_protocols(["http/1.1"])
    return context


async def run_handshake(stream: NetStream, handshake: Handshake, timeout: float | None) -> bytes:
    """Open the tunnel over ``stream`` (connected to the proxy); returns ``leftover``.

    ``timeout`` bounds each read and write; the caller bounds the whole handshake.
    Raises ``httpx.ProxyError`` from the handshake; ``TimeoutError``, ``OSError`` from
    the stream (the caller maps them)."""
    while True:
        data = handshake.outgoing()
        if data:
            await stream.send(data, timeout)
        if handshake.receive(await stream.receive(HANDSHAKE_READ, timeout)):
            return handshake.leftover


async def connect_via(
    connector: Connector,
    spec: ProxySpec,
    request: httpx.Request,
    *,
    timeout: float | None,
    trace: TraceFn | None,
) -> NetStream:
    """A stream for ``request`` through the proxy ``spec`` (see the module docstring).

    Trace events (httpcore's names): ``connection.connect_tcp`` (to the proxy),
    ``connection.start_tls`` (to an https proxy, then to the target).

    Raises:
        httpx.ProxyError, httpx.ConnectError, httpx.ConnectTimeout.
    """
    url = request.url
    host = url.raw_host.decode("ascii")
    port = url.port or DEFAULT_PORTS[url.scheme]
    stream: NetStream | None = None
    step = "connect_tcp"
    try:
        with anyio.fail_after(timeout):
            await emit(trace, "connection.connect_tcp.started", _tcp_info(connector, spec, timeout))
            try:
                stream = await connector.open_tcp(spec.host, spec.port)
            except OSError as exc:
                raise httpx.ConnectError(
                    f"cannot connect to proxy {spec.url}: {describe_error(exc)}"
                ) from exc
            await emit(trace, "connection.connect_tcp.complete", {"return_value": _shown(stream)})
            if spec.kind is ProxyKind.HTTPS:
                step = "start_tls"
                context = spec.ssl_context or connector.proxy_ssl_context
                assert context is not None  # the transport made one: an https proxy is routed
                await _start_tls(stream, TLSEngine(context, spec.host), trace, context, timeout)
            if forwards(spec.kind, url.scheme):
                return stream
            address = host
            if spec.kind is ProxyKind.SOCKS5:  # the client resolves the target's name
                step = "resolve"
                address = await _resolve(host, port)
            step = "proxy_handshake"
            handshake = _handshake(spec, host, address, port)
            if await run_handshake(stream, handshake, timeout) or stream.is_readable():
                raise httpx.ProxyError(
                    f"proxy {spec.url} sent bytes after opening the tunnel to"
                    f" {tunnel_authority(host, port)} (or closed it at once)"
                )
            if url.scheme == "https":
                step = "start_tls"
                sni = request.extensions.get("sni_hostname") or host
                engine = TLSEngine(connector.ssl_context, sni)
                context = connector.ssl_context
                if spec.kind is ProxyKind.HTTPS:  # the target's TLS inside the proxy's
                    stream = StackedTLSStream(stream, engine)
                await _start_tls(stream, engine, trace, context, timeout)
            return stream
    except BaseException as exc:
        if stream is not None:
            await stream.aclose()
        if not isinstance(exc, Exception):
            raise
        mapped = _mapped(exc, spec, step, request)
        await emit(
            trace,
            f"connection.{'start_tls' if step == 'start_tls' else 'connect_tcp'}.failed",
            {"exception": mapped},
        )
        if mapped is exc:  # an httpx error already: as it is, keeping its own cause
            raise
        raise mapped from exc


async def _start_tls(
    stream: NetStream,
    engine: TLSEngine,
    trace: TraceFn | None,
    context: ssl.SSLContext,
    timeout: float | None,
) -> None:
    if trace is not None:
        info = {
            "ssl_context": context,
            "server_hostname": engine.ssl_object.server_hostname,
            "timeout": timeout,
        }
        await trace("connection.start_tls.started", info)
    if isinstance(stream, StackedTLSStream):
        await stream.handshake(timeout)
    else:
        # unasync: skip
        assert isinstance(stream, AsyncioStream | AnyioStream)
        # unasync: end
        # unasync: use assert isinstance(stream, SocketStream)
        await stream.start_tls(engine)
    if trace is not None:
        await trace("connection.start_tls.complete", {"return_value": _shown(stream)})


def _handshake(spec: ProxySpec, host: str, address: str, port: int) -> Handshake:
    """The tunnel's handshake: ``CONNECT host:port``, or SOCKS5 to ``address`` (the name
    for ``socks5h://``, what it resolved to for ``socks5://``)."""
    if not spec.kind.is_socks:
        return ConnectHandshake(str(spec.url), tunnel_authority(host, port), spec.proxy_headers)
    return Socks5Handshake(str(spec.url), address, port, spec.auth)


async def _resolve(host: str, port: int) -> str:
    """``socks5://``: the client resolves the name (the first address the system gives),
    within the connect's deadline like every other step (the scope around it)."""
    try:
        infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise httpx.ConnectError(f"cannot resolve {host}: {describe_error(exc)}") from exc
    address = infos[0][4][0]
    return address if isinstance(address, str) else host


def _mapped(
    exc: Exception, spec: ProxySpec, step: str, request: httpx.Request
) -> httpx.TransportError:
    """The httpx error for a failed proxied connect, naming the proxy (never its
    credentials: ``spec.url`` has none)."""
    if isinstance(exc, httpx.TransportError):
        mapped = exc
    elif isinstance(exc, TimeoutError):
        doing = _TIMED_OUT[step].format(host=request.url.host)
        mapped = httpx.ConnectTimeout(f"connect timed out {doing} (through proxy {spec.url})")
    elif isinstance(exc, (ssl.SSLError, OSError, *_STREAM_ERRORS)):
        mapped = httpx.ConnectError(f"{describe_error(exc)} ({_FAILED[step]} proxy {spec.url})")
    elif isinstance(exc, _CLOSED_ERRORS):
        mapped = httpx.ConnectError(f"connection was closed (through proxy {spec.url})")
    elif isinstance(exc, ValueError):  # a target name SOCKS5 cannot carry
        mapped = httpx.ConnectError(f"{exc} (through proxy {spec.url})")
    else:  # pragma: no cover - a bug of ours: let it surface as it is
        raise exc
    mapped.request = request
    return mapped


def _tcp_info(connector: Connector, spec: ProxySpec, timeout: float | None) -> dict[str, Any]:
    return {
        "host": spec.host,
        "port": spec.port,
        "local_address": connector.local_address,
        "timeout": timeout,
        "socket_options": list(connector.socket_options),
    }


def _shown(stream: NetStream) -> NetworkStream:
    return NetworkStream(stream)
