"""Compare the per-request cost of two revisions of the library, in the same run.

    python -m benchmarks.ab --base abb1359            # base revision vs the working tree
    python -m benchmarks.ab --base main --rounds 12   # more rounds, less noise
    python -m benchmarks.ab --base HEAD~1 --head HEAD --cases h11,httptools
                        # two commits (edit the tree meanwhile); only the cases named
    python -m benchmarks.ab --base main --yardstick floor   # HTTP/1.1 against the h11 floor
    python -m benchmarks.ab --base main --cases h2c   # the HTTP/2 cases alone

What it does: one Node.js server (``server.js``, pinned to the other core, HTTP/1.1 and an
h2c port) serves every contestant.  Child processes alternate between the two revisions
(``base`` checked out into a temporary git worktree, ``head`` this tree), one child per
round.  Each child measures client CPU time per request (``time.process_time()``) of
httpx's default transport and of ``BulkheadTransport`` (h11, httptools, h2c) in the same
process, interleaved, and reports ``bulkhead / default`` for each case.  The result for a
case is the median over rounds of ``head ratio / base ratio``: above 1.0 the head costs
more per request, relative to the same yardstick measured in the same child.

Ratios against a yardstick, not absolute times: on a small shared machine absolute CPU
times drift from minute to minute, while the default transport's cost in the same process
drifts with them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.harness import NodeServer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

#: (case name, transport kind, concurrency, requests per batch)
CASES = [
    ("h11 c=1", "h11", 1, 400),
    ("h11 c=64", "h11", 64, 1280),
    ("httptools c=1", "httptools", 1, 400),
    ("httptools c=64", "httptools", 64, 1280),
    ("h2c c=1", "h2", 1, 300),
    ("h2c c=64", "h2", 64, 1280),
]

# The child: runs in a fresh interpreter with the revision's tree first on sys.path.
CHILD = r"""
import asyncio, json, statistics, sys, time
import httpx
from httpx_bulkhead import BulkheadTransport, Policy

h1_url, h2_url, cases, batches, yardstick = json.loads(sys.argv[1])


class Floor:
    # The h11 floor as a yardstick (its code here, the same for every revision).

    def __init__(self, url, conc):
        import h11
        self.h11, self.url, self.conc, self.conns = h11, httpx.URL(url), conc, []

    async def start(self):
        h11, loop = self.h11, asyncio.get_running_loop()

        class Conn(asyncio.Protocol):
            def __init__(self):
                self.c, self.waiter = h11.Connection(h11.CLIENT), None

            def connection_made(self, transport):
                self.t = transport

            def data_received(self, data):
                self.c.receive_data(data)
                while (event := self.c.next_event()) is not h11.NEED_DATA:
                    if type(event) is h11.EndOfMessage:
                        self.c.start_next_cycle()
                        self.waiter.set_result(None)
                        return

        for _ in range(self.conc):
            _, conn = await loop.create_connection(Conn, self.url.host, self.url.port)
            self.conns.append(conn)
        host = f"{self.url.host}:{self.url.port}".encode()
        self.headers = [(b"host", host), (b"accept", b"*/*"),
                        (b"accept-encoding", b"gzip, deflate"), (b"connection", b"keep-alive"),
                        (b"user-agent", b"python-httpx")]
        return self

    async def get(self, worker):
        conn, h11 = self.conns[worker], self.h11
        request = h11.Request(method=b"GET", target=self.url.raw_path, headers=self.headers)
        data = conn.c.send(request)
        conn.waiter = asyncio.get_running_loop().create_future()
        conn.t.write(data + conn.c.send(h11.EndOfMessage()))
        await conn.waiter

    async def aclose(self):
        for conn in self.conns:
            conn.t.close()
        await asyncio.sleep(0)

def make(kind, conc):
    if kind == "default":
        return httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=conc))
    if kind == "default-h2":
        return httpx.AsyncHTTPTransport(
            limits=httpx.Limits(max_connections=conc), http1=False, http2=True)
    if kind == "h2":
        return BulkheadTransport(default=Policy(max_concurrency=conc), http1=False, http2=True,
                                 trust_env=False)
    return BulkheadTransport(default=Policy(max_concurrency=conc), http1_parser=kind,
                             trust_env=False)

async def batch(transport, url, conc, n):
    left = n
    async def worker(w):
        nonlocal left
        while left > 0:
            left -= 1
            if type(transport) is Floor:
                await transport.get(w)
                continue
            response = await transport.handle_async_request(httpx.Request("GET", url))
            await response.aread()
            await response.aclose()
    start = time.process_time()
    await asyncio.gather(*(worker(w) for w in range(conc)))
    return (time.process_time() - start) / n

async def main():
    out = {}
    for name, kind, conc, n in cases:
        yard = "default-h2" if kind == "h2" else "default"
        url = h2_url if kind == "h2" else h1_url
        ours = make(kind, conc)
        if yardstick == "floor" and kind != "h2":
            theirs = await Floor(url, conc).start()
        else:
            theirs = make(yard, conc)
        await batch(ours, url, conc, conc * 4)  # warm up: connections, caches
        await batch(theirs, url, conc, conc * 4)
        ratios = []
        for _ in range(batches):
            a = await batch(ours, url, conc, n)
            b = await batch(theirs, url, conc, n)
            ratios.append(a / b)
        await ours.aclose()
        await theirs.aclose()
        out[name] = statistics.median(ratios)
    print(json.dumps(out))

asyncio.run(main())
"""


@contextlib.contextmanager
def base_tree(revision: str, name: str = "base") -> Iterator[Path]:
    """``revision`` checked out into a temporary worktree (removed afterwards)."""
    with tempfile.TemporaryDirectory(prefix="bulkhead-ab-") as tmp:
        path = Path(tmp) / name
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(path), revision],
            check=True,
        )
        try:
            yield path
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], check=False
            )


def run_child(
    tree: Path, h1_url: str, h2_url: str, batches: int, yardstick: str = "default"
) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    args = json.dumps([h1_url, h2_url, CASES, batches, yardstick])
    cmd = [sys.executable, "-c", CHILD, args]
    if sys.platform == "linux" and (os.cpu_count() or 1) > 1:
        cmd = ["taskset", "-c", "0", *cmd]  # the client core (the server has core 1)
    done = subprocess.run(cmd, env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"child for {tree} failed:\n{done.stderr}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="git revision to compare against")
    parser.add_argument("--rounds", type=int, default=8, help="children per revision")
    parser.add_argument("--batches", type=int, default=5, help="batches per case per child")
    parser.add_argument("--json", type=Path, help="also write the raw ratios here")
    parser.add_argument(
        "--head", help="git revision to measure instead of the working tree (checked out apart)"
    )
    parser.add_argument(
        "--cases",
        help="comma-separated prefixes of the case names to run (e.g. h11,httptools); default all",
    )
    parser.add_argument(
        "--yardstick",
        choices=("default", "floor"),
        default="default",
        help="what HTTP/1.1 cases are measured against: httpx's default transport, or the h11"
        " floor (a bare Protocol + h11: cheaper and steadier at concurrency 64); default default",
    )
    args = parser.parse_args()
    if args.cases:
        prefixes = tuple(p.strip() for p in args.cases.split(",") if p.strip())
        CASES[:] = [case for case in CASES if case[0].startswith(prefixes)]
    results: dict[str, list[dict[str, float]]] = {"base": [], "head": []}
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        base = stack.enter_context(base_tree(args.base))
        head = ROOT if args.head is None else stack.enter_context(base_tree(args.head, "head"))
        h1 = stack.enter_context(NodeServer(ports=1))
        h2 = stack.enter_context(NodeServer(http2=True))
        trees = {"base": base, "head": head}
        for round_ in range(args.rounds):
            order = ["base", "head"] if round_ % 2 == 0 else ["head", "base"]
            for name in order:
                results[name].append(
                    run_child(trees[name], h1.url(), h2.url(), args.batches, args.yardstick)
                )
            print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
    print(
        f"base {args.base} vs head ({args.head or 'working tree'}), {args.rounds} rounds per"
        f" revision, "
        f"{time.monotonic() - started:.0f} s; ratio = bulkhead / {args.yardstick}"
        " (HTTP/1.1 cases; h2c: httpx default), same child"
    )
    print()
    print("| case | base ratio | head ratio | head / base (median, range) |")
    print("|---|---:|---:|---:|")
    summary: dict[str, Any] = {}
    for name, *_ in CASES:
        base_r = [r[name] for r in results["base"]]
        head_r = [r[name] for r in results["head"]]
        paired = sorted(h / b for h, b in zip(head_r, base_r, strict=True))
        median = statistics.median(paired)
        summary[name] = {"base": base_r, "head": head_r, "head_over_base": paired}
        print(
            f"| {name} | {statistics.median(base_r):.3f} | {statistics.median(head_r):.3f} | "
            f"{median:.3f} ({paired[0]:.3f}-{paired[-1]:.3f}) |"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
