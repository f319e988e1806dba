"""What a user sees through the transport is the same with either HTTP/1.1 parser.

``tests/fuzz`` compares the codecs' verdicts (events, body, reuse; an error's *class*), and
the fault matrix runs every HTTP/1.1 row with both.  Neither compares what reaches the
caller: the ``httpx.Response`` (status, ``reason_phrase``, ``http_version``,
``headers.raw`` with case and order, body) or, for bad input, the exception's class *and
message*.  Since httptools became the default when installed, a message that differs from
h11's is a change users see (logs, alerts matching on text), so the messages must agree
too: h11's words are the reference, except past the head limit, where both say which part
was too long and the limit (h11's own text, "Receive buffer too long", says neither).

Three tests, all against a raw-socket server on 127.0.0.1 that answers each connection's
request with scripted bytes and closes (``tests/servers/raw.py``):

* ``test_each_shape_looks_the_same`` -- a catalogue of shapes (header case and order,
  obs-fold, obs-text, HTTP/1.0, close-delimited bodies, HEAD, 1xx, 101, 204/304 with a
  body, trailers, the head limit, truncation at every point of a chunked body, ...), through
  ``BulkheadTransport`` under asyncio and trio, each with its expected outcome so a
  shape cannot quietly stop exercising what it names;
* ``test_each_refused_request_reads_the_same`` -- requests the codecs refuse (header
  syntax, Host, framing, a body that does not match its ``Content-Length``): the same
  ``httpx.LocalProtocolError`` message;
* ``test_generated_responses_look_the_same`` -- Hypothesis responses from the fuzzer's
  generator (``tests/fuzz/strategies.response_wire``), GET or HEAD, through
  ``BulkheadHTTPTransport``; the transports' counters must agree as well.
  ``BULKHEAD_CODEC_VIEW_EXAMPLES`` examples (100 by default: about 3 s on a quiet
  machine, 6 s under load; the timeout grows with the number).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from httpx_bulkhead import BulkheadHTTPTransport, BulkheadTransport
from httpx_bulkhead._http11 import MAX_HEAD_SIZE
from tests.fuzz.strategies import response_wire
from tests.servers import RawConn, RawServer

pytestmark = pytest.mark.explicit_parser  # both parsers in every test

EXAMPLES = int(os.environ.get("BULKHEAD_CODEC_VIEW_EXAMPLES") or 100)
PARSERS = ("h11", "httptools")
TIMEOUT = 5.0  # every response here ends with the server's close: nothing waits for it

OK = "OK"
CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
LENGTH_2 = b"Content-Length: 2\r\n\r\nok"

#: name -> (response bytes, request method, expected status or exception class)
SHAPES: dict[str, tuple[bytes, str, int | type[Exception]]] = {
    "header case and order": (
        b"HTTP/1.1 200 OK\r\nX-MiXed-CASE: v\r\nset-cookie: a=1\r\nSet-Cookie: b=2\r\n" + LENGTH_2,
        "GET",
        200,
    ),
    "obs-fold": (b"HTTP/1.1 200 OK\r\nX-F: a\r\n\tb\r\n" + LENGTH_2, "GET", 200),
    "obs-text in a value": (b"HTTP/1.1 200 OK\r\nX-V: caf\xe9 \x80\xff\r\n" + LENGTH_2, "GET", 200),
    "non-ASCII reason": (b"HTTP/1.1 200 \xc3\xa9t\xc3\xa9 \xff\r\n" + LENGTH_2, "GET", 200),
    "reason with spaces": (b"HTTP/1.1 404  Not  Found \r\n" + LENGTH_2, "GET", 404),
    "no reason": (b"HTTP/1.1 200\r\n" + LENGTH_2, "GET", 200),
    "value whitespace, empty value": (
        b"HTTP/1.1 200 OK\r\nX-W:   padded   \r\nX-Empty:\r\n" + LENGTH_2,
        "GET",
        200,
    ),
    "bare LF": (b"HTTP/1.1 200 OK\nX: 1\nContent-Length: 2\n\nok", "GET", 200),
    "HTTP/1.0 with length": (b"HTTP/1.0 200 OK\r\n" + LENGTH_2, "GET", 200),
    "HTTP/1.0 close-delimited": (b"HTTP/1.0 200 Fine\r\n\r\nuntil eof", "GET", 200),
    "HTTP/1.1 close-delimited": (
        b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil eof",
        "GET",
        200,
    ),
    "HEAD with a length": (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", "HEAD", 200),
    "1xx before the response": (
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\n" + LENGTH_2,
        "GET",
        200,
    ),
    "101 not asked for": (
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
        "GET",
        httpx.RemoteProtocolError,
    ),
    "304 with a body": (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\nhello", "GET", 304),
    "204 with a body": (b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello", "GET", 204),
    "equal Content-Lengths": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n" + LENGTH_2,
        "GET",
        200,
    ),
    "conflicting Content-Lengths": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nokk",
        "GET",
        httpx.RemoteProtocolError,
    ),
    "chunked with trailers": (CHUNKED + b"2\r\nok\r\n0\r\nX-T: 1\r\n\r\n", "GET", 200),
    "chunk extension": (CHUNKED + b"2;a=b\r\nok\r\n0\r\n\r\n", "GET", 200),
    "invalid trailer": (
        CHUNKED + b"2\r\nok\r\n0\r\nX T: 1\r\n\r\n",
        "GET",
        httpx.RemoteProtocolError,
    ),
    "illegal chunk header": (
        CHUNKED + b"zz\r\nok\r\n0\r\n\r\n",
        "GET",
        httpx.RemoteProtocolError,
    ),
    "long illegal chunk header": (
        CHUNKED + b"z" * 100 + b"\r\n",
        "GET",
        httpx.RemoteProtocolError,
    ),
    "malformed chunk footer": (CHUNKED + b"2\r\nokXX0\r\n\r\n", "GET", httpx.RemoteProtocolError),
    "head over the limit": (
        b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (MAX_HEAD_SIZE + 10) + b"\r\n\r\n",
        "GET",
        httpx.RemoteProtocolError,
    ),
    "chunk-size line over the limit": (
        CHUNKED + b"1" * (MAX_HEAD_SIZE + 10),
        "GET",
        httpx.RemoteProtocolError,
    ),
    "trailer section over the limit": (
        CHUNKED + b"2\r\nok\r\n0\r\nX: " + b"a" * (MAX_HEAD_SIZE + 10),
        "GET",
        httpx.RemoteProtocolError,
    ),
    "closed inside the head": (b"HTTP/1.1 200 OK\r\nContent-Le", "GET", httpx.RemoteProtocolError),
    "closed inside a length-delimited body": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nok",
        "GET",
        httpx.RemoteProtocolError,
    ),
    "closed inside a chunk-size line": (CHUNKED + b"5", "GET", httpx.RemoteProtocolError),
    "closed inside chunk data": (CHUNKED + b"5\r\nok", "GET", httpx.RemoteProtocolError),
    "closed inside a chunk's CRLF": (CHUNKED + b"2\r\nok\r", "GET", httpx.RemoteProtocolError),
    "closed before the trailer section": (
        CHUNKED + b"2\r\nok\r\n0\r\n",
        "GET",
        httpx.RemoteProtocolError,
    ),
    "closed inside the trailer section": (
        CHUNKED + b"2\r\nok\r\n0\r\nX: 1\r\n",
        "GET",
        httpx.RemoteProtocolError,
    ),
    "closed before any byte": (b"", "GET", httpx.RemoteProtocolError),
}


def _answer_and_close(wire: list[bytes]) -> Any:
    """Each connection: read a request, send ``wire[0]``, close (after the client does)."""

    def handler(conn: RawConn) -> None:
        if conn.read_request() is not None:
            conn.send(wire[0])
            conn.sock.shutdown(socket.SHUT_WR)
            while conn.recv():  # closing with unread input would send an RST
                pass

    return handler


def _response_view(response: httpx.Response) -> tuple[Any, ...]:
    return (
        response.status_code,
        response.reason_phrase,
        response.http_version,
        response.headers.raw,
        response.content,
    )


def _error_view(exc: Exception) -> tuple[Any, ...]:
    return (type(exc), str(exc))


def _checked(view: tuple[Any, ...], expected: int | type[Exception]) -> tuple[Any, ...]:
    assert view[0] == expected, view
    return view


@pytest.mark.anyio
@pytest.mark.parametrize("shape", list(SHAPES))
async def test_each_shape_looks_the_same(shape: str, anyio_backend: str) -> None:
    wire, method, expected = SHAPES[shape]
    views = []
    with RawServer(_answer_and_close([wire])) as srv:
        for parser in PARSERS:
            transport = BulkheadTransport(http1_parser=parser, trust_env=False)
            async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
                with anyio.fail_after(TIMEOUT):
                    try:
                        view = _response_view(await client.request(method, srv.url))
                    except httpx.HTTPError as exc:
                        view = _error_view(exc)
                views.append(_checked(view, expected))
                stats = transport.statistics()[srv.url]
                assert (stats.running, stats.in_use_connections) == (0, 0), stats
    reference, fast = views
    assert fast == reference


#: name -> (method, request arguments): requests both codecs refuse before a byte is sent.
REFUSED: dict[str, tuple[str, dict[str, Any]]] = {
    "illegal header name": ("GET", {"headers": [("Bad Header", "1")]}),
    "NUL in a header value": ("GET", {"headers": [("X", "a\x00b")]}),
    "whitespace around a value": ("GET", {"headers": [("X", " a ")]}),
    "two Host headers": ("GET", {"headers": [("Host", "a"), ("Host", "b")]}),
    "Transfer-Encoding: gzip": ("POST", {"headers": [("Transfer-Encoding", "gzip")]}),
    "body short of Content-Length": (
        "POST",
        {"headers": [("Content-Length", "10")], "content": b"hello"},
    ),
    "body past Content-Length": ("POST", {"headers": [("Content-Length", "2")], "content": b"hi!"}),
    "Content-Length not a number": (
        "POST",
        {"headers": [("Content-Length", "x")], "content": b"x"},
    ),
    "both framings": (
        "POST",
        {"headers": [("Content-Length", "5"), ("Transfer-Encoding", "chunked")], "content": b"x"},
    ),
    "illegal method": ("G T", {}),
}


@pytest.mark.anyio
@pytest.mark.parametrize("case", list(REFUSED))
async def test_each_refused_request_reads_the_same(case: str, anyio_backend: str) -> None:
    """A request the codecs refuse is an ``httpx.LocalProtocolError`` with h11's words."""
    method, arguments = REFUSED[case]
    views = []
    with RawServer(_answer_and_close([b"HTTP/1.1 200 OK\r\n" + LENGTH_2])) as srv:
        for parser in PARSERS:
            transport = BulkheadTransport(http1_parser=parser, trust_env=False)
            async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
                with anyio.fail_after(TIMEOUT), pytest.raises(httpx.LocalProtocolError) as caught:
                    await client.request(method, srv.url, **arguments)
                views.append(_error_view(caught.value))
        assert srv.requests == []  # nothing of a refused request reached the server
    reference, fast = views
    assert fast == reference


_COUNTERS = ("completed", "failed", "error", "unknown_state", "peer_closed", "not_reusable")


@pytest.fixture(scope="module")
def scripted() -> Iterator[tuple[RawServer, list[bytes]]]:
    wire = [b""]
    with RawServer(_answer_and_close(wire)) as srv:
        yield srv, wire


def _sync_view(parser: str, url: str, method: str) -> tuple[tuple[Any, ...], tuple[int, ...]]:
    transport = BulkheadHTTPTransport(http1_parser=parser, trust_env=False)
    with httpx.Client(transport=transport, timeout=TIMEOUT) as client:
        try:
            view = _response_view(client.request(method, url))
        except httpx.HTTPError as exc:
            view = _error_view(exc)
        stats = transport.statistics()[url]
    assert (stats.running, stats.in_use_connections) == (0, 0), stats
    return view, tuple(getattr(stats, name) for name in _COUNTERS)


@pytest.mark.timeout(max(60, EXAMPLES // 5))  # a long search is not cut by the suite's 60 s
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(wire=response_wire(), method=st.sampled_from(["GET", "GET", "HEAD"]))
def test_generated_responses_look_the_same(
    scripted: tuple[RawServer, list[bytes]], wire: bytes, method: str
) -> None:
    srv, current = scripted
    current[0] = wire
    reference = _sync_view("h11", srv.url, method)
    fast = _sync_view("httptools", srv.url, method)
    assert fast == reference
