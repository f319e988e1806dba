"""An independent attack on the HTTP/1.1 parser default (README, "HTTP/1.1 parser").

Three parts:

* ``test_hostile_shape_looks_the_same`` -- responses a hostile server might send where h11
  and httptools could still differ in what the user sees (status-line oddities, bytes
  >= 0x80 and NUL in names and values, bare CR/LF, thousands of headers, Content-Length
  with leading zeros, ``+``, huge or non-ASCII digits, chunk extensions and sizes, a head
  at the 64 KiB limit), through ``BulkheadTransport`` under asyncio and trio from a
  raw-socket server on 127.0.0.1: the same ``httpx.Response`` view or the same exception
  class and message, each with its expected outcome; the counters settle.
* ``test_odd_environment_value_is_refused`` and neighbours -- the variable read per
  transport, strictly: whitespace, case, ``0``, unicode look-alikes are a ``ValueError``
  naming the variable; ``http1_parser=`` beats even a bad variable.
* ``test_broken_httptools_*`` -- a fake ``httptools`` package first on ``sys.path`` in a
  child interpreter: an import that raises something other than ``ImportError``, no
  ``__version__``, a module that claims 0.6 but has no parser.  The module docstring of
  ``_parser_choice`` promises "a broken install counts as absent" (an import failing with
  any exception, or no ``HttpResponseParser``: both were strict xfails before the fix).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from httpx_bulkhead import BulkheadHTTPTransport, BulkheadTransport
from httpx_bulkhead._http11 import MAX_HEAD_SIZE
from httpx_bulkhead._parser_choice import ENV_VARIABLE
from tests.servers import RawConn, RawServer

pytestmark = pytest.mark.explicit_parser  # both parsers in every test

PARSERS = ("h11", "httptools")
TIMEOUT = 5.0
ROOT = Path(__file__).resolve().parents[2]

L2 = b"Content-Length: 2\r\n\r\nok"
OK = b"HTTP/1.1 200 OK\r\n"
CHUNKED = OK + b"Transfer-Encoding: chunked\r\n\r\n"
RPE = httpx.RemoteProtocolError


def _head_of(size: int) -> bytes:
    """A response whose head (through the blank line) is ``size`` bytes, then ``ok``."""
    base = OK + b"Content-Length: 2\r\nX: "
    return base + b"a" * (size - len(base) - 4) + b"\r\n\r\nok"


#: name -> (response bytes, expected status or exception class)
HOSTILE: dict[str, tuple[bytes, int | type[Exception]]] = {
    "status 099": (b"HTTP/1.1 099 X\r\n" + L2, RPE),
    "status 2000": (b"HTTP/1.1 2000 OK\r\n" + L2, RPE),
    "status 999": (b"HTTP/1.1 999 X\r\n" + L2, 999),
    "tab after version": (b"HTTP/1.1\t200 OK\r\n" + L2, RPE),
    "two spaces after version": (b"HTTP/1.1  200 OK\r\n" + L2, RPE),
    "lowercase http": (b"http/1.1 200 OK\r\n" + L2, RPE),
    "HTTP/1.2": (b"HTTP/1.2 200 OK\r\n" + L2, 200),
    "HTTP/0.9": (b"HTTP/0.9 200 OK\r\n" + L2, 200),
    "HTTP/1.10": (b"HTTP/1.10 200 OK\r\n" + L2, RPE),
    "reason with NUL": (b"HTTP/1.1 200 O\x00K\r\n" + L2, RPE),
    "reason with DEL and 0x01": (b"HTTP/1.1 200 O\x7f\x01K\r\n" + L2, 200),
    "reason with bare CR": (b"HTTP/1.1 200 O\rK\r\n" + L2, RPE),
    "CRLF before the status line": (b"\r\n" + OK + L2, RPE),
    "NUL before the status line": (b"\x00" + OK + L2, RPE),
    "header name 0x80": (OK + b"X\x80: v\r\n" + L2, RPE),
    "header name 0xff": (OK + b"\xff: v\r\n" + L2, RPE),
    "header value NUL": (OK + b"X: a\x00b\r\n" + L2, RPE),
    "header value DEL and 0x01": (OK + b"X: a\x7f\x01b\r\n" + L2, 200),
    "header value bare CR": (OK + b"X: a\rb\r\n" + L2, RPE),
    "header line ending CR CR LF": (OK + b"X: a\r\r\n" + L2, RPE),
    "status line ending bare CR": (b"HTTP/1.1 200 OK\rX: a\r\n" + L2, RPE),
    "LF and CRLF mixed": (OK + b"X: 1\nContent-Length: 2\r\n\nok", 200),
    "empty header name": (OK + b": v\r\n" + L2, RPE),
    "space before colon": (OK + b"X : v\r\n" + L2, RPE),
    "obs-fold as the first header": (OK + b" X: v\r\n" + L2, RPE),
    "5000 headers": (OK + b"X: v\r\n" * 5000 + L2, 200),
    "15000 empty headers": (OK + b"X:\r\n" * 15000 + L2, 200),
    "Content-Length 0002": (OK + b"Content-Length: 0002\r\n\r\nok", 200),
    "Content-Length +2": (OK + b"Content-Length: +2\r\n\r\nok", RPE),
    "Content-Length -2": (OK + b"Content-Length: -2\r\n\r\nok", RPE),
    "Content-Length 0x2": (OK + b"Content-Length: 0x2\r\n\r\nok", RPE),
    "Content-Length empty": (OK + b"Content-Length:\r\n\r\nok", RPE),
    "Content-Length Arabic-Indic digit": (
        OK + "Content-Length: \u0662\r\n\r\nok".encode(),
        RPE,
    ),
    "Content-Length 2, 2": (OK + b"Content-Length: 2, 2\r\n\r\nok", 200),
    "Content-Length 2, 3": (OK + b"Content-Length: 2, 3\r\n\r\nokk", RPE),
    "Content-Length 10^23": (OK + b"Content-Length: " + b"9" * 23 + b"\r\n\r\nok", RPE),
    "Content-Length 2^64": (OK + b"Content-Length: 18446744073709551616\r\n\r\nok", RPE),
    "Transfer-Encoding CHUNKED": (
        OK + b"Transfer-Encoding: CHUNKED\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        200,
    ),
    "Transfer-Encoding identity": (OK + b"Transfer-Encoding: identity\r\n\r\nok", RPE),
    "two Transfer-Encoding chunked": (
        OK
        + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        RPE,
    ),
    "chunk extension quoted with ;": (CHUNKED + b'2;a="b;c"\r\nok\r\n0\r\n\r\n', 200),
    "chunk extension NUL": (CHUNKED + b"2;a=\x00\r\nok\r\n0\r\n\r\n", 200),
    "chunk extension 0x80": (CHUNKED + b"2;a=\x80\r\nok\r\n0\r\n\r\n", 200),
    "chunk extension with spaces": (CHUNKED + b"2 ; a = b\r\nok\r\n0\r\n\r\n", RPE),
    "chunk extension bare LF": (CHUNKED + b"2;a\nb\r\nok\r\n0\r\n\r\n", RPE),
    "chunk size 0002": (CHUNKED + b"0002\r\nok\r\n000\r\n\r\n", 200),
    "chunk size +2": (CHUNKED + b"+2\r\nok\r\n0\r\n\r\n", RPE),
    "chunk size 19 hex digits": (CHUNKED + b"f" * 19 + b"\r\nok", RPE),
    "chunk size bare LF": (CHUNKED + b"2\nok\r\n0\r\n\r\n", RPE),
    "chunk data ending bare LF": (CHUNKED + b"2\r\nok\n0\r\n\r\n", RPE),
    "trailer NUL": (CHUNKED + b"2\r\nok\r\n0\r\nX: a\x00\r\n\r\n", RPE),
    "head of MAX_HEAD_SIZE bytes": (_head_of(MAX_HEAD_SIZE), 200),
    "head of MAX_HEAD_SIZE + 1 bytes": (_head_of(MAX_HEAD_SIZE + 1), 200),
    "head of MAX_HEAD_SIZE + 2 bytes": (_head_of(MAX_HEAD_SIZE + 2), RPE),
    "200 informational responses first": (b"HTTP/1.1 103 E\r\n\r\n" * 200 + OK + L2, 200),
}


def _answer_and_close(wire: bytes) -> Any:
    def handler(conn: RawConn) -> None:
        if conn.read_request() is not None:
            conn.send(wire)
            conn.sock.shutdown(socket.SHUT_WR)
            while conn.recv():  # closing with unread input would send an RST
                pass

    return handler


@pytest.mark.anyio
@pytest.mark.parametrize("shape", list(HOSTILE))
async def test_hostile_shape_looks_the_same(shape: str, anyio_backend: str) -> None:
    wire, expected = HOSTILE[shape]
    views: list[tuple[Any, ...]] = []
    with RawServer(_answer_and_close(wire)) as srv:
        for parser in PARSERS:
            transport = BulkheadTransport(http1_parser=parser, trust_env=False)
            async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
                with anyio.fail_after(TIMEOUT):
                    try:
                        r = await client.get(srv.url)
                        view: tuple[Any, ...] = (
                            r.status_code,
                            r.reason_phrase,
                            r.http_version,
                            r.headers.raw,
                            r.content,
                        )
                    except httpx.HTTPError as exc:
                        view = (type(exc), str(exc))
                assert view[0] == expected, (parser, view[:2])
                views.append(view)
                stats = transport.statistics()[srv.url]
                assert (stats.running, stats.in_use_connections) == (0, 0), stats
    assert views[1] == views[0]


ODD_VALUES = [
    " h11",
    "h11 ",
    "h11\n",
    "H11",
    "HTTPTOOLS",
    "0",
    "1",
    "auto",
    " ",
    "\t",
    "ħ11",
    "h\u200b11",
]


@pytest.mark.parametrize("value", ODD_VALUES)
@pytest.mark.parametrize("cls", [BulkheadTransport, BulkheadHTTPTransport])
def test_odd_environment_value_is_refused(
    value: str, cls: type[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VARIABLE, value)
    with pytest.raises(ValueError) as caught:
        cls(trust_env=False)
    assert str(caught.value) == f"{ENV_VARIABLE} must be 'h11' or 'httptools', got {value!r}"


def test_variable_read_per_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VARIABLE, "h11")
    first = BulkheadTransport(trust_env=False)
    monkeypatch.setenv(ENV_VARIABLE, "httptools")
    second = BulkheadHTTPTransport(trust_env=False)
    monkeypatch.setenv(ENV_VARIABLE, "")
    third = BulkheadTransport(trust_env=False)  # empty is unset: httptools is installed here
    monkeypatch.setenv(ENV_VARIABLE, "bogus")
    fourth = BulkheadTransport(http1_parser="h11", trust_env=False)  # the argument wins
    parsers = [t.http1_parser for t in (first, second, third, fourth)]
    assert parsers == ["h11", "httptools", "httptools", "h11"]


@pytest.mark.parametrize("argument", ["H11", "", " h11", b"h11"])
def test_odd_argument_is_refused(argument: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VARIABLE, raising=False)
    with pytest.raises(ValueError, match=r"^http1_parser must be 'h11' or 'httptools', got "):
        BulkheadTransport(http1_parser=argument, trust_env=False)


_CHILD = textwrap.dedent(
    """
    import os, httpx
    from httpx_bulkhead import BulkheadHTTPTransport
    try:
        t = BulkheadHTTPTransport(trust_env=False)
    except BaseException as e:
        print("construct", type(e).__name__, e)
        raise SystemExit
    print("parser", t.http1_parser)
    """
)


def _with_fake_httptools(tmp_path: Path, init: str, env_value: str | None = None) -> str:
    """What a child interpreter prints when ``httptools`` is the package ``init``."""
    (tmp_path / "httptools").mkdir()
    (tmp_path / "httptools" / "__init__.py").write_text(init + "\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    env.pop(ENV_VARIABLE, None)
    if env_value is not None:
        env[ENV_VARIABLE] = env_value
    done = subprocess.run(
        [sys.executable, "-c", _CHILD],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.stdout.strip() or done.stderr[-400:]


@pytest.mark.parametrize(
    ("init", "printed"),
    [
        ("", "parser h11"),  # no __version__
        ("__version__ = 'dev'", "parser h11"),
        ("__version__ = '0.5.9'", "parser h11"),
        ("raise ImportError('no llhttp')", "parser h11"),
    ],
)
def test_broken_httptools_counts_as_absent(tmp_path: Path, init: str, printed: str) -> None:
    assert _with_fake_httptools(tmp_path, init) == printed


@pytest.mark.parametrize(
    "init",
    [
        "raise RuntimeError('broken build')",
        "raise OSError('cannot open shared object')",
        "raise SyntaxError('bad')",
    ],
)
def test_broken_httptools_import_error_of_another_class(tmp_path: Path, init: str) -> None:
    printed = _with_fake_httptools(tmp_path, init)
    assert printed == "parser h11", printed


def test_missing_httptools_asked_for_names_the_variable(tmp_path: Path) -> None:
    printed = _with_fake_httptools(tmp_path, "__version__ = '0.5.0'", env_value="httptools")
    assert printed == (
        f"construct ValueError {ENV_VARIABLE}='httptools' needs httptools>=0.6"
        " (0.5.0 is installed): pip install 'httpx-bulkhead[fast]'"
    )


_CHILD_REQUEST = textwrap.dedent(
    """
    import socket, httpx
    from httpx_bulkhead import BulkheadHTTPTransport
    from tests.servers import RawServer

    def handler(conn):
        if conn.read_request() is not None:
            conn.send(b"HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\n\\r\\nok")
            conn.sock.shutdown(socket.SHUT_WR)
            while conn.recv():
                pass

    with RawServer(handler) as srv:
        t = BulkheadHTTPTransport(trust_env=False)
        with httpx.Client(transport=t, timeout=5) as client:
            try:
                print(t.http1_parser, client.get(srv.url).status_code)
            except httpx.HTTPError as e:
                print(t.http1_parser, "httpx", type(e).__name__)
            except Exception as e:
                print(t.http1_parser, "raw", type(e).__name__)
    """
)


def test_broken_httptools_without_a_parser(tmp_path: Path) -> None:
    (tmp_path / "httptools").mkdir()
    (tmp_path / "httptools" / "__init__.py").write_text("__version__ = '0.6.0'\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    env.pop(ENV_VARIABLE, None)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD_REQUEST],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    printed = done.stdout.strip() or done.stderr[-400:]
    assert printed in ("h11 200", "httptools httpx RemoteProtocolError"), printed
