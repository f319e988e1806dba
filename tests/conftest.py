"""Shared fixtures: the anyio backends, a session hypercorn server, helpers; the proxy
tests' targets and proxies come from the ``tests.servers.proxy_fixtures`` plugin."""

from __future__ import annotations

import itertools
import shutil
import socket
import threading
from collections.abc import Callable, Iterator

import anyio
import httpx
import pytest

from httpx_bulkhead import Policy, RequestTimeout
from tests.flavours import Transport, client_for
from tests.servers import HypercornServer, TestApp

pytest_plugins = ("tests.servers.proxy_fixtures",)

_names = itertools.count()


#: Proxy variables of the environment: BulkheadTransport reads them (trust_env), as httpx does.
_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture(scope="session", autouse=True)
def _no_proxies_from_the_environment() -> Iterator[None]:
    """The tests talk to 127.0.0.1 only: a developer's HTTP_PROXY (or a CI runner's) must not
    send them elsewhere.  Tests of the environment's proxies set their own (monkeypatch)."""
    with pytest.MonkeyPatch.context() as patch:
        for name in _PROXY_VARIABLES:
            patch.delenv(name, raising=False)
            patch.delenv(name.upper(), raising=False)
        yield


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Integration tests run under both backends httpx supports."""
    return str(request.param)


@pytest.fixture(params=["h11", "httptools"])
def http1_parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test once per HTTP/1.1 parser (modules opt in with ``usefixtures``): h11 is
    the reference, httptools the fast one (the default when installed).  Each transport
    the test makes without ``http1_parser=`` runs the parameter's parser, through the
    operator's knob (``HTTPX_BULKHEAD_HTTP1_PARSER``, read at construction)."""
    from httpx_bulkhead._parser_choice import ENV_VARIABLE

    monkeypatch.setenv(ENV_VARIABLE, request.param)
    return str(request.param)


@pytest.fixture(params=["async", "sync"])
def flavour(request: pytest.FixtureRequest, anyio_backend: str) -> str:
    """Runs a test against ``BulkheadTransport`` and ``BulkheadHTTPTransport`` (threads as
    callers; see ``tests/flavours.py``).  The sync one runs under asyncio only: the test's
    event loop only starts its threads."""
    if request.param == "sync" and anyio_backend == "trio":
        pytest.skip("the sync transport is driven from one event loop flavour (asyncio)")
    return str(request.param)


@pytest.fixture(scope="session")
def app() -> TestApp:
    return TestApp()


@pytest.fixture(scope="session")
def _server(app: TestApp) -> Iterator[HypercornServer]:
    with HypercornServer(app) as srv:
        yield srv


@pytest.fixture
def server(_server: HypercornServer, app: TestApp) -> HypercornServer:
    """A hypercorn server (HTTP/1.1) on 127.0.0.1, its counters reset for this test."""
    app.reset()
    return _server


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Unique names (gates, buckets) so tests sharing a server never interfere."""
    return lambda prefix: f"{prefix}-{next(_names)}"


#: Checkpoints ``until`` spends before it looks every millisecond.
SPINS = 100


async def until(
    predicate: Callable[[], bool],
    timeout: float = 10.0,
    state: Callable[[], object] | None = None,
) -> None:
    """Yield to the event loop until ``predicate()`` holds: a checkpoint loop, not a
    timed sleep; the timeout only turns a hang into a failure (``TimeoutError``, saying
    what ``state()`` returns then).  After ``SPINS`` checkpoints it looks every
    millisecond instead: the servers of ``tests.servers.asgi`` run in a thread of this
    process, and a loop that only checkpoints holds the GIL they need (under trio a
    request to one took 20,000 checkpoints and more)."""
    spins = 0
    try:
        with anyio.fail_after(timeout):
            while not predicate():
                spins += 1
                await anyio.sleep(0 if spins < SPINS else 0.001)
    except TimeoutError as exc:
        if state is None:
            raise
        raise TimeoutError(f"not reached in {timeout} s; then: {state()!r}") from exc


#: Target names only the tests' resolver knows (``.test`` is reserved: RFC 6761 §6.2).
SLOW_NAME, UNKNOWN_NAME = "slow-resolver.test", "unknown.test"
RESOLVER_THREAD = "httpx_bulkhead resolver"


def resolving(name: str, answer: Callable[[], None]) -> Callable[..., object]:
    """``socket.getaddrinfo`` with ``name`` answered by ``answer()`` (it blocks or raises;
    then ``name`` is 127.0.0.1).  Other names go to the system resolver, and so do numeric
    lookups (trio asks for ``AI_NUMERICHOST`` first): these tests name 127.0.0.1 only.

    The seam is the system resolver, the last call before the C library whichever backend
    or thread makes it.  A DNS server on 127.0.0.1 would not do: the system resolver reads
    ``/etc/resolv.conf`` (port 53), which a test must not change."""
    system = socket.getaddrinfo

    def resolver(host: str | bytes, port: object, *args: int, **kwargs: int) -> object:
        looked_up = host.decode() if isinstance(host, bytes) else host
        flags = args[3] if len(args) > 3 else kwargs.get("flags", 0)
        if looked_up == name and not flags & socket.AI_NUMERICHOST:
            answer()
            host = "127.0.0.1"
        return system(host, port, *args, **kwargs)  # type: ignore[arg-type]

    return resolver


class HungResolver:
    """``socket.getaddrinfo`` (``install``) that hangs on ``SLOW_NAME`` until ``release``:
    ``entered`` once the lookup began, ``answered`` once it returned (the abandoned lookup's
    thread ends then)."""

    def __init__(self) -> None:
        self.release, self.entered, self.answered = (threading.Event() for _ in range(3))

    def install(self, monkeypatch: pytest.MonkeyPatch) -> HungResolver:
        monkeypatch.setattr(socket, "getaddrinfo", resolving(SLOW_NAME, self._hang))
        return self

    def _hang(self) -> None:
        self.entered.set()
        try:
            self.release.wait(10)  # the test's end releases it; 10 s only ends a failing run
        finally:
            self.answered.set()

    async def cut(
        self, transport: Transport, timeout: httpx.Timeout, expected: type[Exception], url: str
    ) -> tuple[BaseException | None, bool]:
        """GET ``url`` through ``transport`` with the client ``timeout``, expecting
        ``expected`` (``lookup_deadline``'s, whose policy ``transport`` has): the connect's
        error (a ``RequestTimeout``'s cause), and whether the deadline cut the lookup while
        it hung; the resolver is released after."""
        try:
            async with client_for(transport, timeout=timeout) as client:
                with pytest.raises(expected) as info:
                    await client.get(url)
                hung = self.entered.is_set() and not self.answered.is_set()
        finally:
            self.release.set()
        return (info.value.__cause__ if expected is RequestTimeout else info.value), hung

    async def ended(self) -> None:
        """The abandoned lookup ends once the resolver answered, and its thread with it."""
        await until(self.answered.is_set)
        await until(lambda: all(t.name != RESOLVER_THREAD for t in threading.enumerate()))


def lookup_deadline(bound: str) -> tuple[httpx.Timeout, Policy | None, type[Exception]]:
    """The client timeout, policy and error of a connect cut at 0.5 s by ``bound``:
    httpx's connect timeout, or the request's budget (``request_timeout``).  The lookup
    must have begun by then (0.2 s was once too short for a loaded CI machine)."""
    if bound == "connect_timeout":
        return httpx.Timeout(5, connect=0.5), None, httpx.ConnectTimeout
    return httpx.Timeout(5), Policy(request_timeout=0.5), RequestTimeout


#: Test files of the layers above the connection: adaptive limits (most of them pure
#: algorithm, fed samples, no network), fleet limits on Redis, statistics, exporters, logs
#: and traces, respx's mocks.  They meet HTTP/1.1 only as well-formed responses from
#: hypercorn or the lab's Node server, which every other suite parses with both parsers;
#: what they test is the same under either.  ``.ci/run``'s h11 pass leaves them out (about
#: 190 of its 480 s).
ABOVE_THE_PARSER = (
    "tests/adversary/test_adaptive",
    "tests/integration/test_adaptive",
    "tests/integration/test_fleet",
    "tests/integration/test_exporters.py",
    "tests/integration/test_histograms.py",
    "tests/integration/test_counters.py",
    "tests/integration/test_logging.py",
    "tests/integration/test_trace.py",
    "tests/integration/test_otel_tracing.py",
    "tests/integration/test_respx",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test using ``http1_parser`` runs each parser itself: mark it ``explicit_parser``,
    so a pass under ``HTTPX_BULKHEAD_HTTP1_PARSER`` (``.ci/run``) can leave it out; a test
    of a file in ``ABOVE_THE_PARSER`` is marked ``parser_free``, and a test run under trio
    (its ``anyio_backend``) ``trio_backend``, for the same pass."""
    root = config.rootpath
    for item in items:
        if "http1_parser" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.explicit_parser)
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("anyio_backend") == "trio":
            item.add_marker(pytest.mark.trio_backend)
        path = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else ""
        if path.startswith(ABOVE_THE_PARSER):
            item.add_marker(pytest.mark.parser_free)


def pytest_report_header() -> str:
    """Say up front whether the tests against Node.js's HTTP/2 server will run."""
    from tests.servers.node import REQUIRE_NODE_ENV

    node = shutil.which("node")
    if node is not None:
        return f"Node.js: {node} (the tests against Node's HTTP/2 server run)"
    return (
        "Node.js: not on PATH; the tests against Node's HTTP/2 server will be skipped"
        f" (or fail, with {REQUIRE_NODE_ENV}=1)"
    )
