"""HTTP/2 request header lists: the pseudo-headers first, names lowercased, connection
headers dropped, and nothing that could be injected through a hop that speaks HTTP/1.1."""

from __future__ import annotations

import os
import re
from typing import Any

import h2.config
import h2.connection
import h2.exceptions
import httpx
import pytest
from hpack import NeverIndexedHeaderTuple
from hypothesis import given, settings
from hypothesis import strategies as st

from httpx_bulkhead._h2headers import request_headers, response_head
from httpx_bulkhead._http2 import H2_CONFIG

FUZZ_EXAMPLES = int(os.environ.get("BULKHEAD_FUZZ_EXAMPLES") or 200)

TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def test_a_plain_request() -> None:
    request = httpx.Request(
        "POST",
        "https://example.com:8443/a/b?c=d",
        headers=[
            ("Host", "example.com:8443"),
            ("Connection", "keep-alive"),
            ("TE", "gzip"),
            ("X-Thing", "1"),
            ("Content-Length", "2"),
        ],
        content=b"hi",
    )
    assert request_headers(request) == [
        (b":method", b"POST"),
        (b":authority", b"example.com:8443"),
        (b":scheme", b"https"),
        (b":path", b"/a/b?c=d"),
        (b"x-thing", b"1"),
        (b"content-length", b"2"),
    ]


def test_the_target_extension_and_te_trailers() -> None:
    request = httpx.Request("OPTIONS", "http://a/", headers={"te": "trailers"})
    request.extensions["target"] = b"*"
    headers = request_headers(request)
    assert (b":path", b"*") in headers and (b"te", b"trailers") in headers


@given(
    st.binary(min_size=1, max_size=12),
    st.binary(max_size=12),
)
def test_refused_exactly_when_a_name_or_value_could_inject(name: bytes, value: bytes) -> None:
    request = httpx.Request("GET", "http://a/", headers=[(name, value)])
    bad_name = TOKEN.fullmatch(name) is None
    bad_value = any(c in value for c in b"\0\r\n")
    host_like = name.lower() == b"host" and re.search(rb"[\x00-\x20\x7f]", value) is not None
    if bad_name or bad_value or host_like:
        with pytest.raises(httpx.LocalProtocolError):
            request_headers(request)
    else:
        request_headers(request)


@pytest.mark.parametrize("method", ["GET\r\nX", "G ET", "GÉT", ""])
def test_a_method_must_be_a_token(method: str) -> None:
    request = httpx.Request("GET", "http://a/")
    request.method = method
    with pytest.raises(httpx.LocalProtocolError):
        request_headers(request)


def test_a_target_must_be_bytes() -> None:
    request = httpx.Request("GET", "http://a/")
    request.extensions["target"] = "/str"
    with pytest.raises(httpx.LocalProtocolError):
        request_headers(request)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ([(b":status", b"404"), (b"content-length", b"3")], (404, b"Not Found", 3)),
        ([(b":status", b"599")], (599, b"", None)),
        ([(b":status", b"20")], None),
        ([(b":status", b"abc")], None),
        ([(b":status", b"101")], None),
    ],
)
def test_the_response_head(
    raw: list[tuple[bytes, bytes]], expected: tuple[int, bytes, int | None] | None
) -> None:
    head, length = response_head(raw, 1)
    if expected is None:
        assert head is None
    else:
        assert head is not None
        assert (head.status, head.reason, length) == expected
        assert head.http_version == b"HTTP/2" and head.stream_id == 1


# -- h2's outbound normalisation and validation, done by request_headers ---------------------
# ``_http2.H2_CONFIG`` turns h2's own off; the list request_headers builds must be what h2
# would have sent, and a request h2 would have refused must be refused.  The reference is
# h2 with its default configuration, given the list a plain client builds (names lowercased,
# Host as :authority, TE other than "trailers" dropped): same verdict, same HEADERS bytes
# (so the same HPACK indexing: never-indexed secrets stay never indexed).
# BULKHEAD_FUZZ_EXAMPLES sets how many requests are generated (200 by default).
_WS = st.sampled_from([b"", b" ", b"\t", b"  ", b"\x0b", b"\x0c", b" \t"])
_VALUE = st.builds(
    lambda lead, core, trail: lead + core + trail,
    _WS,
    st.binary(max_size=30).map(lambda v: bytes(c for c in v if c not in b"\0\r\n")),
    _WS,
)
_NAME = st.sampled_from(
    [b"authorization", b"Proxy-Authorization", b"cookie", b"COOKIE", b"x-a", b"X-B", b"te",
     b"connection", b"keep-alive", b"upgrade", b"accept", b"set-cookie", b"host"]
)  # fmt: skip


def _plain_list(request: httpx.Request) -> list[tuple[bytes, bytes]]:
    authority = request.url.netloc
    rest = []
    for name, value in request.headers.raw:
        lowered = name.lower()
        if lowered == b"host":
            authority = value
        elif lowered != b"te" or value.lower() == b"trailers":
            rest.append((lowered, value))
    target = request.extensions.get("target", request.url.raw_path)
    pseudo = [(b":method", request.method.encode()), (b":authority", authority)]
    return [*pseudo, (b":scheme", request.url.raw_scheme), (b":path", target), *rest]


def _headers_frame(config: h2.config.H2Configuration, headers: Any) -> bytes | None:
    """The HEADERS frame h2 sends for ``headers`` on a fresh connection (None: refused)."""
    conn = h2.connection.H2Connection(config=config)
    conn.initiate_connection()
    conn.data_to_send()
    try:
        conn.send_headers(1, headers, end_stream=True)
    except h2.exceptions.ProtocolError:
        return None
    return conn.data_to_send()


@settings(max_examples=FUZZ_EXAMPLES, deadline=None)
@given(
    st.sampled_from(["GET", "POST", "CONNECT", "OPTIONS"]),
    st.lists(st.tuples(_NAME, _VALUE), max_size=6),
    st.sampled_from([None, b"", b"/", b"*", b"/p?q"]),
)
def test_the_list_and_verdict_are_h2s_own(
    method: str, headers: list[tuple[bytes, bytes]], target: bytes | None
) -> None:
    request = httpx.Request(method, "http://a.example:8080/x", headers=headers)
    if target is not None:
        request.extensions["target"] = target
    host = request.headers.get("host")
    if host is not None and re.search(r"[\x00-\x20\x7f]", host):
        return  # refused by request_headers before (Host as :authority), not h2's concern
    reference = _headers_frame(
        h2.config.H2Configuration(header_encoding=None), _plain_list(request)
    )
    try:
        ours = _headers_frame(H2_CONFIG, request_headers(request))
    except httpx.LocalProtocolError:
        ours = None
    assert ours == reference


def test_secrets_are_never_indexed() -> None:
    request = httpx.Request(
        "GET", "http://a/", headers=[("authorization", "Basic eDp5"), ("cookie", "a=1")]
    )
    sent = [(n, v) for n, v in request_headers(request) if not n.startswith(b":")]
    assert sent == [(b"authorization", b"Basic eDp5"), (b"cookie", b"a=1")]
    assert all(isinstance(h, NeverIndexedHeaderTuple) for h in request_headers(request)[4:])
