"""A representative set of the integration tests, run a second time over TLS.

The tests are imported from their modules and collected here again; this module's fixtures
make every server they use speak TLS, so they run unchanged:

* ``server`` (the shared hypercorn server) is replaced by a hypercorn serving TLS (ALPN
  ``h2`` and ``http/1.1``) for the same ``TestApp``;
* ``RawServer`` and ``HypercornServer``, as the imported tests' modules name them, become
  the same classes with ``tls=`` set (TLS is run by the test server, so the handlers are
  the same);
* ``SSL_CERT_FILE`` names the test CA, so a ``BulkheadTransport()`` with the default
  ``verify=True`` trusts it (httpx reads it when ``trust_env`` is on, the default).

URLs come from ``srv.url``, which is ``https://`` for these servers.  Each test runs under
asyncio and trio, with the default HTTP/1.1 parser (the parser matrix runs on plain TCP).
The selection covers what TLS changes underneath: connection reuse and its state (late,
stale, unsolicited bytes), faults mapped to the same httpx errors through the TLS layer
(resets, truncation, garbage, timeouts), cancellation and timeouts in the middle of an
exchange, streamed bodies both ways, and HTTP/2 negotiated by ALPN rather than prior
knowledge.
(Queue and isolation rules do not depend on the connection's kind: they run on TCP only.)
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tests.integration.test_connections as connections_module
import tests.integration.test_errors as errors_module
import tests.integration.test_http2 as http2_module
import tests.integration.test_http11 as http11_module
import tests.integration.test_isolation as isolation_module
from tests.integration.test_connections import (  # noqa: F401
    test_aclose_wakes_waiters_and_refuses_later_requests,
    test_connection_closed_by_server_while_idle_is_not_used,
    test_late_response_is_never_read_by_the_next_request,
    test_post_whose_body_was_sent_is_not_retried,
    test_randomized_cancellation_leaves_nothing_behind,
    test_stale_connection_is_retried_when_safe,
    test_unclosed_response_is_reported_and_its_slot_returned,
)
from tests.integration.test_errors import (  # noqa: F401
    test_fault_maps_to_httpx_error_and_discards_the_connection,
    test_never_answer_read_timeout,
    test_reset_while_streaming_the_body_is_read_error,
)
from tests.integration.test_http2 import (  # noqa: F401
    test_cancelled_stream_is_reset_and_the_connection_stays_usable,
    test_large_bodies_in_both_directions,
    test_one_stream_timing_out_does_not_fail_the_others,
    test_stream_cap_is_respected_and_scales_out,
)
from tests.integration.test_http11 import (  # noqa: F401
    test_bodyless_responses_leave_the_connection_reusable,
    test_get_and_post_echo,
    test_keepalive_raw_server_single_connection,
    test_per_request_timeout_raises_read_timeout,
    test_streaming_request_body_arrives_whole,
    test_streaming_response_delivers_every_byte,
)
from tests.integration.test_isolation import (  # noqa: F401
    test_slot_held_until_streaming_response_is_closed,
)
from tests.servers import HypercornServer, RawServer, TestApp, default_server_tls, keepalive_ok

pytestmark = pytest.mark.anyio

_MODULES = (connections_module, errors_module, http11_module, http2_module, isolation_module)


@pytest.fixture(scope="module")
def _tls_server(app: TestApp) -> Iterator[HypercornServer]:
    with HypercornServer(app, tls=default_server_tls()) as srv:
        yield srv


@pytest.fixture
def server(_tls_server: HypercornServer, app: TestApp) -> HypercornServer:
    """The shared server, over TLS (overrides ``conftest.server``)."""
    app.reset()
    return _tls_server


@pytest.fixture(autouse=True)
def _everything_over_tls(tmp_path_factory: pytest.TempPathFactory, monkeypatch: Any) -> None:
    tls = default_server_tls()
    ca = Path(tmp_path_factory.mktemp("ca")) / "ca.pem"
    ca.write_bytes(tls.ca_pem)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    for module in _MODULES:
        if hasattr(module, "RawServer"):
            monkeypatch.setattr(module, "RawServer", functools.partial(RawServer, tls=tls))
        if hasattr(module, "HypercornServer"):
            monkeypatch.setattr(
                module, "HypercornServer", functools.partial(HypercornServer, tls=tls)
            )


async def test_the_tests_here_run_over_tls(server: HypercornServer) -> None:
    """The substitutions above are in force (a guard: without them the imported tests
    would pass over plain TCP and prove nothing about TLS)."""
    import httpx

    from httpx_bulkhead import BulkheadTransport

    assert server.url.startswith("https://")
    raw_server = connections_module.__dict__["RawServer"]  # as the imported tests see it
    with raw_server(keepalive_ok(b"ok")) as srv:
        assert srv.url.startswith("https://")
        async with httpx.AsyncClient(transport=BulkheadTransport(), timeout=5) as client:
            response = await client.get(srv.url)  # verified against the test CA
            assert response.extensions["network_stream"].get_extra_info("ssl_object")
    with http2_module.__dict__["HypercornServer"](TestApp()) as h2srv:
        assert h2srv.url.startswith("https://")
