"""A Node.js ``http2`` server (nghttp2: an HTTP/2 stack independent of h2/hypercorn),
run as a subprocess.

::

    with NodeH2Server(max_concurrent_streams=3) as srv:            # h2c, prior knowledge
    with NodeH2Server(tls=default_server_tls()) as srv:            # TLS, ALPN h2/http1.1
        srv.url, srv.port, srv.control_port
        ... GET {srv.url}/hold/gate x5 ...
        await srv.until_held("gate", 5)      # or srv.wait_held(...) from sync code
        srv.stats()["maxStreamsPerSession"]  # <= 3
        srv.release("gate")

Data routes (see ``node_h2.js``): ``/`` -> ``hello``; ``/hold/<name>`` -> ``released:<name>``
once the test calls :meth:`NodeH2Server.release` (held until then; later requests to it
are answered at once); ``/bytes/<n>``; anything else 404. Responses carry ``x-session``
(1, 2, ... per h2 session, ``h1`` for HTTP/1.1) and ``x-stream-id``.

The test talks to a separate plain HTTP/1.1 control server in the same node process (the
data server speaks only h2 without TLS). The counters are Node's view: a stream is open
from its ``'stream'`` event to its ``'close'`` event; streams nghttp2 refuses itself
(beyond the cap) never reach JavaScript and are not counted.

Shutdown: SIGTERM, then ``wait`` (``kill`` after a bounded wait); pipes and the temporary
directory (PEM files, node's stderr) are closed/removed. Node also exits when its stdin
closes, so it cannot outlive the Python process. If node exits with an error during the
test, ``__exit__`` raises with its stderr.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
from pathlib import Path
from types import TracebackType
from typing import IO, Any, TypedDict, cast

import pytest

from .raw import DEFAULT_TIMEOUT, run_blocking
from .tls import ServerTLS

__all__ = [
    "NODE_SCRIPT",
    "REQUIRE_NODE_ENV",
    "NodeH2Server",
    "NodeSessionStats",
    "NodeStats",
    "require_node",
]

NODE_SCRIPT = Path(__file__).with_name("node_h2.js")
LOCALHOST = "127.0.0.1"
#: Set (to anything but "" or "0") where Node.js must be present, as in CI: a test that
#: needs Node then fails instead of being skipped when ``node`` is not on PATH.
REQUIRE_NODE_ENV = "BULKHEAD_REQUIRE_NODE"
NO_NODE = (
    "Node.js (`node`) is not on PATH: the tests against Node's HTTP/2 server are skipped"
    " (install Node.js 18 or later to run them; CI sets " + REQUIRE_NODE_ENV + "=1, which"
    " makes them fail instead)"
)


def require_node(node: str = "node") -> str:
    """The path of ``node``; skips the calling test when it is missing (fails it instead
    when ``BULKHEAD_REQUIRE_NODE`` is set, so CI cannot skip them silently)."""
    found = shutil.which(node)
    if found is None:
        if os.environ.get(REQUIRE_NODE_ENV, "") not in ("", "0"):
            pytest.fail(f"{REQUIRE_NODE_ENV} is set, but Node.js (`node`) is not on PATH")
        pytest.skip(NO_NODE)
    return found


class NodeSessionStats(TypedDict):
    id: int
    open: int
    max: int
    live: bool


class NodeStats(TypedDict):
    """``GET /stats`` on the control port."""

    maxOpenStreams: int
    """Peak number of h2 streams open at once, all sessions together."""
    openStreams: int
    sessions: int
    """h2 sessions (connections) accepted."""
    maxStreamsPerSession: int
    """Peak number of streams open at once on any single session."""
    totalStreams: int
    held: dict[str, int]
    """Requests held right now, per name."""
    entered: dict[str, int]
    """Requests ever held, per name (monotonic)."""
    perSession: list[NodeSessionStats]


class NodeH2Server:
    """Context manager running ``node node_h2.js``; see the module docstring."""

    host = LOCALHOST

    def __init__(
        self,
        max_concurrent_streams: int = 3,
        tls: ServerTLS | None = None,
        *,
        startup_timeout: float = DEFAULT_TIMEOUT,
        node: str = "node",
    ) -> None:
        self.max_concurrent_streams = max_concurrent_streams
        self.tls = tls
        self.startup_timeout = startup_timeout
        self.node = node
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._stderr: IO[bytes] | None = None
        self._port = 0
        self._control_port = 0

    def __repr__(self) -> str:
        return f"<NodeH2Server {self.url if self._port else '(not running)'}>"

    # ---- public state

    @property
    def port(self) -> int:
        if not self._port:
            raise RuntimeError("NodeH2Server is not running")
        return self._port

    @property
    def control_port(self) -> int:
        if not self._control_port:
            raise RuntimeError("NodeH2Server is not running")
        return self._control_port

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (h2c only), or ``https://`` with ``tls``."""
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    # ---- control channel

    def _control(self, path: str, timeout: float = DEFAULT_TIMEOUT) -> tuple[int, Any]:
        conn = http.client.HTTPConnection(self.host, self.control_port, timeout=timeout)
        with contextlib.closing(conn):
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, json.loads(response.read())

    def stats(self) -> NodeStats:
        """The server's counters (blocking; a local HTTP/1.1 round trip)."""
        return cast(NodeStats, self._control("/stats")[1])

    def release(self, name: str) -> int:
        """Answer the requests held on ``name`` (and later ones at once); returns how
        many were waiting."""
        return int(self._control(f"/release/{_quote(name)}")[1]["released"])

    def reset(self) -> NodeStats:
        """Zero the counters (peaks restart from the current open counts) and forget
        released names -- for a server shared between tests."""
        return cast(NodeStats, self._control("/reset")[1])

    def _long_poll(self, path: str, timeout: float, what: str) -> NodeStats:
        ms = max(1, int(timeout * 1000))
        status, body = self._control(f"{path}?timeout={ms}", timeout=timeout + DEFAULT_TIMEOUT)
        if status != 200:
            raise TimeoutError(f"NodeH2Server: {what} not within {timeout}s: {body}")
        return cast(NodeStats, body)

    def wait_held(self, name: str, k: int = 1, timeout: float = DEFAULT_TIMEOUT) -> NodeStats:
        """Block until ``k`` requests were ever held on ``name`` (a long poll on the
        control server); returns the stats at that moment; ``TimeoutError`` otherwise."""
        path = f"/wait-held/{_quote(name)}/{k}"
        return self._long_poll(path, timeout, f"{k} held on {name!r}")

    async def until_held(
        self, name: str, k: int = 1, timeout: float = DEFAULT_TIMEOUT
    ) -> NodeStats:
        """Async (asyncio/trio) version of :meth:`wait_held`."""
        return await run_blocking(functools.partial(self.wait_held, name, k, timeout))

    def wait_idle(self, timeout: float = DEFAULT_TIMEOUT) -> NodeStats:
        """Block until no h2 stream is open (Node closes a stream slightly after the
        client has its response, so wait for this before asserting ``openStreams``)."""
        return self._long_poll("/wait-idle", timeout, "no open stream")

    async def until_idle(self, timeout: float = DEFAULT_TIMEOUT) -> NodeStats:
        return await run_blocking(functools.partial(self.wait_idle, timeout))

    # ---- lifecycle

    def __enter__(self) -> NodeH2Server:
        if self._proc is not None:
            raise RuntimeError("NodeH2Server is not re-entrant")
        require_node(self.node)
        self._tmp = tempfile.TemporaryDirectory(prefix="node-h2-")
        tmp = Path(self._tmp.name)
        cmd = [
            self.node,
            str(NODE_SCRIPT),
            "--max-concurrent-streams",
            str(self.max_concurrent_streams),
        ]
        if self.tls is not None:
            pem = self.tls.write_pem_files(tmp)
            cmd += ["--cert", str(pem.cert_chain), "--key", str(pem.key)]
        try:
            self._stderr = (tmp / "stderr.log").open("wb")
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr
            )
            info = json.loads(self._read_line())
            self._port, self._control_port = int(info["port"]), int(info["controlPort"])
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        returncode, stderr = self.close()
        if exc is None and returncode not in (0, -signal.SIGTERM):
            raise RuntimeError(f"node exited with {returncode}: {stderr}")

    def _read_line(self) -> bytes:
        """node's first stdout line, bounded by ``startup_timeout``."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        data = b""
        deadline = time.monotonic() + self.startup_timeout
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in data:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise TimeoutError(f"node did not start: {self._stderr_text()}")
                chunk = os.read(fd, 4096)
                if not chunk:
                    raise RuntimeError(f"node exited at startup: {self._stderr_text()}")
                data += chunk
        return data.split(b"\n", 1)[0]

    def _stderr_text(self) -> str:
        if self._tmp is None:
            return ""
        with contextlib.suppress(OSError):
            return (Path(self._tmp.name) / "stderr.log").read_text(errors="replace")[-4000:]
        return ""

    def close(self) -> tuple[int | None, str]:
        """Stop node (SIGTERM, wait; SIGKILL if it hangs), close pipes, remove the
        temporary directory. Idempotent. Returns node's exit code and stderr."""
        returncode: int | None = None
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
            proc.terminate()
            try:
                returncode = proc.wait(DEFAULT_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                returncode = proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        stderr = self._stderr_text()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        self._port = self._control_port = 0
        return returncode, stderr


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")
