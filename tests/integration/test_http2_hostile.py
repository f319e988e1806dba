"""HTTP/2 against peers that behave unusually or badly ("Hardening II"): informational
responses during an upload, early final responses, resets and GOAWAY while an upload waits
for flow-control window, refused streams, PING checks, header injection, content-length
mismatches, unread streamed responses, reason phrases.  One regression test (or more) per
numbered item of the issue; each failed on the code before its fix."""

from __future__ import annotations

import contextlib

import anyio
import h2.errors
import httpx
import pytest

from httpx_bulkhead import BulkheadTransport, Policy
from tests.servers import NodeH2Server, h2script
from tests.servers.h2script import H2Reset, H2ScriptServer

pytestmark = pytest.mark.anyio

UPLOAD = b"u" * 200_000  # three stream windows and more
#: Fails a test that would otherwise hang (the point of several of these tests).
HANG = 10.0


def h2c(**policy: object) -> BulkheadTransport:
    return BulkheadTransport(default=Policy(**policy), http1=False, http2=True)  # type: ignore[arg-type]


# -- 1. informational responses during an upload ---------------------------------------


async def test_interim_responses_do_not_stop_an_upload() -> None:
    with H2ScriptServer(interim=(100, 103)) as srv:
        transport = h2c()
        async with httpx.AsyncClient(transport=transport, timeout=5) as client:
            with anyio.fail_after(HANG):
                response = await client.post(f"{srv.url}/count", content=UPLOAD)
            assert (response.status_code, response.text) == (200, f"received:{len(UPLOAD)}")
        assert [s.body for s in srv.streams] == [UPLOAD]


async def test_node_expect_100_continue_upload() -> None:
    with NodeH2Server() as node:
        transport = h2c()
        async with httpx.AsyncClient(transport=transport, timeout=5) as client:
            with anyio.fail_after(HANG):
                response = await client.post(
                    f"{node.url}/upload", content=UPLOAD, headers={"expect": "100-continue"}
                )
            assert (response.status_code, response.text) == (200, f"received:{len(UPLOAD)}")


# -- 2. a final response before the upload is done --------------------------------------


async def test_early_final_response_resets_the_stream() -> None:
    with h2script.serve(max_streams=5) as srv:
        transport = h2c(max_connections=1)
        async with httpx.AsyncClient(transport=transport, timeout=5) as client:
            with anyio.fail_after(HANG):
                for _ in range(8):  # more than the server's five streams
                    response = await client.post(f"{srv.url}/early/413", content=UPLOAD)
                    assert (response.status_code, response.text) == (413, "early")
                after = await client.get(f"{srv.url}/")
            assert after.extensions["bulkhead"].reused
            s = transport.statistics()[srv.url]
            assert (s.connections_created, s.open_streams, s.failed) == (1, 0, 0)
            assert s.streams_reset == 8
        cancels = [(sid, code) for _, sid, code in srv.client_resets]
        assert cancels == [(sid, h2.errors.ErrorCodes.CANCEL) for sid in range(1, 17, 2)]


async def test_node_early_response_to_an_unread_upload() -> None:
    # The same against Node, which follows its early answer with RST_STREAM(NO_ERROR)
    # itself (RFC 9113 §8.1): a cross-check of that path, not a regression test.
    with NodeH2Server(max_concurrent_streams=5) as node:
        transport = h2c(max_connections=1)
        async with httpx.AsyncClient(transport=transport, timeout=5) as client:
            with anyio.fail_after(HANG):
                for _ in range(8):
                    response = await client.post(f"{node.url}/early/413", content=UPLOAD)
                    assert response.status_code == 413
                assert (await client.get(f"{node.url}/")).text == "hello"
            s = transport.statistics()[node.url]
            assert (s.connections_created, s.open_streams, s.failed) == (1, 0, 0)
        await node.until_idle()


# -- 3. waiting for send window wakes on the stream's fate ------------------------------


async def test_reset_while_an_upload_waits_for_window_fails_it_at_once() -> None:
    with h2script.serve() as srv:
        transport = h2c()
        async with httpx.AsyncClient(transport=transport, timeout=None) as client:
            with anyio.fail_after(HANG):
                async with anyio.create_task_group() as tg:
                    failures: list[BaseException] = []

                    async def upload() -> None:
                        try:
                            await client.post(f"{srv.url}/stall/never", content=UPLOAD)
                        except httpx.HTTPError as exc:
                            failures.append(exc)

                    tg.start_soon(upload)
                    await srv.until_event("stalled")
                    srv.reset_stalled(h2.errors.ErrorCodes.INTERNAL_ERROR)
            assert len(failures) == 1
            assert isinstance(failures[0], httpx.RemoteProtocolError)
            assert "reset" in str(failures[0])
            assert (await client.get(f"{srv.url}/")).extensions["bulkhead"].reused
            s = transport.statistics()[srv.url]
            assert (s.open_streams, s.running, s.failed) == (0, 0, 1)


async def test_goaway_below_a_blocked_upload_replays_it_at_once() -> None:
    with h2script.serve() as srv:
        transport = h2c()
        async with httpx.AsyncClient(transport=transport, timeout=None) as client:
            with anyio.fail_after(HANG):
                async with anyio.create_task_group() as tg:
                    results: list[httpx.Response] = []

                    async def upload() -> None:
                        results.append(await client.post(f"{srv.url}/stall/go", content=UPLOAD))

                    tg.start_soon(upload)
                    await srv.until_event("stalled")
                    srv.event("stalled").clear()
                    srv.goaway_now(last_stream_id=0)
                    # Replayed on a new connection without waiting for any timeout.
                    await srv.until_event("stalled")
                    srv.release("go")
            assert [r.text for r in results] == [f"received:{len(UPLOAD)}"]
            s = transport.statistics()[srv.url]
            assert (s.goaways, s.replays, s.connections_created) == (1, 1, 2)
        assert [conn for conn, _ in srv.stalled] == [0, 1]


async def test_goaway_below_an_answered_stream_does_not_refuse_it() -> None:
    # A server may not refuse what it answered (RFC 9113 §6.8); one that does must not make
    # an internal "replay this" escape from the body being read.
    with h2script.serve() as srv:
        transport = h2c()
        async with httpx.AsyncClient(transport=transport, timeout=2) as client:
            async with client.stream("GET", f"{srv.url}/bytes/200000") as response:
                assert response.status_code == 200
                srv.goaway_now(last_stream_id=0)  # the server stops sending it, too
                await srv.until_event("goaway-sent")
                with pytest.raises(httpx.TransportError):
                    await response.aread()
            s = transport.statistics()[srv.url]
            assert (s.goaways, s.replays, s.running) == (1, 0, 0)


class GatedBody:
    """A request body: ``size`` bytes, then it waits for ``gate`` before it ends."""

    def __init__(self, size: int, gate: anyio.Event) -> None:
        self.chunks = [b"g" * size]
        self.gate = gate

    def __aiter__(self) -> GatedBody:
        return self

    async def __anext__(self) -> bytes:
        if self.chunks:
            return self.chunks.pop()
        await self.gate.wait()
        raise StopAsyncIteration


async def test_the_end_of_a_body_waits_while_its_window_is_below_zero() -> None:
    # Found by the adversary: a lowered SETTINGS_INITIAL_WINDOW_SIZE can take a stream's
    # window below zero (RFC 9113 §6.9.2); then not even the empty DATA frame that ends
    # the body may go (h2, hence hypercorn, makes it a connection error).
    with h2script.serve() as srv:
        transport = h2c()
        async with httpx.AsyncClient(transport=transport, timeout=5) as client:
            await client.get(f"{srv.url}/")
            gate = anyio.Event()
            with anyio.fail_after(HANG):
                async with anyio.create_task_group() as tg:
                    results: list[httpx.Response] = []

                    async def upload() -> None:
                        body = GatedBody(65_535, gate)  # the whole stream window
                        results.append(await client.post(f"{srv.url}/stall/w", content=body))

                    tg.start_soon(upload)
                    await srv.until_event("stalled")
                    srv.event("settings-acked").clear()
                    srv.set_initial_window(1)  # the upload's window: 1 - 65,535
                    await client.get(f"{srv.url}/")  # (its reader takes the SETTINGS in)
                    await srv.until_event("settings-acked")
                    gate.set()  # the body ends while the window is below zero
                    await client.get(f"{srv.url}/")  # (the upload has run by now)
                    assert not srv.protocol_errors
                    srv.release("w")  # the server reads it: the window is back
            assert [r.text for r in results] == ["received:65535"]
        assert not srv.protocol_errors


# -- 4. refused streams ------------------------------------------------------------------


async def test_refused_streams_are_forgotten_and_replayed_on_another_connection() -> None:
    refuse = H2Reset(code=h2.errors.ErrorCodes.REFUSED_STREAM, times=1)
    with H2ScriptServer(resets={f"/r{i}": refuse for i in range(20)}) as srv:
        transport = h2c(max_connections=4)
        async with httpx.AsyncClient(transport=transport, timeout=5) as client:
            await client.get(f"{srv.url}/")
            for i in range(20):  # each refused once, then replayed
                response = await client.get(f"{srv.url}/r{i}")
                assert response.extensions["bulkhead"].retried
            s = transport.statistics()[srv.url]
            assert (s.open_streams, s.replays, s.failed) == (0, 20, 0)
            assert s.connections <= 4
        for i in range(20):
            attempts = [(st.conn, st.error_code) for st in srv.streams if st.path == f"/r{i}"]
            (refused_on, first), (answered_on, second) = attempts
            assert (first, second) == (h2.errors.ErrorCodes.REFUSED_STREAM, None)
            assert refused_on != answered_on  # replayed on another connection


# -- 5. the PING health check ------------------------------------------------------------


async def test_requests_arriving_during_a_ping_check_wait_for_its_verdict() -> None:
    with h2script.serve() as srv:
        transport = h2c(ping_after=0.0, ping_timeout=1.0)
        async with httpx.AsyncClient(transport=transport, timeout=5) as client:
            await client.get(f"{srv.url}/")
            srv.mute()  # the connection's peer is now dead (reads, never answers)
            await srv.until_event("muted")
            statuses: list[int] = []

            async def call() -> None:
                statuses.append((await client.get(f"{srv.url}/")).status_code)

            with anyio.fail_after(HANG):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(call)  # its checkout sends the PING
                    await srv.until_event("ping-received")
                    for _ in range(4):  # they arrive while the PING is in flight
                        tg.start_soon(call)
            assert statuses == [200] * 5  # nothing was sent for them on the dead connection
            s = transport.statistics()[srv.url]
            assert s.ping_timeouts == 1 and s.failed == 0
        assert [st.conn for st in srv.streams].count(0) == 1  # the first request only


async def test_a_ping_ack_with_another_payload_is_no_answer() -> None:
    with H2ScriptServer(wrong_ping_acks=True) as srv:
        transport = h2c(ping_after=0.0, ping_timeout=0.3)
        async with httpx.AsyncClient(transport=transport, timeout=5) as client:
            await client.get(f"{srv.url}/")
            second = await client.get(f"{srv.url}/")
            assert not second.extensions["bulkhead"].reused
            s = transport.statistics()[srv.url]
            assert s.ping_timeouts == 1 and s.connections_created == 2


# -- 6. header injection ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "extensions"),
    [
        ({"x-a": "1\r\nx-injected: 1"}, {}),
        ({"x-a": "1\nx"}, {}),
        ({"x-a": "1\x00"}, {}),
        ({"x a": "1"}, {}),
        ({"x:a": "1"}, {}),
        ({"host": "example.com\r\nx-injected: 1"}, {}),
        ({}, {"target": b"/a\r\nx-injected: 1"}),
        ({}, {"target": b"/a b"}),
        ({}, {"target": b"/a\x00"}),
    ],
)
async def test_header_injection_is_refused_before_anything_is_sent(
    headers: dict[str, str], extensions: dict[str, object]
) -> None:
    with h2script.serve() as srv:
        transport = h2c()
        async with httpx.AsyncClient(transport=transport, timeout=5) as client:
            request = client.build_request("GET", f"{srv.url}/", headers=headers)
            request.extensions.update(extensions)
            with pytest.raises(httpx.LocalProtocolError):
                await client.send(request)
            s = transport.statistics()[srv.url]
            assert (s.running, s.failed, s.open_streams) == (0, 1, 0)
            ok = await client.get(f"{srv.url}/")
            assert ok.status_code == 200
        assert len(srv.streams) == 1  # only the good request reached the server


# -- 7. content-length mismatches --------------------------------------------------------


@pytest.mark.parametrize("lie", ["/lie/10/20", "/lie/20/10", "/lie/0/5", "/lie/70000/1"])
async def test_content_length_mismatch_fails_only_its_stream(lie: str) -> None:
    with h2script.serve() as srv:
        transport = h2c()
        async with httpx.AsyncClient(transport=transport, timeout=5) as client:
            await client.get(f"{srv.url}/")
            with anyio.fail_after(HANG):
                async with anyio.create_task_group() as tg:
                    uploads: list[httpx.Response] = []

                    async def innocent_upload() -> None:
                        uploads.append(await client.post(f"{srv.url}/stall/ok", content=UPLOAD))

                    tg.start_soon(innocent_upload)
                    await srv.until_event("stalled")  # still uploading
                    with pytest.raises(httpx.RemoteProtocolError, match="content-length"):
                        await client.get(f"{srv.url}{lie}")
                    srv.release("ok")
            assert [r.text for r in uploads] == [f"received:{len(UPLOAD)}"]
            after = await client.get(f"{srv.url}/")
            assert after.extensions["bulkhead"].reused
            s = transport.statistics()[srv.url]
            assert (s.connections_created, s.open_streams, s.failed) == (1, 0, 1)


async def test_a_connection_error_fails_an_upload_with_an_httpx_error() -> None:
    bad_window_update = bytes([0, 0, 4, 0x8, 0, 0, 0, 0, 0]) + bytes(4)  # increment 0
    with h2script.serve() as srv:
        transport = h2c()
        async with httpx.AsyncClient(transport=transport, timeout=5) as client:
            with anyio.fail_after(HANG):
                async with anyio.create_task_group() as tg:
                    failures: list[BaseException] = []

                    async def upload() -> None:
                        try:
                            await client.post(f"{srv.url}/stall/never", content=UPLOAD)
                        except Exception as exc:
                            failures.append(exc)

                    tg.start_soon(upload)
                    await srv.until_event("stalled")
                    # The window opens and the connection breaks in the same read.
                    srv.open_stalled(then=bad_window_update)
            assert [type(exc) for exc in failures] == [httpx.RemoteProtocolError]
            assert (await client.get(f"{srv.url}/")).status_code == 200
            s = transport.statistics()[srv.url]
            assert (s.connections_created, s.running, s.error) == (2, 0, 1)


async def test_content_length_mismatch_on_a_head_or_a_streamed_read() -> None:
    with h2script.serve() as srv:
        transport = h2c()
        async with httpx.AsyncClient(transport=transport, timeout=5) as client:
            with pytest.raises(httpx.RemoteProtocolError, match="content-length"):
                await client.head(f"{srv.url}/")  # a HEAD response with a body
            async with client.stream("GET", f"{srv.url}/lie/100000/200000") as response:
                chunks = []
                with pytest.raises(httpx.RemoteProtocolError, match="content-length"):
                    async for chunk in response.aiter_raw():
                        chunks.append(chunk)
            assert sum(map(len, chunks)) <= 100_000
            assert (await client.get(f"{srv.url}/")).extensions["bulkhead"].reused
            assert transport.statistics()[srv.url].connections_created == 1


# -- 8. unread streamed responses and the connection window -------------------------------


async def test_unread_streamed_responses_do_not_starve_the_connection() -> None:
    held = 300  # 300 stream windows of 65,535 bytes: more than our first 16 MiB
    with h2script.serve(max_streams=1000) as srv:
        transport = h2c(max_concurrency=held + 1, max_streams_per_connection=held + 1)
        async with httpx.AsyncClient(transport=transport, timeout=5) as client:
            async with contextlib.AsyncExitStack() as stack:
                for _ in range(held):
                    await stack.enter_async_context(client.stream("GET", f"{srv.url}/bytes/65535"))
                await srv.until_answered(held)  # every body sent in full, none read yet
                small = await client.get(f"{srv.url}/bytes/10")
                assert small.content == b"x" * 10
                s = transport.statistics()[srv.url]
                assert (s.connections_created, s.running) == (1, held)
                assert s.open_streams == 0  # complete on the wire, though not read


# -- 9. reason phrases ------------------------------------------------------------------


async def test_reason_phrase_is_left_to_httpx() -> None:
    with h2script.serve() as srv:
        async with httpx.AsyncClient(transport=h2c(), timeout=5) as client:
            response = await client.get(f"{srv.url}/status/404")
            assert response.reason_phrase == "Not Found"
            with pytest.raises(httpx.HTTPStatusError, match="404 Not Found"):
                response.raise_for_status()
