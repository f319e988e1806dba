"""Which HTTP/1.1 parser a transport runs: ``http1_parser=`` beats
``HTTPX_BULKHEAD_HTTP1_PARSER``, which beats "httptools when it can be imported, else h11"
(``_parser_choice.py``).  The rule is tested pure (environment and import passed in), then
through both transports, then with httptools made unimportable for real: in this process
through ``sys.modules`` and, end to end, in a subprocess whose import system refuses it."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import textwrap
import types
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from httpx_bulkhead import BulkheadHTTPTransport, BulkheadTransport
from httpx_bulkhead._parser_choice import (
    ENV_VARIABLE,
    MIN_HTTPTOOLS,
    Choice,
    choose_parser,
    httptools_unusable,
)

ROOT = Path(__file__).resolve().parents[2]


def _yes() -> str | None:  # httptools is usable
    return None


def _no() -> str | None:
    return "not installed"


def _old() -> str | None:
    return "0.5.0 is installed"


@pytest.mark.parametrize(
    ("argument", "variable", "unusable", "expected"),
    [
        # the argument wins over the variable and over what is installed
        ("h11", "httptools", _yes, Choice("h11", "argument")),
        ("httptools", "h11", _yes, Choice("httptools", "argument")),
        ("h11", None, _no, Choice("h11", "argument")),
        ("h11", "nonsense", _no, Choice("h11", "argument")),  # the variable is not read
        # the variable wins over what is installed
        (None, "h11", _yes, Choice("h11", "environment")),
        (None, "httptools", _yes, Choice("httptools", "environment")),
        (None, "h11", _no, Choice("h11", "environment")),
        # neither: httptools when it can be imported, else h11
        (None, None, _yes, Choice("httptools", "installed")),
        (None, None, _no, Choice("h11", "not installed")),
        (None, "", _yes, Choice("httptools", "installed")),  # empty means unset
        (None, "", _no, Choice("h11", "not installed")),
        (None, None, _old, Choice("h11", "0.5.0 is installed")),  # too old: not taken
        ("h11", None, _old, Choice("h11", "argument")),
    ],
)
def test_argument_beats_variable_beats_installed(
    argument: str | None,
    variable: str | None,
    unusable: Callable[[], str | None],
    expected: Choice,
) -> None:
    environ = {} if variable is None else {ENV_VARIABLE: variable}
    assert choose_parser(argument, environ, unusable) == expected


@pytest.mark.parametrize("value", ["llhttp", "H11", "HTTPTOOLS", " h11", "h11 ", "auto", "0"])
def test_a_value_we_do_not_know_names_its_source(value: str) -> None:
    with pytest.raises(ValueError) as from_variable:
        choose_parser(None, {ENV_VARIABLE: value}, _yes)
    assert str(from_variable.value) == (
        f"{ENV_VARIABLE} must be 'h11' or 'httptools', got {value!r}"
    )
    with pytest.raises(ValueError) as from_argument:
        choose_parser(value, {}, _yes)
    assert str(from_argument.value) == f"http1_parser must be 'h11' or 'httptools', got {value!r}"


def test_httptools_asked_for_but_not_usable_is_refused_naming_the_source() -> None:
    with pytest.raises(ValueError) as from_variable:
        choose_parser(None, {ENV_VARIABLE: "httptools"}, _no)
    assert str(from_variable.value) == (
        f"{ENV_VARIABLE}='httptools' needs httptools>=0.6 (not installed):"
        " pip install 'httpx-bulkhead[fast]'"
    )
    with pytest.raises(ValueError) as from_argument:
        choose_parser("httptools", {}, _old)
    assert str(from_argument.value) == (
        "http1_parser='httptools' needs httptools>=0.6 (0.5.0 is installed):"
        " pip install 'httpx-bulkhead[fast]'"
    )


@pytest.mark.parametrize(
    ("version", "why"),
    [
        ("0.6.0", None),
        ("0.6.4", None),
        ("0.7.0rc1", None),
        ("1.0", None),
        ("0.5.0", "0.5.0 is installed"),
        ("0.1.5", "0.1.5 is installed"),
        (None, "? is installed"),  # no version: not what we tested
    ],
)
def test_an_httptools_older_than_the_extra_is_not_usable(
    version: str | None, why: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``[fast]`` extra's floor: httptools 0.5's llhttp leaves obs-fold folded (the
    codec differential tests fail there), and another package may have installed it."""
    stand_in = types.ModuleType("httptools")
    stand_in.HttpResponseParser = type("HttpResponseParser", (), {})  # type: ignore[attr-defined]
    if version is not None:
        stand_in.__version__ = version  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "httptools", stand_in)
    assert httptools_unusable() == why
    if why is not None:
        monkeypatch.delenv(ENV_VARIABLE, raising=False)
        transport = BulkheadHTTPTransport()
        assert transport.http1_parser == "h11"
        transport.close()


def test_the_floor_is_the_fast_extras() -> None:
    """``MIN_HTTPTOOLS`` and ``pip install 'httpx-bulkhead[fast]'`` agree."""
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    fast = re.search(r"^fast = (.*)$", pyproject, flags=re.MULTILINE)
    assert fast is not None
    assert fast[1] == '["httptools>={}.{}"]'.format(*MIN_HTTPTOOLS)


def test_a_non_string_argument_is_refused() -> None:
    with pytest.raises(ValueError, match=r"http1_parser must be .* got 11"):
        choose_parser(11, {}, _yes)  # type: ignore[arg-type]


@pytest.mark.parametrize("make", [BulkheadTransport, BulkheadHTTPTransport])
def test_the_transports_say_which_parser_they_run(
    make: Callable[..., BulkheadTransport | BulkheadHTTPTransport],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The variable is read when the transport is made (set after import), the argument
    beats it, and ``http1_parser`` is a read-only attribute of either transport."""
    monkeypatch.delenv(ENV_VARIABLE, raising=False)
    made = [make()]  # the test extras install httptools: it is the default here
    assert made[0].http1_parser == "httptools"
    monkeypatch.setenv(ENV_VARIABLE, "h11")
    made.append(make())
    assert made[1].http1_parser == "h11"
    made.append(make(http1_parser="httptools"))
    assert made[2].http1_parser == "httptools"
    monkeypatch.setenv(ENV_VARIABLE, "")
    made.append(make())
    assert made[3].http1_parser == "httptools"
    monkeypatch.setenv(ENV_VARIABLE, "llhttp")
    with pytest.raises(ValueError, match=f"^{ENV_VARIABLE} must be 'h11' or 'httptools', got"):
        make()
    with pytest.raises(AttributeError):
        made[0].http1_parser = "h11"  # type: ignore[misc]
    for transport in made:
        if isinstance(transport, BulkheadHTTPTransport):
            transport.close()
        else:
            anyio.run(transport.aclose)


def test_the_choice_and_its_reason_are_logged_at_debug(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VARIABLE, "h11")
    with caplog.at_level(logging.DEBUG, logger="httpx_bulkhead"):
        BulkheadHTTPTransport().close()
        monkeypatch.delenv(ENV_VARIABLE)
        BulkheadHTTPTransport().close()
    lines = [r for r in caplog.records if getattr(r, "event", None) == "http1_parser"]
    assert [r.getMessage() for r in lines] == [
        f"BulkheadHTTPTransport: HTTP/1.1 parser h11 (from {ENV_VARIABLE})",
        "BulkheadHTTPTransport: HTTP/1.1 parser httptools"
        f" (httptools is installed; {ENV_VARIABLE}=h11 chooses h11)",
    ]
    assert [getattr(r, "reason", None) for r in lines] == ["environment", "installed"]


def test_httptools_blocked_in_sys_modules_means_h11(monkeypatch: pytest.MonkeyPatch) -> None:
    """``sys.modules["httptools"] = None`` makes ``import httptools`` raise ImportError, as
    on a machine without it: the default falls back to h11, asking for it is refused."""
    monkeypatch.delenv(ENV_VARIABLE, raising=False)
    monkeypatch.setitem(sys.modules, "httptools", None)
    transport = BulkheadHTTPTransport()
    assert transport.http1_parser == "h11"
    transport.close()
    with pytest.raises(ValueError, match=r"^http1_parser='httptools' needs httptools>=0\.6"):
        BulkheadHTTPTransport(http1_parser="httptools")
    monkeypatch.setenv(ENV_VARIABLE, "httptools")
    with pytest.raises(ValueError, match=f"^{ENV_VARIABLE}='httptools' needs httptools>="):
        BulkheadHTTPTransport()


#: Run in a fresh interpreter whose import system refuses httptools (as if not installed):
#: the transport picks h11 and serves a request from a stdlib server on 127.0.0.1.
_WITHOUT_HTTPTOOLS = textwrap.dedent(
    """
    import http.server, importlib.abc, os, sys, threading

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "httptools" or name.startswith("httptools."):
                raise ImportError(f"No module named {name!r} (refused by the test)")
            return None

    sys.meta_path.insert(0, Refuse())
    os.environ.pop("HTTPX_BULKHEAD_HTTP1_PARSER", None)

    import httpx
    from httpx_bulkhead import BulkheadHTTPTransport

    class Hello(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "5")
            self.end_headers()
            self.wfile.write(b"hello")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    transport = BulkheadHTTPTransport(trust_env=False)
    with httpx.Client(transport=transport) as client:
        response = client.get(f"http://127.0.0.1:{server.server_port}/")
    server.shutdown()
    server.server_close()
    print(transport.http1_parser, response.status_code, response.text)
    print(sorted(m for m in sys.modules if m.split(".")[0] == "httptools"
                 or m == "httpx_bulkhead._httptools"))
    try:
        BulkheadHTTPTransport(http1_parser="httptools")
    except ValueError as exc:
        print(exc)
    """
)


def test_without_httptools_installed_the_default_is_h11_end_to_end() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_HTTPTOOLS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "h11 200 hello",
        "[]",  # neither httptools nor our codec on it was imported
        "http1_parser='httptools' needs httptools>=0.6 (not installed):"
        " pip install 'httpx-bulkhead[fast]'",
    ]
