"""The HTTP/2 adversary: seeded random schedules of hostile or merely unusual server
behaviour against BulkheadTransport, with the invariants checked after each.

Each call carries a ``Plan`` (``plans.py``) in its path: how the server answers it and
what it does to the connection.  Two kinds of schedule, by the seed's parity:

* *chaos* (odd seeds): a policy (stream caps, connections, PING checks) and 20-35 calls,
  GETs and POSTs (bytes, or a streamed body that cannot be replayed; some with
  ``expect: 100-continue``), read whole, streamed, or closed after the head, some
  cancelled after a random delay, started at random moments; plans mix every behaviour
  with connection-wide effects: SETTINGS with caps and initial windows down to 0,
  window starvation and overflow, RST_STREAM, REFUSED_STREAM, GOAWAY, PINGs answered,
  late, never or with another payload, 1xx, early final responses, trailers,
  content-length lies, abrupt closes.  Any call may fail (with an httpx error).
* *strict* (even seeds): no connection-wide effect (a GOAWAY refusing a stalled upload
  aside) and generous limits, so every call's outcome is known in advance: answered
  plans must succeed exactly (1xx, early answers, trailers, uploads of any size, the
  replay after a GOAWAY below a stalled upload), resets, refusals, lies and a reset
  while the upload waits for window must fail with ``httpx.RemoteProtocolError``, and
  unanswered ones must still be waiting when cancelled.

After every schedule:

* every call ended within its hard deadline (no hang), with a response or an
  ``httpx.TransportError`` (nothing else escapes), and a complete response is exactly
  the one the server sent in full (never a reset, refused, unanswered or lying one);
* the statistics balance (``acquired == completed + failed + cancelled``; nothing
  running, waiting or in use; ``open_streams == 0``), every open connection agrees with
  h2 (no stream h2 counts open, nothing left waiting, no body check left armed), and
  the server holds no stream open on any connection still up, never saw a stream beyond
  a cap the client had acknowledged, and never got a frame h2 calls a protocol error;
* the next requests succeed (the server turned benign): a GET and a 70 KB POST;
* once the transport is closed, the server sees every connection go, no
  ``H2Stream``/``HTTP2Connection`` object survives, and (over the whole run) the
  process holds no more file descriptors than after the first schedule.

CI runs ``SCHEDULES`` (6) seeds per backend against the Python adversary and 2 against
Node's ``http2`` server (chaos only, with what Node can be made to play: early answers,
resets, refusals, 1xx, SETTINGS, GOAWAY, PINGs, closes).
``BULKHEAD_ADVERSARY_SCHEDULES=N`` runs N per backend (N // 3 against Node);
``BULKHEAD_ADVERSARY_SEED=S`` runs that seed alone; a failure prints the command.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import math
import os
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import httpx
import pytest

from httpx_bulkhead import BulkheadTransport, Policy
from httpx_bulkhead._http2 import H2Stream, HTTP2Connection
from tests.servers import NodeH2Server

from .plans import Plan, body_of, random_plan, strict_plan
from .server import AdversaryServer

pytestmark = pytest.mark.anyio

SCHEDULES = int(os.environ.get("BULKHEAD_ADVERSARY_SCHEDULES") or 6)
NODE_SCHEDULES = max(1, SCHEDULES // 3)
ONLY_SEED = os.environ.get("BULKHEAD_ADVERSARY_SEED")
FIRST_SEED = 1000
#: httpx's timeouts for every call: each operation, and the pool wait.
TIMEOUT = httpx.Timeout(0.5)
#: The policy's total deadline per call, from slot to last byte.
REQUEST_TIMEOUT = 1.5
PROTOCOL_ERROR = httpx.RemoteProtocolError
#: What a call may take beyond its pool wait and request_timeout (a loaded machine).
SLACK = 3.0


@dataclass(frozen=True)
class Call:
    plan: Plan
    method: str
    body: str  # "none", "bytes", "stream"
    size: int
    expect_continue: bool
    read: str  # "all", "stream", "head" (closed after the head)
    cancel_after: float | None
    start: float
    #: Strict schedules only: "response" (exactly the planned one), "protocol error"
    #: (httpx.RemoteProtocolError), "cancelled" (by ``cancel_after``, nothing before).
    expect: str = "any"

    def describe(self) -> str:
        return (
            f"{self.method} {self.plan.path()} body={self.body}:{self.size} "
            f"read={self.read} cancel={self.cancel_after}"
        )


@dataclass
class Schedule:
    seed: int
    policy: Policy
    calls: list[Call]
    timeout: httpx.Timeout
    server_cap: int = 100
    problems: list[str] = field(default_factory=list)
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)

    def fail(self, message: str) -> None:
        self.problems.append(message)

    @property
    def hard_deadline(self) -> float:
        """No call may take longer: its pool wait, its request_timeout, and some slack."""
        pool = self.timeout.pool if self.timeout.pool is not None else math.inf
        waits = min(pool, self.policy.acquire_timeout or math.inf)
        return waits + (self.policy.request_timeout or math.inf) + SLACK


def draw(seed: int, *, node: bool = False) -> Schedule:
    """Even seeds draw a strict schedule (Python adversary only), odd ones chaos."""
    if seed % 2 == 0 and not node:
        return draw_strict(seed)
    rng = random.Random(seed)
    policy = Policy(
        max_concurrency=rng.choice((4, 8, 16)),
        max_connections=rng.choice((1, 2, 4)),
        max_streams_per_connection=rng.choice((None, 2, 5, 100)),
        ping_after=rng.choice((None, None, 0.0, 0.05)),
        ping_timeout=0.25,
        acquire_timeout=1.0,
        request_timeout=REQUEST_TIMEOUT,
        idle_timeout=2.0,
    )
    calls = []
    for _ in range(rng.randint(20, 35)):
        method = rng.choice(("GET", "GET", "POST"))
        body = "none" if method == "GET" else rng.choice(("bytes", "bytes", "stream"))
        calls.append(
            Call(
                plan=random_plan(rng, node=node),
                method=method,
                body=body,
                size=0 if body == "none" else rng.choice((0, 100, 70_000, 200_000)),
                expect_continue=body != "none" and rng.random() < 0.2,
                read=rng.choice(("all", "all", "stream", "head")),
                cancel_after=rng.uniform(0.0, 0.4) if rng.random() < 0.15 else None,
                start=rng.uniform(0.0, 0.4),
            )
        )
    return Schedule(seed, policy, calls, TIMEOUT)


#: The outcome each mode must have in a strict schedule.
STRICT_OUTCOMES = {
    "ok": "response",
    "early": "response",
    "stallgoaway": "response",  # replayed on another connection, then answered
    "reset": "protocol error",
    "refuse": "protocol error",  # refused on every replay
    "lie": "protocol error",
    "stallreset": "protocol error",
    "hang": "cancelled",
    "stall": "cancelled",
}


def draw_strict(seed: int) -> Schedule:
    """No connection-wide effect (but a GOAWAY refusing a stalled upload), replayable
    bodies, generous limits: every call's outcome is known in advance."""
    rng = random.Random(seed)
    policy = Policy(
        max_concurrency=64,
        max_connections=rng.choice((1, 2, 4)),
        max_streams_per_connection=rng.choice((None, 5, 100)),
        ping_after=rng.choice((None, 0.0)),
        ping_timeout=2.0,
        acquire_timeout=5.0,
        request_timeout=5.0,
    )
    calls = []
    for i in range(rng.randint(15, 25)):
        plan = strict_plan(rng, once=seed * 1000 + i)
        if plan.mode == "early" and plan.status < 300:
            # A 2xx does not stop the upload (it may be a full-duplex exchange), and the
            # head goes to the caller only after it: a response larger than the stream's
            # window, never read, would meet an upload never read in a write timeout
            # (with httpx's default transport as well).
            plan = dataclasses.replace(plan, size=min(plan.size, 40_000))
        stalls = plan.mode.startswith("stall")
        method = "POST" if stalls else rng.choice(("GET", "POST"))
        size = 200_000 if stalls else rng.choice((0, 100, 70_000, 200_000))
        answered = plan.mode in ("ok", "early")
        calls.append(
            Call(
                plan=plan,
                method=method,
                body="none" if method == "GET" else "bytes",
                size=0 if method == "GET" else size,
                expect_continue=method == "POST" and rng.random() < 0.3,
                read=rng.choice(("all", "stream", "head") if answered else ("all", "stream")),
                cancel_after=0.3 if plan.mode in ("hang", "stall") else None,
                start=rng.uniform(0.0, 0.3),
                expect=STRICT_OUTCOMES[plan.mode],
            )
        )
    return Schedule(seed, policy, calls, httpx.Timeout(3.0), server_cap=rng.choice((5, 100)))


class StreamedBody:
    """A request body httpx cannot replay (an iterator, not bytes).  Not an async
    generator: httpx's wrapper does not close the generator it iterates when a transport
    stops reading early, and trio then warns when it is collected."""

    def __init__(self, size: int) -> None:
        self.data = body_of(size)
        self.pos = 0

    def __aiter__(self) -> StreamedBody:
        return self

    async def __anext__(self) -> bytes:
        await anyio.sleep(0)
        if self.pos >= len(self.data):
            raise StopAsyncIteration
        chunk = self.data[self.pos : self.pos + 16_384]
        self.pos += len(chunk)
        return chunk


async def perform(client: httpx.AsyncClient, url: str, call: Call) -> tuple[int, bytes, bool]:
    """``(status, body received, whether the body was read to its end)``."""
    content: bytes | StreamedBody | None = None
    if call.body == "bytes":
        content = body_of(call.size)
    elif call.body == "stream":
        content = StreamedBody(call.size)
    headers = {"expect": "100-continue"} if call.expect_continue else {}
    target = url + call.plan.path()
    if call.read == "all":
        response = await client.request(call.method, target, content=content, headers=headers)
        return response.status_code, response.content, True
    got = b""
    async with client.stream(call.method, target, content=content, headers=headers) as response:
        if call.read == "head":  # closed before its body (iterating httpx's streams part
            return response.status_code, got, False  # way leaves generators to trio's GC)
        async for chunk in response.aiter_raw():
            got += chunk
    return response.status_code, got, True


def check_response(schedule: Schedule, call: Call, status: int, body: bytes, whole: bool) -> None:
    plan = call.plan
    if not plan.answers_in_full:
        if whole:
            schedule.fail(f"a {plan.mode!r} answer was accepted as complete: {call.describe()}")
        return
    expected = body_of(plan.size)
    if status != plan.status or not (body == expected if whole else expected.startswith(body)):
        schedule.fail(f"wrong response {status}, {len(body)} bytes: {call.describe()}")


async def run_calls(schedule: Schedule, client: httpx.AsyncClient, url: str) -> None:
    async def one(call: Call) -> None:
        await anyio.sleep(call.start)
        started = time.monotonic()
        with anyio.move_on_after(schedule.hard_deadline) as hard:
            with anyio.CancelScope() as scope:
                if call.cancel_after is not None:
                    scope.deadline = anyio.current_time() + call.cancel_after
                try:
                    status, body, whole = await perform(client, url, call)
                except httpx.TransportError as exc:
                    schedule.outcomes[f"{call.plan.mode}: {type(exc).__name__}"] += 1
                    wanted = call.expect in ("any", "protocol error")
                    if not wanted or (call.expect != "any" and type(exc) is not PROTOCOL_ERROR):
                        schedule.fail(f"{exc!r}, expected {call.expect}: {call.describe()}")
                    return
                except Exception as exc:
                    schedule.fail(f"{type(exc).__module__}.{exc!r} escaped: {call.describe()}")
                    return
                schedule.outcomes[f"{call.plan.mode}: {status}"] += 1
                if call.expect not in ("any", "response"):
                    schedule.fail(f"got {status}, expected {call.expect}: {call.describe()}")
                check_response(schedule, call, status, body, whole)
            if call.expect == "cancelled" and not scope.cancelled_caught:
                schedule.fail(f"ended before its cancellation: {call.describe()}")
        if hard.cancelled_caught:
            elapsed = time.monotonic() - started
            schedule.fail(f"hung for {elapsed:.1f}s: {call.describe()}")

    async with anyio.create_task_group() as tg:
        for call in schedule.calls:
            tg.start_soon(one, call)


def h2_connections(transport: BulkheadTransport) -> list[HTTP2Connection]:
    conns = []
    for compartment in transport._router.compartments.values():
        conns += [c for c in compartment.connections.open if isinstance(c, HTTP2Connection)]
    return conns


def pool_active(transport: BulkheadTransport, conn: HTTP2Connection) -> int:
    """Requests the pool counts on ``conn`` (its lease's ``active``)."""
    for compartment in transport._router.compartments.values():
        lease = compartment.connections.open.get(conn)
        if lease is not None:
            return lease.active
    return 0


def check_books(schedule: Schedule, transport: BulkheadTransport) -> None:
    for name, s in transport.statistics().items():
        if (s.running, s.waiting, s.waiting_for_connection, s.in_use_connections) != (0,) * 4:
            schedule.fail(f"{name}: left running/waiting/in use: {s}")
        if s.open_streams:
            schedule.fail(f"{name}: open_streams == {s.open_streams} at rest")
        if s.acquired != s.completed + s.failed + s.cancelled:
            schedule.fail(f"{name}: acquired != completed + failed + cancelled: {s}")
    for conn in h2_connections(transport):
        if conn.broken:
            continue
        # h2's own scan (our _H2Connection answers open_outbound_streams with our count)
        h2_open = super(type(conn._h2), conn._h2).open_outbound_streams
        active = pool_active(transport, conn)
        if (h2_open, conn.open_streams, active) != (0, 0, 0):
            schedule.fail(
                f"connection {conn.id}: h2 counts {h2_open} open, we {conn.open_streams}, "
                f"the pool {active}"
            )
        left = (
            getattr(conn._frames, "checking", 0),  # (getattr: the adversary also runs
            getattr(conn, "_window_waiters", ()),  # against older code, to show what it
            conn._sleepers,  # would have found)
            getattr(conn, "_pong_waiters", ()),
        )
        if any(left):
            schedule.fail(f"connection {conn.id}: state left behind at rest: {left}")


async def until(predicate: Callable[[], bool], seconds: float) -> bool:
    with anyio.move_on_after(seconds):
        while not predicate():
            await anyio.sleep(0.01)
        return True
    return False


async def next_requests_succeed(schedule: Schedule, client: httpx.AsyncClient, url: str) -> None:
    try:
        with anyio.fail_after(schedule.hard_deadline):
            got = await client.get(url + Plan(size=10).path())
            posted = await client.post(url + Plan(size=10).path(), content=body_of(70_000))
        if (got.status_code, got.content, posted.status_code) != (200, body_of(10), 200):
            schedule.fail(f"the next requests got {got}, {posted}")
    except (httpx.TransportError, TimeoutError) as exc:
        schedule.fail(f"the next request failed: {exc!r}")


def live_objects() -> int:
    gc.collect()
    return sum(isinstance(o, H2Stream | HTTP2Connection) for o in gc.get_objects())


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def run_schedule(
    schedule: Schedule,
    url: str,
    *,
    server_streams: Callable[[], list[tuple[int, int]]],
    make_benign: Callable[[], Awaitable[None]],
    server_sees_close: bool = True,
) -> None:
    transport = BulkheadTransport(default=schedule.policy, http1=False, http2=True)
    async with httpx.AsyncClient(transport=transport, timeout=schedule.timeout) as client:
        await run_calls(schedule, client, url)
        check_books(schedule, transport)
        # Frames in flight (resets) may still be on their way to the server.
        if not await until(lambda: all(n == 0 for _, n in server_streams()), 3.0):
            schedule.fail(f"the server holds streams open: {server_streams()}")
        await make_benign()
        await next_requests_succeed(schedule, client, url)
        check_books(schedule, transport)
    del client, transport
    if server_sees_close and not await until(lambda: not server_streams(), 3.0):
        schedule.fail(f"connections left open after aclose: {server_streams()}")
    if (alive := live_objects()) != 0:
        schedule.fail(f"{alive} H2Stream/HTTP2Connection objects survived the transport")


def seeds(count: int, offset: int) -> list[int]:
    if ONLY_SEED is not None:
        return [int(ONLY_SEED)]
    return [FIRST_SEED + offset + i for i in range(count)]


def report(schedule: Schedule, test: str) -> None:
    if schedule.problems:
        shown = "\n  ".join(schedule.problems[:10])
        pytest.fail(
            f"adversary seed {schedule.seed}; rerun: BULKHEAD_ADVERSARY_SEED={schedule.seed} "
            f"python -m pytest 'tests/adversary/test_h2_adversary.py::{test}'\n  {shown}",
            pytrace=False,
        )


async def test_adversary(anyio_backend: str) -> None:
    offset = 0 if anyio_backend == "asyncio" else 500
    baseline_fds: int | None = None
    with AdversaryServer() as srv:

        async def make_benign() -> None:
            srv.benign()

        for seed in seeds(SCHEDULES, offset):
            schedule = draw(seed)
            srv.hostile(initial_cap=schedule.server_cap)  # each schedule starts hostile
            await run_schedule(
                schedule,
                srv.url,
                server_streams=srv.open_connections,
                make_benign=make_benign,
            )
            if srv.violations:
                schedule.fail(f"streams opened beyond an acknowledged cap: {srv.violations}")
            if srv.protocol_errors:
                schedule.fail(f"the client broke the protocol: {srv.protocol_errors}")
            report(schedule, f"test_adversary[{anyio_backend}]")
            if baseline_fds is None:
                baseline_fds = open_fds()
        assert srv.streams_seen > 0
    if baseline_fds is not None and ONLY_SEED is None:
        assert open_fds() <= baseline_fds, "file descriptors grew over the schedules"


async def test_adversary_node(anyio_backend: str) -> None:
    offset = 0 if anyio_backend == "asyncio" else 500
    with NodeH2Server() as node:

        def server_streams() -> list[tuple[int, int]]:
            stats = node.stats()
            return [(s["id"], s["open"]) for s in stats["perSession"] if s["live"]]

        async def make_benign() -> None:
            return None  # Node's effects are per request; the probe's plan is plain

        for seed in seeds(NODE_SCHEDULES, 2000 + offset):
            schedule = draw(seed, node=True)
            # (Node leaves some sessions half-closed after the client's FIN: CLOSE-WAIT.)
            await run_schedule(
                schedule,
                node.url,
                server_streams=server_streams,
                make_benign=make_benign,
                server_sees_close=False,
            )
            report(schedule, f"test_adversary_node[{anyio_backend}]")
