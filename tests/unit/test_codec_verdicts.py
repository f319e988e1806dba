"""One verdict from both HTTP/1.1 codecs, decided shape by shape.

Each case below is a request shape on which h11 and httptools once disagreed, with the
verdict we chose: h11's, except where RFC 9112 makes us stricter (then the README says so).
Every case checks both that the codecs agree and that the agreed verdict is the decided one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from httpx_bulkhead._codec import LocalCodecError, make_codec
from tests.fuzz.harness import Request, request_verdicts

SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
HOST = (b"Host", b"example.com")


# ------------------------------------------------------------------------- requests


@dataclass
class Sent:
    """The decided request-side verdict: the bytes written, or refused at call ``refused``
    (0: the head, 1: the first ``data()``, ...)."""

    wire: bytes = b""
    refused: int | None = None


def sent(trace: list[Any]) -> Sent:
    calls = [item for item in trace if not isinstance(item, tuple)]
    if calls[-1] == "refused":
        return Sent(b"".join(calls[:-1]), len(calls) - 1)
    return Sent(b"".join(calls))


REQUESTS: dict[str, tuple[Request, Sent]] = {
    # Issue item 1: the body is counted against Content-Length.
    "surplus smuggles a request": (
        Request(b"POST", b"/", [HOST, (b"Content-Length", b"5")], [b"hello" + SMUGGLED]),
        Sent(b"POST / HTTP/1.1\r\nHost: example.com\r\nContent-Length: 5\r\n\r\n", refused=1),
    ),
    "surplus in a later piece": (
        Request(b"POST", b"/", [HOST, (b"Content-Length", b"5")], [b"hel", b"lo", b"!"]),
        Sent(b"POST / HTTP/1.1\r\nHost: example.com\r\nContent-Length: 5\r\n\r\nhello", 3),
    ),
    "short body": (
        Request(b"POST", b"/", [HOST, (b"Content-Length", b"10")], [b"hello"]),
        Sent(b"POST / HTTP/1.1\r\nHost: example.com\r\nContent-Length: 10\r\n\r\nhello", 2),
    ),
    "body without framing": (
        Request(b"POST", b"/", [HOST], [b"x"]),
        Sent(b"POST / HTTP/1.1\r\nHost: example.com\r\n\r\n", refused=1),
    ),
    "data after end": (
        Request(b"POST", b"/", [HOST, (b"Content-Length", b"1")], [b"x"], extra=b"y"),
        Sent(b"POST / HTTP/1.1\r\nHost: example.com\r\nContent-Length: 1\r\n\r\nx", 3),
    ),
    # An empty piece of a chunked body was encoded as the last chunk (the rest smuggled).
    "empty chunk": (
        Request(b"POST", b"/", [HOST, (b"Transfer-Encoding", b"chunked")], [b"ab", b"", b"c"]),
        Sent(
            b"POST / HTTP/1.1\r\nHost: example.com\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"2\r\nab\r\n1\r\nc\r\n0\r\n\r\n"
        ),
    ),
    # Stricter than h11, which sends both: RFC 9112 §6.2, a sender MUST NOT.
    "Content-Length with Transfer-Encoding": (
        Request(
            b"POST",
            b"/",
            [HOST, (b"Content-Length", b"5"), (b"Transfer-Encoding", b"chunked")],
            [b"hello"],
        ),
        Sent(refused=0),
    ),
    # h11's normalizations, now also the fast codec's.
    "equal Content-Length values collapse": (
        Request(
            b"PUT", b"/", [HOST, (b"Content-Length", b"1, 1"), (b"content-length", b"1")], [b"x"]
        ),
        Sent(b"PUT / HTTP/1.1\r\nHost: example.com\r\nContent-Length: 1\r\n\r\nx"),
    ),
    "Transfer-Encoding value lowercased": (
        Request(b"POST", b"/", [HOST, (b"Transfer-Encoding", b"Chunked")]),
        Sent(
            b"POST / HTTP/1.1\r\nHost: example.com\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        ),
    ),
    "Host written first": (
        Request(b"GET", b"/", [(b"Accept", b"*/*"), HOST]),
        Sent(b"GET / HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n"),
    ),
    # h11's refusals, now also the fast codec's.
    "no Host": (Request(b"GET", b"/", [(b"Accept", b"*/*")]), Sent(refused=0)),
    "two Hosts": (Request(b"GET", b"/", [HOST, (b"host", b"other")]), Sent(refused=0)),
    "value with leading space": (Request(b"GET", b"/", [HOST, (b"X", b" a")]), Sent(refused=0)),
    "value with VT": (Request(b"GET", b"/", [HOST, (b"X", b"a\x0bb")]), Sent(refused=0)),
    "target with space": (Request(b"GET", b"/a b", [HOST]), Sent(refused=0)),
    "target with obs-text": (Request(b"GET", b"/\x80", [HOST]), Sent(refused=0)),
    "odd transfer coding": (
        Request(b"POST", b"/", [HOST, (b"Transfer-Encoding", b"gzip, chunked")]),
        Sent(refused=0),
    ),
}


@pytest.mark.parametrize("case", list(REQUESTS))
def test_requests_encode_as_decided(case: str) -> None:
    request, decided = REQUESTS[case]
    reference, fast = request_verdicts(request)
    assert fast == reference
    assert sent(reference) == decided


def test_waiting_for_continue_ends_with_the_body() -> None:
    """The fast codec kept waiting for 100 after ``end()``; h11 does not."""
    headers = [HOST, (b"Expect", b"100-continue"), (b"Content-Length", b"1")]
    for codec in (make_codec("h11", 1024), make_codec("httptools", 1024)):
        codec.request(b"POST", b"/", headers)
        assert codec.waiting_for_continue
        codec.data(b"x")
        codec.end()
        assert not codec.waiting_for_continue


def test_local_codec_error_is_what_misuse_raises() -> None:
    codec = make_codec("httptools", 1024)
    with pytest.raises(LocalCodecError):
        codec.data(b"no request yet")
