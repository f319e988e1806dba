"""Differential tests of the HTTP/1.1 codecs: the fast one (httptools) must produce what
the reference (h11) produces, for any way the bytes are split into reads."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from httpx_bulkhead._codec import (
    END,
    NEED_DATA,
    CodecError,
    H11Codec,
    Head,
    Informational,
    LocalCodecError,
    framing_in_doubt,
)
from httpx_bulkhead._httptools import HttptoolsCodec

GET = (b"GET", b"/", [(b"Host", b"example.com")])
HEAD = (b"HEAD", b"/", [(b"Host", b"example.com")])
CLOSE = (b"GET", b"/", [(b"Host", b"example.com"), (b"Connection", b"close")])

CASES: list[tuple[str, tuple[bytes, bytes, list[tuple[bytes, bytes]]], bytes]] = [
    ("length", GET, b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"),
    ("empty", GET, b"HTTP/1.1 204 No Content\r\n\r\n"),
    ("not-modified", GET, b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n"),
    (
        "chunked",
        GET,
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    ),
    ("close", GET, b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"),
    ("http10", GET, b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"),
    ("eof-body", GET, b"HTTP/1.1 200 OK\r\n\r\nuntil the end"),
    ("eof-body-headers", GET, b"HTTP/1.1 200 OK\r\nServer: x\r\nX-A: 1\r\n\r\nuntil the end"),
    ("head", HEAD, b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"),
    (
        "informational",
        GET,
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    ),
    ("we-close", CLOSE, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
    ("trailing", GET, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n"),
    ("garbage-after", GET, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok\x00\x01garbage"),
    ("bad-status", GET, b"HTTX/9.9 banana\r\n\r\n"),
    ("bad-chunk", GET, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
    ("truncated", GET, b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort"),
    ("no-response", GET, b""),
    (
        "both-framings",
        GET,
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\n",
    ),
    (
        "http10-chunked",
        GET,
        b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    ),
    ("reason-spaces", GET, b"HTTP/1.1 418 I'm a teapot\r\nContent-Length: 0\r\n\r\n"),
    (
        "set-cookie",
        GET,
        b"HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nContent-Length: 0\r\n\r\n",
    ),
]


def run(
    codec: Any,
    request: tuple[bytes, bytes, list[tuple[bytes, bytes]]],
    wire: bytes,
    cuts: list[int],
) -> list[Any]:
    """Drive a codec through one exchange, reads cut at ``cuts``; a normalized trace."""
    method, target, headers = request
    codec.request(method, target, headers)
    codec.end()
    trace: list[Any] = []
    body = b""
    pos = 0
    pieces = []
    for cut in cuts:
        if pos >= len(wire):
            break
        pieces.append(wire[pos : pos + cut])
        pos += cut
    if pos < len(wire):
        pieces.append(wire[pos:])
    pieces.append(b"")  # end of stream
    try:
        for index, piece in enumerate(pieces):
            codec.feed(piece)
            while (event := codec.next_event()) is not NEED_DATA:
                if type(event) is bytes:
                    body += event
                    continue
                if type(event) is Head:
                    lowered = [(k.lower(), v) for k, v in event.headers]
                    event = Head(event.status, lowered, event.http_version, event.reason)
                trace.append(event)
                if event is END:
                    trace.append(("body", body))
                    reusable = codec.reuse()
                    for rest in pieces[index + 1 : -1]:  # what follows, short of EOF
                        codec.feed(rest)
                    trace.append(("reuse", reusable, codec.has_trailing_data))
                    return trace
                if repr(event) == "CLOSED":  # h11 raises instead: both mean "no response"
                    trace[-1] = "error"
                    return trace
                if repr(event) == "PAUSED":
                    return trace
    except CodecError:
        trace.append("error")
    return trace


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 40), max_size=12))
@pytest.mark.parametrize(("name", "request_", "wire"), CASES, ids=[c[0] for c in CASES])
def test_httptools_codec_matches_h11(
    name: str,
    request_: tuple[bytes, bytes, list[tuple[bytes, bytes]]],
    wire: bytes,
    cuts: list[int],
) -> None:
    reference = run(H11Codec(65536), request_, wire, cuts)
    fast = run(HttptoolsCodec(65536), request_, wire, cuts)
    if name in ("trailing", "garbage-after"):
        # Bytes after the response: the codecs may say so differently (h11: not reusable;
        # httptools: reusable, with trailing data), but what the connection does is the
        # same: it is not kept (``check_reusable`` discards one with trailing data).  Every
        # event, the body and that verdict must agree.
        fast, reference = kept(fast), kept(reference)
        assert fast[-1] == ("kept", False)
    assert fast == reference


def kept(trace: list[Any]) -> list[Any]:
    """The trace with its reuse verdict as the transport acts on it: kept or not."""
    _, reusable, trailing = trace[-1]
    return [*trace[:-1], ("kept", reusable and not trailing)]


def test_request_encoding_is_validated_and_framed() -> None:
    for codec in (H11Codec(1024), HttptoolsCodec(1024)):
        with pytest.raises(LocalCodecError):
            codec.request(b"GET", b"/", [(b"Host", b"x"), (b"X-Bad", b"a\r\nInjected: 1")])
    fast, ref = HttptoolsCodec(1024), H11Codec(1024)
    headers = [(b"Host", b"x"), (b"Transfer-Encoding", b"chunked")]
    assert fast.request(b"POST", b"/up", headers) == ref.request(b"POST", b"/up", headers)
    assert fast.data(b"hello") == ref.data(b"hello")
    assert fast.end() == ref.end()


def test_head_too_long_is_an_error() -> None:
    codec = HttptoolsCodec(100)
    codec.request(*GET)
    codec.end()
    with pytest.raises(CodecError, match="too long"):
        codec.feed(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 200)


def test_informational_then_final() -> None:
    codec = HttptoolsCodec(1024)
    codec.request(
        b"POST", b"/", [(b"Host", b"x"), (b"Expect", b"100-continue"), (b"Content-Length", b"2")]
    )
    assert codec.waiting_for_continue
    codec.feed(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert codec.waiting_for_continue  # until the answer is taken
    assert codec.next_event() == Informational(100)
    assert not codec.waiting_for_continue


def test_make_codec_refuses_an_unknown_parser_name() -> None:
    """Codecs are validated where they are made: an unknown name is an error, not h11."""
    from httpx_bulkhead._codec import make_codec
    from httpx_bulkhead._parser_choice import choose_parser

    assert isinstance(make_codec("h11", 1024), H11Codec)
    assert isinstance(make_codec("httptools", 1024), HttptoolsCodec)
    for name in ("llhttp", "H11", ""):
        with pytest.raises(ValueError, match="http1_parser must be 'h11' or 'httptools'"):
            make_codec(name, 1024)
        with pytest.raises(ValueError, match=repr(name)):
            choose_parser(name)
    assert choose_parser("httptools").parser == "httptools"


def test_request_side_errors_agree() -> None:
    """What a caller must not do is refused by both codecs, before a byte is produced."""
    post = [(b"Host", b"x")]  # a body with neither Content-Length nor chunked
    for make in (H11Codec, HttptoolsCodec):
        codec = make(1024)
        with pytest.raises(LocalCodecError):
            codec.request(b"GE T", b"/", [(b"Host", b"x")])  # not a method token
        with pytest.raises(LocalCodecError):
            codec.request(b"GET", b"/a b", [(b"Host", b"x")])  # a space in the target
        with pytest.raises(LocalCodecError):
            codec.request(b"GET", b"", [(b"Host", b"x")])  # no target
        assert codec.request(b"POST", b"/", post).startswith(b"POST / HTTP/1.1\r\n")
        with pytest.raises(LocalCodecError):
            codec.data(b"unframed")
        with pytest.raises(LocalCodecError):  # one request at a time
            codec.request(b"GET", b"/", [(b"Host", b"x")])


def test_head_exchange_answers_like_h11() -> None:
    """HEAD goes through h11 inside the httptools codec: every question is answered by it,
    and a request body is refused."""
    for codec in (H11Codec(1024), HttptoolsCodec(1024)):
        codec.request(*HEAD)
        with pytest.raises(LocalCodecError):
            codec.data(b"x")
    codecs = (H11Codec(1024), HttptoolsCodec(1024))
    for codec in codecs:
        codec.request(*HEAD)
    views = [(c.awaiting_response, c.waiting_for_continue, c.has_trailing_data) for c in codecs]
    assert views == [(True, False, False)] * 2
    for codec in codecs:
        codec.end()
        codec.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nextra")
    for codec in codecs:
        assert type(codec.next_event()) is Head
        assert codec.next_event() is END
        assert not codec.awaiting_response
        assert codec.has_trailing_data  # bytes after a HEAD response's head: not kept


@pytest.mark.parametrize(
    ("version", "length", "coding", "doubt"),
    [
        (b"1.1", False, False, False),
        (b"1.1", True, False, False),  # Content-Length
        (b"1.1", False, True, False),  # chunked
        (b"1.1", True, True, True),  # both (RFC 9112 §6.3)
        (b"1.0", False, False, False),
        (b"1.0", True, False, False),
        (b"1.0", False, True, True),  # Transfer-Encoding in HTTP/1.0 (§6.1)
        (b"1.0", True, True, True),
    ],
)
def test_framing_in_doubt(version: bytes, length: bool, coding: bool, doubt: bool) -> None:
    assert framing_in_doubt(version, length, coding) is doubt


@pytest.mark.parametrize("make", [H11Codec, HttptoolsCodec])
def test_a_response_whose_framing_is_in_doubt_closes_its_connection(make: Any) -> None:
    """Read by its Transfer-Encoding, then not reused (a plain chunked response is)."""
    chunked = b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    heads = {
        b"HTTP/1.1 200 OK\r\n": True,
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n": False,
        b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n": False,  # a split response
        b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n": False,
    }
    for head, reusable in heads.items():
        codec = make(1024)
        codec.request(*GET)
        codec.end()
        codec.feed(head + chunked)
        assert type(codec.next_event()) is Head
        assert codec.next_event() == b"hello"
        assert codec.next_event() is END
        assert codec.reuse() is reusable, head
