"""Test your bulkheads without a network: ``MockNetwork`` answers from a handler.

``httpx.MockTransport`` (and respx) replace the *whole* transport, so limits, queueing,
connection reuse and statistics are not exercised.  ``MockNetwork`` replaces only the
network under ``BulkheadTransport``: each connection is an in-memory pipe to a tiny
HTTP/1.1 server (h11) that calls your handler for each request, so every compartment rule
applies as in production::

    import respx
    from httpx_bulkhead import BulkheadTransport, Policy
    from httpx_bulkhead.testing import MockNetwork

    router = respx.MockRouter(assert_all_called=False)
    router.get("https://llm.example.com/v1/generate").respond(200, json={"text": "hi"})
    transport = BulkheadTransport(
        hosts={"llm.example.com": Policy(max_concurrency=1)},
        network=MockNetwork(router.async_handler),
    )

The handler takes an ``httpx.Request`` (body already read) and returns an
``httpx.Response``, directly or as an awaitable, exactly like ``httpx.MockTransport``'s.
It may wait (``await event.wait()``) to model a slow server: the request then holds its slot
until the handler returns.  A handler that raises makes the connection fail with
``httpx.ReadError``.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import h11
import httpx

from ._trace import TraceFn

__all__ = ["Handler", "MockNetwork"]

Handler = Callable[[httpx.Request], "httpx.Response | Awaitable[httpx.Response]"]


class MockNetwork:
    """A stand-in for the network: connections to every origin are served by ``handler``.

    Args:
        handler: called with each request; returns the response (or an awaitable of it).

    Attributes:
        connections: connections opened so far (to any origin).
        open_connections: connections opened and not closed yet.
        requests: every request the handler was given, in order.
    """

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self.connections = 0
        self.open_connections = 0
        self.requests: list[httpx.Request] = []

    async def connect(
        self, request: httpx.Request, *, timeout: float | None, trace: TraceFn | None
    ) -> _MemoryStream:
        del timeout, trace
        self.connections += 1
        self.open_connections += 1
        return _MemoryStream(self, request.url.scheme)


class _MemoryStream:
    """A ``NetStream`` whose far end is an h11 server calling the handler."""

    alpn = None

    def __init__(self, network: MockNetwork, scheme: str) -> None:
        self._network = network
        self._scheme = scheme
        self._server = h11.Connection(h11.SERVER)
        self._outbox: deque[bytes] = deque()
        self._closed = False

    async def send(self, data: bytes, timeout: float | None) -> None:
        if self._closed:
            raise ConnectionResetError("the connection is closed")
        self._server.receive_data(data)

    async def receive(self, max_bytes: int, timeout: float | None) -> bytes:
        if self._closed:
            raise ConnectionAbortedError("the connection was closed")
        if not self._outbox:
            with anyio.fail_after(timeout):
                await self._serve()
        if not self._outbox:
            return b""
        chunk = self._outbox.popleft()
        if len(chunk) > max_bytes:
            self._outbox.appendleft(chunk[max_bytes:])
            chunk = chunk[:max_bytes]
        return chunk

    async def _serve(self) -> None:
        """Read one complete request from what the client sent and answer it."""
        server = self._server
        if server.our_state is h11.DONE and server.their_state is h11.DONE:
            server.start_next_cycle()
        head: h11.Request | None = None
        body = bytearray()
        while True:
            event = server.next_event()
            if event is h11.NEED_DATA:
                await anyio.sleep_forever()  # the client waits for an answer it never asked
            if isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                return
        assert head is not None
        request = _to_httpx(head, bytes(body), self._scheme)
        self._network.requests.append(request)
        try:
            result: Any = self._network._handler(request)
            response: httpx.Response = await result if inspect.isawaitable(result) else result
            content = await response.aread()
        except Exception as exc:
            raise ConnectionResetError(f"mock handler failed: {exc!r}") from exc
        headers = [(k, v) for k, v in response.headers.raw if k.lower() != b"transfer-encoding"]
        if not any(k.lower() == b"content-length" for k, _ in headers):
            headers.append((b"content-length", str(len(content)).encode()))
        out = server.send(
            h11.Response(
                status_code=response.status_code, headers=headers, reason=response.reason_phrase
            )
        )
        out += server.send(h11.Data(data=content)) if content else b""
        out += server.send(h11.EndOfMessage())
        self._outbox.append(bytes(out))

    def is_readable(self) -> bool:
        return self._closed or bool(self._outbox)

    def abort(self) -> None:
        if not self._closed:
            self._closed = True
            self._network.open_connections -= 1

    async def aclose(self) -> None:
        self.abort()


def _to_httpx(head: h11.Request, body: bytes, scheme: str) -> httpx.Request:
    headers = list(head.headers.raw_items())
    host = next((v for k, v in headers if k.lower() == b"host"), b"localhost")
    url = f"{scheme}://{host.decode('ascii')}{head.target.decode('ascii')}"
    return httpx.Request(head.method.decode("ascii"), url, headers=headers, content=body)
