"""An instrumented ASGI test app and a hypercorn runner for it.

:class:`TestApp` is an ASGI app whose state can be inspected and controlled from the
test's own thread (asyncio *or* trio): gates that park requests until the test opens
them, and per-bucket concurrency accounting.

:class:`HypercornServer` runs any ASGI app under hypercorn (asyncio worker) in a daemon
thread, bound to ``127.0.0.1`` on an ephemeral port, serving HTTP/1.1, h2c (prior
knowledge, and ``Upgrade: h2c``) on plain TCP and HTTP/1.1 + h2 via ALPN on TLS.

Routes of :class:`TestApp` (query strings are ignored; any method is accepted)::

    /                   200 b"hello"
    /echo               200, body = request body, header x-method: <method>
    /status/{code}      that status, empty body
    /bytes/{n}          200, n bytes of b"x" (Content-Length: n) in 64 KiB body messages
    /stream/{n}         200, n body messages of b"x" * 1024, no Content-Length
                        (chunked on HTTP/1.1)
    /gate/{name}        parks in gate ``name`` until the test opens it, then 200
                        b"released:<name>"; if the client goes away while parked, the
                        handler returns without responding (counted as "abandoned")
    /headers            200, JSON object of request headers (lower-cased names;
                        repeated headers joined with ", ")
    /keepalive/{n}      200 b"keepalive", with ``Keep-Alive: timeout=n`` on HTTP/1.x
    /slow/{ms}          sleeps ms milliseconds, then 200 b"slow" (benchmarks only)
    /close              200 b"close" with ``Connection: close`` on HTTP/1.x
    anything else       404 b"not found"

Every response carries ``x-conn`` (the client's ``ip:port`` as seen by the server, i.e.
an identifier of the TCP connection), ``x-http-version`` (``1.1`` / ``2``) and
``x-bucket``.

Hypercorn notes (0.18):

* The app's ``Keep-Alive`` header is passed through unchanged on HTTP/1.1 (hypercorn
  neither strips nor rewrites it, and never adds one itself); hypercorn's own idle
  timeout is ``keep_alive_timeout`` regardless of what the header says. On HTTP/2 the
  header is connection-specific and illegal (the h2 library would refuse to send it),
  so ``/keepalive/{n}`` and ``/close`` omit those headers on h2.
* Hypercorn adds ``date`` and ``server: hypercorn-h11`` / ``hypercorn-h2`` headers.
* h2c cannot be turned off on a plain-TCP hypercorn listener: a client sending the h2
  preface always gets HTTP/2. ``alpn`` only applies to TLS.
* A ``Connection: close`` response header makes h11 close after the response.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import socket
import ssl
import struct
import threading
from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, cast

from hypercorn.asyncio.run import worker_serve
from hypercorn.config import Config, Sockets
from hypercorn.typing import ASGIFramework
from hypercorn.utils import wrap_app

from .raw import run_blocking
from .tls import DEFAULT_ALPN, ServerTLS

__all__ = [
    "ASGIApp",
    "Gate",
    "HypercornServer",
    "Message",
    "Receive",
    "RequestRecord",
    "Scope",
    "Send",
    "TestApp",
    "serve_lifespan",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LOCALHOST = "127.0.0.1"
CHUNK_SIZE = 64 * 1024
DEFAULT_TIMEOUT = 10.0

_log = logging.getLogger("tests.servers.hypercorn")


# --------------------------------------------------------------------------- gates


class Gate:
    """A named barrier inside :class:`TestApp`; obtain one with ``app.gate(name)``.

    Server side, each request to ``/gate/{name}`` *enters* the gate and then waits until
    the gate is open. Test side (any thread, any event loop):

    * ``gate.entered`` / ``gate.passed`` / ``gate.abandoned`` / ``gate.waiting`` -- counts.
    * ``gate.wait_entered(n, timeout)`` -- block until at least ``n`` requests entered
      (raises ``TimeoutError``). Blocking: call it from a thread, or use
    * ``await gate.until_entered(n, timeout)`` -- the same from async code, asyncio or
      trio (runs the blocking wait in a worker thread via ``raw.run_blocking``).
    * ``gate.open()`` -- release every current waiter and let all future requests through.
    * ``gate.close()`` -- make future requests wait again.

    ``wait_passed`` / ``until_passed`` wait until ``n`` requests were released.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._cond = threading.Condition()
        self._entered = 0
        self._passed = 0
        self._abandoned = 0
        self._open = False
        self._waiters: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Event]] = {}

    def __repr__(self) -> str:
        state = "open" if self._open else "closed"
        return f"<Gate {self.name!r} {state} entered={self._entered} passed={self._passed}>"

    @property
    def entered(self) -> int:
        with self._cond:
            return self._entered

    @property
    def passed(self) -> int:
        with self._cond:
            return self._passed

    @property
    def abandoned(self) -> int:
        """Requests that entered but whose client went away before the gate opened."""
        with self._cond:
            return self._abandoned

    @property
    def waiting(self) -> int:
        """Requests currently parked in the gate."""
        with self._cond:
            return len(self._waiters)

    @property
    def is_open(self) -> bool:
        with self._cond:
            return self._open

    def open(self) -> None:
        """Release all parked requests and let future ones through (thread-safe)."""
        with self._cond:
            self._open = True
            waiters = list(self._waiters.values())
        for loop, event in waiters:
            # RuntimeError: loop already closed, so the request is gone anyway.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(event.set)

    def close(self) -> None:
        """Make requests arriving from now on wait again (thread-safe)."""
        with self._cond:
            self._open = False

    def wait_entered(self, n: int = 1, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Block until at least ``n`` requests have entered; ``TimeoutError`` otherwise."""
        self._wait_count(lambda: self._entered, n, timeout, "entered")

    def wait_passed(self, n: int = 1, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Block until at least ``n`` requests have been released."""
        self._wait_count(lambda: self._passed, n, timeout, "passed")

    async def until_entered(self, n: int = 1, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Async (asyncio/trio) version of :meth:`wait_entered`."""
        await run_blocking(functools.partial(self.wait_entered, n, timeout))

    async def until_passed(self, n: int = 1, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Async (asyncio/trio) version of :meth:`wait_passed`."""
        await run_blocking(functools.partial(self.wait_passed, n, timeout))

    def _wait_count(self, get: Callable[[], int], n: int, timeout: float, what: str) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: get() >= n, timeout):
                raise TimeoutError(
                    f"gate {self.name!r}: {get()} of {n} requests {what} within {timeout}s"
                )

    async def pass_through(self) -> None:
        """Server side: enter the gate and wait until it is open (cancellable)."""
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        key = id(event)
        with self._cond:
            self._entered += 1
            if self._open:
                self._passed += 1
                self._cond.notify_all()
                return
            self._waiters[key] = (loop, event)
            self._cond.notify_all()
        try:
            await event.wait()
        except BaseException:
            with self._cond:
                del self._waiters[key]
                self._abandoned += 1
                self._cond.notify_all()
            raise
        with self._cond:
            del self._waiters[key]
            self._passed += 1
            self._cond.notify_all()


# ------------------------------------------------------------------------- the app


@dataclass(frozen=True)
class RequestRecord:
    """One request as seen by :class:`TestApp` (recorded when it enters the app)."""

    method: str
    path: str
    bucket: str
    conn: str
    http_version: str
    scheme: str


#: A request's TCP connection as the kernel lists it: (server address, client address),
#: both ``(ip, port)``.
Endpoints = tuple[tuple[str, int], tuple[str, int]]


class _Bucket:
    __slots__ = ("conns", "current", "inside", "max", "total")

    def __init__(self) -> None:
        self.current = 0
        self.max = 0
        self.total = 0
        self.conns: set[str] = set()
        #: The requests inside the app now: a token each, with its connection (if known).
        self.inside: dict[object, Endpoints | None] = {}


def _proc_address(address: tuple[str, int]) -> str:
    """``(ip, port)`` as ``/proc/net/tcp`` writes it: ``0100007F:1F90``."""
    ip, port = address
    (word,) = struct.unpack("=I", socket.inet_aton(ip))  # as the kernel prints it: native
    return f"{word:08X}:{port:04X}"


def _closed_by_client(connections: Iterable[Endpoints]) -> set[Endpoints] | None:
    """Which of these IPv4 connections (the server's side) are no longer ``ESTABLISHED``
    in the kernel's table: the client closed it (``CLOSE_WAIT``), or both did.  ``None``
    where the table cannot be read (not Linux): nothing is known."""
    wanted = {}
    for endpoints in connections:
        try:
            wanted[(_proc_address(endpoints[0]), _proc_address(endpoints[1]))] = endpoints
        except (OSError, ValueError, struct.error):  # not IPv4
            continue
    if not wanted:
        return set()
    try:
        with open("/proc/net/tcp", encoding="ascii") as table:
            rows = table.read().splitlines()[1:]
    except OSError:
        return None
    established = set()
    for row in rows:
        fields = row.split()
        key = (fields[1], fields[2])
        if fields[3] == "01" and key in wanted:  # 01: TCP_ESTABLISHED
            established.add(wanted[key])
    return set(wanted.values()) - established


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if bytes(key).lower() == name:
            return bytes(value).decode("latin-1")
    return None


class TestApp:
    """The instrumented ASGI app (see the module docstring for routes).

    Concurrency accounting is per *bucket*: the value of the request header
    ``x-bucket``, or else the ``Host`` header (``127.0.0.1:PORT``; on h2 hypercorn maps
    ``:authority`` to ``host``). A request is "inside" the app from the moment it is
    dispatched until just *before* its final body message is sent, so once a client has
    a complete response, ``current()`` no longer counts it. A request whose client
    disconnects while parked leaves when the handler notices; use
    :meth:`wait_current` / :meth:`until_current` to synchronise on that.

    ``max_concurrent()`` counts what a client-side limit bounds: at each request's
    arrival, the requests inside whose connection the client has not closed.  A client
    that cancels a request closes its connection (HTTP/1.1) before it lets another
    request go, but the handler notices the disconnect later, in the server's own time
    (and a request read from a connection already closed is dispatched all the same):
    counting handlers alone would charge the client for the server's lag.  The kernel's
    connection table (``/proc/net/tcp``, read at the arrival) says which connections
    the client has closed; where it cannot be read, every handler counts.  (A stream
    reset over HTTP/2 leaves its connection open: it counts until its handler leaves.)

    All accessors are thread-safe.
    """

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._buckets: dict[str, _Bucket] = {}
        self._gates: dict[str, Gate] = {}
        self._records: list[RequestRecord] = []

    # ---- test-side API

    def gate(self, name: str) -> Gate:
        """The gate ``name`` (created on first use, by the test or by a request)."""
        with self._cond:
            gate = self._gates.get(name)
            if gate is None:
                gate = self._gates[name] = Gate(name)
            return gate

    def open_all_gates(self) -> None:
        """Open every gate (``HypercornServer`` does this on exit to unblock shutdown)."""
        with self._cond:
            gates = list(self._gates.values())
        for gate in gates:
            gate.open()

    def current(self, bucket: str) -> int:
        """Requests of ``bucket`` inside the app right now."""
        with self._cond:
            b = self._buckets.get(bucket)
            return b.current if b else 0

    def max_concurrent(self, bucket: str) -> int:
        """Highest number of ``bucket`` requests simultaneously inside the app whose
        client had not closed their connection (see the class docstring)."""
        with self._cond:
            b = self._buckets.get(bucket)
            return b.max if b else 0

    def total(self, bucket: str) -> int:
        """Requests of ``bucket`` that entered the app."""
        with self._cond:
            b = self._buckets.get(bucket)
            return b.total if b else 0

    def connections(self, bucket: str) -> set[str]:
        """Distinct ``x-conn`` ids (``ip:port``) that carried requests of ``bucket``."""
        with self._cond:
            b = self._buckets.get(bucket)
            return set(b.conns) if b else set()

    def buckets(self) -> list[str]:
        with self._cond:
            return list(self._buckets)

    def records(self) -> list[RequestRecord]:
        """Every request that entered the app, in arrival order."""
        with self._cond:
            return list(self._records)

    def reset(self) -> None:
        """Clear counters and records. Gates are kept (use unique gate names per test)."""
        with self._cond:
            self._buckets.clear()
            self._records.clear()
            self._cond.notify_all()

    def wait_current(self, bucket: str, n: int = 0, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Block until ``current(bucket) == n``; ``TimeoutError`` otherwise."""

        def check() -> bool:
            b = self._buckets.get(bucket)
            return (b.current if b else 0) == n

        with self._cond:
            if not self._cond.wait_for(check, timeout):
                raise TimeoutError(f"bucket {bucket!r}: current={self.current(bucket)}, wanted {n}")

    async def until_current(
        self, bucket: str, n: int = 0, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        """Async (asyncio/trio) version of :meth:`wait_current`."""
        await run_blocking(functools.partial(self.wait_current, bucket, n, timeout))

    # ---- accounting

    def _enter(self, record: RequestRecord, token: object, endpoints: Endpoints | None) -> None:
        with self._cond:
            b = self._buckets.get(record.bucket)
            if b is None:
                b = self._buckets[record.bucket] = _Bucket()
            b.current += 1
            b.total += 1
            b.inside[token] = endpoints
            if b.current > b.max:  # (no higher count is possible otherwise)
                b.max = max(b.max, self._in_flight(b))
            b.conns.add(record.conn)
            self._records.append(record)
            self._cond.notify_all()

    @staticmethod
    def _in_flight(b: _Bucket) -> int:
        """The requests inside whose client has not closed their connection."""
        closed = _closed_by_client({e for e in b.inside.values() if e is not None})
        if not closed:
            return b.current
        return sum(1 for e in b.inside.values() if e not in closed)

    def _leave(self, bucket: str, token: object) -> None:
        with self._cond:
            b = self._buckets.get(bucket)
            if b is not None and b.current > 0:  # may have been reset() meanwhile
                b.current -= 1
                b.inside.pop(token, None)
            self._cond.notify_all()

    # ---- ASGI

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        if scope["type"] != "http":
            raise RuntimeError(f"TestApp: unsupported scope type {scope['type']!r}")

        client = scope.get("client")
        conn = f"{client[0]}:{client[1]}" if client else "unknown"
        server = scope.get("server")
        endpoints: Endpoints | None = None
        if client and server and server[1] is not None:
            endpoints = ((server[0], int(server[1])), (client[0], int(client[1])))
        bucket = _header(scope, b"x-bucket") or _header(scope, b"host") or ""
        record = RequestRecord(
            method=scope["method"],
            path=scope["path"],
            bucket=bucket,
            conn=conn,
            http_version=scope["http_version"],
            scheme=scope["scheme"],
        )
        left = False
        token = object()

        def leave() -> None:
            nonlocal left
            if not left:
                left = True
                self._leave(bucket, token)

        async def counted_send(message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                leave()
            await send(message)

        self._enter(record, token, endpoints)
        try:
            await self._route(scope, receive, counted_send, record)
        finally:
            leave()

    async def _route(self, scope: Scope, receive: Receive, send: Send, rec: RequestRecord) -> None:
        parts = scope["path"].strip("/").split("/")
        route, arg = parts[0], "/".join(parts[1:])
        h1 = not rec.http_version.startswith("2")

        async def respond(
            status: int, body: bytes, headers: Iterable[tuple[bytes, bytes]] = ()
        ) -> None:
            await self._start(send, rec, status, [(b"content-length", b"%d" % len(body))], headers)
            await send({"type": "http.response.body", "body": body, "more_body": False})

        if route == "" and not arg:
            await respond(200, b"hello")
        elif route == "echo":
            body = await _read_body(receive)
            if body is not None:
                await respond(200, body, [(b"x-method", rec.method.encode())])
        elif route == "status" and arg.isdigit():
            await respond(int(arg), b"")
        elif route == "bytes" and arg.isdigit():
            await self._send_bytes(send, rec, int(arg))
        elif route == "stream" and arg.isdigit():
            await self._start(send, rec, 200, [])
            chunk = b"x" * 1024
            for _ in range(int(arg)):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        elif route == "gate" and arg:
            if await _read_body(receive) is None:
                return
            if await _unless_disconnected(self.gate(arg).pass_through(), receive):
                await respond(200, b"released:" + arg.encode())
        elif route == "headers":
            headers: dict[str, str] = {}
            for key, value in scope["headers"]:
                name = bytes(key).decode("latin-1").lower()
                text = bytes(value).decode("latin-1")
                headers[name] = f"{headers[name]}, {text}" if name in headers else text
            await respond(
                200, json.dumps(headers).encode(), [(b"content-type", b"application/json")]
            )
        elif route == "keepalive" and arg.isdigit():
            extra = [(b"keep-alive", b"timeout=" + arg.encode())] if h1 else []
            await respond(200, b"keepalive", extra)
        elif route == "slow" and arg.isdigit():
            if await _unless_disconnected(asyncio.sleep(int(arg) / 1000), receive):
                await respond(200, b"slow")
        elif route == "close" and not arg:
            await respond(200, b"close", [(b"connection", b"close")] if h1 else [])
        else:
            await respond(404, b"not found")

    async def _start(
        self,
        send: Send,
        rec: RequestRecord,
        status: int,
        headers: Iterable[tuple[bytes, bytes]],
        extra: Iterable[tuple[bytes, bytes]] = (),
    ) -> None:
        all_headers = [
            *headers,
            (b"x-conn", rec.conn.encode()),
            (b"x-http-version", rec.http_version.encode()),
            (b"x-bucket", rec.bucket.encode("latin-1")),
            *extra,
        ]
        await send({"type": "http.response.start", "status": status, "headers": all_headers})

    async def _send_bytes(self, send: Send, rec: RequestRecord, n: int) -> None:
        await self._start(send, rec, 200, [(b"content-length", b"%d" % n)])
        remaining = n
        chunk = b"x" * CHUNK_SIZE
        while remaining > CHUNK_SIZE:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            remaining -= CHUNK_SIZE
        await send({"type": "http.response.body", "body": chunk[:remaining], "more_body": False})


async def serve_lifespan(receive: Receive, send: Send) -> None:
    """Answer an ASGI lifespan scope: startup, then shutdown (any app here)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body, or ``None`` if the client disconnected first."""
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


async def _unless_disconnected(aw: Awaitable[None], receive: Receive) -> bool:
    """Await ``aw`` (after the body was read); ``False`` if the client disconnects first."""

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    work = asyncio.ensure_future(aw)
    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (work, watcher):
            task.cancel()
        await asyncio.gather(work, watcher, return_exceptions=True)
    return work.done() and not work.cancelled() and work.exception() is None


# ---------------------------------------------------------------------- the runner


class _Config(Config):
    """Hypercorn config whose TLS context comes from a :class:`ServerTLS`."""

    def __init__(self, tls: ServerTLS | None, alpn: Sequence[str]) -> None:
        self._tls = tls
        self._alpn = tuple(alpn)

    @property
    def ssl_enabled(self) -> bool:
        return self._tls is not None

    def create_ssl_context(self) -> ssl.SSLContext | None:
        if self._tls is None:
            return None
        return self._tls.server_ssl_context(self._alpn)


class HypercornServer:
    """Run an ASGI app under hypercorn's asyncio worker in a background daemon thread.

    ::

        with HypercornServer(TestApp(), tls=default_server_tls()) as srv:
            srv.url  # "https://127.0.0.1:PORT"

    The listening socket is created and bound (``127.0.0.1:0``) in ``__enter__`` and
    handed to hypercorn's ``worker_serve(..., sockets=...)``, so the port is known
    before hypercorn starts. ``__enter__`` returns once hypercorn is accepting (its
    ``shutdown_trigger`` is only awaited after all listeners are started, which is what
    the ready event hangs off). ``__exit__`` opens all gates of a :class:`TestApp`,
    triggers a graceful shutdown (idle keep-alive connections are closed at once,
    in-flight requests get ``graceful_timeout`` seconds before being cancelled) and
    joins the thread.

    ``tls=None`` serves HTTP/1.1 and h2c; with a :class:`ServerTLS` it serves TLS with
    ALPN ``alpn`` (use ``alpn=("http/1.1",)`` for an HTTP/1.1-only TLS server).
    Errors raised inside hypercorn's thread are re-raised from ``__enter__`` /
    ``__exit__``.
    """

    host = LOCALHOST

    def __init__(
        self,
        app: ASGIApp,
        *,
        tls: ServerTLS | None = None,
        keep_alive_timeout: float = 5.0,
        h2_max_concurrent_streams: int = 100,
        alpn: Sequence[str] = DEFAULT_ALPN,
        graceful_timeout: float = 2.0,
        keep_alive_max_requests: int = 1000,
        read_timeout: int | None = None,
        startup_timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.app = app
        self.tls = tls
        self.startup_timeout = startup_timeout
        config = _Config(tls, alpn)
        config.keep_alive_timeout = keep_alive_timeout
        config.h2_max_concurrent_streams = h2_max_concurrent_streams
        config.alpn_protocols = list(alpn)
        config.graceful_timeout = graceful_timeout
        config.keep_alive_max_requests = keep_alive_max_requests
        config.read_timeout = read_timeout
        config.errorlog = _log
        config.accesslog = None
        self.config: Config = config
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._port = 0

    @property
    def port(self) -> int:
        if not self._port:
            raise RuntimeError("HypercornServer is not running")
        return self._port

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def __repr__(self) -> str:
        return f"<HypercornServer {self.scheme}://{self.host}:{self._port or '?'}>"

    def __enter__(self) -> HypercornServer:
        if self._thread is not None:
            raise RuntimeError("HypercornServer is not re-entrant")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.bind((LOCALHOST, 0))
            sock.listen(self.config.backlog)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._port = sock.getsockname()[1]
        self._thread = threading.Thread(
            target=self._run, name=f"hypercorn-test-{self._port}", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(self.startup_timeout) or self._stop is None:
            self._shutdown()
            raise RuntimeError(f"hypercorn did not start: {self._error!r}") from self._error
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if isinstance(self.app, TestApp):
            self.app.open_all_gates()
        self._shutdown()
        if exc is None and self._error is not None:
            raise RuntimeError("hypercorn thread failed") from self._error

    def _shutdown(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            # RuntimeError: loop already closed, the thread is exiting.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(self.config.graceful_timeout + DEFAULT_TIMEOUT)
            if self._thread.is_alive():
                raise RuntimeError("hypercorn thread did not stop")
        if self._sock is not None:
            self._sock.close()  # normally already closed by asyncio's Server.close()

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to the main thread
            self._error = exc
        finally:
            self._ready.set()  # unblock __enter__ if startup failed

    async def _serve(self) -> None:
        assert self._sock is not None
        stop = asyncio.Event()

        async def shutdown_trigger() -> None:
            # hypercorn awaits this only once every listener is serving.
            self._stop = stop
            self._loop = asyncio.get_running_loop()
            self._ready.set()
            await stop.wait()

        secure = [self._sock] if self.tls is not None else []
        insecure = [] if self.tls is not None else [self._sock]
        app = wrap_app(cast(ASGIFramework, self.app), self.config.wsgi_max_body_size, "asgi")
        try:
            await worker_serve(
                app,
                self.config,
                sockets=Sockets(secure, insecure, []),
                shutdown_trigger=shutdown_trigger,
            )
        except asyncio.CancelledError:
            # hypercorn 0.18 calls ``.exception()`` on the cancelled gather of connection
            # tasks when graceful_timeout expires, which raises CancelledError. The
            # connections are gone by then; treat it as a completed shutdown.
            if not stop.is_set():
                raise
