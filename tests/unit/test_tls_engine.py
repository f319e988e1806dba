"""``TLSEngine`` against a real TLS server (an ``ssl.SSLObject`` on memory buffers, with a
trustme certificate): no socket, no event loop.

The property that matters: after the engine has been fed any prefix of the server's bytes
and has given out all the plaintext it can, ``holds_input()`` is true exactly when the
prefix ends inside a record.  The server seals each message on its own, so the record
boundaries are known without parsing the bytes (the engine's job).  A seeded loop cuts the
stream at random places; ``BULKHEAD_TLS_SPLITS`` sets how many streams (default 40).
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import ssl

import pytest

from httpx_bulkhead._tls import TLSEngine
from tests.servers import default_server_tls, wrong_host_server_tls

SPLITS = int(os.environ.get("BULKHEAD_TLS_SPLITS") or 40)


class Server:
    """The server side of one TLS connection, on memory buffers."""

    def __init__(self, tls: ssl.SSLContext) -> None:
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.obj = tls.wrap_bio(self.incoming, self.outgoing, server_side=True)

    def seal(self, data: bytes) -> bytes:
        self.obj.write(data)
        return self.outgoing.read()


@functools.cache
def server_context() -> ssl.SSLContext:
    return default_server_tls().server_ssl_context()


@functools.cache
def client_context() -> ssl.SSLContext:
    return default_server_tls().client_ssl_context()


def connect(server_tls: ssl.SSLContext | None = None) -> tuple[TLSEngine, Server]:
    """A completed handshake between a fresh engine and a fresh server."""
    server = Server(server_tls or server_context())
    engine = TLSEngine(client_context(), "127.0.0.1")
    for _ in range(10):
        engine.handshake()
        server.incoming.write(engine.outgoing())
        with contextlib.suppress(ssl.SSLWantReadError):
            server.obj.do_handshake()
        engine.feed(server.outgoing.read())
        if engine.handshake():
            server.incoming.write(engine.outgoing())
            with pytest.raises(ssl.SSLWantReadError):
                server.obj.read(1)  # takes the client's Finished
            engine.feed(server.outgoing.read())  # TLS 1.3 session tickets
            assert drain(engine) == b""
            return engine, server
    raise AssertionError("handshake did not complete")


def drain(engine: TLSEngine) -> bytes:
    """All the plaintext the engine can give without more input."""
    out = b""
    while (data := engine.read(65536)) is not None:
        if not data:
            break
        out += data
    return out


def test_handshake_negotiates_and_verifies() -> None:
    engine, _ = connect()
    assert engine.handshake_done
    assert engine.ssl_object.version() in ("TLSv1.2", "TLSv1.3")
    assert not engine.holds_input()


def test_wrong_host_certificate_fails_the_handshake() -> None:
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
        connect(server_tls=wrong_host_server_tls().server_ssl_context())


@pytest.mark.parametrize("seed", range(SPLITS))
def test_held_bytes_are_counted_at_every_cut(seed: int) -> None:
    rng = random.Random(seed)
    engine, server = connect()
    sizes = [1, 7, 100, 1500] if seed == 0 else [1, 7, 100, 1500, 16_000]
    messages = [rng.randbytes(rng.choice(sizes)) for _ in range(6)]
    records = [server.seal(message) for message in messages]
    wire = b"".join(records)
    boundaries = {0}
    for record in records:
        boundaries.add(max(boundaries) + len(record))
    cuts = sorted(rng.sample(range(1, len(wire)), k=min(12, len(wire) - 1)))
    if seed == 0:
        cuts = list(range(1, len(wire)))  # one byte at a time, once
    plaintext = b""
    previous = 0
    for cut in [*cuts, len(wire)]:
        engine.feed(wire[previous:cut])
        previous = cut
        plaintext += drain(engine)
        assert engine.holds_input() is (cut not in boundaries), (seed, cut)
        assert not engine.readable()
        # Only complete records have been decrypted.
        complete = max(b for b in boundaries if b <= cut)
        expected = b"".join(
            m for m, end in zip(messages, sorted(boundaries)[1:], strict=True) if end <= complete
        )
        assert plaintext == expected
    assert plaintext == b"".join(messages)


def test_coalesced_records_stay_counted_until_read() -> None:
    """Two records fed at once: reading a little leaves decrypted bytes (SSLObject.pending)
    and a whole record (the incoming buffer) behind; both count."""
    engine, server = connect()
    engine.feed(server.seal(b"first") + server.seal(b"second"))
    assert engine.read(2) == b"fi"
    assert engine.holds_input() and engine.readable()
    assert engine.read(100) == b"rst"
    assert engine.holds_input()  # the second record, not yet decrypted
    assert drain(engine) == b"second"
    assert not engine.holds_input()


def test_close_notify_is_end_of_stream() -> None:
    engine, server = connect()
    with pytest.raises(ssl.SSLWantReadError):
        server.obj.unwrap()  # sends close_notify, waits for ours
    engine.feed(server.outgoing.read())
    assert engine.read(10) == b""
    assert engine.eof
    assert engine.read(10) == b""


def test_socket_eof_without_close_notify_is_end_of_stream() -> None:
    engine, server = connect()
    engine.feed(server.seal(b"body"))
    engine.feed_eof()
    assert drain(engine) == b"body"
    assert engine.read(10) == b""
    assert engine.eof


def test_eof_inside_a_record_ends_the_stream() -> None:
    """The peer closed half-way through a record: end of stream (as without a
    close_notify; the HTTP framing notices a truncated body), never "need more input"."""
    engine, server = connect()
    record = server.seal(b"truncated")
    engine.feed(record[:10])
    assert engine.read(10) is None and engine.holds_input()
    engine.feed_eof()
    assert engine.read(10) == b""
    assert engine.eof and not engine.holds_input()


def test_a_plain_text_answer_fails_the_handshake() -> None:
    """Bytes that are not TLS records are handed to OpenSSL whole, which refuses them."""
    engine = TLSEngine(client_context(), "127.0.0.1")
    assert engine.handshake() is False
    engine.feed(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    with pytest.raises(ssl.SSLError):
        engine.handshake()
