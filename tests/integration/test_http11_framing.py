"""HTTP/1.1 message framing through the real transport, with both codecs (h11 and
httptools): request bodies held to their ``Content-Length`` (no request smuggling).

Raw-socket servers on 127.0.0.1 read exactly what arrives, so a smuggled request would be
seen and answered as one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import httpx
import pytest

from httpx_bulkhead import BulkheadTransport
from tests.servers import RawConn, RawServer, request_path

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("http1_parser")]

TIMEOUT = 30.0  # long: a test that hangs must fail by its own, shorter, deadline
PROMPTLY = 5.0
SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def answer_with_path(conn: RawConn) -> None:
    """Keep-alive: each request (framed by its Content-Length) answered with its path."""
    while (request := conn.read_request()) is not None:
        conn.send_response(200, request_path(request))


async def parts(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


# ------------------------------------------------------- 1. request body vs Content-Length

BODIES: dict[str, tuple[str, Callable[[], Any], bool]] = {
    # name: (declared Content-Length, content, is the head written before the error)
    "in-memory, surplus smuggles a request": ("5", lambda: b"hello" + SMUGGLED, False),
    "in-memory, short": ("10", lambda: b"hello", False),
    "streamed, surplus smuggles a request": ("5", lambda: parts(b"hel", b"lo" + SMUGGLED), True),
    "streamed, short": ("10", lambda: parts(b"hel", b"lo"), True),
}


@pytest.mark.parametrize("case", list(BODIES))
async def test_request_body_must_match_its_content_length(case: str) -> None:
    """Fails at once with LocalProtocolError, sends nothing past the declared length, and
    discards the connection; the next request gets its own response."""
    declared, content, head_written = BODIES[case]
    with RawServer(answer_with_path) as srv:
        transport = BulkheadTransport()
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
            body = content()
            with anyio.fail_after(PROMPTLY), pytest.raises(httpx.LocalProtocolError):
                await client.post(
                    f"{srv.url}/upload", content=body, headers={"Content-Length": declared}
                )
            if not isinstance(body, bytes):
                # httpx wraps our generator in its own: closing that one leaves ours open
                await body.aclose()
            response = await client.get(f"{srv.url}/next")
            assert response.content == b"/next"
            stats = transport.statistics()[srv.url]
            assert (stats.failed, stats.error, stats.connections_created) == (1, 1, 2)
            assert (stats.running, stats.connections, stats.completed) == (0, 1, 1)
        paths = sorted(request_path(request) for request in srv.requests)  # two connections
    assert paths == ([b"/next", b"/upload"] if head_written else [b"/next"])
