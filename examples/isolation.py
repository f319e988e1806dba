"""A slow dependency next to a fast one, with and without bulkheads (all on 127.0.0.1).

Run: ``python examples/isolation.py``.  It starts two local servers, saturates the slow one
and calls the fast one meanwhile, once through httpx's default transport (one shared pool)
and once through ``BulkheadTransport`` (one compartment each), then prints both results.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx

from httpx_bulkhead import BulkheadTransport, Policy

SLOW_SECONDS = 2.0
POOL = 10  # total connection budget in both runs


async def serve(delay: float) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                await asyncio.sleep(delay)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # client went away, or the example is shutting down
        finally:
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def port(server: asyncio.Server) -> int:
    return int(server.sockets[0].getsockname()[1])


async def scenario(transport: httpx.AsyncBaseTransport, slow: str, fast: str) -> str:
    ok = failed = 0
    latencies: list[float] = []
    timeout = httpx.Timeout(10.0, pool=0.5)
    async with httpx.AsyncClient(transport=transport, timeout=timeout) as client:

        async def slow_call() -> None:
            with contextlib.suppress(httpx.TransportError):
                await client.get(slow)

        async def fast_call() -> None:
            nonlocal ok, failed
            started = time.perf_counter()
            try:
                await client.get(fast)
                ok += 1
                latencies.append(time.perf_counter() - started)
            except httpx.TransportError:
                failed += 1

        slow_tasks = [asyncio.create_task(slow_call()) for _ in range(3 * POOL)]
        await asyncio.sleep(0.2)  # let the slow calls take what they can
        for _ in range(20):
            await fast_call()
        await asyncio.gather(*slow_tasks)
    worst = max(latencies) * 1000 if latencies else float("nan")
    return f"fast host: {ok} ok, {failed} failed, worst latency {worst:.0f} ms"


async def main() -> None:
    slow_server, fast_server = await serve(SLOW_SECONDS), await serve(0.0)
    slow = f"http://127.0.0.1:{port(slow_server)}/"
    fast = f"http://127.0.0.1:{port(fast_server)}/"
    try:
        shared = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=POOL))
        print("httpx default transport (one shared pool):", await scenario(shared, slow, fast))
        bulkheads = BulkheadTransport(default=Policy(max_concurrency=POOL // 2))
        print("BulkheadTransport (a compartment per host): ", await scenario(bulkheads, slow, fast))
        for name, stats in bulkheads.statistics().items():
            print(
                f"  {name}: acquired={stats.acquired} acquire_timeouts={stats.acquire_timeouts}"
                f" connections_created={stats.connections_created}"
            )
    finally:
        for server in (slow_server, fast_server):
            server.close()
            await server.wait_closed()


if __name__ == "__main__":
    asyncio.run(main())
