"""The proxies of our own, scripted: :class:`ProxyEgress` (SOCKS5) and :class:`FaultProxy`
(HTTP), with the :class:`ProxyLedger` that counts what a proxy does per target.

Both are :class:`RawServer` handlers (a thread per connection) and reach 127.0.0.1 only: a
target must be ``127.0.0.1`` or ``localhost`` (mapped to 127.0.0.1 without DNS), any other
is refused (SOCKS reply 2, HTTP 403) and listed in ``ledger.refused``. See ``proxies.py``
for the overview and the real proxies chained to the egress.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import socket
import struct
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from .raw import (
    DEFAULT_TIMEOUT,
    LOCALHOST,
    RawBacked,
    RawConn,
    response_bytes,
    run_blocking,
)

__all__ = [
    "ALLOWED_HOSTS",
    "ESTABLISHED",
    "Fault",
    "FaultProxy",
    "ProxyEgress",
    "ProxyLedger",
    "ProxyRequest",
    "Refuse",
    "Send",
    "SocksScript",
    "SocksStage",
    "TargetStats",
    "close_mid_connect",
    "garbage",
    "never_answer",
    "refuse",
    "trickle",
]

#: The only targets any proxy here reaches; both go to 127.0.0.1.
ALLOWED_HOSTS = frozenset({"127.0.0.1", "localhost"})
#: The answer to a CONNECT that opened its tunnel.
ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"
_RELAY_SIZE = 65536


# --------------------------------------------------------------------------- counting


@dataclass(frozen=True)
class TargetStats:
    """What a proxy did towards one target."""

    opened: int = 0
    """Connections (tunnels or forwarding connections) opened to it, ever."""
    open_now: int = 0
    peak: int = 0
    """The most open at once."""


@dataclass(frozen=True)
class ProxyRequest:
    """A request a :class:`FaultProxy` read (``target``: as on the request line)."""

    conn: int
    method: str
    target: str
    headers: tuple[tuple[str, str], ...]

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


class ProxyLedger:
    """Thread-safe counters of one proxy (or of the egress behind real ones)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._targets: dict[str, TargetStats] = {}
        self._requests: list[ProxyRequest] = []
        self._refused: list[str] = []
        self._names: list[str] = []

    def reset(self) -> None:
        """Forget the history (open connections stay counted in ``open_now``)."""
        with self._cond:
            self._targets = {
                t: TargetStats(0, s.open_now, s.open_now)
                for t, s in self._targets.items()
                if s.open_now
            }
            self._requests.clear()
            self._refused.clear()
            self._names.clear()

    @contextlib.contextmanager
    def connection(self, target: str) -> Iterator[None]:
        """Count a connection to ``target`` open for the duration of the block."""
        with self._cond:
            s = self._targets.get(target, TargetStats())
            self._targets[target] = TargetStats(
                s.opened + 1, s.open_now + 1, max(s.peak, s.open_now + 1)
            )
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                s = self._targets[target]
                self._targets[target] = TargetStats(s.opened, s.open_now - 1, s.peak)
                self._cond.notify_all()

    def record_request(self, request: ProxyRequest) -> None:
        with self._cond:
            self._requests.append(request)
            self._cond.notify_all()

    def record_refused(self, target: str) -> None:
        with self._cond:
            self._refused.append(target)
            self._cond.notify_all()

    def record_name(self, target: str) -> None:
        with self._cond:
            self._names.append(target)

    def stats(self, target: str) -> TargetStats:
        with self._cond:
            return self._targets.get(target, TargetStats())

    def targets(self) -> dict[str, TargetStats]:
        with self._cond:
            return dict(self._targets)

    @property
    def requests(self) -> list[ProxyRequest]:
        with self._cond:
            return list(self._requests)

    @property
    def connects(self) -> list[str]:
        """The targets of the ``CONNECT`` requests read, in order."""
        return [r.target for r in self.requests if r.method == "CONNECT"]

    @property
    def refused(self) -> list[str]:
        """Targets refused because they are not loopback (``host:port``)."""
        with self._cond:
            return list(self._refused)

    @property
    def names(self) -> list[str]:
        """Egress only: targets asked for by name (SOCKS5 ATYP 3), not by address."""
        with self._cond:
            return list(self._names)

    def wait_for(
        self, predicate: Callable[[ProxyLedger], bool], timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        """Block until ``predicate(ledger)`` holds; ``TimeoutError`` otherwise."""
        with self._cond:
            if not self._cond.wait_for(lambda: predicate(self), timeout):
                raise TimeoutError(
                    f"proxy ledger: condition not met in {timeout}s: {self._targets}"
                )

    async def until(
        self, predicate: Callable[[ProxyLedger], bool], timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        """Async (asyncio or trio) :meth:`wait_for`."""
        await run_blocking(functools.partial(self.wait_for, predicate, timeout))


# --------------------------------------------------------------------------- faults


@dataclass(frozen=True)
class Refuse:
    """Answer with ``status`` and ``reason`` (and ``body``), then close (or keep going)."""

    status: int
    reason: str
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    keep_alive: bool = False


@dataclass(frozen=True)
class Send:
    """Write ``data`` as is (a byte at a time, ``byte_delay`` apart, if set), then:
    ``"close"`` (FIN), ``"reset"`` (RST), ``"hang"`` (until the server stops), or
    ``"proceed"``: carry on as a good proxy would, except that the ``200`` of a
    ``CONNECT`` is taken to be in ``data`` (so ``Send(ESTABLISHED, byte_delay=...)`` trickles
    the handshake). ``wait_for``: a server event to wait for first."""

    data: bytes = b""
    then: Literal["close", "reset", "hang", "proceed"] = "close"
    byte_delay: float = 0.0
    wait_for: str | None = None


Fault = Refuse | Send
Script = Callable[[ProxyRequest], Fault | None]


# --------------------------------------------------------------------------- relaying


def _loopback(host: str) -> str | None:
    """``127.0.0.1`` for an allowed target host, ``None`` for any other."""
    return LOCALHOST if host.lower() in ALLOWED_HOSTS else None


def _dial(host: str, port: int) -> socket.socket:
    address = _loopback(host)
    if address is None:  # the callers check first; this is the last line
        raise PermissionError(f"refusing non-loopback target {host}:{port}")
    sock = socket.create_connection((address, port), timeout=DEFAULT_TIMEOUT)
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _relay(conn: RawConn, upstream: socket.socket) -> None:
    """Copy bytes both ways until both directions are closed (or the server stops).

    Client to upstream in this thread (``conn.recv`` hands out what the handler had
    buffered first), upstream to client in a helper joined before returning. The target's
    FIN is passed on as a FIN; the client's ends the tunnel (as tinyproxy does: servers
    such as hypercorn would otherwise hold a half-closed connection until their idle
    timeout).
    """

    def back() -> None:
        with contextlib.suppress(OSError):
            while data := upstream.recv(_RELAY_SIZE):
                conn.send(data)
        with contextlib.suppress(OSError):
            conn.sock.shutdown(socket.SHUT_WR)

    helper = threading.Thread(target=back, name=f"proxy-relay-{conn.index}", daemon=True)
    helper.start()
    try:
        with contextlib.suppress(OSError):
            while data := conn.recv():
                upstream.sendall(data)
        with contextlib.suppress(OSError):  # as tinyproxy does: the client's close ends it all
            upstream.shutdown(socket.SHUT_RDWR)
        while helper.is_alive():
            helper.join(0.05)
            if conn.stopping:
                with contextlib.suppress(OSError):
                    upstream.shutdown(socket.SHUT_RDWR)
    finally:
        upstream.close()


def _send(conn: RawConn, fault: Send) -> bool:
    """Carry out a :class:`Send`; whether to go on as if all was well."""
    if fault.wait_for is not None and not conn.wait(fault.wait_for):
        return False
    if fault.byte_delay:
        for i in range(len(fault.data)):
            conn.send(fault.data[i : i + 1])
            if not conn.sleep(fault.byte_delay):
                return False
    elif fault.data:
        conn.send(fault.data)
    if fault.then == "reset":
        conn.reset()
    elif fault.then == "hang":
        conn.wait("never")
    return fault.then == "proceed"


def _recv_exact(conn: RawConn, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


# --------------------------------------------------------------------------- egress


SocksStage = Literal["greeting", "auth", "connect"]
SocksScript = Callable[[SocksStage, str], Send | int | None]

_SOCKS_NO_AUTH, _SOCKS_USER_PASSWORD, _SOCKS_NO_METHOD = 0, 2, 0xFF


def _socks_reply(code: int, host: str = "0.0.0.0", port: int = 0) -> bytes:
    return b"\x05" + bytes([code]) + b"\x00\x01" + socket.inet_aton(host) + struct.pack("!H", port)


class ProxyEgress(RawBacked):
    """Our SOCKS5 server (RFC 1928, ``CONNECT`` only): the way out of the real proxies, and
    the only one; also a SOCKS5 proxy to test against directly, with faults.

    Args:
        auth: require username/password authentication (RFC 1929) with these
            credentials; ``None`` (default): no authentication.
        script: ``script(stage, target)`` is called at ``"greeting"`` (target ``""``),
            ``"auth"`` (target ``"user:password"`` as received) and ``"connect"``
            (``host:port``); a :class:`Send` replaces our answer at that stage (garbage,
            a partial or trickled reply with ``then="proceed"``...), an ``int`` answers a
            ``CONNECT`` with that reply code (1-8), ``None`` goes on normally.

    ``ledger`` counts per target; ``ledger.names`` lists the targets asked for by name
    (ATYP 3) rather than by address; ``url`` is ``socks5://127.0.0.1:PORT``.
    """

    scheme = "socks5"

    def __init__(
        self, *, auth: tuple[str, str] | None = None, script: SocksScript | None = None
    ) -> None:
        self.auth = auth
        self.script = script
        self.ledger = ProxyLedger()
        super().__init__(self._handle)

    def _fault(self, conn: RawConn, stage: SocksStage, target: str) -> Send | int | None:
        return None if self.script is None else self.script(stage, target)

    def _handle(self, conn: RawConn) -> None:
        greeting = _recv_exact(conn, 2)
        methods = _recv_exact(conn, greeting[1]) if greeting and greeting[0] == 5 else None
        if greeting is None or methods is None:
            return
        fault = self._fault(conn, "greeting", "")
        if isinstance(fault, Send) and not _send(conn, fault):
            return
        if fault is None:
            method = _SOCKS_NO_AUTH if self.auth is None else _SOCKS_USER_PASSWORD
            conn.send(bytes([5, method if method in methods else _SOCKS_NO_METHOD]))
            if method not in methods:
                return
            if method == _SOCKS_USER_PASSWORD and not self._authenticate(conn):
                return
        target = self._read_target(conn)
        if target is None:
            return
        host, _, port = target.rpartition(":")
        fault = self._fault(conn, "connect", target)
        if isinstance(fault, int):
            conn.send(_socks_reply(fault))
            return
        established = fault is not None
        if isinstance(fault, Send) and not _send(conn, fault):
            return
        if _loopback(host) is None:
            self.ledger.record_refused(target)
            conn.send(_socks_reply(2))  # not allowed by ruleset
            return
        try:
            upstream = _dial(host, int(port))
        except OSError:
            conn.send(_socks_reply(5))  # connection refused
            return
        bound_host, bound_port = upstream.getsockname()[:2]
        with self.ledger.connection(target):  # counted before the client hears of it
            if not established:
                conn.send(_socks_reply(0, bound_host, bound_port))
            _relay(conn, upstream)

    def _authenticate(self, conn: RawConn) -> bool:
        """RFC 1929: VER=1, ULEN, UNAME, PLEN, PASSWD; answer 1 0 (or 1 1 and close)."""
        assert self.auth is not None
        head = _recv_exact(conn, 2)
        user = _recv_exact(conn, head[1]) if head and head[0] == 1 else None
        size = _recv_exact(conn, 1) if user is not None else None
        password = _recv_exact(conn, size[0]) if size is not None else None
        if user is None or password is None:
            return False
        given = f"{user.decode('utf-8', 'replace')}:{password.decode('utf-8', 'replace')}"
        fault = self._fault(conn, "auth", given)
        if isinstance(fault, Send):
            return _send(conn, fault)
        ok = given == f"{self.auth[0]}:{self.auth[1]}"
        conn.send(b"\x01\x00" if ok else b"\x01\x01")
        return ok

    def _read_target(self, conn: RawConn) -> str | None:
        """The ``CONNECT`` request's ``host:port`` (``None``: not a CONNECT, or cut)."""
        head = _recv_exact(conn, 4)
        if head is None:
            return None
        _, command, _, atyp = head
        if atyp == 1:
            raw = _recv_exact(conn, 4)
            host = socket.inet_ntoa(raw) if raw else ""
        elif atyp == 3:
            size = _recv_exact(conn, 1)
            raw = _recv_exact(conn, size[0]) if size else None
            host = raw.decode("ascii", "replace") if raw else ""
        elif atyp == 4:
            raw = _recv_exact(conn, 16)
            host = f"[{socket.inet_ntop(socket.AF_INET6, raw)}]" if raw else ""
        else:
            host = ""
        port_bytes = _recv_exact(conn, 2) if host else None
        if port_bytes is None:
            return None
        target = f"{host}:{struct.unpack('!H', port_bytes)[0]}"
        if atyp == 3:
            self.ledger.record_name(target)
        if command != 1:
            conn.send(_socks_reply(7))  # command not supported
            return None
        return target


# --------------------------------------------------------------------------- FaultProxy


@dataclass
class _Upstream:
    sock: socket.socket
    buffer: bytes = b""
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def fill(self) -> bool:
        data = self.sock.recv(_RELAY_SIZE)
        self.buffer += data
        return bool(data)

    def read_until(self, marker: bytes) -> bytes | None:
        while marker not in self.buffer:
            if not self.fill():
                return None
        end = self.buffer.index(marker) + len(marker)
        data, self.buffer = self.buffer[:end], self.buffer[end:]
        return data

    def read_exact(self, n: int) -> bytes | None:
        while len(self.buffer) < n:
            if not self.fill():
                return None
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def close(self) -> None:
        self.sock.close()
        self.stack.close()


def _parse_head(head: bytes) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    lines = head.decode("latin-1").split("\r\n")
    method, _, rest = lines[0].partition(" ")
    target = rest.rsplit(" ", 1)[0]
    headers = tuple(
        (name.strip(), value.strip())
        for name, _, value in (line.partition(":") for line in lines[1:] if line)
    )
    return method, target, headers


class FaultProxy(RawBacked):
    """Our own HTTP proxy on ``127.0.0.1``: good until ``script`` says otherwise.

    Args:
        script: called with every request read (in the connection's thread); a
            :class:`Refuse` or :class:`Send` replaces the normal handling, ``None`` keeps it.
        auth: require ``Proxy-Authorization: Basic`` for these credentials (407 with
            ``Proxy-Authenticate`` otherwise).

    ``ledger`` counts targets (a forwarding connection or a tunnel is open while the proxy
    holds its upstream socket), requests and non-loopback refusals; ``connections`` is the
    number of client connections accepted. Events: ``srv.event(name)`` as on RawServer.
    """

    def __init__(
        self, script: Script | None = None, *, auth: tuple[str, str] | None = None
    ) -> None:
        self.script = script
        self.ledger = ProxyLedger()
        self._expected_auth = (
            None
            if auth is None
            else "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        )
        super().__init__(self._handle)

    # ---- one client connection

    def _handle(self, conn: RawConn) -> None:
        upstreams: dict[str, _Upstream] = {}
        try:
            while (raw := conn.read_request()) is not None:
                head, _, body = raw.partition(b"\r\n\r\n")
                method, target, headers = _parse_head(head)
                request = ProxyRequest(conn.index, method, target, headers)
                self.ledger.record_request(request)
                fault = self.script(request) if self.script is not None else None
                if (
                    fault is None
                    and self._expected_auth is not None
                    and request.header("proxy-authorization") != self._expected_auth
                ):
                    fault = Refuse(
                        407,
                        "Proxy Authentication Required",
                        headers=(("Proxy-Authenticate", 'Basic realm="test"'),),
                        keep_alive=True,
                    )
                if fault is not None and not self._apply(conn, fault):
                    return
                if isinstance(fault, Refuse):
                    continue
                established = isinstance(fault, Send)  # it sent the 200 (or what stands for it)
                if method == "CONNECT":
                    self._tunnel(conn, target, established=established)
                    return
                if not self._forward(conn, request, head, body, upstreams):
                    return
        finally:
            for upstream in upstreams.values():
                upstream.close()

    def _apply(self, conn: RawConn, fault: Fault) -> bool:
        """Carry out a fault; whether to go on with the connection."""
        if isinstance(fault, Refuse):
            headers = [*fault.headers]
            if not fault.keep_alive:
                headers.append(("Connection", "close"))
            conn.send(response_bytes(fault.status, fault.body, headers, reason=fault.reason))
            return fault.keep_alive
        return _send(conn, fault)

    def _refuse_target(self, conn: RawConn, target: str) -> None:
        self.ledger.record_refused(target)
        conn.send(
            response_bytes(403, b"loopback only", [("Connection", "close")], reason="Filtered")
        )

    def _tunnel(self, conn: RawConn, target: str, *, established: bool) -> None:
        host, _, port = target.rpartition(":")
        host = host.strip("[]")
        if _loopback(host) is None or not port.isdigit():
            self._refuse_target(conn, target)
            return
        try:
            upstream = _dial(host, int(port))
        except OSError:
            conn.send(response_bytes(502, b"", [("Connection", "close")], reason="Bad Gateway"))
            return
        with self.ledger.connection(target):
            if not established:
                conn.send(ESTABLISHED)
            _relay(conn, upstream)

    def _forward(
        self,
        conn: RawConn,
        request: ProxyRequest,
        head: bytes,
        body: bytes,
        upstreams: dict[str, _Upstream],
    ) -> bool:
        """Forward one absolute-form request and relay its response; whether the client
        connection stays open."""
        parts = urllib.parse.urlsplit(request.target)
        if parts.scheme != "http" or not parts.hostname:
            conn.send(response_bytes(400, b"absolute-form http:// only", [("Connection", "close")]))
            return False
        port = parts.port or 80
        target = f"{parts.hostname}:{port}"
        if _loopback(parts.hostname) is None:
            self._refuse_target(conn, target)
            return False
        upstream = upstreams.get(target)
        if upstream is None:
            try:
                upstream = _Upstream(_dial(parts.hostname, port))
            except OSError:
                conn.send(response_bytes(502, b"", [("Connection", "close")], reason="Bad Gateway"))
                return False
            upstream.stack.enter_context(self.ledger.connection(target))
            upstreams[target] = upstream
        origin_form = parts.path or "/"
        if parts.query:
            origin_form += "?" + parts.query
        lines = head.split(b"\r\n")
        version = lines[0].rsplit(b" ", 1)[1]
        kept = [
            line
            for line in lines[1:]
            if line.split(b":", 1)[0].strip().lower()
            not in (b"proxy-authorization", b"proxy-connection")
        ]
        out = b"\r\n".join([f"{request.method} {origin_form} ".encode() + version, *kept])
        client_close = (request.header("connection") or "").lower() == "close"
        try:
            upstream.sock.sendall(out + b"\r\n\r\n" + body)
            response, reusable = self._read_response(upstream, request.method)
        except OSError:
            response, reusable = None, False
        if response is None:
            upstreams.pop(target).close()
            conn.send(response_bytes(502, b"", [("Connection", "close")], reason="Bad Gateway"))
            return False
        conn.send(response)
        if not reusable:
            upstreams.pop(target).close()
        return reusable and not client_close

    @staticmethod
    def _read_response(upstream: _Upstream, method: str) -> tuple[bytes | None, bool]:
        """One response from ``upstream``, raw; and whether its connection is reusable."""
        while True:
            head = upstream.read_until(b"\r\n\r\n")
            if head is None:
                return None, False
            _, status, headers = _parse_head(head)
            code = int(status.split(" ", 1)[0])
            if not 100 <= code < 200:
                break
        fields = {name.lower(): value.lower() for name, value in headers}
        keep = fields.get("connection") != "close" and not head.startswith(b"HTTP/1.0")
        if method == "HEAD" or code in (204, 304):
            return head, keep
        if "chunked" in fields.get("transfer-encoding", ""):
            body = b""
            while True:
                size_line = upstream.read_until(b"\r\n")
                if size_line is None:
                    return None, False
                body += size_line
                size = int(size_line.split(b";")[0].strip(), 16)
                if size == 0:  # the trailer section, up to its empty line
                    while (line := upstream.read_until(b"\r\n")) not in (None, b"\r\n"):
                        body += line
                    if line is None:
                        return None, False
                    return head + body + line, keep
                chunk = upstream.read_exact(size + 2)
                if chunk is None:
                    return None, False
                body += chunk
        if "content-length" in fields:
            body_bytes = upstream.read_exact(int(fields["content-length"]))
            return (None, False) if body_bytes is None else (head + body_bytes, keep)
        rest = upstream.buffer  # delimited by the close
        while upstream.fill():
            rest = upstream.buffer
        return head + rest, False


# --------------------------------------------------------------------------- fault factories


def refuse(status: int, reason: str, body: bytes = b"") -> Refuse:
    """Refuse the request: e.g. ``refuse(407, "Proxy Authentication Required")``."""
    headers = (("Proxy-Authenticate", 'Basic realm="test"'),) if status == 407 else ()
    return Refuse(status, reason, body, headers)


def close_mid_connect(partial: bytes = b"HTTP/1.1 200 Conn") -> Send:
    """Send the start of the ``200`` (or nothing), then close."""
    return Send(partial, "close")


def garbage(data: bytes = b"SSH-2.0-OpenSSH_9.2\r\n\r\n") -> Send:
    """Answer with something that is not HTTP, then close."""
    return Send(data, "close")


def trickle(byte_delay: float = 0.005, answer: bytes = ESTABLISHED) -> Send:
    """Send the ``CONNECT`` answer a byte at a time, then tunnel as usual."""
    return Send(answer, "proceed", byte_delay=byte_delay)


def never_answer(wait_for: str | None = None) -> Send:
    """Read the request, answer nothing, hold the connection until the server stops."""
    return Send(b"", "hang", wait_for=wait_for)
