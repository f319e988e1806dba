"""A synchronous ``httpx.Client`` given the transport fails at once with a ``TypeError``
that says to use ``httpx.AsyncClient`` (and what to do with a sync client), however it is
used; before, ``AttributeError: ... no attribute '__enter__'`` (or ``'handle_request'``)."""

from __future__ import annotations

import httpx
import pytest

from httpx_bulkhead import BulkheadTransport

ADVICE = r"async transport: use it with httpx\.AsyncClient, not httpx\.Client"


# (mypy flags the mistake too: the ``type: ignore``s below are the mistake under test)
def test_with_block() -> None:
    with pytest.raises(TypeError, match=ADVICE) as caught:
        with httpx.Client(transport=BulkheadTransport()):  # type: ignore[arg-type]
            pass
    assert "httpx.HTTPTransport(limits=httpx.Limits(max_connections=N))" in str(caught.value)


def test_request_without_a_with_block_touches_no_network() -> None:
    client = httpx.Client(transport=BulkheadTransport())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=ADVICE):
        client.get("http://127.0.0.1:9/")  # raised before any connection is attempted
    with pytest.raises(TypeError, match=r"await transport\.aclose\(\)"):
        client.close()


@pytest.mark.anyio
async def test_the_async_client_is_unaffected() -> None:
    async with httpx.AsyncClient(transport=BulkheadTransport()) as client:
        assert not client.is_closed
