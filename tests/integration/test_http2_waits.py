"""Streams of one HTTP/2 connection waiting for their responses at once while some of them
time out: the task reading for the connection may be one that times out, and the reader
role must pass on to a stream still waiting (``HTTP2Connection.wait_timed`` under asyncio,
whose waits are bare futures and loop timers; ``wait_until`` under trio), or the others
would wait for a reader that left.

A seeded schedule per round: which streams get a short read timeout, in which order the
requests start and the others are answered.  CI runs ``ROUNDS`` rounds per backend;
``H2_WAIT_ROUNDS=200`` (and ``H2_WAIT_SEED``) run more.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable

import anyio
import httpx
import pytest

from httpx_bulkhead import BulkheadTransport, Policy
from tests.conftest import until
from tests.servers import HypercornServer, TestApp

pytestmark = pytest.mark.anyio

ROUNDS = int(os.environ.get("H2_WAIT_ROUNDS", "3"))
SEED = int(os.environ.get("H2_WAIT_SEED", "18"))
STREAMS = 6


@pytest.mark.parametrize("round_", range(ROUNDS))
async def test_streams_timing_out_hand_the_reader_role_on(
    server: HypercornServer, app: TestApp, unique: Callable[[str], str], round_: int
) -> None:
    rng = random.Random(SEED * 100_003 + round_)
    short = set(rng.sample(range(STREAMS), rng.randint(1, STREAMS - 1)))
    read_timeout = {i: 0.2 + 0.2 * rng.random() for i in short}
    starts = rng.sample(range(STREAMS), STREAMS)
    answers = rng.sample(sorted(set(range(STREAMS)) - short), STREAMS - len(short))
    gates = [app.gate(unique(f"h2wait{i}")) for i in range(STREAMS)]
    transport = BulkheadTransport(
        default=Policy(max_concurrency=STREAMS), http1=False, http2=True, trust_env=False
    )
    results: dict[int, object] = {}

    async def call(client: httpx.AsyncClient, i: int) -> None:
        timeout = httpx.Timeout(10, read=read_timeout.get(i, 10))
        try:
            response = await client.get(f"{server.url}/gate/{gates[i].name}", timeout=timeout)
            results[i] = response.status_code
        except httpx.ReadTimeout as exc:
            results[i] = exc

    try:
        async with httpx.AsyncClient(transport=transport) as client:
            await client.get(f"{server.url}/")  # one connection, its SETTINGS in
            async with anyio.create_task_group() as tg:
                for i in starts:
                    tg.start_soon(call, client, i)
                for i in answers:
                    await gates[i].until_entered(1)
                await until(lambda: short <= results.keys())
                for i in answers:
                    gates[i].open()
                    await until(lambda i=i: i in results)  # type: ignore[misc]
            timed_out = {i for i, r in results.items() if isinstance(r, httpx.ReadTimeout)}
            assert timed_out == short
            assert all(results[i] == 200 for i in answers)
            stats = transport.statistics()[server.url]
            assert (stats.connections_created, stats.running) == (1, 0)
            assert stats.streams_reset == len(short)
            assert (await client.get(f"{server.url}/")).status_code == 200
    finally:
        for gate in gates:
            gate.open()
