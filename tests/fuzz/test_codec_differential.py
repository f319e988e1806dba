"""Differential fuzzing of the HTTP/1.1 codecs: h11 (the reference) and httptools must give
the same verdict on generated requests and responses (see ``harness.py`` for what a verdict
is).  A disagreement is a bug in one of them, or a shape to decide: decide it (h11 is the
reference; stricter only where RFC 9112 says so, documented), fix it, and add the minimized
example to ``tests/unit/test_codec_verdicts.py``.

CI runs ``BULKHEAD_FUZZ_EXAMPLES`` examples per test: 200 by default (1,000 in all, about
10 s); ``BULKHEAD_FUZZ_EXAMPLES=20000 python -m pytest tests/fuzz`` runs a longer search
(the per-test timeout grows with it).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz import strategies as gen
from tests.fuzz.harness import Exchange, Request, request_verdicts, reused_in_doubt, verdicts

EXAMPLES = int(os.environ.get("BULKHEAD_FUZZ_EXAMPLES") or 200)

# Long searches must not be cut by the suite's 60 s per-test timeout.
pytestmark = pytest.mark.timeout(max(60, EXAMPLES // 10))

fuzz = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@fuzz
@given(gen.requests())
def test_requests_encode_alike(request: Request) -> None:
    reference, fast = request_verdicts(request)
    assert fast == reference


@fuzz
@given(gen.exchanges())
def test_responses_parse_alike(exchange: Exchange) -> None:
    reference, fast = verdicts([exchange])
    assert fast == reference
    assert not reused_in_doubt(reference)


@fuzz
@given(gen.doubtful_exchanges())
def test_framing_in_doubt_closes_alike(exchange: Exchange) -> None:
    """A response whose framing is in doubt is read alike and never leaves its connection
    to the next request (RFC 9112 §6.3, §6.1)."""
    reference, fast = verdicts([exchange])
    assert fast == reference
    assert not reused_in_doubt(reference)


@fuzz
@given(gen.exchanges(), gen.exchanges())
def test_second_exchange_parses_alike(first: Exchange, second: Exchange) -> None:
    """A connection's next exchange starts clean, whatever the first one was."""
    reference, fast = verdicts([first, second])
    assert fast == reference
    assert not reused_in_doubt(reference)


@fuzz
@given(st.binary(min_size=1, max_size=32), gen.exchanges())
def test_unsolicited_bytes_are_noticed_alike(data: bytes, exchange: Exchange) -> None:
    reference, fast = verdicts([exchange], before=data)
    assert fast == reference
