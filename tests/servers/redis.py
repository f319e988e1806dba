"""A real ``redis-server`` (Debian's package) on ``127.0.0.1``, for the fleet-limit tests.

::

    with RedisServer() as server:          # random free port, own temp dir, no persistence
        server.url                         # redis://127.0.0.1:PORT/0
        server.client()                    # a sync redis.Redis, for checks from the test
        server.stop()                      # SIGTERM by PID, wait
        server.start()                     # again, on the same port (empty: no persistence)
        server.pause() / server.resume()   # SIGSTOP / SIGCONT: connections hang, not refused

The server is started from the command line (no config file): ``--save ''`` and
``--appendonly no`` (nothing on disk, so a restart comes back empty, like a Redis that lost
its data), ``--dir`` a temporary directory removed on exit, bound to ``127.0.0.1`` only
(``--protected-mode yes``).  It is stopped by its PID (never by name), continued first if
it was paused.

When ``redis-server`` is missing the test is skipped with the install command, or fails
when ``BULKHEAD_REQUIRE_REDIS=1`` (CI installs it and sets that).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import pytest

from .raw import DEFAULT_TIMEOUT, LOCALHOST

if TYPE_CHECKING:
    import redis

__all__ = [
    "INSTALL",
    "REQUIRE_REDIS_ENV",
    "RedisServer",
    "free_port",
    "importorskip_redis_py",
    "require_redis_server",
]

#: CI sets it to 1: a missing redis-server (or redis-py) then fails the test.
REQUIRE_REDIS_ENV = "BULKHEAD_REQUIRE_REDIS"
INSTALL = "Debian: apt-get install -y redis-server"


def _missing(message: str) -> None:
    if os.environ.get(REQUIRE_REDIS_ENV) == "1":
        pytest.fail(f"{message}; {REQUIRE_REDIS_ENV}=1 requires it", pytrace=False)
    pytest.skip(f"{message}; CI installs it and sets {REQUIRE_REDIS_ENV}=1")


def importorskip_redis_py() -> None:
    """At a test module's top: skip the module without redis-py, unless
    ``BULKHEAD_REQUIRE_REDIS=1`` (then its import error fails the collection)."""
    if os.environ.get(REQUIRE_REDIS_ENV) != "1":
        pytest.importorskip("redis", reason="pip install 'httpx-bulkhead[redis]'")


def require_redis_server() -> str:
    """The path of ``redis-server`` and a check that redis-py imports; skips (or fails
    under ``BULKHEAD_REQUIRE_REDIS=1``) otherwise."""
    try:
        import redis  # noqa: F401
    except ImportError:
        _missing("Python package redis is not installed (pip install 'httpx-bulkhead[redis]')")
    path = shutil.which("redis-server")
    if path is None:
        _missing(f"redis-server is not installed ({INSTALL})")
    assert path is not None
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOCALHOST, 0))
        return int(sock.getsockname()[1])


def _ping(port: int, timeout: float) -> bool:
    """One PING over a raw socket (RESP): True on ``+PONG``."""
    try:
        with socket.create_connection((LOCALHOST, port), timeout) as sock:
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """``redis-server`` as a subprocess on ``127.0.0.1:port``; see the module docstring."""

    def __init__(self) -> None:
        self.port = 0
        self._program = ""
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False
        self._client: redis.Redis | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"redis://{LOCALHOST}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> RedisServer:
        self._program = require_redis_server()
        self._dir = tempfile.TemporaryDirectory(prefix="bulkhead-redis-")
        try:
            for _ in range(3):  # the port is picked before the server binds it: retry a race
                self.port = free_port()
                if self._spawn():
                    return self
            raise RuntimeError(f"redis-server did not start: {self.output()}")
        except BaseException:
            self._cleanup()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._cleanup()

    # -- control ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start again on the same port (after ``stop``); empty, as nothing was saved."""
        if self.running:
            raise RuntimeError("redis-server is running")
        deadline = time.monotonic() + DEFAULT_TIMEOUT
        while not self._spawn():  # the old socket may linger a moment in TIME_WAIT
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not restart: {self.output()}")
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM by PID (after SIGCONT if paused), then SIGKILL if it lingers."""
        proc, self._proc = self._proc, None
        if self._client is not None:
            self._client.connection_pool.disconnect()
        if proc is None:
            return
        if proc.poll() is None:
            if self._paused:
                os.kill(proc.pid, signal.SIGCONT)
            proc.terminate()
            try:
                proc.wait(DEFAULT_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(DEFAULT_TIMEOUT)
        self._paused = False

    def pause(self) -> None:
        """SIGSTOP: the server keeps its sockets but answers nothing (a hung Redis)."""
        assert self._proc is not None and self._proc.poll() is None
        os.kill(self._proc.pid, signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """SIGCONT after ``pause``."""
        assert self._proc is not None
        os.kill(self._proc.pid, signal.SIGCONT)
        self._paused = False

    def client(self) -> redis.Redis:
        """A sync client (``decode_responses=True``) for the test's own checks: one per
        server, reconnecting after a restart, closed on exit."""
        if self._client is None:
            import redis

            self._client = redis.Redis(
                host=LOCALHOST,
                port=self.port,
                decode_responses=True,
                socket_timeout=DEFAULT_TIMEOUT,
                socket_connect_timeout=DEFAULT_TIMEOUT,
            )
        return self._client

    def output(self) -> str:
        log = self._log
        return log.read_text("utf-8", "replace") if log is not None and log.exists() else ""

    # -- internals -------------------------------------------------------------------------
    @property
    def _log(self) -> Path | None:
        return None if self._dir is None else Path(self._dir.name) / "redis.log"

    def _spawn(self) -> bool:
        assert self._dir is not None and self._log is not None
        command = [
            self._program,
            "--port", str(self.port),
            "--bind", LOCALHOST,
            "--protected-mode", "yes",
            "--save", "",
            "--appendonly", "no",
            "--dir", self._dir.name,
            "--daemonize", "no",
            "--logfile", "",
            "--loglevel", "warning",
        ]  # fmt: skip
        with self._log.open("ab") as log:
            self._proc = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        self.starts += 1
        deadline = time.monotonic() + DEFAULT_TIMEOUT
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:  # exited: port taken, most likely
                self._proc = None
                return False
            if _ping(self.port, 0.5):
                return True
            time.sleep(0.01)
        self.stop()
        return False

    def _cleanup(self) -> None:
        try:
            self.stop()
        finally:
            if self._client is not None:
                self._client.close()
                self._client = None
            if self._dir is not None:
                with contextlib.suppress(OSError):
                    self._dir.cleanup()
                self._dir = None
