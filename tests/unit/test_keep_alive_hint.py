"""The ``Keep-Alive: timeout=`` hint read off a response head (parsed once per distinct
value: the cache must never hand one value's answer to another)."""

from __future__ import annotations

import pytest

from httpx_bulkhead._http11 import _KEEP_ALIVE_CACHE, _KEEP_ALIVE_PARSED, _keep_alive_timeout


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (b"timeout=5", 5.0),
        (b"timeout=5, max=100", 5.0),
        (b"max=100,  Timeout = 2.5 ", 2.5),
        (b"max=100", None),
        (b"timeout=soon", None),
        (b"timeout=-1", None),
        (b"timeout=0", 0.0),
    ],
)
def test_keep_alive_timeout_parses_every_time_alike(value: bytes, seconds: float | None) -> None:
    headers = [(b"Content-Length", b"0"), (b"Keep-Alive", value)]
    assert _keep_alive_timeout(headers) == seconds
    assert _keep_alive_timeout([(b"keep-alive", bytes(value))]) == seconds  # from the cache


def test_keep_alive_cache_stays_bounded_and_right_past_its_size() -> None:
    for n in range(3 * _KEEP_ALIVE_CACHE):
        assert _keep_alive_timeout([(b"Keep-Alive", b"timeout=%d" % n)]) == float(n)
    for n in range(3 * _KEEP_ALIVE_CACHE):
        assert _keep_alive_timeout([(b"Keep-Alive", b"timeout=%d" % n)]) == float(n)
        assert len(_KEEP_ALIVE_PARSED) <= _KEEP_ALIVE_CACHE
    assert _keep_alive_timeout([(b"Connection", b"keep-alive")]) is None


def test_a_long_value_is_parsed_but_not_kept() -> None:
    """The cache is bounded in bytes too: a hostile server's long values (up to the 64 KiB
    head limit each) are parsed every time, never kept (64 of them would pin 4 MiB)."""
    _KEEP_ALIVE_PARSED.clear()
    long_value = b"timeout=7, " + b"x" * 60_000
    assert _keep_alive_timeout([(b"Keep-Alive", long_value)]) == 7.0
    assert long_value not in _KEEP_ALIVE_PARSED
    assert sum(len(value) for value in _KEEP_ALIVE_PARSED) <= 64 * 64
