"""Proxies on 127.0.0.1 for the tests: real ones (tinyproxy, pproxy) and a scripted one.

::

    with ProxyEgress() as egress, TinyProxy(egress) as proxy:    # Debian's tinyproxy
        httpx.AsyncHTTPTransport(proxy=proxy.url)                  # http://127.0.0.1:PORT
        egress.ledger.stats("127.0.0.1:8443")   # TargetStats(opened, open_now, peak)
        proxy.requests()                        # [("CONNECT", "127.0.0.1:8443"), ...]
    with ProxyEgress() as egress, PProxy("https", egress, tls=default_server_tls()) as proxy:
    with ProxyEgress() as egress, PProxy("socks5", egress) as proxy:   # socks5://...
    with FaultProxy(script=lambda req: refuse(407, "Proxy Authentication Required")) as proxy:

**Only loopback, three times over.** The real proxies never dial a target themselves: they
are chained (tinyproxy's ``Upstream socks5``, pproxy's ``-r socks5://``) to
:class:`ProxyEgress`, our SOCKS5 server, which connects to ``127.0.0.1`` only: it accepts
the targets ``127.0.0.1`` and ``localhost`` (mapped to ``127.0.0.1`` without DNS) and
refuses every other one (SOCKS reply 2, "not allowed by ruleset"). Each proxy is also told
to refuse other targets itself (tinyproxy's ``Filter`` with ``FilterDefaultDeny``, pproxy's
``-b``), and :class:`FaultProxy` refuses them with 403. No test needs DNS beyond
``localhost``, which is resolved here, never by a resolver.

**Counting.** A :class:`ProxyLedger` counts what a proxy opened to each target
(``"host:port"`` as the client named it): connections opened, open now, the peak of
concurrently open ones. For the real proxies the egress keeps it (every upstream
connection they open passes through it, so its counts are the proxy's); tinyproxy's log
gives its request lines (``CONNECT`` and forwarded requests). :class:`FaultProxy` keeps
its own ledger, plus every request it read and its client connections.

**Real proxies.** tinyproxy (C, Debian's ``tinyproxy``): HTTP forwarding (absolute-form)
and ``CONNECT``; ``BasicAuth`` when given ``auth``; one request per client connection for
forwarded requests (it closes after each). pproxy (Python, PyPI): ``http`` (forwarding and
``CONNECT``), ``https`` (TLS to the proxy itself, then the same) and ``socks5`` (names or
addresses, so with and without remote DNS). When a program is missing, the test is skipped
with the command that installs it, or fails when ``BULKHEAD_REQUIRE_PROXIES=1`` (CI).

**Ours** (``proxy_scripted.py``, re-exported here). :class:`FaultProxy`: a well-behaved
HTTP proxy (forwarding with keep-alive on both sides, ``CONNECT`` then a byte relay) until
its ``script(request)`` returns a fault for a request: :class:`Refuse` (a status and a
reason, e.g. 407/403/502), or :class:`Send` (bytes as they are, optionally a byte at a
time, then close, reset, hang or carry on as if all was well): garbage, a close
mid-handshake, a trickled ``200``. :class:`ProxyEgress` is a SOCKS5 proxy in its own right
too, with username/password authentication (``auth=``) and the same faults per handshake
stage (``script(stage, target)``: a :class:`Send`, or a reply code). Factories
(``refuse``, ``garbage``, ``close_mid_connect``, ``trickle``, ``never_answer``) build the
usual faults.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Literal, TypeVar

import pytest

from .proxy_scripted import (
    ALLOWED_HOSTS,
    ESTABLISHED,
    Fault,
    FaultProxy,
    ProxyEgress,
    ProxyLedger,
    ProxyRequest,
    Refuse,
    Send,
    SocksScript,
    SocksStage,
    TargetStats,
    close_mid_connect,
    garbage,
    never_answer,
    refuse,
    trickle,
)
from .raw import DEFAULT_TIMEOUT, LOCALHOST
from .tls import PemFiles, ServerTLS

__all__ = [
    "ALLOWED_HOSTS",
    "ESTABLISHED",
    "REQUIRE_PROXIES_ENV",
    "Fault",
    "FaultProxy",
    "PProxy",
    "ProxyEgress",
    "ProxyLedger",
    "ProxyRequest",
    "Refuse",
    "Send",
    "SocksScript",
    "SocksStage",
    "TargetStats",
    "TinyProxy",
    "close_mid_connect",
    "garbage",
    "never_answer",
    "refuse",
    "require_program",
    "trickle",
]

#: CI sets it to 1: a missing proxy program then fails the test instead of skipping it.
REQUIRE_PROXIES_ENV = "BULKHEAD_REQUIRE_PROXIES"
_P = TypeVar("_P", bound="_ProxyProcess")


def require_program(name: str, install: str) -> str:
    """The path of program ``name``; skips the test when it is missing (fails instead when
    ``BULKHEAD_REQUIRE_PROXIES=1``, as in CI). ``install`` says how to get it."""
    path = shutil.which(name)
    if path is not None:
        return path
    message = f"{name} is not installed ({install})"
    if os.environ.get(REQUIRE_PROXIES_ENV) == "1":
        pytest.fail(f"{message}; {REQUIRE_PROXIES_ENV}=1 requires it", pytrace=False)
    pytest.skip(f"{message}; CI installs it and sets {REQUIRE_PROXIES_ENV}=1")


def _require_module(module: str, install: str) -> None:
    try:
        __import__(module)
    except ImportError:
        message = f"Python package {module} is not installed ({install})"
        if os.environ.get(REQUIRE_PROXIES_ENV) == "1":
            pytest.fail(f"{message}; {REQUIRE_PROXIES_ENV}=1 requires it", pytrace=False)
        pytest.skip(message)


# --------------------------------------------------------------------------- subprocesses


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOCALHOST, 0))
        return int(sock.getsockname()[1])


class _ProxyProcess:
    """A proxy program run as a subprocess on ``127.0.0.1:port``, stopped on exit."""

    scheme = "http"

    def __init__(self, egress: ProxyEgress) -> None:
        self.egress = egress
        self.port = 0
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._output: Path | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://{LOCALHOST}:{self.port}"

    @property
    def ledger(self) -> ProxyLedger:
        """The egress's ledger: what this proxy opened to each target."""
        return self.egress.ledger

    def _command(self, directory: Path) -> list[str]:
        raise NotImplementedError

    def __enter__(self: _P) -> _P:
        self._dir = tempfile.TemporaryDirectory(prefix="bulkhead-proxy-")
        directory = Path(self._dir.name)
        self._output = directory / "output.log"
        last = ""
        try:
            for _ in range(3):  # the port is picked before the program binds it: retry a race
                self.port = _free_port()
                command = self._command(directory)  # may skip the test: cleaned up below
                with self._output.open("wb") as output:
                    self._proc = subprocess.Popen(
                        command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT
                    )
                if self._wait_listening():
                    return self
                last = self._stop()
        except BaseException:
            self._stop()
            self._cleanup()
            raise
        self._cleanup()
        raise RuntimeError(f"{type(self).__name__} did not start: {last}")

    def _wait_listening(self) -> bool:
        assert self._proc is not None
        deadline = time.monotonic() + DEFAULT_TIMEOUT
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            with (
                contextlib.suppress(OSError),
                socket.create_connection((LOCALHOST, self.port), 0.5),
            ):
                return True
            time.sleep(0.02)
        return False

    def _stop(self) -> str:
        """Stop the process; its output."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(DEFAULT_TIMEOUT)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait(DEFAULT_TIMEOUT)
            self._proc = None
        return self.output()

    def output(self) -> str:
        """What the program printed so far."""
        if self._output is None or not self._output.exists():
            return ""
        return self._output.read_text("utf-8", "replace")

    def _cleanup(self) -> None:
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self._stop()
        finally:
            self._cleanup()


class TinyProxy(_ProxyProcess):
    """Debian's tinyproxy (``apt-get install tinyproxy``), chained to ``egress``.

    ``auth``: require ``Proxy-Authorization: Basic`` for these credentials (407 otherwise).
    :meth:`requests` reads the request lines from its log.
    """

    def __init__(self, egress: ProxyEgress, *, auth: tuple[str, str] | None = None) -> None:
        super().__init__(egress)
        self.auth = auth
        self._log: Path | None = None

    def _command(self, directory: Path) -> list[str]:
        program = require_program("tinyproxy", "Debian: apt-get install tinyproxy")
        (directory / "filter").write_text("^127\\.0\\.0\\.1$\n^localhost$\n")
        self._log = directory / "tinyproxy.log"
        self._log.write_text("")
        lines = [
            f"Port {self.port}",
            f"Listen {LOCALHOST}",
            f"Allow {LOCALHOST}",
            "Timeout 60",
            "MaxClients 200",
            f'LogFile "{self._log}"',
            "LogLevel Connect",
            f'Filter "{directory / "filter"}"',
            "FilterType ere",
            "FilterDefaultDeny Yes",
            f"Upstream socks5 {LOCALHOST}:{self.egress.port}",
        ]
        if self.auth is not None:
            lines.append(f"BasicAuth {self.auth[0]} {self.auth[1]}")
        config = directory / "tinyproxy.conf"
        config.write_text("\n".join(lines) + "\n")
        return [program, "-d", "-c", str(config)]

    def requests(self) -> list[tuple[str, str]]:
        """(method, target) of every request line tinyproxy logged, in order."""
        if self._log is None or not self._log.exists():
            return []
        found = []
        for line in self._log.read_text("utf-8", "replace").splitlines():
            _, marker, request = line.partition("): ")
            if marker and "Request (file descriptor" in line:
                method, _, rest = request.partition(" ")
                found.append((method, rest.rsplit(" ", 1)[0]))
        return found

    def client_connections(self) -> int:
        """Client connections tinyproxy accepted (its log's), not counting our start-up
        probe."""
        if self._log is None or not self._log.exists():
            return 0
        # max(): the probe's line may not be in the log yet (tinyproxy writes it late); it
        # comes first once it is, so differences between two calls stay right.
        return max(0, self._log.read_text("utf-8", "replace").count("Connect (file descriptor") - 1)

    def wait_requests(self, n: int, timeout: float = DEFAULT_TIMEOUT) -> list[tuple[str, str]]:
        """Block until ``n`` request lines are in the log; returns them."""
        deadline = time.monotonic() + timeout
        while len(found := self.requests()) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"tinyproxy logged {len(found)} of {n} requests: {found}")
            time.sleep(0.01)
        return found


class PProxy(_ProxyProcess):
    """pproxy (PyPI), chained to ``egress``: ``protocol`` ``"http"`` (forwarding and
    ``CONNECT``), ``"https"`` (the same inside TLS with ``tls``'s certificate, so clients
    trust ``tls.client_ssl_context()``) or ``"socks5"``."""

    def __init__(
        self,
        protocol: Literal["http", "https", "socks5"],
        egress: ProxyEgress,
        *,
        tls: ServerTLS | None = None,
    ) -> None:
        super().__init__(egress)
        if (protocol == "https") != (tls is not None):
            raise ValueError("PProxy: tls= is required for https and only for it")
        self.protocol = protocol
        self.scheme = protocol
        self.tls = tls
        self.pem: PemFiles | None = None

    def _command(self, directory: Path) -> list[str]:
        _require_module("pproxy", "pip install -e '.[test]'")
        listen = {"http": "http", "https": "http+ssl", "socks5": "socks5"}[self.protocol]
        command = [
            sys.executable,
            "-u",  # unbuffered: requests() reads its log as it goes
            "-c",
            # pproxy installs uvloop when it can import it, and then fails to start with
            # uvloop >= 0.22 (no current event loop): the tests' proxy runs on asyncio's.
            "import sys; sys.modules['uvloop'] = None; from pproxy.server import main; main()",
            "-v",
            "-l",
            f"{listen}://{LOCALHOST}:{self.port}",
            "-r",
            f"socks5://{LOCALHOST}:{self.egress.port}",
            "-b",
            "{(?!(?:127\\.0\\.0\\.1|localhost)$)}",  # block every other target
        ]
        if self.tls is not None:
            self.pem = self.tls.write_pem_files(directory)
            command += ["--ssl", f"{self.pem.cert_chain},{self.pem.key}"]
        return command

    def requests(self) -> list[tuple[str, str]]:
        """(protocol, target) of every connection pproxy logged, the target as the client
        named it (``localhost:PORT`` for a name, ``127.0.0.1:PORT`` for an address)."""
        found = []
        for line in self.output().splitlines():
            words = line.split()
            if len(words) >= 4 and words[2] == "->" and words[0] in ("http", "socks5"):
                found.append((words[0], words[-1]))
        return found
