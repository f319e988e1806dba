"""HTTP/2 header lists: the request's, checked so that nothing can be injected, and the
response head.  Pure functions.

A request's header list is refused (``httpx.LocalProtocolError``, before anything is sent)
when a hop that turns it back into HTTP/1.1 could be made to split a header or the request
line: a name that is not a token (RFC 9110 §5.1, as h11 and Go's transport require), a value
with NUL, CR or LF (RFC 9113 §8.2.1), ``:method``, ``:authority`` (Host) or ``:path`` (the
``target`` extension) with a control or a space.  Costs one regular-expression search over
the joined values and one each over authority and path; names and methods already found
valid are remembered (values never are: they may be secrets).

The list is final: h2 sends it as it is (its outbound normalisation and validation are off,
``H2_CONFIG`` in ``_http2``, because they cost a third of a request's h2 time and repeat
what is done here).  So this module also does what they did: names lowercased and
connection-specific headers dropped (RFC 9113 §8.2.2), values stripped of surrounding
whitespace (§8.2.1), ``authorization``, ``proxy-authorization`` and short ``cookie`` values
kept out of the HPACK dynamic table (never indexed, RFC 7541 §7.1.3, as h2 and nghttp2
do), and a request h2 would have refused is refused here: an empty ``:path`` and an
ordinary CONNECT (which must not carry ``:scheme`` or ``:path``, §8.5).
tests/unit/test_h2headers.py checks, on generated requests, that the list and the verdict
are h2's own.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
from hpack import NeverIndexedHeaderTuple

from ._exchange import ResponseHead

__all__ = ["request_headers", "response_head"]

_CONNECTION_HEADERS = frozenset(
    {b"host", b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"}
)
#: RFC 9110 §5.1 field names (a token), lowercased as HTTP/2 requires (RFC 9113 §8.2.1).
_FIELD_NAME = re.compile(rb"[!#$%&'*+\-.^_`|~0-9a-z]+")
#: RFC 9113 §8.2.1: a field value must not contain NUL, CR or LF.
_BAD_VALUE = re.compile(rb"[\x00\r\n]")
#: Nor may ``:authority`` or ``:path`` contain controls or spaces (a request line built
#: from them by an HTTP/1.1 hop would be split).
_BAD_PSEUDO = re.compile(rb"[\x00-\x20\x7f]")
#: Names and methods already found valid (no values: they may be secrets).
_GOOD_NAMES: set[bytes] = set()
_GOOD_METHODS: dict[str, bytes] = {}
_CACHE_LIMIT = 1024
#: Kept out of HPACK's dynamic table (never indexed); ``cookie`` only below this length.
_SECRET_HEADERS = frozenset({b"authorization", b"proxy-authorization"})
_SHORT_COOKIE = 20
#: The reason phrase httpx gives each status (HTTP/2 has none on the wire).
_REASONS = {int(code): httpx.codes.get_reason_phrase(code).encode() for code in httpx.codes}


def request_headers(request: httpx.Request) -> list[tuple[bytes, bytes]]:
    """The request's HTTP/2 header list, refusing what could inject a header or a request
    when a hop turns it back into HTTP/1.1 (RFC 9113 §8.2.1, §8.3.1).

    Raises:
        httpx.LocalProtocolError: before anything is sent.
    """
    url = request.url
    method = _GOOD_METHODS.get(request.method)
    if method is None:
        method = _check_method(request)
    authority: bytes = url.netloc
    target: Any = request.extensions.get("target", url.raw_path)
    headers: list[tuple[bytes, bytes]] = []
    values = []
    for name, value in request.headers.raw:
        lowered = name.lower()
        if lowered not in _GOOD_NAMES:
            _check_name(lowered, request)
        values.append(value)  # checked even when the header is not sent (as h11 does)
        if lowered in _CONNECTION_HEADERS:
            if lowered == b"host":
                authority = value
            continue
        if lowered == b"te" and value.lower() != b"trailers":
            continue
        value = value.strip()
        if lowered in _SECRET_HEADERS or (lowered == b"cookie" and len(value) < _SHORT_COOKIE):
            headers.append(NeverIndexedHeaderTuple(lowered, value))
        else:
            headers.append((lowered, value))
    if not isinstance(target, bytes):
        raise httpx.LocalProtocolError("the 'target' extension must be bytes", request=request)
    if _BAD_PSEUDO.search(authority) or _BAD_PSEUDO.search(target):
        raise httpx.LocalProtocolError(
            "invalid character in the request target or Host", request=request
        )
    if _BAD_VALUE.search(b"".join(values)):
        name = next(n.lower() for n, v in request.headers.raw if _BAD_VALUE.search(v))
        raise httpx.LocalProtocolError(
            f"invalid character (CR, LF or NUL) in header {name.decode('ascii')!r}",
            request=request,
        )
    if not target:
        raise httpx.LocalProtocolError("an empty :path is forbidden", request=request)
    if method == b"CONNECT":
        raise httpx.LocalProtocolError(
            "an ordinary CONNECT request over HTTP/2 has no :scheme or :path", request=request
        )
    pseudo = [(b":method", method), (b":authority", authority), (b":scheme", url.raw_scheme)]
    pseudo.append((b":path", target))
    return pseudo + headers


def _check_name(name: bytes, request: httpx.Request) -> None:
    if _FIELD_NAME.fullmatch(name) is None:
        raise httpx.LocalProtocolError(f"invalid header name {name!r}", request=request)
    if len(_GOOD_NAMES) < _CACHE_LIMIT:
        _GOOD_NAMES.add(name)


def _check_method(request: httpx.Request) -> bytes:
    method = request.method.encode("ascii", "replace")
    if _FIELD_NAME.fullmatch(method.lower()) is None:  # a token (RFC 9110 §9.1)
        raise httpx.LocalProtocolError(f"invalid method {request.method!r}", request=request)
    if len(_GOOD_METHODS) < _CACHE_LIMIT:
        _GOOD_METHODS[request.method] = method
    return method


def response_head(raw: Any, stream_id: int) -> tuple[ResponseHead | None, int | None]:
    """The response head (``None`` if its ``:status`` is not three digits, RFC 9113
    §8.3.2), and its ``content-length`` (h2 has checked that it is digits)."""
    status = 0
    length: int | None = None
    headers: list[tuple[bytes, bytes]] = []
    for name, value in raw:
        if name == b":status":
            if len(value) == 3 and value.isdigit():
                status = int(value)
        elif not name.startswith(b":"):
            headers.append((name, value))
            if name == b"content-length":
                length = int(value)
    if status < 200:  # (h2 hands 1xx on as informational responses)
        return None, None
    # HTTP/2 has no reason phrase: give the one httpx gives when there is none.
    reason = _REASONS.get(status, b"")
    return ResponseHead(status, headers, b"HTTP/2", reason, stream_id), length
