"""Drive an HTTP/1.1 codec through requests and responses and record its *verdict*, so two
codecs can be compared: what a request encodes to (or that it is refused), and what a
response yields read by read (events, body bytes, error, reusability).

A verdict is what the connection driver (``_http11.py``) acts on, normalized where the
codecs may legitimately differ:

* an error is recorded with its text, which users read (h11's words are the reference:
  ``_codec.py``, "One message"), wherever in the read it is raised (the fast codec may
  refuse a read in ``feed``, h11 waits for ``next_event``);
* h11 raises where the fast codec yields ``CLOSED`` (EOF before any response byte): the
  driver turns both into the same ``RemoteProtocolError``, so both are recorded as h11's
  error (``CLOSED_BEFORE_RESPONSE``);
* body bytes are compared per read, concatenated (the codecs may cut them differently);
* reusability is what the driver ends up doing: ``reuse()`` and no trailing data (h11 may
  say "reusable" and then report trailing data, which discards the connection just the
  same when it is next checked).

Besides the agreement, ``reused_in_doubt`` holds a verdict to one rule of ours: no
connection is reused after a response whose framing was in doubt (both framings, or
``Transfer-Encoding`` outside HTTP/1.1), whatever shape its head took.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from httpx_bulkhead._codec import (
    END,
    NEED_DATA,
    PAUSED,
    Codec,
    CodecError,
    Head,
    Informational,
    LocalCodecError,
    make_codec,
)

Headers = list[tuple[bytes, bytes]]

#: A roomy limit, so that verdicts do not depend on where each codec checks it.
MAX_HEAD = 1 << 20
#: h11's error for an end of stream before any response byte, where the fast codec yields
#: ``CLOSED``: the driver reports both as "Server disconnected without sending a
#: response." (``_http11.py``), so both are recorded as this text.
CLOSED_BEFORE_RESPONSE = (
    "can't handle event type ConnectionClosed when role=SERVER and state=SEND_RESPONSE"
)


@dataclass
class Request:
    method: bytes = b"GET"
    target: bytes = b"/"
    headers: Headers = field(default_factory=lambda: [(b"Host", b"example.com")])
    body: list[bytes] = field(default_factory=list)
    #: Call ``end()`` (after the body); False leaves the request unfinished.
    end: bool = True
    #: A ``data()`` call after ``end()`` (misuse: must be refused).
    extra: bytes | None = None


@dataclass
class Exchange:
    request: Request
    #: The response bytes, already cut into reads.
    reads: list[bytes]
    #: The peer closes the connection after the last read.
    eof: bool = True
    #: ``end()`` is called before this read (0: before any response byte).
    end_before: int = 0


def codecs() -> tuple[Codec, Codec]:
    """The reference and the fast codec, fresh."""
    return make_codec("h11", MAX_HEAD), make_codec("httptools", MAX_HEAD)


def cut(wire: bytes, sizes: Sequence[int]) -> list[bytes]:
    """``wire`` cut into reads of the given sizes (the rest in one last read)."""
    reads = []
    pos = 0
    for size in sizes:
        if pos >= len(wire):
            break
        reads.append(wire[pos : pos + size])
        pos += size
    if pos < len(wire):
        reads.append(wire[pos:])
    return reads


def encode(codec: Codec, request: Request) -> list[Any]:
    """What the request side produces, call by call, up to the first refusal (with its
    message, which the caller reads as ``httpx.LocalProtocolError``; a ``data()`` after
    ``end()`` is a misuse the driver never makes: its refusal is recorded without it)."""
    out: list[Any] = []
    try:
        out.append(codec.request(request.method, request.target, request.headers))
        out.append(("waiting-for-100", codec.waiting_for_continue))
        for chunk in request.body:
            out.append(codec.data(chunk))
        if request.end:
            out.append(codec.end())
            out.append(("waiting-for-100", codec.waiting_for_continue))
    except LocalCodecError as exc:
        out.append(("refused", str(exc)))
        return out
    if request.extra is not None:
        try:
            out.append(codec.data(request.extra))
        except LocalCodecError as exc:
            out.append(("refused", "data() after end()" if request.end else str(exc)))
    return out


def exchange(codec: Codec, ex: Exchange) -> tuple[list[Any], bool]:
    """Run one exchange; returns its verdict and whether the connection may be reused."""
    sent = encode(codec, Request(**{**ex.request.__dict__, "end": False, "extra": None}))
    trace: list[Any] = [("request", sent)]
    if isinstance(sent[-1], tuple) and sent[-1][0] == "refused":
        return trace, False
    ended = False
    reads = [*ex.reads, b""] if ex.eof else list(ex.reads)
    trace.append(("awaiting", codec.awaiting_response))
    for index, data in enumerate(reads):
        if index == ex.end_before and ex.request.end:
            ended = _end(codec, trace)
        step: list[Any] = []
        try:  # the fast codec may refuse a read at once; h11 waits for next_event
            codec.feed(data)
        except CodecError as exc:
            step.append(("error", str(exc)))
            trace.append((index, step, None))
            return trace, False
        outcome = _drain(codec, step)
        # (after an error the codecs' states are of no interest: the connection goes)
        trace.append((index, step, None if outcome == "error" else codec.awaiting_response))
        if outcome == "end":
            if not ended and ex.request.end:  # the response came first: finish sending
                ended = _end(codec, trace)
            reusable = codec.reuse() and not codec.has_trailing_data
            for rest in reads[index + 1 :]:
                if rest:
                    codec.feed(rest)  # only records trailing data: never raises
            trailing = codec.has_trailing_data  # the driver checks this before reuse
            trace.append(("reusable", reusable, "trailing", trailing))
            return trace, reusable and not trailing
        if outcome is not None:
            return trace, False
    return trace, False


def unsolicited(codec: Codec, data: bytes) -> bool:
    """Bytes arriving while no request is outstanding: is the connection still clean?"""
    codec.feed(data)
    return not codec.has_trailing_data


def _end(codec: Codec, trace: list[Any]) -> bool:
    try:
        trace.append(("end", codec.end()))
    except LocalCodecError as exc:
        trace.append(("end", "refused", str(exc)))
        return False
    return True


def _drain(codec: Codec, step: list[Any]) -> str | None:
    """Take events until more data is needed; ``"end"``, ``"error"``, ``"paused"`` or None."""
    body = b""
    outcome = None
    while True:
        try:
            event = codec.next_event()
        except CodecError as exc:
            step.append(("error", str(exc)))
            outcome = "error"
            break
        if event is NEED_DATA:
            break
        if type(event) is bytes:
            body += event
            continue
        if body:
            step.append(("data", body))
            body = b""
        if type(event) is Head:
            step.append(("head", event.status, event.headers, event.http_version, event.reason))
        elif type(event) is Informational:
            step.append(("1xx", event.status))
        elif event is END:
            outcome = "end"
            break
        elif event is PAUSED:
            outcome = "paused"
            break
        else:  # CLOSED: h11 raises instead (the driver says the same for both)
            step.append(("error", CLOSED_BEFORE_RESPONSE))
            outcome = "error"
            break
    if body:
        step.append(("data", body))
    if outcome is not None and outcome != "error":  # an error is recorded with its text
        step.append(outcome)
    return outcome


def verdicts(exchanges: Sequence[Exchange], before: bytes = b"") -> tuple[Any, Any]:
    """Both codecs through the same exchanges on one connection (the next one runs only if
    the previous left the connection reusable), with ``before`` arriving unsolicited
    first.  Returns (reference verdict, fast verdict)."""
    results = []
    for codec in codecs():
        trace: list[Any] = []
        if before and not unsolicited(codec, before):
            trace.append("unsolicited bytes: connection not reusable")
        else:
            for ex in exchanges:
                steps, reusable = exchange(codec, ex)
                trace.append(steps)
                if not reusable:
                    break
        results.append(trace)
    return results[0], results[1]


def reused_in_doubt(verdict: list[Any]) -> bool:
    """Whether a connection was left reusable after a final response whose framing was in
    doubt: ``Transfer-Encoding`` with ``Content-Length``, or in a version other than
    HTTP/1.1 (RFC 9112 §6.3, §6.1).  Read from the head as the codec reported it, so the
    fuzzer looks for a shape that slips past the codecs' rule (``framing_in_doubt``)."""
    for steps in verdict:
        if not isinstance(steps, list) or steps[-1][:2] != ("reusable", True):
            continue
        heads = [
            item
            for entry in steps
            if type(entry[0]) is int
            for item in entry[1]
            if item[0] == "head"
        ]
        if not heads:
            continue
        _, _, headers, version, _ = heads[-1]
        names = {name.lower() for name, _ in headers}
        if b"transfer-encoding" in names and (b"content-length" in names or version != b"1.1"):
            return True
    return False


def request_verdicts(request: Request) -> tuple[list[Any], list[Any]]:
    reference, fast = codecs()
    return encode(reference, request), encode(fast, request)
