"""Our exceptions, and the one place where low-level failures become httpx ones.

The tree, as a caller sees it (two classes have two parents, so they appear twice)::

    httpx.TransportError
     ├── BulkheadError                a rule of the bulkhead stopped the request
     │    ├── BulkheadFull            the wait queue (max_pending) is full: rejected at once
     │    ├── TransportClosed         the transport was closed (before or while waiting), or another
     │    │                           event loop took it over from this request's (see the message)
     │    ├── AcquireTimeout          no slot, connection or fleet lease within the acquire timeout
     │    ├── FleetUnavailable        the Redis of a fleet limit is unavailable ("reject")
     │    └── RequestTimeout          request_timeout passed: the exchange was abandoned
     └── httpx.TimeoutException
          ├── httpx.PoolTimeout
          │    └── AcquireTimeout     (the same class as above)
          ├── RequestTimeout          (the same class as above)
          └── httpx.ConnectTimeout, httpx.ReadTimeout, httpx.WriteTimeout

So ``except BulkheadError`` catches everything the bulkhead itself decided, and code that
catches httpx's timeouts (``except httpx.TimeoutException``) keeps catching ours.

Messages name the compartment and the configured value that was exceeded (``compartment
'llm.example.com': no slot within acquire_timeout=0.5 s (3 running, 10 waiting)``); they
never contain a URL (which could carry credentials) or a header value.

Every other failure is the httpx exception the default transport would raise
(``ConnectError``, ``ReadTimeout``, ``RemoteProtocolError``, ...), raised ``from`` its cause
with ``request`` set.  No ``OSError``, ``ssl.SSLError``, h11, h2 or anyio exception escapes.
"""

from __future__ import annotations

import ssl
from typing import Literal, NoReturn

import anyio
import httpx

__all__ = [
    "AcquireTimeout",
    "BulkheadError",
    "BulkheadFull",
    "FleetUnavailable",
    "RequestTimeout",
    "TransportClosed",
    "raise_mapped",
]


class BulkheadError(httpx.TransportError):
    """A rule of the bulkhead stopped the request: a limit or deadline of its ``Policy``, or
    the transport's state.  Only ``RequestTimeout`` comes after network I/O started."""


class BulkheadFull(BulkheadError):
    """The compartment's wait queue (``Policy.max_pending``) was full; rejected at once."""


class TransportClosed(BulkheadError):
    """The transport was closed before the request could get a slot; or, for a request
    begun on an event loop that another loop has since taken the transport over from,
    before it could get a connection (the message says which)."""


class AcquireTimeout(httpx.PoolTimeout, BulkheadError):
    """No slot and usable connection within ``Policy.acquire_timeout`` (or httpx's pool timeout)."""


class FleetUnavailable(BulkheadError):
    """The Redis server of a fleet-wide limit (``RedisFleetLimit``) did not answer, and its
    ``on_unavailable`` is ``"reject"``: the request was refused without waiting further.
    Not a timeout: Redis being down is not the dependency being busy."""


class RequestTimeout(httpx.TimeoutException, BulkheadError):
    """``Policy.request_timeout`` passed: the exchange was abandoned (an HTTP/1.1 connection
    closed, an HTTP/2 stream reset).  Also an ``httpx.TimeoutException``."""


Phase = Literal["connect", "write", "read"]

_TIMEOUTS: dict[Phase, type[httpx.TimeoutException]] = {
    "connect": httpx.ConnectTimeout,
    "write": httpx.WriteTimeout,
    "read": httpx.ReadTimeout,
}
_ERRORS: dict[Phase, type[httpx.TransportError]] = {
    "connect": httpx.ConnectError,
    "write": httpx.WriteError,
    "read": httpx.ReadError,
}


def raise_mapped(exc: BaseException, phase: Phase, request: httpx.Request) -> NoReturn:
    """Re-raise ``exc`` as the httpx exception the default transport would raise.

    Args:
        exc: the low-level exception (``OSError``, ``ssl.SSLError``, anyio, ``TimeoutError``;
            protocol errors are turned into httpx ones by the codecs, not here).
        phase: what was being done: ``"connect"``, ``"write"`` or ``"read"``.
        request: attached to the raised exception.

    Raises:
        httpx.TransportError: always; exceptions that are already httpx ones pass through.
    """
    if isinstance(exc, httpx.TransportError):
        raise exc
    mapped: httpx.TransportError
    if isinstance(exc, TimeoutError):
        mapped = _TIMEOUTS[phase](f"{phase} timed out", request=request)
    elif isinstance(exc, anyio.EndOfStream):
        mapped = _ERRORS[phase]("connection closed by peer", request=request)
    elif isinstance(exc, ssl.SSLError | OSError | anyio.BrokenResourceError):
        mapped = _ERRORS[phase](_describe(exc), request=request)
    elif isinstance(exc, anyio.ClosedResourceError):
        mapped = _ERRORS[phase]("connection was closed", request=request)
    else:  # pragma: no cover - a bug of ours: let it surface as it is
        raise exc
    raise mapped from exc


def describe_error(exc: BaseException) -> str:
    """A short text for a low-level error (its message, else its type's name)."""
    return _describe(exc)


def _describe(exc: BaseException) -> str:
    cause = exc.__cause__ if isinstance(exc, anyio.BrokenResourceError) else exc
    text = str(cause) if cause is not None else ""
    return text or type(cause or exc).__name__
