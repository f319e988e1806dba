"""``AsyncioStream.receive`` hands over everything buffered, up to ``max_bytes``, in one
piece, and loses nothing: what a busy reader finds waiting (an HTTP/2 connection at high
concurrency finds a few dozen small reads) is parsed at once, not one read per cycle.

The protocol is fed directly (``data_received``, as asyncio's transport does) so the
chunking is exactly the one generated; the transport is a real socket pair's.  A seeded
loop generates the cases: ``BULKHEAD_FUZZ_EXAMPLES`` of them (200 by default)."""

from __future__ import annotations

import asyncio
import os
import random
import socket

import pytest

from httpx_bulkhead._streams import AsyncioStream, StreamProtocol

EXAMPLES = int(os.environ.get("BULKHEAD_FUZZ_EXAMPLES") or 200)


async def _stream() -> tuple[AsyncioStream, StreamProtocol, socket.socket]:
    ours, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_connection(StreamProtocol, sock=ours)
    assert isinstance(transport, asyncio.Transport)
    return AsyncioStream(transport, protocol), protocol, theirs


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_read_takes_everything_buffered_up_to_its_size() -> None:
    stream, proto, peer = await _stream()
    try:
        for chunk in (b"ab", b"cde", b"f"):
            proto.data_received(chunk)
        assert await stream.receive(65536, 1.0) == b"abcdef"
        for chunk in (b"ab", b"cde", b"fgh"):
            proto.data_received(chunk)
        assert await stream.receive(5, 1.0) == b"abcde"  # the third would not fit
        assert await stream.receive(5, 1.0) == b"fgh"
        for chunk in (b"abcdefg", b"h"):
            proto.data_received(chunk)
        assert await stream.receive(3, 1.0) == b"abc"  # split: the rest waits in front
        assert await stream.receive(10, 1.0) == b"defgh"
        assert proto.buffered == 0 and not proto.chunks
    finally:
        await stream.aclose()
        peer.close()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_generated_chunkings_lose_nothing_and_respect_the_size() -> None:
    rng = random.Random(18)
    stream, proto, peer = await _stream()
    try:
        for _ in range(EXAMPLES):
            chunks = [rng.randbytes(rng.randint(1, 40)) for _ in range(rng.randint(1, 12))]
            max_bytes = rng.randint(1, 120)
            for chunk in chunks:
                proto.data_received(chunk)
            whole = b"".join(chunks)
            got = b""
            while proto.chunks:
                buffered = proto.buffered
                piece = await stream.receive(max_bytes, 1.0)
                assert 0 < len(piece) <= max_bytes
                if buffered <= max_bytes:  # all of it fits: all of it comes
                    assert len(piece) == buffered
                got += piece
                assert proto.buffered == len(whole) - len(got)
            assert got == whole, (chunks, max_bytes)
    finally:
        await stream.aclose()
        peer.close()
