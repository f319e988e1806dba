"""A hostile proxy: a seeded loop of faults at random points of the proxy exchange
(refusals, closes and resets mid-answer, garbage, a trickled answer, silence, bytes after
the answer), on tunnels (https targets) and forwarded requests (http targets), with the
client's task cancelled at random moments of the handshake.  The ``flavour`` fixture runs
both for the sync transport too, from threads; a thread cannot be cancelled, so there the
random moment is the connect deadline instead (``Timeout(connect=...)``), which cuts the
handshake at that point as a cancellation does.  After every request:
nothing hangs past its deadline and only httpx errors escape; after the run: statistics
counters agree, no connection is left in use, the next request succeeds, and no file
descriptor is left open.

``BULKHEAD_PROXY_FAULT_EXAMPLES`` (default 24 per backend and flavour) sets the number of requests;
``BULKHEAD_PROXY_FAULT_SEED`` the seed (default: 0, 1, ...; the failing seed is in the
assertion message)."""

from __future__ import annotations

import contextlib
import gc
import os
import random
import time

import anyio
import httpx
import pytest

from httpx_bulkhead import Policy
from tests.flavours import Flavour, client_for, make_transport
from tests.resources import FdSnapshot, assert_no_fd_growth, settle_io
from tests.servers import HypercornServer, TestApp, default_server_tls
from tests.servers.proxies import (
    ESTABLISHED,
    FaultProxy,
    ProxyRequest,
    Refuse,
    Send,
    refuse,
)

pytestmark = pytest.mark.anyio

EXAMPLES = int(os.environ.get("BULKHEAD_PROXY_FAULT_EXAMPLES", "24"))
SEED = os.environ.get("BULKHEAD_PROXY_FAULT_SEED")
CONNECT_TIMEOUT = 0.3
READ_TIMEOUT = 0.5
#: Longest a request may take: the connect timeout (the whole proxy handshake), one read
#: timeout, and slack for a loaded machine.
DEADLINE = CONNECT_TIMEOUT + READ_TIMEOUT + 3.0


def fault_for(rng: random.Random) -> Refuse | Send | None:
    """One proxy behaviour, with its random point of failure."""
    cut = rng.randrange(len(ESTABLISHED) + 1)
    choice = rng.randrange(9)
    if choice == 0:
        return refuse(rng.choice([403, 407, 502, 503]), "No")
    if choice == 1:
        return Send(ESTABLISHED[:cut], "close")
    if choice == 2:
        return Send(ESTABLISHED[:cut], "reset")
    if choice == 3:
        return Send(rng.randbytes(rng.randrange(1, 64)), rng.choice(["close", "hang"]))
    if choice == 4:
        return Send(ESTABLISHED, "proceed", byte_delay=0.002)  # trickled: must work
    if choice == 5:
        return Send(ESTABLISHED[:cut], "hang")  # silent mid-answer
    if choice == 6:
        return Send(ESTABLISHED + rng.randbytes(rng.randrange(1, 16)), "hang")
    return None  # a good proxy


def _cut(
    flavour: Flavour, after: float | None, timeout: httpx.Timeout
) -> tuple[float | None, httpx.Timeout]:
    """How a request is cut ``after`` seconds (``None``: not cut): the task's cancel scope
    (async), or its connect deadline (sync: a thread cannot be cancelled)."""
    if flavour == "async" or after is None:
        return after, timeout
    return None, httpx.Timeout(timeout.read, connect=max(after, 1e-6))


async def test_a_hostile_proxy_never_breaks_the_transport(
    anyio_backend: str, flavour: Flavour
) -> None:
    seed = int(SEED) if SEED is not None else (0 if anyio_backend == "asyncio" else 1)
    seed += 2 if flavour == "sync" and SEED is None else 0
    rng = random.Random(seed)
    gc.collect()
    before = FdSnapshot.take()
    app = TestApp()
    tls = default_server_tls()
    with (
        HypercornServer(app) as plain,
        HypercornServer(app, tls=tls) as secure,
        FaultProxy() as proxy,
    ):
        faults: list[Refuse | Send | None] = []

        def script(request: ProxyRequest) -> Refuse | Send | None:
            return faults.pop(0) if faults else None

        proxy.script = script
        transport = make_transport(
            flavour,
            proxy=proxy.url,
            verify=tls.client_ssl_context(),
            http2=rng.random() < 0.5,
            default=Policy(max_concurrency=4),
            # Every https request opens a new tunnel (the handshake is what is attacked);
            # http requests are forwarded on a kept-alive proxy connection.
            hosts={f"127.0.0.1:{secure.port}": Policy(max_idle_connections=0)},
        )
        timeout = httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT)
        outcomes: dict[str, int] = {}
        async with client_for(transport, timeout=timeout) as client:
            for i in range(EXAMPLES):
                faults[:] = [fault_for(rng)]
                url = f"{rng.choice([plain.url, secure.url])}/"
                cancel_after = rng.uniform(0, 0.06) if rng.random() < 0.3 else None
                where = f"seed {seed}, request {i}: {faults[0]} {url} cancel={cancel_after}"
                outcome = "cancelled"
                cut, this = _cut(flavour, cancel_after, timeout)
                started = time.monotonic()
                with anyio.fail_after(DEADLINE):
                    with anyio.move_on_after(cut):
                        try:
                            response = await client.get(url, timeout=this)
                            outcome = str(response.status_code)
                        except httpx.TransportError as exc:
                            outcome = type(exc).__name__
                            assert "Traceback" not in str(exc), where
                # (fail_after cannot cut a worker thread: the sync flavour's bound)
                assert time.monotonic() - started < DEADLINE, where
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
                stats = transport.statistics()
                for name, s in stats.items():
                    assert s.running == 0 and s.in_use_connections == 0, (where, name, s)
                    assert s.acquired == s.completed + s.failed + s.cancelled, (where, s)
            faults.clear()
            for url in (plain.url, secure.url):  # the next requests succeed
                assert (await client.get(f"{url}/")).text == "hello"
        assert sum(outcomes.values()) == EXAMPLES
        assert outcomes.get("200", 0) >= 1, outcomes  # the loop did reach the targets
    await settle_io()
    assert_no_fd_growth(before, f"seed {seed}: {outcomes}")


async def test_cancelled_at_every_step_of_the_tunnel(anyio_backend: str, flavour: Flavour) -> None:
    """A trickled proxy answer and TLS handshake behind it, the request's task cancelled
    (sync: its connect deadline passing) at increasing moments: from before the TCP
    connect to after the tunnel is up.  Every cancellation leaves nothing open and the
    counters agree."""
    gc.collect()
    before = FdSnapshot.take()
    tls = default_server_tls()
    with HypercornServer(TestApp(), tls=tls) as secure, FaultProxy() as proxy:
        proxy.script = lambda request: Send(ESTABLISHED, "proceed", byte_delay=0.001)
        transport = make_transport(flavour, proxy=proxy.url, verify=tls.client_ssl_context())
        key = f"https://127.0.0.1:{secure.port}"
        timeout = httpx.Timeout(5)
        async with client_for(transport, timeout=timeout) as client:
            for step in range(25):
                cut, this = _cut(flavour, step * 0.004, timeout)
                with anyio.fail_after(DEADLINE), anyio.move_on_after(cut):
                    with contextlib.suppress(httpx.ConnectTimeout):
                        await client.get(f"{secure.url}/", timeout=this)
                s = transport.statistics()[key]
                assert s.running == 0 and s.in_use_connections == 0, (step, s)
                assert s.acquired == s.completed + s.failed + s.cancelled, (step, s)
            proxy.script = None
            assert (await client.get(f"{secure.url}/")).text == "hello"
            s = transport.statistics()[key]
            # Some of the cancels (sync: deadlines) landed in the handshake.
            assert (s.failed if flavour == "sync" else s.cancelled) >= 1, s
    await settle_io()
    assert_no_fd_growth(before, "cancelled tunnels")
