"""HTTP/2 request header lists: the pseudo-headers first, names lowercased, connection
headers dropped, and nothing that could be injected through a hop that speaks HTTP/1.1."""

from __future__ import annotations

import re

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from httpx_bulkhead._h2headers import request_headers, response_head

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
