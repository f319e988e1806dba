"""Client CPU per request through a real proxy: ``BulkheadTransport(proxy=...)`` against
``httpx.AsyncHTTPTransport(proxy=...)``, same run, interleaved.

    python -m benchmarks.proxy                  # about 30 s
    python -m benchmarks.proxy --rounds 20 --requests 400

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

import httpx

from benchmarks.harness import NodeServer
from httpx_bulkhead import BulkheadTransport
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

_HTTPS = """
const https = require("https"), fs = require("fs");
const [key, cert] = process.argv.slice(1);  // node -e: no script path
const server = https.createServer(
  { key: fs.readFileSync(key), cert: fs.readFileSync(cert) },
  (req, res) => { req.resume(); req.on("end", () => {
    res.writeHead(200, { "content-length": 2 }); res.end("ok"); }); });
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
    stats = ours.statistics()
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--requests", type=int, default=300)
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
            asyncio.run(measure(proxy.url, urls, args.rounds, args.requests))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
