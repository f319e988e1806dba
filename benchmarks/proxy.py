"""Client CPU per request through a real proxy: ``BulkheadTransport(proxy=...)`` against
``httpx.AsyncHTTPTransport(proxy=...)``, same run, interleaved.

    python -m benchmarks.proxy                  # about 30 s
    python -m benchmarks.proxy --rounds 20 --requests 400
    python -m benchmarks.proxy --sync           # the sync transports (httpx.Client's)

Everything but the client runs in other processes, so ``time.process_time()`` of this one
is the client's cost: Debian's tinyproxy, chained to our SOCKS5 egress
(``tests/servers/proxy_scripted.ProxyEgress``, started in a child interpreter: in this
process its relay threads would be counted), and two Node.js servers: an HTTPS one (the
test CA's certificate, keep-alive) and ``benchmarks/server.js`` (plain HTTP/1.1).

Cases:

* ``CONNECT, keep-alive``: ``https://`` target, one tunnel opened through tinyproxy then
  reused for every request (the steady state: TLS records inside the tunnel).
* ``forwarded``: ``http://`` target, forwarded by tinyproxy in absolute form; tinyproxy
  closes the client connection after each response, so each request also dials the proxy
  (for both transports).
* ``isolation``: the README's isolation scenario through the proxy (tunnels): a fast host
  beside a slow one, 10 connections in all, with and without the proxy.

``--sync`` measures ``BulkheadHTTPTransport(proxy=...)`` against
``httpx.HTTPTransport(proxy=...)`` instead (the CPU table only, one calling thread).

Each round measures both transports on each case, alternating which goes first; the
result is the median over rounds of ``bulkhead / default`` CPU per request, in the same
process minutes apart at most (absolute figures drift on a shared machine, the ratio much
less).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness import NodeServer
from httpx_bulkhead import BulkheadHTTPTransport, BulkheadTransport, Policy
from tests.servers.proxies import TinyProxy
from tests.servers.tls import default_server_tls

ROOT = Path(__file__).resolve().parent.parent

_EGRESS = """
import sys
sys.path.insert(0, sys.argv[1])
from tests.servers.proxy_scripted import ProxyEgress
with ProxyEgress() as egress:
    print(egress.port, flush=True)
    sys.stdin.read()
"""

_HTTPS = r"""
const https = require("https"), fs = require("fs");
const [key, cert] = process.argv.slice(1);  // node -e: no script path
const server = https.createServer(
  { key: fs.readFileSync(key), cert: fs.readFileSync(cert) },
  (req, res) => { req.resume(); req.on("end", () => {
    const answer = () => { res.writeHead(200, { "content-length": 2 }); res.end("ok"); };
    const slow = /^\/slow\?ms=(\d+)/.exec(req.url);
    if (!slow) return answer();
    const timer = setTimeout(answer, Number(slow[1]));
    res.on("close", () => clearTimeout(timer)); }); });
server.keepAliveTimeout = 120000;
server.listen(0, "127.0.0.1", () => console.log(server.address().port));
process.stdin.on("end", () => process.exit(0)); process.stdin.resume();
"""


@contextlib.contextmanager
def child(command: list[str]) -> Iterator[str]:
    """A child process that prints one line (a port) and exits when its stdin closes."""
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line:
            raise RuntimeError(f"{command[0]} exited before listening")
        yield line
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


async def per_request(transport: httpx.AsyncBaseTransport, url: str, n: int) -> float:
    """Client CPU seconds per request, ``n`` sequential requests."""
    start = time.process_time()
    for _ in range(n):
        response = await transport.handle_async_request(httpx.Request("GET", url))
        await response.aread()
        await response.aclose()
    return (time.process_time() - start) / n


def per_request_sync(transport: httpx.BaseTransport, url: str, n: int) -> float:
    """``per_request`` for a sync transport."""
    start = time.process_time()
    for _ in range(n):
        response = transport.handle_request(httpx.Request("GET", url))
        response.read()
        response.close()
    return (time.process_time() - start) / n


async def measure(proxy: str, urls: dict[str, str], rounds: int, requests: int) -> None:
    tls = default_server_tls()
    ours = BulkheadTransport(proxy=proxy, verify=tls.client_ssl_context())
    theirs = httpx.AsyncHTTPTransport(proxy=proxy, verify=tls.client_ssl_context())
    contestants: dict[str, httpx.AsyncBaseTransport] = {"bulkhead": ours, "default": theirs}
    sizes = {"CONNECT, keep-alive": requests, "forwarded": max(20, requests // 8)}
    for transport in contestants.values():  # warm up: the tunnel, imports, caches
        for url in urls.values():
            await per_request(transport, url, 5)
    ratios: dict[str, list[float]] = {case: [] for case in urls}
    cpu: dict[tuple[str, str], list[float]] = {}
    for r in range(rounds):
        for case, url in urls.items():
            order = list(contestants) if r % 2 == 0 else list(reversed(contestants))
            got = {name: await per_request(contestants[name], url, sizes[case]) for name in order}
            ratios[case].append(got["bulkhead"] / got["default"])
            for name, value in got.items():
                cpu.setdefault((case, name), []).append(value)
    await ours.aclose()
    await theirs.aclose()
    _table(ours.statistics(), urls, rounds, ratios, cpu)


def measure_sync(proxy: str, urls: dict[str, str], rounds: int, requests: int) -> None:
    """``measure`` for the sync transports, from one thread."""
    tls = default_server_tls()
    ours = BulkheadHTTPTransport(proxy=proxy, verify=tls.client_ssl_context())
    theirs = httpx.HTTPTransport(proxy=proxy, verify=tls.client_ssl_context())
    contestants: dict[str, httpx.BaseTransport] = {"bulkhead": ours, "default": theirs}
    sizes = {"CONNECT, keep-alive": requests, "forwarded": max(20, requests // 8)}
    for transport in contestants.values():
        for url in urls.values():
            per_request_sync(transport, url, 5)
    ratios: dict[str, list[float]] = {case: [] for case in urls}
    cpu: dict[tuple[str, str], list[float]] = {}
    for r in range(rounds):
        for case, url in urls.items():
            order = list(contestants) if r % 2 == 0 else list(reversed(contestants))
            got = {name: per_request_sync(contestants[name], url, sizes[case]) for name in order}
            ratios[case].append(got["bulkhead"] / got["default"])
            for name, value in got.items():
                cpu.setdefault((case, name), []).append(value)
    ours.close()
    theirs.close()
    _table(ours.statistics(), urls, rounds, ratios, cpu)


def _table(
    stats: dict[str, Any],
    urls: dict[str, str],
    rounds: int,
    ratios: dict[str, list[float]],
    cpu: dict[tuple[str, str], list[float]],
) -> None:
    print(f"\nclient CPU per request through tinyproxy, median of {rounds} rounds")
    print(f"  {'case':22} {'bulkhead':>12} {'default':>12} {'bulkhead/default':>18}")
    for case in urls:
        mine = statistics.median(cpu[(case, "bulkhead")]) * 1e6
        base = statistics.median(cpu[(case, "default")]) * 1e6
        ratio = statistics.median(ratios[case])
        spread = f"[{min(ratios[case]):.2f}..{max(ratios[case]):.2f}]"
        print(f"  {case:22} {mine:>9.0f} µs {base:>9.0f} µs {ratio:>10.2f} {spread}")
    created = {name: s.connections_created for name, s in stats.items()}
    print(f"  bulkhead connections opened per compartment: {created}")


async def isolation(
    transport: httpx.AsyncBaseTransport,
    slow_url: str,
    fast_url: str,
    *,
    calls: int = 40,
    slow_callers: int = 30,
    interval: float = 0.05,
) -> tuple[int, float, float]:
    """The README's isolation scenario: ``slow_callers`` tasks calling the slow host in a
    loop, the fast host called every ``interval``; pool timeout 0.5 s.  Returns the fast
    host's (successes, p50, p99) in seconds."""
    timeout = httpx.Timeout(10.0, pool=0.5)
    latencies: list[float] = []
    async with httpx.AsyncClient(transport=transport, timeout=timeout) as client:
        stop = asyncio.Event()

        async def slow_caller() -> None:
            while not stop.is_set():
                with contextlib.suppress(httpx.HTTPError):
                    await client.get(slow_url)

        await client.get(fast_url)  # the fast host's tunnel, opened before the load
        tasks = [asyncio.create_task(slow_caller()) for _ in range(slow_callers)]
        await asyncio.sleep(0.3)  # the slow host's callers take every place they can
        for _ in range(calls):
            started = time.perf_counter()
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(fast_url)).status_code == 200:
                    latencies.append(time.perf_counter() - started)
            await asyncio.sleep(interval)
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    latencies.sort()
    if not latencies:
        return 0, float("nan"), float("nan")
    p99 = latencies[min(len(latencies) - 1, max(0, -(-99 * len(latencies) // 100) - 1))]
    return len(latencies), statistics.median(latencies), p99


async def measure_isolation(proxy: str, https_port: str, slow_ms: int) -> None:
    """Fast host https://localhost:P beside slow host https://127.0.0.1:P (the same server,
    two origins), 10 connections in all: bulkhead 5 + 5, with and without the proxy, and
    httpx's transport through the proxy (one shared pool)."""
    tls = default_server_tls()
    slow = f"https://127.0.0.1:{https_port}/slow?ms={slow_ms}"
    fast = f"https://localhost:{https_port}/"
    contestants: list[tuple[str, httpx.AsyncBaseTransport]] = [
        (
            "BulkheadTransport, direct (5 + 5)",
            BulkheadTransport(
                default=Policy(max_concurrency=5), verify=tls.client_ssl_context(), trust_env=False
            ),
        ),
        (
            "BulkheadTransport, through the proxy (5 + 5)",
            BulkheadTransport(
                proxy=proxy, default=Policy(max_concurrency=5), verify=tls.client_ssl_context()
            ),
        ),
        (
            "httpx default, through the proxy (one pool of 10)",
            httpx.AsyncHTTPTransport(
                proxy=proxy,
                verify=tls.client_ssl_context(),
                limits=httpx.Limits(max_connections=10),
            ),
        ),
    ]
    print(
        f"\nisolation: fast host beside a slow one ({slow_ms} ms, 30 callers), pool timeout 0.5 s"
    )
    print(f"  {'fast host under load':50} {'success':>8} {'p50':>9} {'p99':>9}")
    for name, transport in contestants:
        ok, p50, p99 = await isolation(transport, slow, fast)
        print(f"  {name:50} {ok:>5}/40 {p50 * 1e3:>6.1f} ms {p99 * 1e3:>6.1f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--slow-ms", type=int, default=1000, help="the slow host's latency")
    parser.add_argument("--sync", action="store_true", help="the sync transports' CPU table")
    args = parser.parse_args(argv)
    node = shutil.which("node")
    if node is None or shutil.which("tinyproxy") is None:
        print("needs node and tinyproxy on PATH", file=sys.stderr)
        return 2
    tls = default_server_tls()
    with tempfile.TemporaryDirectory() as tmp:
        pem = tls.write_pem_files(Path(tmp))
        with (
            child([sys.executable, "-c", _EGRESS, str(ROOT)]) as egress_port,
            child([node, "-e", _HTTPS, str(pem.key), str(pem.cert_chain)]) as https_port,
            NodeServer() as plain,
            TinyProxy(types.SimpleNamespace(port=int(egress_port))) as proxy,  # type: ignore[arg-type]
        ):
            urls = {
                "CONNECT, keep-alive": f"https://127.0.0.1:{https_port}/",
                "forwarded": plain.url(),
            }
            if args.sync:
                measure_sync(proxy.url, urls, args.rounds, args.requests)
                return 0
            asyncio.run(measure(proxy.url, urls, args.rounds, args.requests))
            asyncio.run(measure_isolation(proxy.url, https_port, args.slow_ms))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
