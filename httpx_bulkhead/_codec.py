"""HTTP/1.1 message codecs: bytes to events and back, for one client connection.

``HTTP11Connection`` talks to a codec, not to h11 directly, so the parser can be swapped:

* ``H11Codec`` (the default and the reference): h11, pure Python, strict.
* ``HttptoolsCodec`` (``_httptools.py``, optional: ``pip install 'httpx-bulkhead[fast]'``):
  llhttp through httptools, several times cheaper per exchange.

A codec is pure: it does no I/O and reads no clock.  Events returned by ``next_event``:
``NEED_DATA``; a ``Head`` (final response head) or ``Informational`` (1xx); ``bytes`` (body
data); ``END`` (response complete); ``CLOSED`` (the peer closed before any response);
``PAUSED`` (101 or CONNECT: the connection left HTTP).  Malformed input raises
``CodecError`` (from ``next_event``, or from ``feed`` when it can tell at once); misuse of
the request side raises ``LocalCodecError``.

One verdict
-----------
Both codecs must give the same verdict on every input: the same request bytes or the same
refusal; the same events, body bytes, error (with its message: see below) at the same
read, and the same reusability.  h11 is the reference.  We are stricter than h11 in two
places, in both codecs:

* a request carrying both ``Content-Length`` and ``Transfer-Encoding`` is refused (RFC 9112
  §6.2: a sender MUST NOT send both; h11 sends both and frames by the second);
* a response whose framing is in doubt (``framing_in_doubt``: both framings, or
  ``Transfer-Encoding`` in an HTTP/1.0 response) is read as h11 reads it, by its
  ``Transfer-Encoding``, and then its connection closes (h11 would keep it): what follows
  the chunked body may be a response smuggled under the ``Content-Length``, and our rule
  is that a connection whose state is unknown is never reused.

``tests/fuzz`` checks the agreement on generated requests and responses split into random
reads; ``tests/unit/test_codec_verdicts.py`` pins each decided shape.

Every buffer a peer can grow is bounded by ``max_head``: the head, an incomplete chunk-size
line and the trailer section (h11's ``max_incomplete_event_size`` is the same number).

One message
-----------
What a user reads is the same too: an error's message is h11's words for the same input
(the fast codec asks h11 for the words of a request it refuses; ``tests/fuzz`` compares the
messages, ``tests/integration/test_codec_user_view.py`` what reaches the caller), with one
exception, ``too_long``: past the limit h11 says "Receive buffer too long", which names
neither the part nor the limit, so both codecs say which part outgrew which limit.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, TypeAlias, cast

import h11

__all__ = [
    "BOTH_FRAMINGS",
    "CLOSED",
    "END",
    "NEED_DATA",
    "PARSERS",
    "PAUSED",
    "Codec",
    "CodecError",
    "Event",
    "H11Codec",
    "Head",
    "Informational",
    "LocalCodecError",
    "framing_in_doubt",
    "make_codec",
    "too_long",
]

#: The HTTP/1.1 parsers a codec can be made with (``http1_parser``).
PARSERS = ("h11", "httptools")


class _Sentinel:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


NEED_DATA = _Sentinel("NEED_DATA")
END = _Sentinel("END")
CLOSED = _Sentinel("CLOSED")
PAUSED = _Sentinel("PAUSED")


class Head(NamedTuple):
    status: int
    headers: list[tuple[bytes, bytes]]  # as received (original case)
    http_version: bytes  # b"1.1", b"1.0"
    reason: bytes


class Informational(NamedTuple):
    status: int


#: What ``Codec.next_event`` returns: a marker (``NEED_DATA``, ``END``, ``CLOSED``,
#: ``PAUSED``), a response head, a 1xx, or body bytes.
Event: TypeAlias = "_Sentinel | Head | Informational | bytes"


class CodecError(Exception):
    """The peer sent something that is not valid HTTP/1.1."""


class LocalCodecError(Exception):
    """We were asked to send something that is not valid HTTP/1.1."""


class Codec(Protocol):
    def request(self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
        """The request head, as bytes to write."""
        ...

    def data(self, chunk: bytes) -> bytes:
        """A piece of the request body, framed."""
        ...

    def end(self) -> bytes:
        """The end of the request body (the last chunk marker, if chunked)."""
        ...

    def feed(self, data: bytes) -> None:
        """Bytes from the peer; ``b""`` at end of stream."""
        ...

    def next_event(self) -> Event: ...

    @property
    def waiting_for_continue(self) -> bool:
        """We sent ``Expect: 100-continue`` and neither 100 nor a final response came."""
        ...

    @property
    def awaiting_response(self) -> bool:
        """No part of the final response has been parsed yet."""
        ...

    def reuse(self) -> bool:
        """After ``END``: if both sides completed and keep the connection alive, and the
        response's framing was not in doubt (``framing_in_doubt``), get ready for the next
        exchange and return True; else False (the connection must close)."""
        ...

    @property
    def has_trailing_data(self) -> bool:
        """Bytes arrived that belong to no request (the connection is not safe to reuse)."""
        ...


def make_codec(name: str, max_head: int) -> Codec:
    """A fresh codec: ``"h11"`` or ``"httptools"`` (anything else is a ``ValueError``)."""
    if name == "h11":
        return H11Codec(max_head)
    if name == "httptools":
        from ._httptools import HttptoolsCodec  # the optional dependency, when chosen

        return HttptoolsCodec(max_head)
    raise ValueError(f"http1_parser must be 'h11' or 'httptools', got {name!r}")


def too_long(in_head: bool, limit: int) -> str:
    """The message of a response part that outgrew ``limit`` (``max_head``), both codecs'."""
    part = "response head" if in_head else "chunk header or trailer section"
    return f"{part} too long (over {limit} bytes)"


class H11Codec:
    """The reference codec, on h11 (which would keep a connection whose framing was in
    doubt: ``framing_in_doubt`` is ours)."""

    __slots__ = ("_doubt", "_eof", "_h11", "_in_head", "_max_head")

    def __init__(self, max_head: int) -> None:
        self._h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=max_head)
        self._eof = False
        self._max_head = max_head
        self._in_head = True  # no final response head yet (only for the limit's message)
        # The final response's framing is in doubt: close after it (a codec serves no
        # exchange after one, so this is never reset).
        self._doubt = False

    def _send(self, event: Any) -> bytes:
        try:
            return self._h11.send(event) or b""
        except h11.LocalProtocolError as exc:
            raise LocalCodecError(str(exc)) from exc

    def request(self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
        try:
            event = h11.Request(method=method, target=target, headers=headers)
        except h11.LocalProtocolError as exc:
            raise LocalCodecError(str(exc)) from exc
        if all(_framings(headers)):  # h11 would send both: we are stricter
            raise LocalCodecError(BOTH_FRAMINGS)
        self._in_head = True
        return self._send(event)

    def data(self, chunk: bytes) -> bytes:
        return self._send(h11.Data(data=chunk))

    def end(self) -> bytes:
        return self._send(h11.EndOfMessage())

    def feed(self, data: bytes) -> None:
        if not data:
            self._eof = True
        self._h11.receive_data(data)

    def next_event(self) -> Event:
        try:
            event = self._h11.next_event()
        except h11.RemoteProtocolError as exc:
            if exc.error_status_hint == 431:  # h11's only 431: an event past the limit
                raise CodecError(too_long(self._in_head, self._max_head)) from exc
            raise CodecError(str(exc) or "protocol error") from exc
        # Exact types, not isinstance: h11's events derive from an ABC, whose isinstance
        # check costs a call each (four events per exchange, up to five checks each), and
        # h11 makes these classes only, never subclasses.
        kind = type(event)
        if kind is h11.Data:
            return bytes(cast(h11.Data, event).data)
        if kind is h11.Response:
            head = cast(h11.Response, event)
            self._in_head = False
            headers = head.headers.raw_items()
            self._doubt = framing_in_doubt(head.http_version, *_framings(headers))
            return Head(head.status_code, headers, head.http_version, head.reason)
        if kind is h11.EndOfMessage:
            return END
        if event is h11.NEED_DATA:
            return NEED_DATA
        if kind is h11.InformationalResponse:
            return Informational(cast(h11.InformationalResponse, event).status_code)
        if kind is h11.ConnectionClosed:
            return CLOSED
        if event is h11.PAUSED:
            return PAUSED
        raise CodecError(f"unexpected h11 event {event!r}")  # (none other exists)

    @property
    def waiting_for_continue(self) -> bool:
        return self._h11.client_is_waiting_for_100_continue

    @property
    def awaiting_response(self) -> bool:
        return self._h11.their_state is h11.SEND_RESPONSE

    def reuse(self) -> bool:
        # After a body delimited by the end of the stream h11 reports both sides DONE, but
        # the peer has closed: nothing can follow.
        # Bytes already after the response belong to no request (a desync or a smuggled
        # response): the connection is not reused, as the httptools codec decides too.
        # A response whose framing was in doubt leaves the connection in an unknown state.
        if self._eof or self._h11.trailing_data[0] or self._doubt:
            return False
        if self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE:
            self._h11.start_next_cycle()
            return True
        return False

    @property
    def has_trailing_data(self) -> bool:
        return bool(self._h11.trailing_data[0])


# -- framing rules shared by both codecs ------------------------------------------------

BOTH_FRAMINGS = "Content-Length and Transfer-Encoding in one request (RFC 9112 §6.2)"


def framing_in_doubt(http_version: bytes, content_length: bool, transfer_encoding: bool) -> bool:
    """Whether a response's framing is in doubt, so that its connection must close after it.

    The body is still read by its ``Transfer-Encoding``, as h11 reads it; but what follows
    it on the connection cannot be trusted to start the next response:

    * ``Content-Length`` and ``Transfer-Encoding`` together: the second wins, but such a
      message "might indicate an attempt to perform request smuggling or response
      splitting and ought to be handled as an error" (RFC 9112 §6.3; §6.2: a sender MUST
      NOT send both).  A peer framing by ``Content-Length`` (a proxy on the way) sees
      another response where we see the end of this one.
    * ``Transfer-Encoding`` in a message of another version than HTTP/1.1: HTTP/1.0 has
      no transfer codings, so the framing is faulty and the connection closes after the
      message (§6.1).

    Args:
        http_version: the response's version (``b"1.1"``, ``b"1.0"``).
        content_length: the head carries a ``Content-Length`` field.
        transfer_encoding: the head carries a ``Transfer-Encoding`` field.
    """
    return transfer_encoding and (content_length or http_version != b"1.1")


def _framings(headers: list[tuple[bytes, bytes]]) -> tuple[bool, bool]:
    """Whether the headers carry ``Content-Length`` and ``Transfer-Encoding``."""
    length = chunked = False
    for name, _ in headers:
        size = len(name)  # compare lengths first: most names are neither
        if size == 14:
            length = length or name.lower() == b"content-length"
        elif size == 17:
            chunked = chunked or name.lower() == b"transfer-encoding"
    return length, chunked
