"""The mapping from low-level failures to the httpx exceptions the default transport raises:
every kind the I/O shell can meet, in every phase (the integration tests and the fault
matrix reach most of them through real sockets; this table holds all of them)."""

from __future__ import annotations

import ssl

import anyio
import httpx
import pytest

from httpx_bulkhead._exceptions import Phase, raise_mapped

REQUEST = httpx.Request("GET", "http://127.0.0.1:1/")
ERRORS = {"connect": httpx.ConnectError, "write": httpx.WriteError, "read": httpx.ReadError}
TIMEOUTS = {"connect": httpx.ConnectTimeout, "write": httpx.WriteTimeout, "read": httpx.ReadTimeout}


def broken_pipe() -> anyio.BrokenResourceError:
    exc = anyio.BrokenResourceError()
    exc.__cause__ = BrokenPipeError(32, "Broken pipe")
    return exc


CASES: list[tuple[BaseException, str, str]] = [
    # (low-level exception, "error" or "timeout" or an httpx class name, message)
    (TimeoutError(), "timeout", "{phase} timed out"),
    # (h11's errors never get here: the codecs turn them into CodecError/LocalCodecError,
    # which the connection raises as httpx.RemoteProtocolError/LocalProtocolError.)
    (anyio.EndOfStream(), "error", "connection closed by peer"),
    (anyio.ClosedResourceError(), "error", "connection was closed"),
    (
        ConnectionResetError(104, "Connection reset by peer"),
        "error",
        "[Errno 104] Connection reset by peer",
    ),
    (ConnectionRefusedError(), "error", "ConnectionRefusedError"),
    (broken_pipe(), "error", "[Errno 32] Broken pipe"),
    (anyio.BrokenResourceError(), "error", "BrokenResourceError"),
    (ssl.SSLError(1, "[SSL] record layer failure"), "error", "[SSL] record layer failure"),
]


@pytest.mark.parametrize("phase", ["connect", "write", "read"])
@pytest.mark.parametrize(("exc", "kind", "message"), CASES, ids=lambda v: repr(v)[:40])
def test_every_low_level_failure_becomes_the_matching_httpx_error(
    phase: Phase, exc: BaseException, kind: str, message: str
) -> None:
    expected: type[httpx.TransportError]
    if kind == "error":
        expected = ERRORS[phase]
    elif kind == "timeout":
        expected = TIMEOUTS[phase]
    else:
        expected = getattr(httpx, kind)
    with pytest.raises(httpx.TransportError) as caught:
        raise_mapped(exc, phase, REQUEST)
    assert type(caught.value) is expected
    assert str(caught.value) == message.format(phase=phase)
    assert caught.value.request is REQUEST
    assert caught.value.__cause__ is exc


def test_an_httpx_error_passes_through_unchanged() -> None:
    original = httpx.ReadTimeout("read timed out", request=REQUEST)
    with pytest.raises(httpx.ReadTimeout) as caught:
        raise_mapped(original, "write", REQUEST)
    assert caught.value is original
