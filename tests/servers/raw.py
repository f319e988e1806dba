"""A raw-socket HTTP/1.1 server scripted per connection, for faults real servers avoid.

::

    def handler(conn: RawConn) -> None:       # runs in its own thread per connection
        while (request := conn.read_request()) is not None:
            conn.send_response(200, b"ok")

    with RawServer(handler) as srv:            # 127.0.0.1:0
        srv.url, srv.port, srv.connections, srv.requests

Synchronisation between handler and test uses named events: ``srv.event(name)`` is a
``threading.Event`` (subclass) shared by both sides. Handlers wait with
``conn.wait(name)`` / ``conn.sleep(seconds)``, which also return early when the server
shuts down; tests wait with ``await srv.wait_event(name)`` (asyncio or trio; see
:func:`run_blocking`) or, from sync code, ``srv.wait_event_sync(name)``.
Naming elsewhere: ``wait_requests`` / ``wait_connections`` block, their ``until_*``
twins are awaitable.

Shutdown (``__exit__``): sets the stop flag, wakes the accept loop, ``shutdown()``s
every connection socket (so blocked ``recv``/``send`` return), joins every thread and
closes every socket. ``OSError``s raised in handlers (client went away, reset during
shutdown...) are recorded in ``srv.errors`` and ignored; any other handler exception is
re-raised from ``__exit__`` so handler bugs do not go unnoticed.

TLS: ``RawServer(handler, tls=ServerTLS)`` serves https on the same scripted handlers.
The server side of TLS runs on an ``ssl.SSLObject`` over memory buffers, so a handler
controls the records on the wire: ``conn.send`` sends one record per call (up to 16 KiB),
``conn.seal(data)`` returns the encrypted bytes without sending them, and
``conn.send_raw(bytes)`` writes bytes as they are (several records in one write, or part
of a record).  On plain TCP ``seal`` returns its input, so the same handler serves both.
A failed handshake is recorded in ``srv.errors`` and sets event ``"handshake-failed"``.

Unix sockets: ``RawServer(handler, uds=path)`` listens on ``path`` instead of TCP
(``srv.url`` is then ``http://localhost``; the client must be given ``uds=path``).

The handler factories at the bottom of the module cover the usual faults.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import selectors
import socket
import ssl
import struct
import sys
import threading
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import anyio.to_thread

if TYPE_CHECKING:
    from .tls import ServerTLS

__all__ = [
    "Handler",
    "RawConn",
    "RawServer",
    "ServerEvent",
    "chunked_garbage",
    "close_after_response",
    "extra_response_in_next_record",
    "extra_response_while_idle",
    "first_answer_then_ok",
    "garbage_status_line",
    "huge_headers",
    "keepalive_header",
    "keepalive_ok",
    "late_response",
    "never_answer",
    "no_length_keep_alive",
    "request_path",
    "reset_after_headers",
    "reset_mid_body",
    "response_bytes",
    "run_blocking",
    "slowloris",
    "truncated_body",
]

LOCALHOST = "127.0.0.1"
DEFAULT_TIMEOUT = 10.0
MAX_HEAD = 1024 * 1024
RECV_SIZE = 65536

Handler = Callable[["RawConn"], None]
T = TypeVar("T")
_R = TypeVar("_R", bound="RawBacked")


def _current_trio() -> Any:
    """The ``trio`` module if the calling task runs under trio, else ``None``."""
    trio: Any = sys.modules.get("trio")
    if trio is None:
        return None
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return None
    return trio


async def run_blocking(func: Callable[[], T]) -> T:
    """Run a blocking call in a worker thread, from asyncio or trio (via anyio).

    If the awaiting task is cancelled, the thread is abandoned (it finishes on its own;
    all waits in this package have timeouts). Under trio this calls
    ``trio.to_thread.run_sync`` directly: anyio 4.16's ``to_thread`` passes
    ``abandon_on_cancel=``, which trio < 0.23 (0.22.2 is installed) does not accept.
    """
    trio = _current_trio()
    if trio is not None:
        params = inspect.signature(trio.to_thread.run_sync).parameters
        flag = "abandon_on_cancel" if "abandon_on_cancel" in params else "cancellable"
        result: T = await trio.to_thread.run_sync(func, **{flag: True})
        return result
    return await anyio.to_thread.run_sync(func, abandon_on_cancel=True)


class ServerEvent(threading.Event):
    """A ``threading.Event`` that also wakes handlers blocked in ``RawConn.wait``."""

    def __init__(self, on_set: Callable[[], None]) -> None:
        super().__init__()
        self._on_set = on_set

    def set(self) -> None:
        super().set()
        self._on_set()


def request_path(request: bytes) -> bytes:
    """The request-target of a raw request (``b"/path?q"``), ``b""`` if unparsable."""
    line = request.split(b"\r\n", 1)[0]
    parts = line.split(b" ")
    return parts[1] if len(parts) >= 3 else b""


def response_bytes(
    status: int = 200,
    body: bytes = b"",
    headers: Iterable[tuple[str, str]] = (),
    *,
    reason: str = "",
    content_length: bool = True,
) -> bytes:
    """Serialise an HTTP/1.1 response (with ``Content-Length`` unless told otherwise)."""
    lines = [f"HTTP/1.1 {status} {reason or _REASONS.get(status, 'Status')}"]
    if content_length:
        lines.append(f"Content-Length: {len(body)}")
    lines.extend(f"{name}: {value}" for name, value in headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


_REASONS = {200: "OK", 204: "No Content", 404: "Not Found", 500: "Internal Server Error"}


class _ServerTLS:
    """The server side of TLS over a blocking socket, on memory buffers (so the caller
    decides how records are grouped into writes)."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext) -> None:
        self.sock = sock
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.obj = context.wrap_bio(self.incoming, self.outgoing, server_side=True)

    def handshake(self) -> None:
        """Raises ``ssl.SSLError`` or ``OSError`` (``ConnectionError`` on EOF)."""
        while True:
            try:
                self.obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                self.flush()
                data = self.sock.recv(RECV_SIZE)
                if not data:
                    raise ConnectionError("EOF during the TLS handshake") from None
                self.incoming.write(data)
        self.flush()  # the last flight, and TLS 1.3 session tickets

    def flush(self) -> None:
        data = self.outgoing.read()
        if data:
            self.sock.sendall(data)

    def seal(self, data: bytes) -> bytes:
        """``data`` as TLS records (one per 16 KiB), not sent."""
        if data:
            self.obj.write(data)
        return self.outgoing.read()

    def recv(self, n: int) -> bytes:
        """Up to ``n`` decrypted bytes; ``b""`` on EOF, close_notify or a TLS error."""
        while True:
            try:
                return self.obj.read(n)
            except ssl.SSLWantReadError:
                data = self.sock.recv(RECV_SIZE)
                if not data:
                    return b""
                self.incoming.write(data)
            except ssl.SSLError:
                return b""


class RawConn:
    """One accepted connection, handed to the handler (which runs in its own thread).

    ``index`` is the 0-based accept order. Reads return ``None``/``b""`` on EOF,
    connection reset, or server shutdown -- handlers can simply return then.
    ``tls`` is set once the TLS handshake is done (https servers only).
    """

    def __init__(self, server: RawServer, sock: socket.socket, index: int) -> None:
        self.server = server
        self.sock = sock
        self.index = index
        self.peer: Any = sock.getpeername()  # (host, port); "" on a Unix socket
        self.tls: _ServerTLS | None = None
        self._buffer = b""
        self._lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"<RawConn #{self.index} peer={self.peer}>"

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def stopping(self) -> bool:
        """True once the server is shutting down."""
        return self.server.stopping

    # ---- reading

    def recv(self, n: int = RECV_SIZE) -> bytes:
        """Up to ``n`` bytes (buffered first); ``b""`` on EOF/reset/shutdown."""
        if self._buffer:
            data, self._buffer = self._buffer[:n], self._buffer[n:]
            return data
        try:
            return self.sock.recv(n) if self.tls is None else self.tls.recv(n)
        except OSError:
            return b""

    def _fill(self) -> bool:
        try:
            data = self.sock.recv(RECV_SIZE) if self.tls is None else self.tls.recv(RECV_SIZE)
        except OSError:
            data = b""
        self._buffer += data
        return bool(data)

    def _read_line(self) -> bytes | None:
        while b"\r\n" not in self._buffer:
            if not self._fill():
                return None
        line, self._buffer = self._buffer.split(b"\r\n", 1)
        return line

    def _read_exact(self, n: int) -> bytes | None:
        while len(self._buffer) < n:
            if not self._fill():
                return None
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def read_request(self) -> bytes | None:
        """Read one request (head + body by Content-Length or chunked); raw bytes.

        Returns ``None`` on EOF (including EOF mid-request), reset or shutdown. The head
        is appended to ``server.requests`` as soon as it is complete.
        """
        while b"\r\n\r\n" not in self._buffer:
            if len(self._buffer) > MAX_HEAD or not self._fill():
                return None
        end = self._buffer.index(b"\r\n\r\n") + 4
        head, self._buffer = self._buffer[:end], self._buffer[end:]
        self.server._record_request(head)

        length = 0
        chunked = False
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value.strip())
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True

        if not chunked:
            body = self._read_exact(length)
            return None if body is None else head + body

        raw = b""
        while True:
            size_line = self._read_line()
            if size_line is None:
                return None
            size = int(size_line.split(b";")[0].strip(), 16)
            raw += size_line + b"\r\n"
            if size == 0:
                while True:  # trailers, up to the empty line
                    trailer = self._read_line()
                    if trailer is None:
                        return None
                    raw += trailer + b"\r\n"
                    if not trailer:
                        return head + raw
            chunk = self._read_exact(size + 2)
            if chunk is None:
                return None
            raw += chunk

    # ---- writing

    def send(self, data: bytes) -> None:
        """``sendall`` (over TLS: as records, in one write); raises ``OSError`` if the
        peer is gone (handlers may let it)."""
        self.sock.sendall(self.seal(data))

    def seal(self, data: bytes) -> bytes:
        """What ``send(data)`` would write: TLS records over TLS, ``data`` itself else."""
        return data if self.tls is None else self.tls.seal(data)

    def send_raw(self, data: bytes) -> None:
        """Write ``data`` exactly as given (e.g. several sealed records, or part of one)."""
        self.sock.sendall(data)

    def send_response(
        self,
        status: int = 200,
        body: bytes = b"",
        headers: Iterable[tuple[str, str]] = (),
        *,
        reason: str = "",
    ) -> None:
        """Send a complete response with ``Content-Length`` and ``x-conn: <index>``."""
        all_headers = [("x-conn", str(self.index)), *headers]
        self.send(response_bytes(status, body, all_headers, reason=reason))

    # ---- closing

    def close(self) -> None:
        """Close the socket (FIN). Idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self.sock.close()

    def reset(self) -> None:
        """Abort the connection with a TCP RST (SO_LINGER 0, then close). Idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                try:
                    self.sock.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
                finally:
                    self.sock.close()

    def _interrupt(self) -> None:
        """Unblock a handler stuck in recv/send (called by the server on shutdown)."""
        with self._lock:
            if not self._closed:
                with contextlib.suppress(OSError):
                    self.sock.shutdown(socket.SHUT_RDWR)

    # ---- synchronisation

    def wait(self, event: str | threading.Event, timeout: float | None = None) -> bool:
        """Wait for a server event (by name) or server shutdown.

        Returns ``True`` if the event is set, ``False`` on shutdown or timeout.
        """
        return self.server._wait(event, timeout)

    def sleep(self, seconds: float) -> bool:
        """Sleep, but wake up on shutdown. Returns ``False`` if the server is stopping."""
        self.server._wait(None, seconds)
        return not self.server.stopping


class RawServer:
    """Accept on ``127.0.0.1:0`` and run ``handler(conn)`` in a thread per connection.

    Attributes: ``port``, ``host``, ``url`` (``http://127.0.0.1:PORT``, or ``https://``
    with ``tls``), ``connections`` (number accepted), ``requests`` (raw heads read via
    ``read_request``, in order), ``errors`` (``OSError``s raised by handlers).

    ``tls``: serve TLS with this certificate, offering ``alpn`` (``None``: plain TCP).
    ``uds``: listen on this Unix socket path instead of TCP (removed on exit).
    """

    host = LOCALHOST

    def __init__(
        self,
        handler: Handler,
        *,
        join_timeout: float = DEFAULT_TIMEOUT,
        tls: ServerTLS | None = None,
        alpn: tuple[str, ...] = ("http/1.1",),
        uds: str | None = None,
    ) -> None:
        self.handler = handler
        self.join_timeout = join_timeout
        self.uds = uds
        self._tls_context = None if tls is None else tls.server_ssl_context(alpn=alpn)
        self.errors: list[BaseException] = []
        self._failures: list[BaseException] = []
        self._cond = threading.Condition()
        self._events: dict[str, ServerEvent] = {}
        self._requests: list[bytes] = []
        self._conns: list[RawConn] = []
        self._threads: list[threading.Thread] = []
        self._stopping = False
        self._listener: socket.socket | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._port = 0

    # ---- public state

    @property
    def port(self) -> int:
        if self.uds is not None:
            raise RuntimeError("a RawServer on a Unix socket has no port")
        if not self._port:
            raise RuntimeError("RawServer is not running")
        return self._port

    @property
    def url(self) -> str:
        if self.uds is not None:
            return "http://localhost"
        scheme = "http" if self._tls_context is None else "https"
        return f"{scheme}://{self.host}:{self.port}"

    @property
    def connections(self) -> int:
        with self._cond:
            return len(self._conns)

    @property
    def requests(self) -> list[bytes]:
        with self._cond:
            return list(self._requests)

    @property
    def stopping(self) -> bool:
        with self._cond:
            return self._stopping

    def __repr__(self) -> str:
        return f"<RawServer http://{self.host}:{self._port or '?'}>"

    # ---- events

    def event(self, name: str) -> ServerEvent:
        """The named event shared by handlers and the test (created on first use)."""
        with self._cond:
            ev = self._events.get(name)
            if ev is None:
                ev = self._events[name] = ServerEvent(self._notify)
            return ev

    def set_event(self, name: str) -> None:
        self.event(name).set()

    def wait_event_sync(self, name: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Block until event ``name`` is set; ``TimeoutError`` otherwise."""
        if not self.event(name).wait(timeout):
            raise TimeoutError(f"RawServer event {name!r} not set within {timeout}s")

    async def wait_event(self, name: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Async (asyncio/trio): wait until event ``name`` is set; ``TimeoutError``
        otherwise. Blocking variant: :meth:`wait_event_sync`."""
        await run_blocking(functools.partial(self.wait_event_sync, name, timeout))

    def wait_requests(self, n: int = 1, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Block until at least ``n`` request heads were read; ``TimeoutError`` otherwise."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._requests) >= n, timeout):
                raise TimeoutError(f"{len(self._requests)} of {n} requests within {timeout}s")

    async def until_requests(self, n: int = 1, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Async (asyncio/trio) version of :meth:`wait_requests`."""
        await run_blocking(functools.partial(self.wait_requests, n, timeout))

    def wait_connections(self, n: int = 1, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Block until at least ``n`` connections were accepted."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._conns) >= n, timeout):
                raise TimeoutError(f"{len(self._conns)} of {n} connections within {timeout}s")

    async def until_connections(self, n: int = 1, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Async (asyncio/trio) version of :meth:`wait_connections`."""
        await run_blocking(functools.partial(self.wait_connections, n, timeout))

    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _wait(self, event: str | threading.Event | None, timeout: float | None) -> bool:
        ev = self.event(event) if isinstance(event, str) else event
        with self._cond:
            self._cond.wait_for(lambda: self._stopping or (ev is not None and ev.is_set()), timeout)
            return ev is not None and ev.is_set()

    def _record_request(self, head: bytes) -> None:
        with self._cond:
            self._requests.append(head)
            self._cond.notify_all()

    # ---- lifecycle

    def __enter__(self) -> RawServer:
        if self._listener is not None:
            raise RuntimeError("RawServer is not re-entrant")
        family = socket.AF_INET if self.uds is None else socket.AF_UNIX
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.bind((LOCALHOST, 0) if self.uds is None else self.uds)
            listener.listen(128)
            listener.setblocking(False)
            self._wake_r, self._wake_w = socket.socketpair()
        except BaseException:
            listener.close()
            raise
        self._listener = listener
        self._port = listener.getsockname()[1] if self.uds is None else -1
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name=f"raw-accept-{self._port}", daemon=True
        )
        self._accept_thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
        if exc is None and self._failures:
            raise RuntimeError(f"RawServer handler failed: {self._failures!r}") from (
                self._failures[0]
            )

    def close(self) -> None:
        """Stop accepting, interrupt handlers, join all threads, close all sockets."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._wake_w is not None:
            with contextlib.suppress(OSError):
                self._wake_w.send(b"x")
        if self._accept_thread is not None:
            self._accept_thread.join(self.join_timeout)
        with self._cond:
            conns = list(self._conns)
            threads = list(self._threads)
        for conn in conns:
            conn._interrupt()
        stuck = []
        for thread in threads:
            thread.join(self.join_timeout)
            if thread.is_alive():
                stuck.append(thread.name)
        for conn in conns:
            conn.close()
        for sock in (self._listener, self._wake_r, self._wake_w):
            if sock is not None:
                sock.close()
        if self.uds is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.uds)
        if stuck or (self._accept_thread is not None and self._accept_thread.is_alive()):
            raise RuntimeError(f"RawServer threads did not stop: {stuck}")

    def _accept_loop(self) -> None:
        assert self._listener is not None and self._wake_r is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self._listener, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while not self.stopping:
                for key, _ in sel.select():
                    if key.fileobj is self._wake_r:
                        return
                    try:
                        sock, _addr = self._listener.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        return
                    self._spawn(sock)

    def _spawn(self, sock: socket.socket) -> None:
        sock.setblocking(True)
        if sock.family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._cond:
            if self._stopping:
                sock.close()
                return
            try:
                conn = RawConn(self, sock, len(self._conns))
            except OSError:  # peer already gone (getpeername failed)
                sock.close()
                return
            thread = threading.Thread(
                target=self._run_handler,
                args=(conn,),
                name=f"raw-conn-{self._port}-{conn.index}",
                daemon=True,
            )
            self._conns.append(conn)
            self._threads.append(thread)
            self._cond.notify_all()
        thread.start()

    def _run_handler(self, conn: RawConn) -> None:
        try:
            if self._tls_context is not None:
                tls = _ServerTLS(conn.sock, self._tls_context)
                try:
                    tls.handshake()
                except (ssl.SSLError, OSError) as exc:
                    with self._cond:
                        self.errors.append(exc)
                    self.set_event("handshake-failed")
                    return
                conn.tls = tls
            self.handler(conn)
        except OSError as exc:
            with self._cond:
                self.errors.append(exc)
        except BaseException as exc:  # re-raised from __exit__
            with self._cond:
                self._failures.append(exc)
        finally:
            conn.close()


# ------------------------------------------------------------------ handler factories


def hold_on_request(conn: RawConn) -> None:
    """Like :func:`keepalive_ok`, except a request for ``/hold...``: it sets event ``held``
    and is answered only once the test sets ``release``."""
    while (request := conn.read_request()) is not None:
        if request_path(request).startswith(b"/hold"):
            conn.server.event("held").set()
            if not conn.wait("release"):
                return
        conn.send_response(200, b"ok")


def keepalive_ok(body: bytes = b"ok", headers: Iterable[tuple[str, str]] = ()) -> Handler:
    """Serve every request on the connection: 200, ``Content-Length``, keep-alive,
    ``x-conn: <conn index>`` plus ``headers``. Returns when the client closes."""
    extra = list(headers)

    def handler(conn: RawConn) -> None:
        while conn.read_request() is not None:
            conn.send_response(200, body, extra)

    return handler


def _first_request_on_0(conn: RawConn) -> bool:
    """Whether ``conn`` is connection #0 and its first request was read; any other
    connection is served ``fresh`` here, every request."""
    if conn.index != 0:
        keepalive_ok(b"fresh")(conn)
        return False
    return conn.read_request() is not None


def first_answer_then_ok(answer: Handler) -> Handler:
    """Connection #0 has its first request answered by ``answer(conn)`` (which may read
    more), then each later request on it ``second-on-0``; other connections answer every
    request ``fresh``: a client that wrongly reuses connection #0 reads whatever ``answer``
    left on it."""

    def handler(conn: RawConn) -> None:
        if not _first_request_on_0(conn):
            return
        answer(conn)
        while conn.read_request() is not None:
            conn.send_response(200, b"second-on-0")

    return handler


def keepalive_header(timeout: int, body: bytes = b"ok") -> Handler:
    """Like :func:`keepalive_ok`, each response also carrying
    ``Connection: keep-alive`` and ``Keep-Alive: timeout=<timeout>``.

    The server itself never closes the connection: it only advertises the timeout.
    """
    return keepalive_ok(body, [("Connection", "keep-alive"), ("Keep-Alive", f"timeout={timeout}")])


def close_after_response(
    body: bytes = b"ok", *, wait_for: str | None = None, event: str = "closed"
) -> Handler:
    """Answer one request as if keeping the connection alive (``Content-Length``, no
    ``Connection: close``), then close the socket (FIN) and set event ``event``.

    Simulates a server closing an idle keep-alive connection. With ``wait_for``, the
    close happens only once the test sets that event (e.g. after it has read the first
    response), otherwise immediately after the response.
    Test: ``await srv.wait_event("closed")`` before sending the next request.
    """

    def handler(conn: RawConn) -> None:
        if conn.read_request() is None:
            return
        conn.send_response(200, body, [("Connection", "keep-alive")])
        if wait_for is not None and not conn.wait(wait_for):
            return
        conn.close()
        conn.server.set_event(event)

    return handler


def extra_response_in_next_record(smuggled: bytes = b"smuggled") -> Handler:
    """Connection #0 answers its first request and, in the same write but a record of its
    own (over TLS), a second response nobody asked for; later requests on it get
    ``second-on-0``.  Other connections answer ``fresh``.

    Over TLS the unsolicited response then sits in the client's TLS layer, already read
    from the socket: a client checking only the socket for readability reuses the
    connection and reads ``smuggled`` as the answer to its next request.
    """

    def answer(conn: RawConn) -> None:
        first = response_bytes(200, b"ok", [("x-conn", "0")])
        conn.send_raw(conn.seal(first) + conn.seal(response_bytes(200, smuggled)))

    return first_answer_then_ok(answer)


def extra_response_while_idle(
    smuggled: bytes = b"smuggled", *, split: int = 20, idle: str = "idle"
) -> Handler:
    """Connection #0 answers its first request; once the test sets ``idle``, it sends the
    first ``split`` bytes of an unsolicited response (over TLS: of its record) and sets
    ``"partial"``; if another request arrives on it, the rest follows (so a client that
    reused the connection reads ``smuggled``).  Other connections answer ``fresh``."""

    def handler(conn: RawConn) -> None:
        if not _first_request_on_0(conn):
            return
        conn.send_response(200, b"ok")
        wire = conn.seal(response_bytes(200, smuggled))
        if not conn.wait(idle):
            return
        conn.send_raw(wire[:split])
        conn.server.set_event("partial")
        if conn.read_request() is not None:
            conn.send_raw(wire[split:])
        conn.wait("never")

    return handler


def late_response(gate_event_name: str) -> Handler:
    """Connection #0: read request 1, wait until the test sets ``gate_event_name``, then
    send its response (the *late* response) and set ``"<gate_event_name>.sent"``; then
    keep serving that connection normally. Every other connection (and every later
    request) is served at once. All bodies are ``b"response-for:" + request path``.

    Use: request 1 times out client-side; the test then sends request 2 and sets the
    gate. A client that wrongly reused connection #0 reads ``response-for:/<req 1>``
    as the answer to request 2.
    """

    def handler(conn: RawConn) -> None:
        first = conn.index == 0
        while (request := conn.read_request()) is not None:
            if first:
                first = False
                if not conn.wait(gate_event_name):
                    return
                try:
                    conn.send_response(200, b"response-for:" + request_path(request))
                finally:
                    conn.server.set_event(gate_event_name + ".sent")
            else:
                conn.send_response(200, b"response-for:" + request_path(request))

    return handler


def never_answer() -> Handler:
    """Read requests and never answer; returns when the client closes or the server
    shuts down. Use ``srv.until_requests(n)`` to know the request arrived."""

    def handler(conn: RawConn) -> None:
        while conn.read_request() is not None:
            pass

    return handler


def reset_after_headers(*, before_reset: str | None = None) -> Handler:
    """Send a response head (``Content-Length: 100``) then abort with a TCP RST.

    With ``before_reset``, wait for that event before the RST (so the test can make
    sure the client has consumed the headers); the kernel may otherwise deliver the RST
    before the client reads the head.
    """

    def handler(conn: RawConn) -> None:
        if conn.read_request() is None:
            return
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nx-conn: %d\r\n\r\n" % conn.index)
        if before_reset is not None:
            conn.wait(before_reset)
        conn.reset()

    return handler


def reset_mid_body(*, before_reset: str | None = None) -> Handler:
    """Send a head with ``Content-Length: 100`` and 10 body bytes, then TCP RST.
    ``before_reset`` as in :func:`reset_after_headers`."""

    def handler(conn: RawConn) -> None:
        if conn.read_request() is None:
            return
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
        if before_reset is not None:
            conn.wait(before_reset)
        conn.reset()

    return handler


def truncated_body() -> Handler:
    """``Content-Length: 100``, 10 body bytes, then a clean close (FIN)."""

    def handler(conn: RawConn) -> None:
        if conn.read_request() is None:
            return
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
        conn.close()

    return handler


def garbage_status_line() -> Handler:
    """Answer with a non-HTTP status line, then close."""

    def handler(conn: RawConn) -> None:
        if conn.read_request() is None:
            return
        conn.send(b"HTTX/9.9 banana\r\nContent-Length: 2\r\n\r\nok")
        conn.close()

    return handler


def chunked_garbage() -> Handler:
    """``Transfer-Encoding: chunked`` with an invalid chunk-size line, then close."""

    def handler(conn: RawConn) -> None:
        if conn.read_request() is None:
            return
        conn.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n")
        conn.close()

    return handler


def huge_headers(size: int) -> Handler:
    """A 200 response whose ``x-huge`` header value is ``size`` bytes (body ``ok``).

    Limits: raw h11 rejects heads over 16 KiB (``max_incomplete_event_size``), but
    httpcore raises that to 100 KiB, so ``httpx.Client`` fails ("Receive buffer too
    long") only above ~100 KiB. Serves in a keep-alive loop.
    """
    return keepalive_ok(b"ok", [("x-huge", "a" * size)])


def no_length_keep_alive(
    body: bytes = b"body-until-eof", *, close_after: float = 0.2, close_on: str | None = None
) -> Handler:
    """Response with neither ``Content-Length`` nor ``Transfer-Encoding`` nor
    ``Connection: close`` (body delimited by EOF), then close after ``close_after``
    seconds -- or when the test sets event ``close_on``, if given."""

    def handler(conn: RawConn) -> None:
        if conn.read_request() is None:
            return
        conn.send(b"HTTP/1.1 200 OK\r\n\r\n" + body)
        if close_on is not None:
            conn.wait(close_on)
        else:
            conn.sleep(close_after)
        conn.close()

    return handler


def slowloris(
    interval: float = 0.1, *, body_size: int = 1000, trickle_head: bool = True
) -> Handler:
    """Trickle a response one byte every ``interval`` seconds (a timing server).

    With ``trickle_head`` the status line and headers are trickled too; otherwise the
    head (``Content-Length: body_size``) is sent at once and only the body trickles.
    Each byte resets a per-read timeout, so only an overall deadline cuts it short.
    Stops when the client goes away or the server shuts down.
    """

    def handler(conn: RawConn) -> None:
        if conn.read_request() is None:
            return
        head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % body_size
        payload = b"x" * body_size
        if trickle_head:
            payload = head + payload
        else:
            conn.send(head)
        for i in range(len(payload)):
            if not conn.sleep(interval):
                return
            conn.send(payload[i : i + 1])

    return handler


class RawBacked:
    """The base of a test server that runs its protocol on a :class:`RawServer`:
    ``port``, ``url`` (``scheme://127.0.0.1:PORT``), ``connections``, events, and the
    context manager that starts and stops it (a handler failure fails the test on exit).
    Subclasses set ``scheme`` and pass their connection handler to ``__init__``."""

    scheme = "http"

    def __init__(self, handler: Handler) -> None:
        self.server = RawServer(handler)

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return f"{self.scheme}://{LOCALHOST}:{self.port}"

    @property
    def connections(self) -> int:
        return self.server.connections

    def set_event(self, name: str) -> None:
        self.server.set_event(name)

    def __enter__(self: _R) -> _R:
        self.server.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.server.__exit__(exc_type, exc, tb)
