"""Benchmark harness: a Node.js server, the contestants, request drivers and measurements.

Everything measured here is a *ratio against httpx's default transport taken in the same
run*: the machine is small (2 cores) and shared, so absolute numbers drift from minute to
minute; contestants are interleaved round by round (``interleave``) so drift hits them alike.

* The server is ``server.js`` (Node's ``http``), started as a subprocess on 127.0.0.1 and
  pinned to one core, the client pinned to the other (``pin``), so the Python client is
  what is measured.
* The main metric is client CPU time per request (``time.process_time()`` deltas around a
  batch of requests); requests per second (wall clock) is reported beside it.
* Contestants (HTTP/1.1): ``httpx-default`` (``httpx.AsyncHTTPTransport``), ``bulkhead``
  (``BulkheadTransport`` with ``http1_parser="h11"``, the reference codec),
  ``bulkhead+httptools`` (``BulkheadTransport`` with ``http1_parser="httptools"``, the
  default when httptools is installed) and ``h11-floor``: h11 driven
  over a bare asyncio ``Protocol``, one keep-alive connection per worker, the least an
  h11-based client can do; ``httptools-floor``, the same for httptools, and the aiohttp
  clients ``httpx-aiohttp`` and ``aiohttp`` (``contestants.py``, optional packages).
* Contestants (HTTP/2, h2c with prior knowledge, against ``server.js --http2``):
  ``httpx-default-h2`` (``AsyncHTTPTransport(http1=False, http2=True)``) and ``bulkhead-h2``
  (``BulkheadTransport(http1=False, http2=True)``).  The server counts the TCP connections
  each port accepted (``NodeServer.stats``), so each contestant gets a port of its own.
* ``h2-floor``: h2 driven over a bare asyncio ``Protocol``, one h2c connection for all
  workers, streams multiplexed, output written once per read; no pool, no limits, h2
  configured as BulkheadTransport configures it: the least an h2-based client can do.
* ``h11-floor+models`` and ``httptools-floor+models`` (``models_floor.py``): each floor's
  Protocol behind ``handle_async_request``, taking the ``httpx.Request`` and returning an
  ``httpx.Response``: what httpx's transport contract costs any transport, without ours.
* ``h2-floor+models``: the same floor called as an httpx transport is
  (``H2FloorTransport``): it takes the ``httpx.Request`` the driver built, sends its
  headers, and returns an ``httpx.Response`` (the stream's headers, its body as a response
  stream) that the driver reads and closes.  What the transport contract costs on top of
  the floor, so ``bulkhead-h2 / h2-floor+models`` is what our code adds.
* Drivers run one request each: through ``httpx.AsyncClient`` (``level="client"``) or by
  calling ``transport.handle_async_request`` directly (``level="transport"``).

Used by ``benchmarks/report.py`` (interleaved suites, results.json, tables, plots) and
``benchmarks/test_bench.py`` (pytest-benchmark entries).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import importlib.metadata
import itertools
import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, cast

import h2.connection
import h2.events
import h11
import httpx

from benchmarks.contestants import (
    AIOHTTP,
    HTTPTOOLS_FLOOR,
    HTTPX_AIOHTTP,
    AiohttpDriver,
    HttptoolsFloorDriver,
    aiohttp_transport,
    floor_headers,
)
from benchmarks.models_floor import MODELS_FLOORS, floor_models_transport
from httpx_bulkhead import BulkheadTransport, Policy
from httpx_bulkhead._http2 import H2_CONFIG
from httpx_bulkhead._load import CallRecord, percentile, saturate, steady_calls

__all__ = [
    "AIOHTTP",
    "BULKHEAD",
    "CONTESTANTS",
    "DEFAULT",
    "FLOOR",
    "H2_BULKHEAD",
    "H2_CONTESTANTS",
    "H2_DEFAULT",
    "H2_FLOOR",
    "H2_FLOOR_MODELS",
    "HTTPTOOLS",
    "HTTPTOOLS_FLOOR",
    "HTTPX_AIOHTTP",
    "MORE_CONTESTANTS",
    "Driver",
    "NodeServer",
    "Sample",
    "interleave",
    "library_info",
    "machine_info",
    "make_driver",
    "paired_ratio",
    "pin",
    "run_batch",
]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

DEFAULT = "httpx-default"
BULKHEAD = "bulkhead"
FLOOR = "h11-floor"
HTTPTOOLS = "bulkhead+httptools"
CONTESTANTS = (DEFAULT, BULKHEAD, HTTPTOOLS, FLOOR)
#: The HTTP/1.1 overhead rows beside those: each parser's floor, the aiohttp clients.
MORE_CONTESTANTS = (HTTPTOOLS_FLOOR, HTTPX_AIOHTTP, AIOHTTP)
#: HTTP/2 with prior knowledge (h2c), one origin: the same two transports, ``http1=False``.
H2_DEFAULT = "httpx-default-h2"
H2_BULKHEAD = "bulkhead-h2"
#: The HTTP/2 floor: h2 driven over a bare asyncio ``Protocol`` (``H2FloorDriver``).
H2_FLOOR = "h2-floor"
#: The h2 floor plus the httpx models a transport must take and give (``H2FloorTransport``).
H2_FLOOR_MODELS = "h2-floor+models"
H2_CONTESTANTS = (H2_DEFAULT, H2_BULKHEAD, H2_FLOOR, H2_FLOOR_MODELS)
#: The base each contestant's ``cpu_ratio`` is taken against (httpx's default, same protocol).
BASE_OF = {
    BULKHEAD: DEFAULT,
    HTTPTOOLS: DEFAULT,
    FLOOR: DEFAULT,
    HTTPTOOLS_FLOOR: DEFAULT,
    HTTPX_AIOHTTP: DEFAULT,
    AIOHTTP: DEFAULT,
    H2_BULKHEAD: H2_DEFAULT,
    H2_FLOOR: H2_DEFAULT,
    H2_FLOOR_MODELS: H2_DEFAULT,
}

Level = Literal["client", "transport"]

#: Cores for the client (this process) and the server, when the machine has two or more.
CLIENT_CPU = 0
SERVER_CPU = 1
#: Idle connections are kept this long by both transports, so nothing expires mid-run.
IDLE_SECONDS = 60.0


# -- the machine ------------------------------------------------------------------------
def machine_info() -> dict[str, Any]:
    """Facts for the README: cores, CPU model, Python and library versions."""
    model = platform.processor() or "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    node = shutil.which("node")
    node_version = (
        subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()
        if node
        else None
    )
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "node": node_version,
        "httpx": httpx.__version__,
        "httpcore": importlib.metadata.version("httpcore"),
        "h11": importlib.metadata.version("h11"),
        "httptools": _version("httptools"),
        "h2": _version("h2"),
    }


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def library_info() -> dict[str, Any]:
    """Which library source was measured: git HEAD, whether tracked library files differ from
    it, and a hash of the transport's modules (``httpx_bulkhead/*.py`` but the demo)."""
    digest = hashlib.sha256()
    for path in sorted((ROOT / "httpx_bulkhead").glob("*.py")):
        if path.name not in ("_demo.py", "__main__.py"):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    info: dict[str, Any] = {"source_sha256": digest.hexdigest()[:16], "git_head": None}
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        git = ["git", "-C", str(ROOT)]
        info["git_head"] = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no", "--", "httpx_bulkhead"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        info["library_dirty"] = bool(status.strip())
    return info


@contextlib.contextmanager
def pin(cpu: int = CLIENT_CPU) -> Iterator[bool]:
    """Pin this process to ``cpu`` for the block (if the machine has it); yields whether it
    did.  The previous affinity is restored afterwards."""
    if not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2:
        yield False
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield True
    finally:
        os.sched_setaffinity(0, before)


def open_fds() -> int:
    """File descriptors this process has open (Linux; -1 elsewhere)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1


def raise_fd_limit(wanted: int = 16384) -> None:
    """More file descriptors (1,000 origins need thousands of sockets); children inherit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


# -- the Node.js server -------------------------------------------------------------------
class NodeServer:
    """``node server.js`` on ``ports`` ports of 127.0.0.1, pinned to ``cpu`` if possible;
    with ``http2``, h2c (HTTP/2 with prior knowledge) announcing ``max_concurrent_streams``.

    Use as a context manager; the server exits when its stdin is closed (or, failing that,
    is terminated), so it never outlives the harness.  ``stats()``/``reset()`` ask it, over
    its stdin, how many connections and requests each port saw.
    """

    def __init__(
        self,
        ports: int = 1,
        *,
        cpu: int | None = SERVER_CPU,
        http2: bool = False,
        max_concurrent_streams: int = 100,
    ) -> None:
        self.want_ports = ports
        self.cpu = cpu
        self.http2 = http2
        self.max_concurrent_streams = max_concurrent_streams
        self.ports: list[int] = []
        self.pinned = False
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> NodeServer:
        node = shutil.which("node")
        if node is None:
            raise RuntimeError("the benchmarks need Node.js (`node`) on PATH")
        raise_fd_limit()
        cmd = [node, str(HERE / "server.js"), "--ports", str(self.want_ports)]
        if self.http2:
            cmd += ["--http2", "--max-concurrent-streams", str(self.max_concurrent_streams)]
        taskset = shutil.which("taskset")
        if self.cpu is not None and taskset and (os.cpu_count() or 1) > self.cpu:
            cmd = [taskset, "-c", str(self.cpu), *cmd]
            self.pinned = True
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            self.__exit__(None, None, None)
            raise RuntimeError("server.js exited before listening")
        self.ports = list(json.loads(line)["ports"])
        return self

    def __exit__(self, *exc_info: object) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.close()  # server.js exits on EOF
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.terminate()
            proc.wait(timeout=5)
        proc.stdout.close()

    def url(self, index: int = 0, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.ports[index]}{path}"

    def _command(self, command: str) -> dict[str, Any]:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise RuntimeError("the server is not running")
        proc.stdin.write(command.encode() + b"\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("server.js exited")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"server.js: {answer['error']}")
        return answer

    def stats(self) -> list[dict[str, int]]:
        """Per port, since the last ``reset``: ``connections`` accepted, ``open`` now,
        ``requests`` started and ``max_streams``, the most requests in flight at once on one
        connection (HTTP/2 streams; 1 on HTTP/1.1)."""
        return list(self._command("stats")["ports"])

    def reset(self) -> None:
        """Zero the counters of ``stats`` (but ``open``)."""
        self._command("reset")


# -- contestants --------------------------------------------------------------------------
def default_transport(
    max_connections: int | None, *, max_keepalive: int | None = None, http2: bool = False
) -> httpx.AsyncHTTPTransport:
    """httpx's default transport with one pool of ``max_connections`` (``None``: unlimited);
    with ``http2``, HTTP/2 only (prior knowledge on http://)."""
    keepalive = max_connections if max_keepalive is None else max_keepalive
    limits = httpx.Limits(
        max_connections=max_connections,
        max_keepalive_connections=keepalive,
        keepalive_expiry=IDLE_SECONDS,
    )
    if http2:
        return httpx.AsyncHTTPTransport(limits=limits, http1=False, http2=True)
    return httpx.AsyncHTTPTransport(limits=limits)


def bulkhead_transport(
    max_concurrency: int,
    *,
    hosts: Mapping[str, Policy] | None = None,
    http1_parser: str | None = None,
    http2: bool = False,
) -> BulkheadTransport:
    """``BulkheadTransport`` with ``max_concurrency`` per compartment (one per origin), the
    given HTTP/1.1 codec (``None``: the transport's default, httptools when installed);
    with ``http2``, HTTP/2 only (prior knowledge on http://; the stream cap per connection
    stays the default, 100)."""
    policy = Policy(max_concurrency=max_concurrency, idle_timeout=IDLE_SECONDS)
    if http2:
        return BulkheadTransport(
            default=policy, hosts=hosts, http1=False, http2=True, trust_env=False
        )
    # trust_env=False: the yardstick (httpx.AsyncHTTPTransport on its own) ignores HTTP_PROXY.
    return BulkheadTransport(
        default=policy, hosts=hosts, http1_parser=http1_parser, trust_env=False
    )


def pool_size(transport: httpx.AsyncBaseTransport) -> int:
    """Open connections held by a transport (for the record, not for control flow)."""
    if isinstance(transport, BulkheadTransport):
        return sum(s.connections for s in transport.statistics().values())
    if isinstance(transport, httpx.AsyncHTTPTransport):
        return len(transport._pool.connections)  # httpcore's public pool property
    return 0


def client_connection_stats(transport: httpx.AsyncBaseTransport) -> dict[str, int]:
    """What the transport says about its connections (the server's count is the reference):
    ``pooled`` now, and for BulkheadTransport ``created`` and HTTP/2 ``scale_outs``."""
    out = {"pooled": pool_size(transport)}
    if isinstance(transport, BulkheadTransport):
        stats = transport.statistics().values()
        out["created"] = sum(s.connections_created for s in stats)
        out["scale_outs"] = sum(s.scale_outs for s in stats)
    return out


class Driver(Protocol):
    """Sends one request (``i``-th of the run, by ``worker``) and reads the whole response."""

    name: str

    async def __call__(self, worker: int, i: int) -> None: ...

    async def aclose(self) -> None: ...


class ClientDriver:
    """``httpx.AsyncClient.get`` through a transport, cycling over ``urls``."""

    def __init__(self, name: str, transport: httpx.AsyncBaseTransport, urls: Sequence[str]):
        self.name = name
        self.transport = transport
        self._client = httpx.AsyncClient(transport=transport)
        self._urls = list(urls)

    async def __call__(self, worker: int, i: int) -> None:
        response = await self._client.get(self._urls[i % len(self._urls)])
        if response.status_code != 200:
            raise RuntimeError(f"unexpected status {response.status_code}")

    async def aclose(self) -> None:
        await self._client.aclose()


class TransportDriver:
    """``transport.handle_async_request`` called directly (no client), body read and
    response closed: what the transport itself costs."""

    def __init__(self, name: str, transport: httpx.AsyncBaseTransport, urls: Sequence[str]):
        self.name = name
        self.transport = transport
        self._urls = [httpx.URL(u) for u in urls]

    async def __call__(self, worker: int, i: int) -> None:
        request = httpx.Request("GET", self._urls[i % len(self._urls)])
        response = await self.transport.handle_async_request(request)
        try:
            await response.aread()
        finally:
            await response.aclose()
        if response.status_code != 200:
            raise RuntimeError(f"unexpected status {response.status_code}")

    async def aclose(self) -> None:
        await self.transport.aclose()


class _H11Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection driven by h11 on a bare asyncio Protocol."""

    def __init__(self) -> None:
        self._h11 = h11.Connection(h11.CLIENT)
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[int] | None = None
        self._status = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # (uvloop's: not a subclass)

    def data_received(self, data: bytes) -> None:
        self._h11.receive_data(data)
        while True:
            event = self._h11.next_event()
            if event is h11.NEED_DATA:
                return
            if isinstance(event, h11.Response):
                self._status = event.status_code
            elif isinstance(event, h11.EndOfMessage):
                self._h11.start_next_cycle()
                if self._waiter is not None and not self._waiter.done():
                    self._waiter.set_result(self._status)
                return
            elif isinstance(event, h11.ConnectionClosed):
                return

    def connection_lost(self, exc: Exception | None) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionError("connection lost"))

    async def get(self, target: bytes, headers: list[tuple[bytes, bytes]]) -> int:
        assert self._transport is not None
        data = self._h11.send(h11.Request(method=b"GET", target=target, headers=headers))
        data = (data or b"") + (self._h11.send(h11.EndOfMessage()) or b"")
        self._waiter = asyncio.get_running_loop().create_future()
        self._transport.write(data)
        return await self._waiter

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class H11FloorDriver:
    """The floor: one h11 connection per worker, opened in ``start``, no pool, no limits,
    the same request headers as ``httpx.AsyncClient`` sends."""

    def __init__(self, url: str, concurrency: int) -> None:
        self.name = FLOOR
        parsed = httpx.URL(url)
        self._host, self._port = parsed.host, parsed.port or 80
        self._target = parsed.raw_path
        self._headers = floor_headers(self._host, self._port)
        self._concurrency = concurrency
        self._conns: list[_H11Connection] = []

    async def start(self) -> H11FloorDriver:
        loop = asyncio.get_running_loop()
        for _ in range(self._concurrency):
            _, protocol = await loop.create_connection(_H11Connection, self._host, self._port)
            self._conns.append(protocol)
        return self

    async def __call__(self, worker: int, i: int) -> None:
        status = await self._conns[worker].get(self._target, self._headers)
        if status != 200:
            raise RuntimeError(f"unexpected status {status}")

    async def aclose(self) -> None:
        for conn in self._conns:
            conn.close()
        self._conns.clear()
        await asyncio.sleep(0)  # let the loop run the transports' close callbacks


class _H2Connection(asyncio.Protocol):
    """One h2c connection (prior knowledge) driven by h2 on a bare asyncio Protocol: every
    stream's waiter is resolved by ``data_received``, which writes h2's output once per
    read (WINDOW_UPDATEs, SETTINGS acks).  h2 is configured as BulkheadTransport configures
    it (``H2_CONFIG``: outbound header checks off), so the ratio to the floor is what our
    code adds to the same h2 work."""

    def __init__(self) -> None:
        self._h2 = h2.connection.H2Connection(config=H2_CONFIG)
        self._transport: asyncio.Transport | None = None
        self._waiters: dict[int, asyncio.Future[int]] = {}
        self._status: dict[int, int] = {}
        self._lost: Exception | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._h2.initiate_connection()
        transport.write(self._h2.data_to_send())

    def data_received(self, data: bytes) -> None:
        h2c = self._h2
        for event in h2c.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                for name, value in event.headers:
                    if name == b":status":
                        self._status[event.stream_id] = int(value)
            elif isinstance(event, h2.events.DataReceived):
                h2c.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                waiter = self._waiters.pop(event.stream_id, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(self._status.pop(event.stream_id, 0))
            elif isinstance(event, h2.events.StreamReset | h2.events.ConnectionTerminated):
                self.connection_lost(ConnectionError(f"HTTP/2: {type(event).__name__}"))
                return
        out = h2c.data_to_send()
        if out and self._transport is not None:
            self._transport.write(out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = exc or ConnectionError("connection lost")
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(self._lost)
        self._waiters.clear()

    async def get(self, headers: list[tuple[bytes, bytes]]) -> int:
        assert self._transport is not None
        if self._lost is not None:
            raise self._lost
        h2c = self._h2
        stream_id = h2c.get_next_available_stream_id()
        h2c.send_headers(stream_id, headers, end_stream=True)
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters[stream_id] = waiter
        self._transport.write(h2c.data_to_send())
        return await waiter

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class H2FloorDriver:
    """The HTTP/2 floor: one h2c connection (prior knowledge) shared by every worker, one
    stream per request, opened in ``start``; no pool, no limits, the same request headers
    as ``httpx.AsyncClient`` sends."""

    def __init__(self, url: str) -> None:
        self.name = H2_FLOOR
        parsed = httpx.URL(url)
        self._host, self._port = parsed.host, parsed.port or 80
        self._headers = [
            (b":method", b"GET"),
            (b":authority", f"{self._host}:{self._port}".encode()),
            (b":scheme", b"http"),
            (b":path", parsed.raw_path),
            (b"accept", b"*/*"),
            (b"accept-encoding", b"gzip, deflate"),
            (b"user-agent", f"python-httpx/{httpx.__version__}".encode()),
        ]
        self._conn: _H2Connection | None = None

    async def start(self) -> H2FloorDriver:
        loop = asyncio.get_running_loop()
        _, self._conn = await loop.create_connection(_H2Connection, self._host, self._port)
        return self

    async def __call__(self, worker: int, i: int) -> None:
        assert self._conn is not None
        status = await self._conn.get(self._headers)
        if status != 200:
            raise RuntimeError(f"unexpected status {status}")

    async def aclose(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        await asyncio.sleep(0)  # let the loop run the transport's close callback


#: What ``_H2ModelsConnection.exchange`` resolves to: status, headers, body chunks.
_H2Response = tuple[int, list[tuple[bytes, bytes]], list[bytes]]


class _H2ModelsConnection(_H2Connection):
    """The floor's connection, keeping each response's headers and body chunks (for
    ``H2FloorTransport``); otherwise the same work, frame for frame."""

    def __init__(self) -> None:
        super().__init__()
        self._responses: dict[int, asyncio.Future[_H2Response]] = {}
        self._heads: dict[int, tuple[int, list[tuple[bytes, bytes]]]] = {}
        self._bodies: dict[int, list[bytes]] = {}

    def data_received(self, data: bytes) -> None:
        h2c = self._h2
        for event in h2c.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                status, headers = 0, []
                for name, value in event.headers:
                    if name == b":status":
                        status = int(value)
                    elif not name.startswith(b":"):
                        headers.append((name, value))
                self._heads[event.stream_id] = (status, headers)
            elif isinstance(event, h2.events.DataReceived):
                self._bodies.setdefault(event.stream_id, []).append(event.data)
                h2c.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                stream_id = event.stream_id
                waiter = self._responses.pop(stream_id, None)
                status, headers = self._heads.pop(stream_id, (0, []))
                body = self._bodies.pop(stream_id, [])
                if waiter is not None and not waiter.done():
                    waiter.set_result((status, headers, body))
            elif isinstance(event, h2.events.StreamReset | h2.events.ConnectionTerminated):
                self.connection_lost(ConnectionError(f"HTTP/2: {type(event).__name__}"))
                return
        out = h2c.data_to_send()
        if out and self._transport is not None:
            self._transport.write(out)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        assert self._lost is not None
        for waiter in self._responses.values():
            if not waiter.done():
                waiter.set_exception(self._lost)
        self._responses.clear()

    async def exchange(self, headers: list[tuple[bytes, bytes]]) -> _H2Response:
        assert self._transport is not None
        if self._lost is not None:
            raise self._lost
        h2c = self._h2
        stream_id = h2c.get_next_available_stream_id()
        h2c.send_headers(stream_id, headers, end_stream=True)
        waiter: asyncio.Future[_H2Response] = asyncio.get_running_loop().create_future()
        self._responses[stream_id] = waiter
        self._transport.write(h2c.data_to_send())
        return await waiter


class _FloorBody(httpx.AsyncByteStream):
    """A response body already received, handed out as a transport's response stream."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk


#: Headers that must not go out on HTTP/2 (Host becomes :authority; RFC 9113 §8.2.2).
_H2_HOP_HEADERS = frozenset(
    {b"host", b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"}
)


class H2FloorTransport(httpx.AsyncBaseTransport):
    """The h2 floor called as a transport is: ``handle_async_request`` turns the
    ``httpx.Request`` into the least header list HTTP/2 needs (pseudo-headers from its URL,
    its own headers lowercased, without Host and the connection-specific ones), sends it on
    the floor's one connection and returns an ``httpx.Response`` with the stream's headers
    and body.  No checks, pool, limits or timeouts: what any h2 transport pays for the
    httpx contract, over the floor."""

    def __init__(self, url: str) -> None:
        parsed = httpx.URL(url)
        self._host, self._port = parsed.host, parsed.port or 80
        self._conn: _H2ModelsConnection | None = None

    async def start(self) -> H2FloorTransport:
        loop = asyncio.get_running_loop()
        _, self._conn = await loop.create_connection(_H2ModelsConnection, self._host, self._port)
        return self

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert self._conn is not None
        url = request.url
        headers = [
            (b":method", request.method.encode()),
            (b":authority", url.netloc),
            (b":scheme", url.raw_scheme),
            (b":path", url.raw_path),
        ]
        headers += [
            (name, value)
            for name, value in ((n.lower(), v) for n, v in request.headers.raw)
            if name not in _H2_HOP_HEADERS
        ]
        status, response_headers, body = await self._conn.exchange(headers)
        return httpx.Response(
            status,
            headers=response_headers,
            stream=_FloorBody(body),
            extensions={"http_version": b"HTTP/2"},
        )

    async def aclose(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        await asyncio.sleep(0)  # let the loop run the transport's close callback


async def make_driver(
    contestant: str, level: Level, urls: Sequence[str], concurrency: int
) -> Driver:
    """A driver for ``contestant`` at ``level``, sized for ``concurrency`` workers on one or
    more origins (``urls``): enough connections that none is opened once warm."""
    if contestant == FLOOR:
        if len(urls) != 1:
            raise ValueError("the h11 floor serves one origin")
        return await H11FloorDriver(urls[0], concurrency).start()
    if contestant == HTTPTOOLS_FLOOR:
        if len(urls) != 1:
            raise ValueError("the httptools floor serves one origin")
        return await HttptoolsFloorDriver(urls[0], concurrency).start()
    if contestant == AIOHTTP:  # a whole client: the same driver at both levels
        return AiohttpDriver(urls, concurrency if len(urls) == 1 else None, IDLE_SECONDS)
    if contestant == H2_FLOOR:
        if len(urls) != 1:
            raise ValueError("the h2 floor serves one origin")
        return await H2FloorDriver(urls[0]).start()
    transport: httpx.AsyncBaseTransport
    if contestant in (DEFAULT, H2_DEFAULT):
        transport = default_transport(
            concurrency if len(urls) == 1 else None, http2=contestant == H2_DEFAULT
        )
    elif contestant == BULKHEAD:
        transport = bulkhead_transport(concurrency, http1_parser="h11")
    elif contestant == HTTPTOOLS:
        transport = bulkhead_transport(concurrency, http1_parser="httptools")
    elif contestant == H2_BULKHEAD:
        transport = bulkhead_transport(concurrency, http2=True)
    elif contestant == H2_FLOOR_MODELS:
        if len(urls) != 1:
            raise ValueError("the h2 floor serves one origin")
        transport = await H2FloorTransport(urls[0]).start()
    elif contestant == HTTPX_AIOHTTP:
        transport = aiohttp_transport(concurrency if len(urls) == 1 else None, IDLE_SECONDS)
    elif contestant in MODELS_FLOORS:
        transport = await floor_models_transport(contestant, urls, concurrency)
    else:
        raise ValueError(f"unknown contestant {contestant!r}")
    if level == "client":
        return ClientDriver(contestant, transport, urls)
    return TransportDriver(contestant, transport, urls)


# -- measurements -------------------------------------------------------------------------
@dataclass(frozen=True)
class Sample:
    """One batch: requests completed, client CPU seconds and wall seconds it took."""

    requests: int
    cpu: float
    wall: float

    @property
    def cpu_us(self) -> float:
        """Client CPU microseconds per request."""
        return 1e6 * self.cpu / self.requests if self.requests else math.nan

    @property
    def rps(self) -> float:
        return self.requests / self.wall if self.wall > 0 else math.nan


async def run_batch(
    call: Callable[[int, int], Awaitable[None]],
    requests: int,
    concurrency: int,
    *,
    max_seconds: float | None = None,
) -> Sample:
    """``requests`` requests by ``concurrency`` workers (closed loop), timed.  With
    ``max_seconds``, workers stop taking new requests after that long (slow contestants)."""
    counter = itertools.count()
    done = 0

    async def worker(w: int) -> None:
        nonlocal done
        for i in counter:
            # (at least one request per batch: a stalled machine must not leave it empty)
            if i >= requests or (done and time.perf_counter() > deadline):
                return
            await call(w, i)
            done += 1

    gc.collect()
    deadline = math.inf if max_seconds is None else time.perf_counter() + max_seconds
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return Sample(done, time.process_time() - cpu0, time.perf_counter() - wall0)


async def interleave(
    drivers: Sequence[Driver],
    *,
    rounds: int,
    requests: int,
    concurrency: int,
    warmup: int,
    max_seconds: float | None = None,
) -> dict[str, list[Sample]]:
    """Warm every driver up, then ``rounds`` rounds in which each driver runs one batch;
    the order rotates every round (AB, BA, ... / ABC, BCA, CAB, ...) so that a drift of
    the machine's speed hits every contestant alike."""
    for driver in drivers:
        await run_batch(driver, warmup, concurrency, max_seconds=max_seconds)
    samples: dict[str, list[Sample]] = {d.name: [] for d in drivers}
    for r in range(rounds):
        k = r % len(drivers)
        for driver in [*drivers[k:], *drivers[:k]]:
            sample = await run_batch(driver, requests, concurrency, max_seconds=max_seconds)
            samples[driver.name].append(sample)
    return samples


@dataclass
class Summary:
    """Medians over rounds, and the paired (same-round) ratio against httpx's default
    (``httpx-default``, or ``httpx-default-h2`` for HTTP/2 contestants: ``BASE_OF``)."""

    cpu_us: float
    rps: float
    rounds: int
    requests_per_round: float
    cpu_ratio: float | None = None  # median of per-round cpu_us / default's cpu_us
    cpu_ratio_range: tuple[float, float] | None = None
    rps_ratio: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summarize(samples: Mapping[str, Sequence[Sample]]) -> dict[str, Summary]:
    out: dict[str, Summary] = {}
    for name, runs in samples.items():
        summary = Summary(
            cpu_us=statistics.median(s.cpu_us for s in runs),
            rps=statistics.median(s.rps for s in runs),
            rounds=len(runs),
            requests_per_round=statistics.mean(s.requests for s in runs),
        )
        base = BASE_OF.get(name)
        if base is not None and base in samples:
            ratio = paired_ratio(samples, name, base)
            summary.cpu_ratio, summary.cpu_ratio_range = ratio[0], (ratio[1], ratio[2])
            summary.rps_ratio = statistics.median(
                s.rps / b.rps for s, b in zip(runs, samples[base], strict=True)
            )
        out[name] = summary
    return out


def paired_ratio(
    samples: Mapping[str, Sequence[Sample]], name: str, base: str
) -> tuple[float, float, float]:
    """CPU per request of ``name`` over ``base``, round by round (both ran in each round):
    ``(median, min, max)`` over rounds."""
    ratios = [s.cpu_us / b.cpu_us for s, b in zip(samples[name], samples[base], strict=True)]
    return statistics.median(ratios), min(ratios), max(ratios)


# -- profiling -----------------------------------------------------------------------------
_PACKAGES = (
    "httpx_bulkhead",
    "httpcore",
    "httpx",
    "h11",
    "httptools",
    "h2",
    "hpack",
    "hyperframe",
    "anyio",
    "sniffio",
    "asyncio",
    "benchmarks",
)


def _package_of(filename: str) -> str:
    if filename.startswith("~") or filename.startswith("<"):
        return "builtins (socket I/O, ...)"
    parts = Path(filename).parts
    for name in _PACKAGES:
        if name in parts:
            return name
    return "other"


def _where(filename: str, line: int, func: str) -> str:
    """``package/module.py:line(function)``, from the package directory down."""
    if filename.startswith("~") or filename.startswith("<"):
        return func  # a builtin: "<method 'send' of '_socket.socket' objects>"
    parts = Path(filename).parts
    for name in _PACKAGES:
        if name in parts:
            parts = parts[parts.index(name) :]
            break
    else:
        parts = parts[-2:]
    return f"{'/'.join(parts)}:{line}({func})"


async def profile_breakdown(
    driver: Driver, requests: int, concurrency: int, *, top: int = 12
) -> tuple[dict[str, float], Sample, list[dict[str, Any]]]:
    """Run a batch under cProfile; exclusive time by package as shares of the total (what
    part of the CPU each layer takes; cProfile inflates small calls, so read it as a map of
    where the time goes, not as a measurement), and the ``top`` functions by exclusive time
    (``where``, ``share``, ``calls_per_request``, ``cumulative_share``; cProfile counts each
    resumption of a coroutine as a call).  The ``gc.collect()`` that ``run_batch`` makes
    before its clock starts is left out."""
    import cProfile
    import pstats

    profiler = cProfile.Profile(time.process_time)  # CPU, not wall: waiting in epoll is free
    profiler.enable()
    try:
        sample = await run_batch(driver, requests, concurrency)
    finally:
        profiler.disable()
    # {(file, line, function): (primitive calls, calls, exclusive time, cumulative, callers)}
    stats: dict[tuple[str, int, str], tuple[Any, ...]] = cast(Any, pstats.Stats(profiler)).stats
    stats.pop(("~", 0, "<built-in method gc.collect>"), None)  # run_batch's, not the client's
    totals: dict[str, float] = {}
    for (filename, _line, _func), (_cc, _nc, tottime, _ct, _callers) in stats.items():
        package = _package_of(filename)
        totals[package] = totals.get(package, 0.0) + tottime
    whole = sum(totals.values()) or 1.0
    shares = {k: v / whole for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}
    hottest = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    spots = [
        {
            "where": _where(*key),
            "share": tottime / whole,
            "cumulative_share": cumtime / whole,
            "calls_per_request": ncalls / max(1, sample.requests),
        }
        for key, (_cc, ncalls, tottime, cumtime, _callers) in hottest
    ]
    return shares, sample, spots


# -- warming pools ----------------------------------------------------------------------------
async def fill_pool(driver: Driver, url: str, connections: int) -> float:
    """Make ``driver``'s pool hold ``connections`` connections to ``url``'s origin: send that
    many requests at once to a path the server holds for 300 ms, so each needs its own.
    Returns the seconds it took.  (Not time-bounded: cancelling queued requests in httpx's
    default pool costs as much as serving them, so size the call instead.)"""
    if not isinstance(driver, ClientDriver | TransportDriver):
        raise TypeError("only pooled transports can be filled")
    held = url.rstrip("/") + "/slow?ms=300"
    transport = driver.transport

    async def one() -> None:
        response = await transport.handle_async_request(httpx.Request("GET", held))
        try:
            await response.aread()
        finally:
            await response.aclose()

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(connections)))
    return time.perf_counter() - started


async def warm_origins(driver: Driver, urls: Sequence[str], concurrency: int, *,
                       max_seconds: float | None = None) -> float:  # fmt: skip
    """One request per origin (so at least one pooled connection each), at most
    ``max_seconds``; returns the seconds it took."""
    started = time.perf_counter()
    await run_batch(driver, len(urls), concurrency, max_seconds=max_seconds)
    return time.perf_counter() - started


# -- isolation and recovery ------------------------------------------------------------------
@dataclass
class LoadRun:
    """One isolation/recovery run: every call made, and the compartments' last snapshot."""

    label: str
    records: list[CallRecord] = field(default_factory=list)
    saturated_after: float | None = None

    def of(self, host: str) -> list[CallRecord]:
        return [r for r in self.records if r.host == host]

    def fast_summary(self) -> dict[str, Any]:
        return host_summary(self.of("fast"))


def host_summary(records: Sequence[CallRecord]) -> dict[str, Any]:
    """Success rate, latency quantiles of the successes (ms) and failures by type."""
    ok = [r.latency for r in records if r.ok]
    failures: dict[str, int] = {}
    for r in records:
        if r.error is not None:
            failures[r.error] = failures.get(r.error, 0) + 1
    return {
        "calls": len(records),
        "ok": len(ok),
        "success_rate": len(ok) / len(records) if records else math.nan,
        "p50_ms": 1000 * percentile(ok, 0.5),
        "p99_ms": 1000 * percentile(ok, 0.99),
        "max_ms": 1000 * max(ok, default=math.nan),
        "failures": failures,
    }


class _SentCounter:
    """An httpx ``trace`` callback counting requests whose head was written, with a future
    resolved when ``target`` is reached: saturation is an event, not a sleep."""

    def __init__(self, target: int) -> None:
        self.count = 0
        self.target = target
        self.reached: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def __call__(self, name: str, info: dict[str, Any]) -> None:
        if name == "http11.send_request_headers.complete":
            self.count += 1
            if self.count >= self.target and not self.reached.done():
                self.reached.set_result(None)


async def load_run(
    label: str,
    transport: httpx.AsyncBaseTransport,
    *,
    fast_url: str,
    slow_url: Callable[[float], str] | None,
    slow_workers: int = 0,
    slow_rate: float | None = None,
    saturation: int = 0,
    duration: float,
    interval: float = 0.05,
    pool_timeout: float = 0.5,
) -> LoadRun:
    """Fast host called every ``interval`` s for ``duration`` s (open loop), beside a slow
    host loaded either by ``slow_workers`` closed-loop workers (started first; the fast calls
    start once ``saturation`` slow requests have been written) or by open-loop calls every
    ``slow_rate`` s to ``slow_url(t)``, or not at all (``slow_url=None``)."""
    run = LoadRun(label)
    timeout = httpx.Timeout(10.0, pool=pool_timeout)
    t0 = time.perf_counter()
    async with httpx.AsyncClient(transport=transport, timeout=timeout) as client:
        workers: list[asyncio.Task[None]] = []
        tasks: list[asyncio.Task[None]] = []
        try:
            if slow_url is not None and slow_workers:
                sent = _SentCounter(saturation)
                workers = await saturate(
                    client,
                    slow_url(0.0),
                    host="slow",
                    workers=slow_workers,
                    records=run.records,
                    t0=t0,
                    extensions={"trace": sent},
                )
                await asyncio.wait_for(sent.reached, 10.0)
                run.saturated_after = time.perf_counter() - t0
            if slow_url is not None and slow_rate is not None:
                tasks.append(
                    asyncio.create_task(
                        steady_calls(
                            client,
                            slow_url,
                            host="slow",
                            interval=slow_rate,
                            duration=duration,
                            records=run.records,
                            t0=t0,
                        )
                    )
                )
            await steady_calls(
                client,
                lambda _: fast_url,
                host="fast",
                interval=interval,
                duration=duration,
                records=run.records,
                t0=t0,
            )
            await asyncio.gather(*tasks)
        finally:
            for task in [*workers, *tasks]:
                task.cancel()
            await asyncio.gather(*workers, *tasks, return_exceptions=True)
    return run


def success_timeline(
    records: Sequence[CallRecord], *, bucket: float, until: float
) -> list[dict[str, float]]:
    """Calls per ``bucket`` seconds of *completion* time: ok and failed counts, from 0 to
    ``until`` or the last completion, whichever is later."""
    last = max((r.sent_at + r.latency for r in records), default=0.0)
    n = max(1, math.ceil(max(until, last) / bucket))
    ok = [0] * n
    failed = [0] * n
    for r in records:
        k = min(n - 1, int((r.sent_at + r.latency) / bucket))
        if r.ok:
            ok[k] += 1
        else:
            failed[k] += 1
    return [{"t": round(k * bucket, 3), "ok": ok[k], "failed": failed[k]} for k in range(n)]


def records_json(records: Sequence[CallRecord]) -> list[list[Any]]:
    """Compact: ``[host, sent_at, latency, error]`` rows."""
    return [
        [r.host, round(r.sent_at, 5), round(r.latency, 6), r.error]
        for r in sorted(records, key=lambda r: r.sent_at)
    ]


def python_flags() -> dict[str, Any]:
    return {"executable": sys.executable, "optimize": sys.flags.optimize, "dev": sys.flags.dev_mode}
