"""The client side of TLS over memory buffers (sans-IO), shared by both byte streams.

Theory of operation
-------------------
``TLSEngine`` holds an ``ssl.SSLObject`` between two ``MemoryBIO``: the stream gives it the
bytes read from the socket (``feed``) and sends what it asks to (``outgoing``); the engine
does no I/O and never waits.

We own this layer, rather than use asyncio's ``start_tls`` or anyio's ``TLSStream``, so that
we can say at any moment whether the peer has sent bytes nobody read yet: an idle HTTP/1.1
connection holding such bytes must not be reused, or they are read as the answer to the
next request (RFC 9112 §9.3).  A TLS layer reads the socket ahead of its caller, so once
the socket is drained the bytes can wait in three places:

* decrypted, not yet read: ``SSLObject.pending()``;
* whole records not yet decrypted (OpenSSL decrypts one record per ``read``): the incoming
  ``MemoryBIO``, whose ``pending`` is public because the BIO is ours;
* the start of a record whose end has not arrived.  Given to OpenSSL, it would move those
  bytes into a buffer of its own that nothing reports.  So ``feed`` follows the record
  framing (RFC 8446 §5.1: a 5-byte header ending in a 16-bit length) and hands OpenSSL
  complete records only; the incomplete tail stays in ``_held`` until its end arrives.

``holds_input()`` is true when any of the three is non-empty.  Bytes that do not look like
TLS records (a plain-text server on a TLS port) are passed through whole, so OpenSSL
reports the error.

End of stream: a close_notify, or the socket's EOF without one, reads as ``b""`` (as anyio's
``standard_compatible=False`` and httpcore do): a truncated body is caught by the HTTP
framing, not here.
"""

from __future__ import annotations

import ssl

__all__ = ["TLSEngine"]

_HEADER = 5
#: Record content types (RFC 8446 §5.1 and TLS 1.2): change_cipher_spec .. heartbeat.
_CONTENT_TYPES = range(20, 25)
#: Longest record body TLS 1.2 allows (2^14 + 2048); TLS 1.3 allows less.
_MAX_RECORD = 2**14 + 2048


class TLSEngine:
    """A TLS client connection without I/O: feed it socket bytes, send its ``outgoing()``."""

    __slots__ = ("_held", "_in", "_out", "_unframed", "eof", "handshake_done", "ssl_object")

    def __init__(self, context: ssl.SSLContext, server_hostname: str | None) -> None:
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self.ssl_object = context.wrap_bio(self._in, self._out, server_hostname=server_hostname)
        self._held = b""  # the start of a record whose end has not arrived
        self._unframed = False  # the peer does not speak TLS records: pass bytes through
        self.handshake_done = False
        self.eof = False  # close_notify or EOF seen: ``read`` returns b"" from now on

    # -- input -----------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        """Bytes read from the socket (complete records go to OpenSSL, a partial one waits)."""
        if self._held:
            data = self._held + data
        if self._unframed:
            self._in.write(data)
            self._held = b""
            return
        end = 0
        size = len(data)
        while end + _HEADER <= size:
            length = data[end + 3] << 8 | data[end + 4]
            if data[end] not in _CONTENT_TYPES or length > _MAX_RECORD:
                self._unframed = True  # not TLS: let OpenSSL say so
                end = size
                break
            if end + _HEADER + length > size:
                break
            end += _HEADER + length
        if end:
            self._in.write(data[:end] if end < size else data)
        self._held = data[end:] if end < size else b""

    def feed_eof(self) -> None:
        """The socket reached end of stream."""
        if self._held:  # an incomplete record: OpenSSL reports the truncation
            self._in.write(self._held)
            self._held = b""
        self._in.write_eof()

    def readable(self) -> bool:
        """Whether ``read`` may return data without more input (else it would return
        ``None``): plaintext or whole records are buffered.  Saves the exception OpenSSL
        raises for "need more input"."""
        return self._in.pending > 0 or self.ssl_object.pending() > 0

    def holds_input(self) -> bool:
        """Whether bytes from the peer wait in the TLS layer (see the module docstring)."""
        return bool(self._held) or self._in.pending > 0 or self.ssl_object.pending() > 0

    # -- the connection ------------------------------------------------------------------
    def handshake(self) -> bool:
        """Advance the handshake; true once it is complete (send ``outgoing()`` either way).

        Raises:
            ssl.SSLError: the handshake failed (certificate, protocol, EOF).
        """
        try:
            self.ssl_object.do_handshake()
        except ssl.SSLWantReadError:
            return False
        self.handshake_done = True
        return True

    def read(self, max_bytes: int) -> bytes | None:
        """Up to ``max_bytes`` decrypted bytes; ``None`` when more input is needed; ``b""``
        at end of stream.  Raises ``ssl.SSLError`` on a TLS failure."""
        if self.eof:
            return b""
        try:
            data = self.ssl_object.read(max_bytes)
        except ssl.SSLWantReadError:
            return None
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
            self.eof = True
            return b""
        except ssl.SSLError as exc:
            if "UNEXPECTED_EOF" in str(exc):  # OpenSSL 3 without SSLEOFError mapping
                self.eof = True
                return b""
            raise
        if not data:  # a close_notify (SSLObject reads it as b"")
            self.eof = True
        return data

    def read_available(self, max_bytes: int) -> bytes | None:
        """Like ``read``, but as many records as are buffered, up to ``max_bytes`` bytes
        in all (OpenSSL decrypts one record per ``read``): fewer, larger pieces for the
        HTTP parser.  Per-record work is kept to the ``SSLObject.read`` call."""
        data = self.read(max_bytes)
        incoming, tls = self._in, self.ssl_object
        if not data or not (incoming.pending or tls.pending()):
            return data
        pieces = [data]
        size = len(data)
        try:
            while size < max_bytes and (incoming.pending or tls.pending()):
                more = tls.read(max_bytes - size)
                if not more:
                    break  # close_notify: the next ``read`` reports the end
                pieces.append(more)
                size += len(more)
        except ssl.SSLError:
            pass  # a record without data, or a failure: the next ``read`` reports it
        return b"".join(pieces)

    def write(self, data: bytes) -> None:
        """Encrypt ``data``; send ``outgoing()`` next."""
        self.ssl_object.write(data)

    def outgoing(self) -> bytes:
        """Bytes to send to the peer (records, handshake messages, alerts)."""
        return self._out.read()

    @property
    def alpn(self) -> str | None:
        return self.ssl_object.selected_alpn_protocol()
