"""Run httpx's own test suite with our transports as its clients' defaults.

    python scripts/httpx_suite.py            # from the repo root, after pip install -e '.[test]'

What it does:

1. ``pip download``s the httpx 0.28.1 source distribution from PyPI into a temporary
   directory and extracts it there (nothing is written into this repository).
2. Installs the packages httpx's tests import that are missing from the current environment
   (at the versions httpx 0.28.1 pins for its own CI where it pins one).
3. Copies ``scripts/httpx_suite_conftest.py`` to the root of the extracted tree as
   ``conftest.py``: it records every test's outcome, and in a patched run replaces
   ``httpx.AsyncClient._init_transport`` (mode ``async``) so a client created without
   ``transport=`` gets ``BulkheadTransport(verify=, cert=, trust_env=, http1=, http2=,
   limits=, ...)``, and ``_init_proxy_transport`` so every proxy mount (``proxy=``, or one
   per environment proxy) is ``BulkheadTransport(proxy=..., ...)``; or
   ``httpx.Client._init_transport`` and ``_init_proxy_transport`` (mode ``sync``) so it
   and its proxy mounts get ``BulkheadHTTPTransport`` with the same arguments.
4. Runs ``pytest -m "not network"`` there three times: with httpx's default transports,
   then patched in each mode.  Only 127.0.0.1 is used (the suite starts its own uvicorn
   server).
5. Re-runs the tests that failed only in a patched run once more, patched and not, so that a
   flaky test (httpx's suite has a couple) is not reported as an incompatibility.
6. Prints each patched run beside the default one, and every patched-only failure with its
   reason.

Exit status: 0 when every failure that is confirmed patched-only is listed in ``KNOWN``
(tests that look at httpx's internals rather than at behaviour); 1 when one outside ``KNOWN``
appears, or a run broke off (crash, timeout) or the patch was never exercised; 2 on a setup
error (download, install).  Failures that did not reproduce on the re-run are printed as
flaky but do not change the exit status.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

HTTPX_VERSION: Final = "0.28.1"
REPO_ROOT: Final = Path(__file__).resolve().parent.parent
CONFTEST: Final = Path(__file__).resolve().with_name("httpx_suite_conftest.py")

# Distribution -> requirement installed when that distribution is missing.  These are what
# httpx 0.28.1's tests import (tests/conftest.py: uvicorn, trustme, cryptography; the
# decoders: brotli, zstandard, chardet; the CLI tests: click, pygments, rich; the proxy
# tests: socksio, httpcore; the async tests: anyio (its pytest plugin runs them on asyncio
# and trio), sniffio), pinned like httpx's own requirements.txt / extras where it pins.
TEST_REQUIREMENTS: Final[dict[str, str]] = {
    "pytest": "pytest>=8",
    "pytest-timeout": "pytest-timeout>=2.3",
    "anyio": "anyio>=4.4",
    "sniffio": "sniffio",
    "trio": "trio",
    "certifi": "certifi",
    "idna": "idna",
    "httpcore": "httpcore==1.*",
    "h2": "h2>=3,<5",
    "brotli": "brotli",
    "zstandard": "zstandard>=0.18.0",
    "chardet": "chardet==5.2.0",
    "socksio": "socksio==1.*",
    "click": "click==8.*",
    "pygments": "pygments==2.*",
    "rich": "rich>=10,<14",
    "cryptography": "cryptography",
    "trustme": "trustme",
    "uvicorn": "uvicorn==0.32.1",
}

# Patched-only failures that are not incompatibilities of BulkheadTransport: tests that
# inspect httpx's internals (isinstance checks on AsyncHTTPTransport, ``transport._pool``,
# httpcore specifics) rather than behaviour.  test id (or id without its [parameters]) ->
# why.  Listed by full id, so a new failing case of the same test is reported as NEW.
_POOL_PROXY_URL: Final = (
    "reads transport._pool._proxy_url (httpcore's proxy pool) of the mounted proxy transport;"
    " the mount is ours (BulkheadTransport or BulkheadHTTPTransport(proxy=...)), and where requests"
    " really go with these environments is checked side by side with httpx in tests/integration/"
    "test_proxy_environment.py (internals, not behaviour)"
)
#: The cases of test_proxies_environ (``AsyncClient-`` and ``Client-``) whose expected proxy
#: is not None.
_ENVIRON_PROXIED: Final = (
    "http://127.0.0.1-env4-http://localhost:123",
    "http://127.0.0.1-env6-http://localhost:123",
    "http://127.0.0.1-env7-http://localhost:123",
    "http://google.com-env1-http://example.com",
    "http://google.com-env2-http://example.com",
    "https://foo.example.com-env13-http://localhost:123",
    "https://mit.edu.info-env12-http://localhost:123",
    "https://mit.edu.info-env9-http://localhost:123",
    "https://www.example2.com-env15-http://localhost:123",
)
KNOWN: Final[dict[str, str]] = {
    **{
        f"tests/client/test_proxies.py::test_proxies_environ[AsyncClient-{case}]": _POOL_PROXY_URL
        for case in _ENVIRON_PROXIED
    },
    "tests/client/test_proxies.py::test_socks_proxy": (
        "asserts the async proxy mount is an httpx.AsyncHTTPTransport whose _pool is"
        " httpcore.AsyncSOCKSProxy; ours is BulkheadTransport(proxy='socks5://...') with its own"
        " SOCKS5 handshake (tests/integration/test_proxy_transport.py sends requests through"
        " socks5:// and socks5h://): internals, not behaviour"
    ),
}
#: The same for ``BulkheadHTTPTransport`` as ``httpx.Client``'s default (and its proxy mounts).
KNOWN_SYNC: Final[dict[str, str]] = {
    **{
        f"tests/client/test_proxies.py::test_proxies_environ[Client-{case}]": _POOL_PROXY_URL
        for case in _ENVIRON_PROXIED
    },
    "tests/client/test_proxies.py::test_socks_proxy": (
        "asserts the sync proxy mount is an httpx.HTTPTransport whose _pool is"
        " httpcore.SOCKSProxy; ours is BulkheadHTTPTransport(proxy='socks5://...') with the"
        " same SOCKS5 handshake as the async transport (tests/integration/"
        "test_proxy_transport.py sends requests through it for both): internals, not behaviour"
    ),
    "tests/test_api.py::test_httpcore_lazy_loading": (
        "checks that creating an httpx.Client imports httpcore (for its default"
        " HTTPTransport); BulkheadHTTPTransport does not use httpcore"
    ),
    "tests/test_main.py::test_auth": (
        "httpx's CLI trace callback formats info['request'] as an httpcore.Request (byte"
        " header pairs, url.target); our trace events carry the httpx.Request (_trace.py)"
    ),
    "tests/test_main.py::test_verbose": "as tests/test_main.py::test_auth",
}

PER_TEST_TIMEOUT: Final = 30  # seconds, pytest-timeout, so a hung test cannot stall the run
RUN_TIMEOUT: Final = 150  # seconds for one full pytest run (the suite takes ~15 s here)
MAX_RERUN: Final = 100  # patched-only failures beyond this many are not re-run
# httpx's tests/conftest.py serves on uvicorn's default 127.0.0.1:8000, and tests/test_main.py
# expects that port in its output, so it cannot be moved: wait for it to be free instead.
SERVER_PORT: Final = 8000
PORT_WAIT: Final = 30.0  # seconds
FAILING: Final = frozenset({"failed", "error"})


@dataclass
class TestResult:
    nodeid: str
    status: str = "passed"  # passed failed error skipped xfailed xpassed
    reason: str = ""
    transports: int = 0  # BulkheadTransports the patch created during the test
    requests: int = 0  # requests those transports handled


@dataclass
class Run:
    label: str
    returncode: int
    timed_out: bool
    summary: str  # pytest's own closing line
    log: Path
    tests: dict[str, TestResult] = field(default_factory=dict)
    meta: dict[str, str] = field(default_factory=dict)

    def counts(self) -> Counter[str]:
        return Counter(t.status for t in self.tests.values())

    def failing(self) -> set[str]:
        return {nodeid for nodeid, t in self.tests.items() if t.status in FAILING}

    def broken(self) -> str | None:
        """Why this run cannot be trusted, or None."""
        if self.timed_out:
            return f"did not finish within {RUN_TIMEOUT} s"
        if self.returncode not in (0, 1):
            return f"pytest exited with {self.returncode} ({self.summary or 'no summary'})"
        if not self.tests:
            return "no test ran"
        return None


class SetupError(Exception):
    pass


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--sdist", type=Path, help="use this httpx sdist instead of downloading")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument(
        "--no-install", action="store_true", help="do not install missing test dependencies"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="show pytest's output")
    args = parser.parse_args(argv)

    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="httpx-suite-"))
    if args.keep:
        print(f"httpx-suite: working in {tmp} (kept afterwards)")
    try:
        try:
            tree = prepare(tmp, args.sdist, install=not args.no_install)
            return run_and_report(tree, tmp, verbose=args.verbose, started=started)
        except SetupError as exc:
            print(f"httpx-suite: setup failed: {exc}", file=sys.stderr)
            return 2
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


# --- setup -------------------------------------------------------------------------------


def prepare(tmp: Path, sdist: Path | None, *, install: bool) -> Path:
    if sdist is None:
        sdist = download(tmp / "dist")
    tree = extract(sdist, tmp / "src")
    if (tree / "conftest.py").exists():
        raise SetupError(f"{tree / 'conftest.py'} already exists; refusing to overwrite it")
    shutil.copyfile(CONFTEST, tree / "conftest.py")
    missing = [req for dist, req in TEST_REQUIREMENTS.items() if not installed(dist)]
    if missing:
        if not install:
            raise SetupError(f"missing test dependencies: {' '.join(missing)}")
        print(f"httpx-suite: installing {' '.join(missing)}", flush=True)
        pip("install", *missing)
    return tree


def download(dest: Path) -> Path:
    print(f"httpx-suite: downloading the httpx {HTTPX_VERSION} sdist from PyPI", flush=True)
    pip(
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        f"httpx=={HTTPX_VERSION}",
        "-d",
        str(dest),
    )
    found = sorted(dest.glob(f"httpx-{HTTPX_VERSION}.tar.gz"))
    if not found:
        raise SetupError(f"pip download left no httpx-{HTTPX_VERSION}.tar.gz in {dest}")
    return found[0]


def extract(sdist: Path, dest: Path) -> Path:
    dest.mkdir(parents=True)
    with tarfile.open(sdist) as archive:
        if hasattr(tarfile, "data_filter"):
            archive.extractall(dest, filter="data")
        else:  # pragma: no cover - Python without the extraction filters (< 3.11.4)
            for member in archive.getmembers():
                target = (dest / member.name).resolve()
                if not target.is_relative_to(dest.resolve()) or member.issym() or member.islnk():
                    raise SetupError(f"unsafe member in {sdist}: {member.name}")
            archive.extractall(dest)
    tree = dest / f"httpx-{HTTPX_VERSION}"
    if not (tree / "tests" / "conftest.py").is_file() or not (tree / "httpx").is_dir():
        raise SetupError(f"{sdist} does not hold httpx's package and tests")
    return tree


def installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def pip(*args: str) -> None:
    command = [sys.executable, "-m", "pip", *args, "--quiet", "--disable-pip-version-check"]
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        raise SetupError(f"{' '.join(command)} exited with {done.returncode}:\n{done.stdout}")


# --- the runs ----------------------------------------------------------------------------


def pytest_run(
    tree: Path, tmp: Path, label: str, *, patch: str, verbose: bool, nodeids: Iterable[str] = ()
) -> Run:
    """One pytest run; ``patch``: ``""`` (httpx's default transports), ``"async"``
    (``AsyncClient`` gets ``BulkheadTransport``) or ``"sync"`` (``Client`` gets
    ``BulkheadHTTPTransport``)."""
    results = tmp / f"{label}.jsonl"
    log = tmp / f"{label}.log"
    results.unlink(missing_ok=True)
    env = dict(os.environ)
    # The extracted tree first, so the httpx under test is the 0.28.1 sdist (whatever httpx
    # is installed) and ``tests`` is httpx's; then this checkout, so httpx_bulkhead is ours.
    paths = [str(tree), str(REPO_ROOT), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env["HTTPX_SUITE_RESULTS"] = str(results)
    env["HTTPX_SUITE_PATCH"] = patch
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_PLUGINS", None)
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "not network",
        "-p",
        "no:cacheprovider",
        f"--timeout={PER_TEST_TIMEOUT}",
        "-q",
        "-rfE",
        *nodeids,
    ]
    print(f"httpx-suite: {label}: pytest -m 'not network' in {tree}", flush=True)
    wait_for_free_port(SERVER_PORT, PORT_WAIT)
    timed_out = False
    with open(log, "w", encoding="utf-8") as out:
        process = subprocess.Popen(
            command,
            cwd=tree,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=None if verbose else out,
            stderr=subprocess.STDOUT if not verbose else None,
        )
        try:
            returncode = process.wait(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            timed_out = True
            process.kill()
            returncode = process.wait()
    run = Run(label, returncode, timed_out, pytest_summary(log), log)
    read_results(run, results)
    return run


def wait_for_free_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            try:
                probe.bind(("127.0.0.1", port))
                return
            except OSError as exc:
                if time.monotonic() >= deadline:
                    raise SetupError(
                        f"127.0.0.1:{port} is in use ({exc}); httpx's test server needs it"
                    ) from exc
        time.sleep(0.5)


def pytest_summary(log: Path) -> str:
    lines = [line.strip("= \n") for line in log.read_text(errors="replace").splitlines()]
    pattern = re.compile(r"\d+ (passed|failed|skipped|error|errors|deselected)\b|no tests ran")
    return next((line for line in reversed(lines) if pattern.search(line)), "")


def read_results(run: Run, results: Path) -> None:
    if not results.exists():
        return
    for line in results.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if "meta" in record:
            run.meta = {str(k): str(v) for k, v in record["meta"].items()}
            continue
        nodeid = str(record["nodeid"])
        test = run.tests.setdefault(nodeid, TestResult(nodeid))
        when, outcome, xfail = record["when"], record["outcome"], bool(record["xfail"])
        reason = str(record["reason"])
        if when == "collect" or (when == "setup" and outcome == "failed"):
            test.status, test.reason = "error", reason
        elif outcome == "skipped":
            test.status, test.reason = ("xfailed" if xfail else "skipped"), reason
        elif when == "call" and outcome == "failed":
            test.status, test.reason = "failed", reason
        elif when == "call" and xfail:
            test.status = "xpassed"
        elif when == "teardown" and outcome == "failed" and test.status not in FAILING:
            test.status, test.reason = "error", f"(in teardown) {reason}"
        if when == "teardown":
            test.transports = int(record.get("transports", 0))
            test.requests = int(record.get("requests", 0))


# --- the report --------------------------------------------------------------------------


def checkout_state() -> str:
    """This checkout's commit, and whether the library has uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--", "httpx_bulkhead"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return f"(commit {head}{', with uncommitted changes' if dirty else ''})"


def known_reason(nodeid: str) -> str | None:
    return KNOWN.get(nodeid, KNOWN.get(nodeid.split("[", 1)[0]))


def short(reason: str, lines: int = 4, width: int = 160) -> str:
    kept = [line.rstrip()[:width] for line in reason.strip().splitlines() if line.strip()]
    more = " ..." if len(kept) > lines else ""
    return "\n        ".join(kept[:lines]) + more


def line_counts(counts: Counter[str]) -> str:
    passed = counts["passed"] + counts["xpassed"]
    failed = counts["failed"] + counts["error"]
    skipped = counts["skipped"] + counts["xfailed"]
    # Not the "N passed, N failed" shape: CI reads that as the run's own verdict.
    return f"passed={passed} failed={failed} skipped={skipped}"


#: The patched runs: mode -> (the transport substituted, the client it is the default of).
MODES: Final[dict[str, tuple[str, str]]] = {
    "async": ("BulkheadTransport", "httpx.AsyncClient"),
    "sync": ("BulkheadHTTPTransport", "httpx.Client"),
}


def run_and_report(tree: Path, tmp: Path, *, verbose: bool, started: float) -> int:
    default = pytest_run(tree, tmp, "default", patch="", verbose=verbose)
    failed = False
    lines = []
    for mode in MODES:
        patched = pytest_run(tree, tmp, f"patched-{mode}", patch=mode, verbose=verbose)
        failed |= report(tree, tmp, default, patched, mode, verbose=verbose)
        lines.append(f"{MODES[mode][0]}: {line_counts(patched.counts())}")
    print(f"\n(took {time.monotonic() - started:.0f} s)")
    print(f"httpx-suite: {'; '.join(lines)} (default transports: {line_counts(default.counts())})")
    return 1 if failed else 0


def report(tree: Path, tmp: Path, default: Run, patched: Run, mode: str, *, verbose: bool) -> bool:
    """Print the patched run of ``mode`` beside the default one; true if it fails the check."""
    ours, client = MODES[mode]
    known = KNOWN if mode == "async" else KNOWN_SYNC
    problems: list[str] = []
    for run in (default, patched):
        why = run.broken()
        if why:
            problems.append(f"the {run.label} run is incomplete: {why} (--keep keeps its log)")
            print(f"--- tail of the {run.label} run's output:")
            print("\n".join(run.log.read_text(errors="replace").splitlines()[-30:]))
        httpx_file = run.meta.get("httpx_file", "")
        if run.meta and not Path(httpx_file).is_relative_to(tree):
            problems.append(f"the {run.label} run imported httpx from {httpx_file}, not {tree}")

    # Failing only under our transport: failing in the patched run, run and not failing in
    # the default one.
    candidates = sorted(
        nodeid
        for nodeid in patched.failing()
        if nodeid in default.tests and default.tests[nodeid].status not in FAILING
    )
    confirmed: list[str] = candidates
    flaky: list[str] = []
    both: list[str] = []
    if candidates and len(candidates) <= MAX_RERUN and not patched.broken():
        print(f"httpx-suite: re-running the {len(candidates)} patched-only failure(s)", flush=True)
        again_patched = pytest_run(
            tree, tmp, f"rerun-{mode}", patch=mode, verbose=verbose, nodeids=candidates
        )
        again_default = pytest_run(
            tree, tmp, f"rerun-default-{mode}", patch="", verbose=verbose, nodeids=candidates
        )
        confirmed, flaky, both = [], [], []
        for nodeid in candidates:
            p = again_patched.tests.get(nodeid)
            d = again_default.tests.get(nodeid)
            if p is not None and p.status not in FAILING:
                flaky.append(nodeid)
            elif d is not None and d.status in FAILING:
                both.append(nodeid)
            else:
                confirmed.append(nodeid)

    # Side by side.
    dc, pc = default.counts(), patched.counts()
    statuses = ["passed", "failed", "error", "skipped", "xfailed", "xpassed"]
    print()
    print(f"httpx {HTTPX_VERSION} test suite, -m 'not network', {ours} as {client}'s default")
    print(f"  {'':10} {ours:>22} {'default transports':>22}")
    for status in statuses:
        if status in ("passed", "failed", "error", "skipped") or dc[status] or pc[status]:
            print(f"  {status:10} {pc[status]:>22} {dc[status]:>22}")
    print(f"  pytest said: {patched.summary or '-'} | {default.summary or '-'}")
    through = [t for t in patched.tests.values() if t.requests]
    requests = sum(t.requests for t in through)
    transports = sum(t.transports for t in patched.tests.values())
    print(
        f"  {ours}: {transports} created by the patch, {requests} requests sent"
        f" through it by {len(through)} tests"
    )
    where = Path(patched.meta.get("httpx_bulkhead_file", "?")).parent
    print(f"  httpx_bulkhead: {where} {checkout_state()}")
    if not patched.broken() and requests == 0:
        problems.append(f"no request went through {ours}: the patch did not take")

    def reason_of(nodeid: str) -> str | None:
        return known.get(nodeid, known.get(nodeid.split("[", 1)[0]))

    unknown = [n for n in confirmed if reason_of(n) is None]
    if confirmed:
        print(f"\nFailing only with {ours} ({len(confirmed)}):")
        for nodeid in confirmed:
            reason = reason_of(nodeid)
            tag = f"KNOWN: {reason}" if reason else "NEW"
            print(f"  {nodeid}  [{tag}]")
            print(f"        {short(patched.tests[nodeid].reason)}")
    if flaky:
        print(f"\nFailed once with {ours}, passed on re-run ({len(flaky)}, flaky):")
        for nodeid in flaky:
            print(f"  {nodeid}\n        {short(patched.tests[nodeid].reason)}")
    if both:
        print(f"\nFailed with {ours}, and with the default on re-run ({len(both)}):")
        for nodeid in both:
            print(f"  {nodeid}\n        {short(patched.tests[nodeid].reason)}")
    shared = sorted(patched.failing() & default.failing())
    if shared:
        print(f"\nFailing with both transports ({len(shared)}):")
        for nodeid in shared:
            print(f"  {nodeid}\n        {short(patched.tests[nodeid].reason, lines=1)}")
    default_only = sorted(default.failing() - patched.failing())
    if default_only:
        print(f"\nFailing only with the default transport ({len(default_only)}):")
        for nodeid in default_only:
            print(f"  {nodeid}\n        {short(default.tests[nodeid].reason, lines=1)}")
    failing_ids = patched.failing() | {n.split("[", 1)[0] for n in patched.failing()}
    stale = sorted(k for k in known if k not in failing_ids)
    if stale and not patched.broken():
        print(f"\nKNOWN entries that no longer fail (remove them): {', '.join(stale)}")
    for problem in problems:
        print(f"\nhttpx-suite: ERROR: {problem}")
    return bool(unknown or problems)


if __name__ == "__main__":
    sys.exit(main())
