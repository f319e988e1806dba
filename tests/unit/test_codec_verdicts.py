"""One verdict from both HTTP/1.1 codecs, decided shape by shape.

Each case below is a request or response shape on which h11 and httptools once disagreed
(the issue's list, and what the differential fuzzer in ``tests/fuzz`` found since), with the
verdict we chose: h11's, except where RFC 9112 makes us stricter (then the README says so).
Every case checks both that the codecs agree, read whole and byte by byte, and that the
agreed verdict is the decided one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from httpx_bulkhead._codec import NEED_DATA, CodecError, LocalCodecError, make_codec
from tests.fuzz.harness import Exchange, Request, request_verdicts, verdicts

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
    calls = [item for item in trace if not isinstance(item, tuple) or item[0] == "refused"]
    if isinstance(calls[-1], tuple):  # ("refused", message)
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
    # Found by the fuzzer: an empty piece of a chunked body was encoded as the last chunk.
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
    """Found by the fuzzer: the fast codec kept waiting for 100 after ``end()``."""
    headers = [HOST, (b"Expect", b"100-continue"), (b"Content-Length", b"1")]
    for codec in (make_codec("h11", 1024), make_codec("httptools", 1024)):
        codec.request(b"POST", b"/", headers)
        assert codec.waiting_for_continue
        codec.data(b"x")
        codec.end()
        assert not codec.waiting_for_continue


# ------------------------------------------------------------------------ responses


@dataclass
class Verdict:
    """The decided response-side verdict."""

    error: bool = False
    body: bytes = b""
    headers: list[tuple[bytes, bytes]] | None = None
    reusable: bool = True


def verdict_of(trace: list[Any]) -> Verdict:
    steps = trace[-1]
    items = [item for entry in steps if type(entry[0]) is int for item in entry[1]]
    if any(item[0] == "error" for item in items):  # ("error", message)
        return Verdict(error=True, reusable=False)
    head = next(item for item in items if item[0] == "head")
    body = b"".join(item[1] for item in items if item[0] == "data")
    reusable = steps[-1][0] == "reusable" and steps[-1][1] and not steps[-1][3]
    return Verdict(body=body, headers=head[2], reusable=reusable)


def ok(body: bytes = b"hello", **kwargs: Any) -> Verdict:
    return Verdict(body=body, **kwargs)


ERROR = Verdict(error=True, reusable=False)
CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
TE = (b"Transfer-Encoding", b"chunked")

# name: (response bytes, the peer closes after them, decided verdict)
RESPONSES: dict[str, tuple[bytes, bool, Verdict]] = {
    # Issue item 3.
    "gzip, chunked": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        False,
        ERROR,
    ),
    "chunked, identity: refused at once, not at EOF": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, identity\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        False,
        ERROR,
    ),
    # Framing in doubt (RFC 9112 §6.3, §6.1): read by Transfer-Encoding, as h11 reads it,
    # and the connection closes after it (stricter than h11, which keeps it).
    "Content-Length with Transfer-Encoding: chunked wins, then close": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\n",
        False,
        ok(headers=[(b"Content-Length", b"3"), TE], reusable=False),
    ),
    "Transfer-Encoding before Content-Length": (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\ncontent-length: 5\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\n",
        False,
        ok(headers=[(b"transfer-encoding", b"chunked"), (b"content-length", b"5")], reusable=False),
    ),
    "response split: the chunked body ends early, Content-Length counts a second response": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 52\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\n",
        False,
        ok(headers=[(b"Content-Length", b"52"), TE], reusable=False),
    ),
    "response split, the second response in the same read": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 52\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled",
        False,
        ok(headers=[(b"Content-Length", b"52"), TE], reusable=False),
    ),
    "HTTP/1.0 with Transfer-Encoding and keep-alive": (
        b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\n",
        False,
        ok(headers=[(b"Connection", b"keep-alive"), TE], reusable=False),
    ),
    "HTTP/1.0 with both framings": (
        b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\n",
        False,
        ok(headers=[(b"Content-Length", b"3"), TE], reusable=False),
    ),
    "204 with both framings": (
        b"HTTP/1.1 204 No Content\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        False,
        ok(b"", headers=[(b"Content-Length", b"3"), TE], reusable=False),
    ),
    "Content-Length with another coding": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: gzip\r\n\r\nhello",
        False,
        ERROR,
    ),
    "obs-fold is unfolded": (
        b"HTTP/1.1 200 OK\r\nX: a\r\n  b\r\nContent-Length: 5\r\n\r\nhello",
        False,
        ok(headers=[(b"X", b"a b"), (b"Content-Length", b"5")]),
    ),
    "bare LF": (
        b"HTTP/1.1 200 OK\nX: 1\nContent-Length: 5\n\nhello",
        False,
        ok(headers=[(b"X", b"1"), (b"Content-Length", b"5")]),
    ),
    "Content-Length: 5, 5": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello",
        False,
        ok(headers=[(b"Content-Length", b"5")]),
    ),
    "repeated Content-Length": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\nhello",
        False,
        ok(headers=[(b"Content-Length", b"5")]),
    ),
    "conflicting Content-Length": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        False,
        ERROR,
    ),
    "Transfer-Encoding: identity": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\n\r\nhello",
        True,
        ERROR,
    ),
    "Transfer-Encoding: Chunked": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        False,
        ok(headers=[TE]),
    ),
    # Found by the fuzzer.
    "HTTP/1.0 with keep-alive is not reused": (
        b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 5\r\n\r\nhello",
        False,
        ok(headers=[(b"Connection", b"keep-alive"), (b"Content-Length", b"5")], reusable=False),
    ),
    "another version": (
        b"HTTP/2.0 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        False,
        ok(headers=[(b"Content-Length", b"5")]),
    ),
    "status below 100": (b"HTTP/1.1 099 OK\r\nContent-Length: 5\r\n\r\nhello", False, ERROR),
    "blank line before the status line": (
        b"\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        False,
        ERROR,
    ),
    "VT in the reason phrase": (
        b"HTTP/1.1 200 O\x0bK\r\nContent-Length: 5\r\n\r\nhello",
        False,
        ERROR,
    ),
    "control character in a value": (
        b"HTTP/1.1 200 OK\r\nX: a\x01b\r\nContent-Length: 5\r\n\r\nhello",
        False,
        ok(headers=[(b"X", b"a\x01b"), (b"Content-Length", b"5")]),
    ),
    "trailing whitespace is not part of a value": (
        b"HTTP/1.1 200 OK\r\nX: 1 \t\r\nContent-Length: 5\r\n\r\nhello",
        False,
        ok(headers=[(b"X", b"1"), (b"Content-Length", b"5")]),
    ),
    "a blank line after the response": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello\r\n",
        False,
        ok(headers=[(b"Content-Length", b"5")], reusable=False),
    ),
    "unsolicited 101": (b"HTTP/1.1 101 Switching Protocols\r\n\r\n", False, ERROR),
    "1xx then final": (
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5"
        b"\r\n\r\nhello",
        False,
        ok(headers=[(b"Content-Length", b"5")]),
    ),
    "trailers are dropped, not added to the head": (
        CHUNKED + b"5\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n",
        False,
        ok(headers=[TE]),
    ),
    "folded trailer": (CHUNKED + b"5\r\nhello\r\n0\r\nX: a\r\n b\r\n\r\n", False, ok(headers=[TE])),
    "bare LF in the trailer section": (
        CHUNKED + b"5\r\nhello\r\n0\r\nX: a\n\n",
        False,
        ok(headers=[TE]),
    ),
    "malformed trailer": (CHUNKED + b"5\r\nhello\r\n0\r\nbad line\r\n\r\n", False, ERROR),
    "Transfer-Encoding in the trailers": (
        CHUNKED + b"5\r\nhello\r\n0\r\nTransfer-Encoding: gzip\r\n\r\n",
        False,
        ERROR,
    ),
    "spaces after the chunk size": (
        CHUNKED + b"5  \r\nhello\r\n0\r\n\r\n",
        False,
        ok(headers=[TE]),
    ),
    "space before a chunk extension": (CHUNKED + b"5 ;a=b\r\nhello\r\n0\r\n\r\n", False, ERROR),
    "CR in a chunk extension": (
        CHUNKED + b"5;a\rb\r\nhello\r\n0\r\n\r\n",
        False,
        ok(headers=[TE]),
    ),
    "21 hex digits": (CHUNKED + b"0" * 20 + b"5\r\nhello\r\n0\r\n\r\n", False, ERROR),
    "20 hex digits": (CHUNKED + b"0" * 19 + b"5\r\nhello\r\n0\r\n\r\n", False, ok(headers=[TE])),
    "no CRLF after chunk data": (CHUNKED + b"5\r\nhelloXX0\r\n\r\n", False, ERROR),
    "LF after chunk data": (CHUNKED + b"5\r\nhello\n0\r\n\r\n", False, ERROR),
    "EOF inside a chunked body": (CHUNKED + b"5\r\nhel", True, ERROR),
    "EOF after the last chunk": (CHUNKED + b"5\r\nhello\r\n0\r\n", True, ERROR),
}


@pytest.mark.parametrize("case", list(RESPONSES))
@pytest.mark.parametrize("reads", ["whole", "bytewise"])
def test_responses_get_the_decided_verdict(case: str, reads: str) -> None:
    wire, eof, decided = RESPONSES[case]
    pieces = [wire] if reads == "whole" else [wire[i : i + 1] for i in range(len(wire))]
    request = Request(headers=[HOST])
    reference, fast = verdicts([Exchange(request, pieces, eof=eof)])
    assert fast == reference
    assert verdict_of(reference) == decided


def test_a_head_response_with_both_framings_closes_the_connection() -> None:
    """No body follows a HEAD response whatever its framing fields (RFC 9112 §6.3 rule 1),
    but a server that sends both broke §6.2: its connection is not reused either."""
    wire = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
    request = Request(method=b"HEAD", headers=[HOST])
    reference, fast = verdicts([Exchange(request, [wire], eof=False)])
    assert fast == reference
    assert verdict_of(reference) == ok(b"", headers=[(b"Content-Length", b"3"), TE], reusable=False)


def test_an_h11_exchange_leaves_trailing_data_noticed() -> None:
    """Found by the fuzzer: after an exchange h11 parsed for the fast codec (here a 1xx
    came first), bytes after the response were forgotten when the codec went idle."""
    wire = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n\r\n"
    request = Request(headers=[HOST, (b"Connection", b"close")])
    reference, fast = verdicts([Exchange(request, [wire], eof=False)])
    assert fast == reference
    assert reference[0][-1] == ("reusable", False, "trailing", True)


def test_the_next_exchange_starts_clean() -> None:
    """After a chunked or h11-parsed exchange the fast codec's llhttp parser is replaced,
    so the next response on the connection parses normally."""
    first_wires = [
        CHUNKED + b"5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 103 Early Hints\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello",
    ]
    second = Exchange(Request(headers=[HOST]), [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"])
    second.eof = False
    for wire in first_wires:
        first = Exchange(Request(headers=[HOST]), [wire], eof=False)
        reference, fast = verdicts([first, second])
        assert fast == reference
        assert len(reference) == 2
        assert verdict_of(reference) == ok(b"ok", headers=[(b"Content-Length", b"2")])


# ------------------------------------------------------------- bounded buffers (item 2)

LIMIT = 1024


FLOODS = {
    "trailer lines": CHUNKED + b"5\r\nhello\r\n0\r\n",
    "one trailer line": CHUNKED + b"5\r\nhello\r\n0\r\nX-Long: ",
    "a chunk-size line": CHUNKED + b"5;ext=",
    "the reason phrase": b"HTTP/1.1 200 ",
    "header lines, read by read": b"HTTP/1.1 200 OK\r\n",
}


@pytest.mark.parametrize("case", list(FLOODS))
@pytest.mark.parametrize("parser", ["h11", "httptools"])
def test_every_buffer_is_bounded_by_the_head_limit(case: str, parser: str) -> None:
    """Megabytes of one message part fail the response once past the limit, whatever the
    part: the codec never holds much more than the limit."""
    line = b"X-Flood: " + b"a" * 40 + b"\r\n" if "lines" in case else b"a" * 50
    codec = make_codec(parser, LIMIT)
    codec.request(b"GET", b"/", [HOST])
    codec.end()
    pieces = [FLOODS[case]] + [line] * 100_000  # about 5 MB
    taken = 0
    with pytest.raises(CodecError, match=r"(?i)too long"):
        for piece in pieces:
            codec.feed(piece)
            taken += len(piece)
            while codec.next_event() is not NEED_DATA:
                pass
    assert taken <= 2 * LIMIT + 100


def test_local_codec_error_is_what_misuse_raises() -> None:
    codec = make_codec("httptools", LIMIT)
    with pytest.raises(LocalCodecError):
        codec.data(b"no request yet")
