"""Root ``conftest.py`` that ``scripts/httpx_suite.py`` copies into the extracted httpx sdist.

Not a test module of this repository: it is only ever loaded by pytest from the root of the
extracted httpx tree.  Driven by environment variables set by ``httpx_suite.py``:

``HTTPX_SUITE_RESULTS``
    a JSON-lines file: one line per test phase report (node id, phase, outcome, reason).
``HTTPX_SUITE_PATCH``
    ``"async"``: an ``httpx.AsyncClient`` created without ``transport=``
    (``_init_transport``) gets a ``BulkheadTransport`` built from the same keyword
    arguments, and so does each proxy mount (``_init_proxy_transport``:
    ``BulkheadTransport(proxy=...)``); ``"sync"``: an ``httpx.Client`` likewise gets a
    ``BulkheadHTTPTransport``, and so does each of its proxy mounts; anything else:
    nothing is patched.

In both runs uvicorn's ``http="auto"`` is pinned to its h11 implementation, as in httpx's own
CI (which does not install httptools): with httptools installed, uvicorn writes
``transfer-encoding`` in lower case and httpx's CLI tests (``tests/test_main.py``) fail with
either transport.
"""

from __future__ import annotations

import importlib
import json
import os
import ssl
from typing import TYPE_CHECKING, Any

import httpx
import pytest

if TYPE_CHECKING:
    from httpx_bulkhead import BulkheadHTTPTransport, BulkheadTransport

_RESULTS = os.environ.get("HTTPX_SUITE_RESULTS")
_MODE = os.environ.get("HTTPX_SUITE_PATCH", "")
_PATCH = _MODE in ("async", "sync")
# The transports the patch created during the current test (dropped when it ends), so the
# report can show that the test really went through ours.
_created: list[BulkheadTransport | BulkheadHTTPTransport] = []


def _patch(client: type[httpx.Client] | type[httpx.AsyncClient], ours: type[Any]) -> None:
    """``client`` (``httpx.Client`` or ``httpx.AsyncClient``) gets ``ours``
    (``BulkheadHTTPTransport`` or ``BulkheadTransport``) as its default transport and as
    each proxy mount, built from the arguments httpx 0.28.1 gives its own transports."""
    original = client._init_transport

    def _init_transport(
        self: Any,
        verify: ssl.SSLContext | str | bool = True,
        cert: Any = None,
        trust_env: bool = True,
        http1: bool = True,
        http2: bool = False,
        limits: httpx.Limits = httpx._config.DEFAULT_LIMITS,
        transport: Any = None,
    ) -> Any:
        if transport is not None:
            return original(self, transport=transport)
        # The same arguments the client gives its HTTPTransport, plus the transport-only
        # ones at their defaults (the client has no such options).
        return _made(
            ours(
                verify=verify,
                cert=cert,
                trust_env=trust_env,
                http1=http1,
                http2=http2,
                limits=limits,
                retries=0,
                local_address=None,
                uds=None,
                socket_options=None,
            )
        )

    def _init_proxy_transport(
        self: Any,
        proxy: httpx.Proxy,
        verify: ssl.SSLContext | str | bool = True,
        cert: Any = None,
        trust_env: bool = True,
        http1: bool = True,
        http2: bool = False,
        limits: httpx.Limits = httpx._config.DEFAULT_LIMITS,
    ) -> Any:
        # What the client gives its HTTPTransport(proxy=...) for each proxy mount
        # (``proxy=`` on the client, or one per environment proxy).
        return _made(
            ours(
                verify=verify,
                cert=cert,
                trust_env=trust_env,
                http1=http1,
                http2=http2,
                limits=limits,
                proxy=proxy,
            )
        )

    client._init_transport = _init_transport  # type: ignore[method-assign]
    client._init_proxy_transport = _init_proxy_transport  # type: ignore[method-assign]


def _made(transport: BulkheadTransport | BulkheadHTTPTransport) -> Any:
    _created.append(transport)
    return transport


def _pin_uvicorn_h11() -> None:
    protocols = importlib.import_module("uvicorn.config").HTTP_PROTOCOLS
    protocols["auto"] = protocols["h11"]


_pin_uvicorn_h11()
if _MODE == "async":
    from httpx_bulkhead import BulkheadTransport as _Async

    _patch(httpx.AsyncClient, _Async)
elif _MODE == "sync":
    from httpx_bulkhead import BulkheadHTTPTransport as _Sync

    _patch(httpx.Client, _Sync)


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = [f"httpx-suite: httpx {httpx.__version__} from {os.path.dirname(httpx.__file__)}"]
    if _PATCH:
        import httpx_bulkhead

        where = os.path.dirname(httpx_bulkhead.__file__)
        if _MODE == "async":
            lines.append(f"httpx-suite: AsyncClient default transport: BulkheadTransport ({where})")
        else:
            lines.append(f"httpx-suite: Client default transport: BulkheadHTTPTransport ({where})")
    else:
        lines.append("httpx-suite: default transports: httpx's own")
    return lines


def pytest_sessionstart(session: pytest.Session) -> None:
    """Tell the driver which httpx and which httpx_bulkhead this run really imported."""
    meta: dict[str, object] = {"httpx_version": httpx.__version__, "httpx_file": httpx.__file__}
    if _PATCH:
        import httpx_bulkhead

        meta["httpx_bulkhead_file"] = httpx_bulkhead.__file__
    _write({"meta": meta})


def _write(record: dict[str, object]) -> None:
    if _RESULTS is not None:
        with open(_RESULTS, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    _created.clear()


def _reason(report: pytest.TestReport) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])
    crash = getattr(report.longrepr, "reprcrash", None)
    message = getattr(crash, "message", None)
    if isinstance(message, str) and message:
        return message
    return report.longreprtext


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _RESULTS is None:
        return
    record: dict[str, object] = {
        "nodeid": report.nodeid,
        "when": report.when,
        "outcome": report.outcome,
        "xfail": hasattr(report, "wasxfail"),
        "reason": "" if report.passed else _reason(report),
    }
    if report.when == "teardown":
        record["transports"] = len(_created)
        record["requests"] = sum(
            stats.acquired for transport in _created for stats in transport.statistics().values()
        )
        _created.clear()
    _write(record)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if _RESULTS is None or not report.failed:
        return
    record: dict[str, object] = {
        "nodeid": report.nodeid,
        "when": "collect",
        "outcome": "failed",
        "xfail": False,
        "reason": report.longreprtext,
    }
    _write(record)
