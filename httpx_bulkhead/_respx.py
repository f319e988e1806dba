"""respx's default mode (``respx.mock`` without ``using=``) for ``BulkheadTransport``.

respx's default mocker ("httpcore") intercepts by patching ``handle_async_request`` (and
``handle_request``) of httpcore's ``AsyncConnectionPool``, ``AsyncHTTPConnection`` and
``AsyncHTTPProxy`` classes with ``unittest.mock.patch``.  httpx's default transport goes
through those classes; ours never does, so without this module a request would reach the
network and the route never be called.

So the transport asks respx itself, without patching anything: while a router is started in
that mode, each request is first offered to respx's routers, as respx's ``using="httpx"``
mode does (a ``MockTransport`` in front of the client's transport).  A mocked route answers
without the bulkheads (no ``extensions["bulkhead"]``, as with ``using="httpx"``); a
pass-through route (``route.pass_through()``) goes on through them to the network; an
unmocked request raises respx's ``AllMockedAssertionError`` (unless the router was made
with ``assert_all_mocked=False``), as it does for httpx's own transport.

What we use of respx: ``respx.mocks.HTTPCoreMocker`` (in that module's ``__all__``), its
``routers`` (the routers started in that mode) and ``async_handler`` (what respx's own patch
calls), and ``respx.models.PassThrough``: tested against the installed respx in
``tests/integration/test_respx_default_mode.py``.  Should a respx release change them while
httpcore is patched by respx, the request is refused with a ``RuntimeError`` rather than let
through to the network.

Cost when respx is not imported: one ``sys.modules`` lookup per request (in the transport).
"""

from __future__ import annotations

import sys
from typing import Any

import httpx

__all__ = ["MOCKS_MODULE", "respx_response"]

#: The module whose presence in ``sys.modules`` means respx may be mocking.
MOCKS_MODULE = "respx.mocks"

UNKNOWN_RESPX = (
    "respx.mock is active in its default mode (it patches httpcore, which BulkheadTransport"
    " does not use), and this respx version does not offer what BulkheadTransport needs to"
    " route requests to it; refusing to send the request to the network. Use"
    " respx.mock(using='httpx'), or httpx_bulkhead.testing.MockNetwork"
)


async def respx_response(request: httpx.Request) -> httpx.Response | None:
    """respx's answer to ``request`` while ``respx.mock`` runs in its default mode; ``None``
    when no router is started in that mode or the route passes the request through.

    Raises:
        respx's ``AllMockedAssertionError`` (an unmocked request), or what a route's side
        effect raises; ``RuntimeError`` if respx patches httpcore but its mocker is unknown.
    """
    mocker: Any = getattr(sys.modules.get(MOCKS_MODULE), "HTTPCoreMocker", None)
    routers = getattr(mocker, "routers", None)
    handler = getattr(mocker, "async_handler", None)
    models = sys.modules.get("respx.models")
    pass_through: Any = getattr(models, "PassThrough", None)
    if not isinstance(routers, list) or handler is None or pass_through is None:
        if _httpcore_patched_by_respx():
            raise RuntimeError(UNKNOWN_RESPX)
        return None
    if not routers:
        return None
    await request.aread()  # as httpx.MockTransport does: routes may match on the body
    try:
        response = await handler(request)
    except pass_through:
        return None
    return response if isinstance(response, httpx.Response) else None


def _httpcore_patched_by_respx() -> bool:
    httpcore = sys.modules.get("httpcore")
    pool = getattr(httpcore, "AsyncConnectionPool", None)
    method = getattr(pool, "handle_async_request", None)
    return str(getattr(method, "__module__", "")).startswith("respx")
