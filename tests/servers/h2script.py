"""A scripted HTTP/2 server (``h2`` in server mode) for behaviours real servers avoid.

h2c with prior knowledge (the client sends the connection preface straight away) on
``127.0.0.1:0``, one thread per connection -- built on :class:`~tests.servers.raw.RawServer`,
so events, ``srv.url``/``port``/``connections``, shutdown and handler-failure reporting work
the same way::

    with h2script.serve(max_streams=2) as srv:          # H2ScriptServer
        ...  GET {srv.url}/hold/gate  x3   (3 requests on one or more connections)
        await srv.until_held("gate", 2)                 # 2 requests are being held
        assert srv.max_open_streams_per_connection <= 2
        srv.release("gate")                             # answers them (and later ones)

Routes (``:path``, query string ignored):

* ``/hold/<name>`` -- answered only once the test sets event ``<name>`` (``srv.release``);
  the connection keeps reading and serving other streams meanwhile.
* ``/bytes/<n>`` -- ``n`` bytes of ``b"x"`` (flow-controlled: honours the client's windows).
* ``/echo`` -- the request body.
* ``/count`` -- ``b"received:<n>"``, the request body's length, once it is complete.
* ``/status/<code>`` -- that status, body ``b"status:<code>"``.
* ``/early/<status>`` -- answered with ``<status>`` as soon as the request HEADERS arrive,
  before the body; the body is never read (its stream window is never reopened, the
  connection window is) and the stream is never reset by the server.
* ``/stall/<name>`` -- the body is not read (stream window never reopened) until event
  ``<name>`` is set; then it is read and answered as ``/count``. Once the client has
  used up the stream's window, the stream is *stalled* (event ``"stalled"``,
  ``srv.stalled``); :meth:`H2ScriptServer.reset_stalled` and
  :meth:`H2ScriptServer.goaway_now` act on stalled uploads.
* ``/lie/<declared>/<actual>`` -- ``content-length: <declared>`` with ``<actual>`` bytes.
* anything else -- ``b"stream:<stream id>"``.

Every response (``200`` unless the route says otherwise) has ``content-length``,
``x-conn: <connection index>`` and ``x-stream-id: <id>``; a released held stream gets the
same body as an unheld one.

Behaviours (constructor options; the factories at the bottom name the usual ones):
``max_streams`` (SETTINGS_MAX_CONCURRENT_STREAMS, changeable live with
:meth:`H2ScriptServer.set_max_streams`), ``hold`` (hold *every* request on one event),
``goaway_after``, ``ack_pings=False``, ``wrong_ping_acks`` (ACK with another payload),
``interim`` (1xx responses sent before every final one), ``resets`` (RST_STREAM per path)
and ``settings_zero``. They compose.

Accounting (thread-safe, all read under the server lock): a stream is *open* from its
HEADERS until it is answered (END_STREAM sent), reset by either side, ignored after a
GOAWAY, or its connection ends. ``srv.open_streams`` / ``srv.max_open_streams`` count
over all connections, ``srv.max_open_streams_per_connection`` and
``srv.connection_stats`` per connection.

Named events set by the server (wait with ``await srv.until_event(name)``, a synonym of
``RawServer.wait_event``):

* ``"<name>.entered"`` -- a first request is held on ``<name>``.
* ``"settings-acked"`` / ``"settings-acked-<n>"`` -- the client ACKed a SETTINGS frame of
  ours (``<n>``: the MAX_CONCURRENT_STREAMS it carried; the initial SETTINGS count too).
* ``"ping-received"``, ``"stalled"``, ``"goaway-sent"``, ``"goaway-done"`` (the streams kept by the
  GOAWAY are answered; the server then closes the connection), ``"client-goaway"``,
  ``"over-cap"`` (a client opened a stream beyond the acknowledged cap),
  ``"conn-<index>.closed"`` (that connection's thread is done with it).

Events stay set; ``srv.event(name).clear()`` re-arms one (e.g. to see a second ACK of
the same value).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import re
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
from hyperframe.frame import GoAwayFrame, PingFrame

from .raw import DEFAULT_TIMEOUT, RECV_SIZE, RawConn, RawServer, run_blocking

__all__ = [
    "DEFAULT_MAX_STREAMS",
    "H2ConnStats",
    "H2Reset",
    "H2ScriptServer",
    "H2Stream",
    "Outcome",
    "change_cap",
    "goaway_after",
    "never_ping",
    "refuse_stream",
    "reset_stream",
    "serve",
    "settings_zero",
]

#: h2's own default for SETTINGS_MAX_CONCURRENT_STREAMS on a server.
DEFAULT_MAX_STREAMS = 100
_MCS = h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS
_WINDOW = h2.settings.SettingCodes.INITIAL_WINDOW_SIZE
_PING = 0x6
_ACK = 0x1

Outcome = Literal["open", "held", "answered", "reset", "refused", "cancelled", "ignored", "dropped"]
"""What became of a stream. ``open``: request still arriving or being answered; ``held``:
waiting for its event; ``answered``: END_STREAM sent; ``reset``: we sent RST_STREAM
(:class:`H2Reset`); ``refused``: RST_STREAM REFUSED_STREAM because it exceeded the
acknowledged cap or came above a GOAWAY with ``goaway_refuse_above``; ``cancelled``: the
client reset it; ``ignored``: above our GOAWAY's last_stream_id, never processed;
``dropped``: the connection ended while it was open."""


@dataclass
class H2Stream:
    """One request stream as the server saw it (snapshots are handed out)."""

    conn: int
    """Index of its connection (accept order, as ``RawConn.index``)."""
    stream_id: int
    method: str
    path: str
    """``:path`` as sent (query string included)."""
    headers: list[tuple[str, str]]
    body: bytes = b""
    outcome: Outcome = "open"
    error_code: int | None = None
    """The RST_STREAM code, for ``reset``/``refused``/``cancelled``."""


@dataclass
class H2ConnStats:
    """Per-connection accounting (snapshots are handed out)."""

    index: int
    open_streams: int = 0
    max_open_streams: int = 0
    stream_ids: list[int] = field(default_factory=list)
    """Every stream id received, in arrival order."""
    advertised_cap: int | None = None
    """The MAX_CONCURRENT_STREAMS last sent (``None``: not advertised, i.e. unlimited)."""
    acked_cap: int | None = None
    """The MAX_CONCURRENT_STREAMS the client last ACKed (``None``: none yet/unlimited)."""
    goaway_last_stream_id: int | None = None
    closed: bool = False


@dataclass(frozen=True)
class H2Reset:
    """Reset requests to one path with RST_STREAM ``code``.

    ``after_headers``: send a ``200`` response head first, then the reset. ``times``:
    only the first ``times`` such requests (over all connections); later ones are
    answered normally (``None``: all of them).
    """

    code: int = h2.errors.ErrorCodes.INTERNAL_ERROR
    after_headers: bool = False
    times: int | None = None


class _LenientSettings(h2.settings.Settings):
    """h2 treats a HEADERS frame beyond our MAX_CONCURRENT_STREAMS as a *connection* error
    (``TooManyStreamsError``, GOAWAY PROTOCOL_ERROR) and reads the limit only through this
    property. Reporting "unlimited" here lets the server record the violation itself and
    refuse just that stream (RFC 9113 §5.1.2 allows a stream error). The value on the
    wire is still the real one (``self[MAX_CONCURRENT_STREAMS]``)."""

    @property
    def max_concurrent_streams(self) -> int:
        return 2**31 - 1

    @max_concurrent_streams.setter
    def max_concurrent_streams(self, value: int) -> None:
        self[_MCS] = value


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _strip_ping_acks(data: bytes) -> bytes:
    """Drop PING frames with the ACK flag from a run of whole serialized frames."""
    out = bytearray()
    i = 0
    while i + 9 <= len(data):
        end = i + 9 + int.from_bytes(data[i : i + 3], "big")
        if not (data[i + 3] == _PING and data[i + 4] & _ACK):
            out += data[i:end]
        i = end
    out += data[i:]
    return bytes(out)


_LIE = re.compile(r"/lie/\d+/\d+")


def _hold_name(path: str) -> str | None:
    path = path.split("?", 1)[0]
    return path[len("/hold/") :] if path.startswith("/hold/") and len(path) > 6 else None


class H2ScriptServer(RawServer):
    """Scripted HTTP/2 server; see the module docstring. Use as a context manager.

    Options:

    * ``max_streams`` -- SETTINGS_MAX_CONCURRENT_STREAMS in the initial SETTINGS
      (``None``: not sent, i.e. unlimited).
    * ``hold`` -- hold every request (any path) on this event, as if ``/hold/<hold>``.
    * ``goaway_after`` -- once that many requests are held on a connection, send GOAWAY
      (NO_ERROR) with ``last_stream_id`` = the id of the ``goaway_keep``-th held stream
      (lowest ids first; ``goaway_keep=0`` gives ``last_stream_id=0``). Held streams
      above it, and any stream the client opens later, are ``ignored`` (or
      RST_STREAM REFUSED_STREAM with ``goaway_refuse_above``); those at/below it are
      answered at once (or stay held until their event with ``goaway_answer_kept=False``);
      when they are done the server half-closes (FIN), waits for the client's EOF and
      closes. The GOAWAY frame is written raw (hyperframe): h2's ``close_connection``
      puts its state machine in CLOSED and would refuse to answer the kept streams.
    * ``ack_pings`` -- ``False``: never ACK a PING (h2 queues the ACK itself; the server
      filters it out of the outgoing bytes). Pings are still recorded (``srv.pings``).
    * ``wrong_ping_acks`` -- answer every PING with an ACK carrying other bytes than the
      PING's (RFC 9113 §6.7 requires the same payload).
    * ``interim`` -- informational statuses (``(100,)``, ``(100, 103)``...) sent on every
      stream as soon as its request HEADERS arrive, before anything else.
    * ``resets`` -- ``{path: H2Reset(...)}``: RST_STREAM for requests to that exact path
      (query string ignored), once the request is complete.
    * ``settings_zero`` -- after the first response on a connection, send
      SETTINGS_MAX_CONCURRENT_STREAMS=0 on it.

    Streams the client opens beyond the cap it has ACKed (or beyond the higher of old
    and new values while a change is unacknowledged) are recorded in ``srv.violations``,
    counted as open for the accounting, then refused (RST_STREAM REFUSED_STREAM).
    """

    def __init__(
        self,
        *,
        max_streams: int | None = DEFAULT_MAX_STREAMS,
        hold: str | None = None,
        goaway_after: int | None = None,
        goaway_keep: int = 1,
        goaway_answer_kept: bool = True,
        goaway_refuse_above: bool = False,
        ack_pings: bool = True,
        wrong_ping_acks: bool = False,
        interim: Sequence[int] = (),
        resets: Mapping[str, H2Reset] | None = None,
        settings_zero: bool = False,
        join_timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        super().__init__(self._serve_connection, join_timeout=join_timeout)
        if goaway_after is not None and not 0 <= goaway_keep <= goaway_after:
            raise ValueError("goaway_keep must be between 0 and goaway_after")
        self.hold = hold
        self.goaway_after = goaway_after
        self.goaway_keep = goaway_keep
        self.goaway_answer_kept = goaway_answer_kept
        self.goaway_refuse_above = goaway_refuse_above
        self.ack_pings = ack_pings and not wrong_ping_acks
        self.wrong_ping_acks = wrong_ping_acks
        self.interim = tuple(interim)
        self.settings_zero = settings_zero
        self._resets = dict(resets or {})
        self._reset_counts: collections.Counter[str] = collections.Counter()
        self._cap = max_streams
        self._cap_generation = 0
        self._wakers_lock = threading.Lock()
        self._wakers: dict[int, socket.socket] = {}
        # accounting, under self._cond
        self._conn_stats: dict[int, H2ConnStats] = {}
        self._streams: list[H2Stream] = []
        self._open = 0
        self._max_open = 0
        self._held_now: collections.Counter[str] = collections.Counter()
        self._entered: collections.Counter[str] = collections.Counter()
        self._answered: list[tuple[int, int]] = []
        self._settings_acks: list[tuple[int, int | None]] = []
        self._goaways: list[tuple[int, int]] = []
        self._pings: list[tuple[int, bytes]] = []
        self._violations: list[H2Stream] = []
        self._protocol_errors: list[str] = []
        self._client_goaways: list[tuple[int, int | None]] = []
        self._client_resets: list[tuple[int, int, int]] = []
        self._bytes_after_client_goaway = b""
        self._stalled: list[tuple[int, int]] = []
        self._commands: list[Callable[[_Connection], None]] = []

    def __enter__(self) -> H2ScriptServer:
        super().__enter__()
        return self

    def __repr__(self) -> str:
        return f"<H2ScriptServer http://{self.host}:{self._port or '?'}>"

    # ---- control

    def set_max_streams(self, n: int) -> None:
        """Advertise SETTINGS_MAX_CONCURRENT_STREAMS=``n`` from now on: every live
        connection sends a SETTINGS frame (from its own thread, woken at once), new
        connections start with it. Wait for the client with
        ``await srv.until_event(f"settings-acked-{n}")``."""
        with self._cond:
            self._cap = n
            self._cap_generation += 1
        self._wake_all()

    def release(self, name: str) -> None:
        """Answer the requests held on ``name``, and later ones at once (sets the event)."""
        self.set_event(name)

    def command(self, action: Callable[[_Connection], None]) -> None:
        """Run ``action(conn)`` once in the thread of every connection open now (woken at
        once; connections accepted later do not run it)."""
        with self._cond:
            self._commands.append(action)
        self._wake_all()

    def reset_stalled(self, code: int = h2.errors.ErrorCodes.INTERNAL_ERROR) -> None:
        """RST_STREAM ``code`` on every stalled upload (see ``/stall/<name>``)."""
        self.command(lambda conn: conn.reset_stalled(code))

    def open_stalled(self, then: bytes = b"") -> None:
        """Reopen the windows of the stalled uploads (WINDOW_UPDATE) and send ``then`` (an
        invalid frame, say) in the same write, so the client reads both at once."""
        self.command(lambda conn: conn.open_stalled(then))

    def send_raw(self, data: bytes) -> None:
        """Send ``data`` (an invalid frame, say) on every open connection, after what h2
        has queued."""
        self.command(lambda conn: conn.raw.send(conn.h2.data_to_send() + data))

    def set_initial_window(self, size: int) -> None:
        """SETTINGS_INITIAL_WINDOW_SIZE=``size`` on every open connection (one SETTINGS
        frame: send the next only once the client has acknowledged this one)."""
        self.command(lambda conn: conn.set_initial_window(size))

    def mute(self) -> None:
        """Make every open connection a dead peer: it still reads (``srv.pings`` and
        events keep working) but never sends another byte. Event ``"muted"`` once done."""
        self.command(_Connection.mute)

    def goaway_now(self, last_stream_id: int = 0) -> None:
        """GOAWAY (NO_ERROR, ``last_stream_id``) on every open connection: streams above it
        are ``ignored``; the others finish, then the connection closes."""
        self.command(lambda conn: conn.send_goaway(last_stream_id))

    # ---- accounting (snapshots)

    @property
    def open_streams(self) -> int:
        """Streams open now, over all connections."""
        with self._cond:
            return self._open

    @property
    def max_open_streams(self) -> int:
        """Peak of :attr:`open_streams` (all connections together)."""
        with self._cond:
            return self._max_open

    @property
    def max_open_streams_per_connection(self) -> int:
        """The highest number of streams ever open at once on any single connection."""
        with self._cond:
            return max((s.max_open_streams for s in self._conn_stats.values()), default=0)

    @property
    def connection_stats(self) -> list[H2ConnStats]:
        """Per-connection accounting, by connection index."""
        with self._cond:
            return [
                dataclasses.replace(s, stream_ids=list(s.stream_ids))
                for _, s in sorted(self._conn_stats.items())
            ]

    @property
    def streams(self) -> list[H2Stream]:
        """Every stream received, in arrival order."""
        with self._cond:
            return [dataclasses.replace(s, headers=list(s.headers)) for s in self._streams]

    @property
    def stream_ids(self) -> list[tuple[int, int]]:
        """``(connection index, stream id)`` of every stream received, in arrival order."""
        with self._cond:
            return [(s.conn, s.stream_id) for s in self._streams]

    @property
    def answered(self) -> list[tuple[int, int]]:
        """``(connection index, stream id)`` of every stream answered, in order."""
        with self._cond:
            return list(self._answered)

    def held(self, name: str) -> int:
        """Requests held on ``name`` right now."""
        with self._cond:
            return self._held_now[name]

    def entered(self, name: str) -> int:
        """Requests that were ever held on ``name`` (monotonic)."""
        with self._cond:
            return self._entered[name]

    @property
    def settings_acks(self) -> list[tuple[int, int | None]]:
        """``(connection index, MAX_CONCURRENT_STREAMS value)`` per SETTINGS ACK received."""
        with self._cond:
            return list(self._settings_acks)

    @property
    def goaways(self) -> list[tuple[int, int]]:
        """``(connection index, last_stream_id)`` per GOAWAY sent."""
        with self._cond:
            return list(self._goaways)

    @property
    def client_goaways(self) -> list[tuple[int, int | None]]:
        """``(connection index, error code)`` per GOAWAY received from the client."""
        with self._cond:
            return list(self._client_goaways)

    @property
    def client_resets(self) -> list[tuple[int, int, int]]:
        """``(connection index, stream id, error code)`` per RST_STREAM received."""
        with self._cond:
            return list(self._client_resets)

    @property
    def bytes_after_client_goaway(self) -> bytes:
        """What a client sent after its own GOAWAY (nothing, from a correct one)."""
        with self._cond:
            return self._bytes_after_client_goaway

    @property
    def stalled(self) -> list[tuple[int, int]]:
        """``(connection index, stream id)`` of every upload that stalled on ``/stall/``."""
        with self._cond:
            return list(self._stalled)

    @property
    def pings(self) -> list[tuple[int, bytes]]:
        """``(connection index, opaque data)`` per PING received (not ACKs)."""
        with self._cond:
            return list(self._pings)

    @property
    def violations(self) -> list[H2Stream]:
        """Streams opened beyond the acknowledged cap (then refused)."""
        with self._cond:
            return [dataclasses.replace(s) for s in self._violations]

    @property
    def protocol_errors(self) -> list[str]:
        """h2 ``ProtocolError``s raised by client frames (the connection was closed)."""
        with self._cond:
            return list(self._protocol_errors)

    # ---- waiting

    def wait_until(
        self, predicate: Callable[[], bool], timeout: float = DEFAULT_TIMEOUT, what: str = ""
    ) -> None:
        """Block until ``predicate()`` (called under the server lock, so read the private
        counters or use the public properties -- the lock is re-entrant) holds;
        ``TimeoutError`` otherwise."""
        with self._cond:
            if not self._cond.wait_for(predicate, timeout):
                raise TimeoutError(f"H2ScriptServer: {what or predicate} not within {timeout}s")

    def wait_held(self, name: str, k: int = 1, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Block until at least ``k`` requests have been held on ``name`` (counted by
        :meth:`entered`, so releasing does not undo it)."""
        self.wait_until(lambda: self._entered[name] >= k, timeout, f"{k} held on {name!r}")

    async def until_held(self, name: str, k: int = 1, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Async (asyncio/trio) version of :meth:`wait_held`."""
        await run_blocking(functools.partial(self.wait_held, name, k, timeout))

    def wait_open_streams(self, n: int, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Block until at least ``n`` streams are open at once (all connections)."""
        self.wait_until(lambda: self._open >= n, timeout, f"{n} open streams")

    async def until_open_streams(self, n: int, timeout: float = DEFAULT_TIMEOUT) -> None:
        await run_blocking(functools.partial(self.wait_open_streams, n, timeout))

    def wait_idle(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Block until no stream is open."""
        self.wait_until(lambda: self._open == 0, timeout, "no open stream")

    async def until_idle(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        await run_blocking(functools.partial(self.wait_idle, timeout))

    def wait_answered(self, n: int, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Block until at least ``n`` streams were answered (all connections)."""
        self.wait_until(lambda: len(self._answered) >= n, timeout, f"{n} answered")

    async def until_answered(self, n: int, timeout: float = DEFAULT_TIMEOUT) -> None:
        await run_blocking(functools.partial(self.wait_answered, n, timeout))

    async def until_event(self, name: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Same as :meth:`RawServer.wait_event` (asyncio/trio)."""
        await self.wait_event(name, timeout)

    # ---- internals: wake-ups

    def _notify(self) -> None:
        super()._notify()
        self._wake_all()  # a ServerEvent was set: held streams may be releasable

    def _wake_all(self) -> None:
        with self._wakers_lock:
            for waker in self._wakers.values():
                with contextlib.suppress(OSError):  # full (already woken) or closing
                    waker.send(b"\0")

    # ---- internals: accounting (connection threads)

    def _set(self, *names: str) -> None:
        for name in names:
            self.event(name).set()

    def _conn_opened(self, index: int) -> tuple[int | None, int]:
        """Register a connection; returns the cap to advertise and its generation."""
        with self._cond:
            self._conn_stats[index] = H2ConnStats(index=index, advertised_cap=self._cap)
            return self._cap, self._cap_generation

    def _stream_opened(self, rec: H2Stream) -> None:
        with self._cond:
            stats = self._conn_stats[rec.conn]
            stats.stream_ids.append(rec.stream_id)
            stats.open_streams += 1
            stats.max_open_streams = max(stats.max_open_streams, stats.open_streams)
            self._open += 1
            self._max_open = max(self._max_open, self._open)
            self._streams.append(rec)
            self._record_request(
                f"{rec.method} {rec.path} HTTP/2\r\nx-conn: {rec.conn}\r\n"
                f"x-stream-id: {rec.stream_id}\r\n\r\n".encode()
            )

    def _stream_held(self, rec: H2Stream, name: str) -> None:
        with self._cond:
            rec.outcome = "held"
            self._held_now[name] += 1
            self._entered[name] += 1
            self._cond.notify_all()
        self._set(f"{name}.entered")

    def _stream_unheld(self, name: str) -> None:
        with self._cond:
            self._held_now[name] -= 1

    def _stream_closed(
        self, rec: H2Stream, outcome: Outcome, error_code: int | None = None
    ) -> None:
        with self._cond:
            rec.outcome = outcome
            rec.error_code = error_code
            self._conn_stats[rec.conn].open_streams -= 1
            self._open -= 1
            if outcome == "answered":
                self._answered.append((rec.conn, rec.stream_id))
            self._cond.notify_all()

    def _violation(self, rec: H2Stream) -> None:
        with self._cond:
            self._violations.append(rec)
        self._set("over-cap")

    def _take_reset(self, path: str) -> H2Reset | None:
        key = path.split("?", 1)[0]
        spec = self._resets.get(key)
        if spec is None:
            return None
        with self._cond:
            if spec.times is not None and self._reset_counts[key] >= spec.times:
                return None
            self._reset_counts[key] += 1
        return spec

    def _cap_sent(self, index: int, cap: int | None) -> None:
        with self._cond:
            self._conn_stats[index].advertised_cap = cap

    def _settings_acked(self, index: int, cap: int | None) -> None:
        with self._cond:
            self._conn_stats[index].acked_cap = cap
            self._settings_acks.append((index, cap))
        self._set("settings-acked", *([] if cap is None else [f"settings-acked-{cap}"]))

    def _ping_received(self, index: int, data: bytes) -> None:
        with self._cond:
            self._pings.append((index, data))
        self._set("ping-received")

    def _goaway_sent(self, index: int, last_stream_id: int) -> None:
        with self._cond:
            self._conn_stats[index].goaway_last_stream_id = last_stream_id
            self._goaways.append((index, last_stream_id))
        self._set("goaway-sent")

    def _after_client_goaway(self, data: bytes) -> None:
        with self._cond:
            self._bytes_after_client_goaway += data

    def _client_reset(self, index: int, stream_id: int, code: int) -> None:
        with self._cond:
            self._client_resets.append((index, stream_id, code))

    def _stream_stalled(self, index: int, stream_id: int) -> None:
        with self._cond:
            self._stalled.append((index, stream_id))
        self._set("stalled")

    def _pending_commands(self, seen: int) -> list[Callable[[_Connection], None]]:
        with self._cond:
            return self._commands[seen:]

    def _client_goaway(self, index: int, code: int | None) -> None:
        with self._cond:
            self._client_goaways.append((index, code))
        self._set("client-goaway")

    def _protocol_error(self, index: int, exc: h2.exceptions.ProtocolError) -> None:
        with self._cond:
            self._protocol_errors.append(f"conn {index}: {exc!r}")

    def _conn_done(self, index: int, leftovers: list[H2Stream]) -> None:
        for rec in leftovers:
            self._stream_closed(rec, "dropped")
        with self._cond:
            self._conn_stats[index].closed = True
        self._set(f"conn-{index}.closed")

    # ---- internals: per connection

    def _serve_connection(self, raw: RawConn) -> None:
        _Connection(self, raw).run()


class _Connection:
    """One HTTP/2 connection; runs entirely in its RawServer handler thread."""

    def __init__(self, server: H2ScriptServer, raw: RawConn) -> None:
        self.server = server
        self.raw = raw
        self.index = raw.index
        cap, self.cap_generation = server._conn_opened(self.index)
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        self.h2 = h2.connection.H2Connection(config=config)
        initial: dict[h2.settings.SettingCodes, int] = {
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: (
                h2.connection.H2Connection.DEFAULT_MAX_HEADER_LIST_SIZE
            )
        }
        if cap is not None:
            initial[_MCS] = cap
        self.h2.local_settings = _LenientSettings(client=False, initial_values=initial)
        self.unacked: collections.deque[int | None] = collections.deque([cap])
        self.acked: int | None = None  # None: not yet ACKed, or unlimited
        self.streams: dict[int, H2Stream] = {}  # open ones
        self.held: dict[int, str] = {}
        self.sending: dict[int, bytearray] = {}
        self.goaway_last: int | None = None
        self.unread: dict[int, int] = {}  # streams whose body is not read: bytes received
        self.stalls: dict[int, str] = {}  # /stall/<name> streams not released yet
        self.stalled: set[int] = set()  # ... whose stream window the client has used up
        self.responded: set[int] = set()  # response HEADERS sent
        self.muted = False
        self.client_went_away = False
        self.commands_seen = len(server._pending_commands(0))
        self.zeroed = False
        self.finished = False
        self.graceful = False

    # ---- main loop

    def run(self) -> None:
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        with self.server._wakers_lock:
            self.server._wakers[self.index] = wake_w
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(self.raw.sock, selectors.EVENT_READ)
                sel.register(wake_r, selectors.EVENT_READ)
                self.h2.initiate_connection()
                self.flush()
                while not self.finished and not self.raw.stopping:
                    self.progress()
                    self.flush()
                    if self.finished:
                        break
                    for key, _ in sel.select():
                        if key.fileobj is wake_r:
                            with contextlib.suppress(OSError):
                                wake_r.recv(4096)
                        else:
                            data = self.raw.recv(RECV_SIZE)
                            if not data:
                                return
                            self.receive(data)
                            self.flush()
            if self.graceful:
                self.linger()
        finally:
            with self.server._wakers_lock:
                del self.server._wakers[self.index]
            wake_r.close()
            wake_w.close()
            self.server._conn_done(self.index, list(self.streams.values()))

    def mute(self) -> None:
        self.muted = True
        self.server._set("muted")

    def flush(self) -> None:
        data = self.h2.data_to_send()
        if self.muted:
            return
        if data and not self.server.ack_pings:
            data = _strip_ping_acks(data)
        if data:
            self.raw.send(data)

    def linger(self) -> None:
        """Half-close, then read until the client's EOF: closing with unread input would
        make the kernel send RST, which can destroy responses the client has not read."""
        with contextlib.suppress(OSError):
            self.raw.sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + self.server.join_timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.raw.sock, selectors.EVENT_READ)
            while (left := deadline - time.monotonic()) > 0:
                if not sel.select(left):
                    continue
                data = self.raw.recv(RECV_SIZE)
                if not data:
                    return
                if self.client_went_away:
                    self.server._after_client_goaway(data)

    # ---- incoming

    def receive(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:  # h2 queued a GOAWAY
            self.server._protocol_error(self.index, exc)
            self.finished = self.graceful = True
            return
        for event in events:
            if self.finished:
                break
            self.handle(event)

    def handle(self, event: h2.events.Event) -> None:
        ev = h2.events
        if isinstance(event, ev.RequestReceived):
            self.on_request(event)
        elif isinstance(event, ev.DataReceived):
            sid, size = event.stream_id, event.flow_controlled_length
            rec = self.streams.get(sid)
            if rec is not None:
                rec.body += event.data
            if sid in self.unread:
                # Not read: only the connection window is given back, so the client's
                # stream window stays used up (and other streams are not starved).
                self.unread[sid] += size
                if size:
                    self.h2.increment_flow_control_window(size)
                window = self.h2.local_settings.initial_window_size
                if sid in self.stalls and sid not in self.stalled and self.unread[sid] >= window:
                    self.stalled.add(sid)
                    self.server._stream_stalled(self.index, sid)
            elif size:
                self.h2.acknowledge_received_data(size, sid)
        elif isinstance(event, ev.StreamEnded):
            self.on_request_complete(event.stream_id)
        elif isinstance(event, ev.StreamReset):
            self.unread.pop(event.stream_id, None)
            self.server._client_reset(self.index, event.stream_id, int(event.error_code))
            if event.stream_id in self.streams:
                self.close_stream(event.stream_id, "cancelled", int(event.error_code))
        elif isinstance(event, ev.SettingsAcknowledged):
            cap = self.unacked.popleft() if self.unacked else None
            self.acked = cap
            self.server._settings_acked(self.index, cap)
        elif isinstance(event, ev.PingReceived):
            self.server._ping_received(self.index, event.ping_data)
            if self.server.wrong_ping_acks:
                self.flush()  # keep frame order (h2's own ACK is filtered out)
                wrong = bytes(b ^ 0xFF for b in event.ping_data)
                self.raw.send(PingFrame(0, opaque_data=wrong, flags=["ACK"]).serialize())
        elif isinstance(event, ev.ConnectionTerminated):
            code = None if event.error_code is None else int(event.error_code)
            self.server._client_goaway(self.index, code)
            self.finished = True  # h2 is CLOSED now: it would refuse to send anything
            self.graceful = self.client_went_away = True  # record what else comes

    def enforced_cap(self) -> int | None:
        """The stream limit the client must be respecting now (``None``: unknown)."""
        if self.acked is None:
            return None
        return max([self.acked, *(c for c in self.unacked if c is not None)])

    def on_request(self, event: h2.events.RequestReceived) -> None:
        headers = [(_text(k), _text(v)) for k, v in event.headers]
        pseudo = dict(headers)
        sid = event.stream_id
        rec = H2Stream(
            conn=self.index,
            stream_id=sid,
            method=pseudo.get(":method", ""),
            path=pseudo.get(":path", ""),
            headers=headers,
        )
        self.streams[sid] = rec
        self.server._stream_opened(rec)
        cap = self.enforced_cap()
        if cap is not None and len(self.streams) > cap:
            self.server._violation(rec)
            self.reset(sid, h2.errors.ErrorCodes.REFUSED_STREAM, "refused")
            return
        if self.goaway_last is not None and sid > self.goaway_last:
            self.drop_above_goaway(sid)
            return
        for status in self.server.interim:
            self.h2.send_headers(sid, [(":status", str(status))])
        path = rec.path.split("?", 1)[0]
        if path.startswith("/early/") and path[7:].isdigit():
            self.unread[sid] = 0
            self.respond(sid, int(path[7:]), b"early")
        elif path.startswith("/stall/") and len(path) > 7:
            self.unread[sid] = 0
            self.stalls[sid] = path[7:]

    def on_request_complete(self, sid: int) -> None:
        if sid not in self.stalls:
            self.unread.pop(sid, None)
        rec = self.streams.get(sid)
        if rec is None or rec.outcome != "open" or sid in self.responded:
            return
        h2_stream = self.h2.streams.get(sid)
        if h2_stream is None or h2_stream.closed:
            return  # reset by the client in the same read as its END_STREAM: that event follows
        spec = self.server._take_reset(rec.path)
        if spec is not None:
            if spec.after_headers:
                self.h2.send_headers(sid, self.response_head(sid, None))
            self.reset(sid, spec.code, "reset")
            return
        name = self.server.hold or _hold_name(rec.path)
        if name is None:
            self.respond(sid)
        else:
            self.held[sid] = name
            self.server._stream_held(rec, name)

    # ---- outgoing

    def progress(self) -> None:
        """Everything that does not wait for input: commands, cap changes, releases,
        GOAWAY, data."""
        commands = self.server._pending_commands(self.commands_seen)
        self.commands_seen += len(commands)
        for action in commands:
            action(self)
        for sid, name in list(self.stalls.items()):
            if self.server.event(name).is_set():
                del self.stalls[sid]
                self.stalled.discard(sid)
                received = self.unread.pop(sid, 0)
                if received and sid in self.streams:
                    self.h2.increment_flow_control_window(received, stream_id=sid)
        with self.server._cond:
            cap, generation = self.server._cap, self.server._cap_generation
        if generation != self.cap_generation and cap is not None:
            self.cap_generation = generation
            self.send_cap(cap)
        k = self.server.goaway_after
        if k is not None and self.goaway_last is None and len(self.held) >= k:
            self.goaway_after_held()
        for sid, name in list(self.held.items()):
            if self.server.event(name).is_set():
                self.respond(sid)
        self.pump()
        if self.goaway_last is not None and not any(
            sid <= self.goaway_last for sid in self.streams
        ):
            self.server._set("goaway-done")
            self.finished = self.graceful = True

    def set_initial_window(self, size: int) -> None:
        self.h2.update_settings({_WINDOW: size})
        self.unacked.append(self.enforced_cap())  # (its ACK leaves the cap as it is)

    def send_cap(self, cap: int) -> None:
        self.h2.update_settings({_MCS: cap})
        self.unacked.append(cap)
        self.server._cap_sent(self.index, cap)

    def goaway_after_held(self) -> None:
        held = sorted(self.held)
        keep = self.server.goaway_keep
        self.send_goaway(held[keep - 1] if keep else 0)

    def reset_stalled(self, code: int) -> None:
        for sid in sorted(self.stalled):
            self.stalled.discard(sid)
            self.stalls.pop(sid, None)
            self.unread.pop(sid, None)
            if sid in self.streams:
                self.reset(sid, code, "reset")

    def open_stalled(self, then: bytes) -> None:
        for sid in sorted(self.stalled):
            if sid in self.streams:
                self.h2.increment_flow_control_window(self.unread[sid], stream_id=sid)
                self.unread[sid] = 0
        self.stalled.clear()
        self.raw.send(self.h2.data_to_send() + then)

    def send_goaway(self, last: int) -> None:
        self.flush()  # keep frame order: whatever h2 queued goes first
        self.raw.send(GoAwayFrame(0, last_stream_id=last, error_code=0).serialize())
        self.goaway_last = last
        self.server._goaway_sent(self.index, last)
        for sid in [s for s in self.streams if s > last]:
            self.drop_above_goaway(sid)
        if self.server.goaway_answer_kept:
            for sid in [s for s in self.held if s <= last]:
                self.respond(sid)

    def drop_above_goaway(self, sid: int) -> None:
        if self.server.goaway_refuse_above:
            self.reset(sid, h2.errors.ErrorCodes.REFUSED_STREAM, "refused")
        else:
            self.close_stream(sid, "ignored")

    def response_head(self, sid: int, length: int | None) -> list[tuple[str, str]]:
        head = [(":status", "200"), ("x-conn", str(self.index)), ("x-stream-id", str(sid))]
        if length is not None:
            head.insert(1, ("content-length", str(length)))
        return head

    def respond(self, sid: int, status: int = 200, body: bytes | None = None) -> None:
        rec = self.streams[sid]
        path = rec.path.split("?", 1)[0]
        declared: int | None = None
        if body is not None:
            pass
        elif path == "/echo":
            body = rec.body
        elif path == "/count" or path.startswith("/stall/"):
            body = b"received:%d" % len(rec.body)
        elif path.startswith("/bytes/") and path[7:].isdigit():
            body = b"x" * int(path[7:])
        elif path.startswith("/status/") and path[8:].isdigit():
            status = int(path[8:])
            body = b"status:%d" % status
        elif _LIE.fullmatch(path):
            declared, actual = (int(n) for n in path.split("/")[2:])
            body = b"x" * actual
        else:
            body = b"stream:%d" % sid
        self.unhold(sid)
        self.responded.add(sid)
        head = self.response_head(sid, len(body) if declared is None else declared)
        head[0] = (":status", str(status))
        self.h2.send_headers(sid, head, end_stream=not body)
        if body:
            self.sending[sid] = bytearray(body)
            self.pump()
        else:
            self.close_stream(sid, "answered")

    def pump(self) -> None:
        """Send queued bodies as far as the flow-control windows allow."""
        for sid, buf in list(self.sending.items()):
            h2_stream = self.h2.streams.get(sid)
            if h2_stream is None or h2_stream.closed:
                continue  # reset by the client in this read: that event follows
            while buf:
                n = min(
                    len(buf),
                    self.h2.local_flow_control_window(sid),
                    self.h2.max_outbound_frame_size,
                )
                if n <= 0:
                    break
                self.h2.send_data(sid, bytes(buf[:n]), end_stream=n == len(buf))
                del buf[:n]
            if not buf:
                self.close_stream(sid, "answered")

    def reset(self, sid: int, code: int, outcome: Outcome) -> None:
        self.h2.reset_stream(sid, code)
        self.close_stream(sid, outcome, int(code))

    def unhold(self, sid: int) -> None:
        name = self.held.pop(sid, None)
        if name is not None:
            self.server._stream_unheld(name)

    def close_stream(self, sid: int, outcome: Outcome, code: int | None = None) -> None:
        self.unhold(sid)
        self.sending.pop(sid, None)
        self.responded.discard(sid)
        rec = self.streams.pop(sid)
        self.server._stream_closed(rec, outcome, code)
        if outcome == "answered" and self.server.settings_zero and not self.zeroed:
            self.zeroed = True
            self.send_cap(0)


# ------------------------------------------------------------------ factories


def serve(max_streams: int | None = DEFAULT_MAX_STREAMS, hold: str | None = None) -> H2ScriptServer:
    """A well-behaved server advertising MAX_CONCURRENT_STREAMS=``max_streams``.

    ``/hold/<name>`` waits for event ``<name>``; with ``hold``, *every* request waits for
    event ``hold``. Everything else is answered at once with ``b"stream:<id>"``.
    """
    return H2ScriptServer(max_streams=max_streams, hold=hold)


def change_cap(max_streams: int = DEFAULT_MAX_STREAMS, hold: str | None = None) -> H2ScriptServer:
    """Same as :func:`serve`, for tests that lower/raise the cap mid-connection with
    ``srv.set_max_streams(n)`` then ``await srv.until_event(f"settings-acked-{n}")``
    (every server supports that; this name just says what the test is about)."""
    return H2ScriptServer(max_streams=max_streams, hold=hold)


def goaway_after(
    k: int,
    *,
    keep: int = 1,
    answer_kept: bool = True,
    refuse_above: bool = False,
    max_streams: int | None = DEFAULT_MAX_STREAMS,
    hold: str | None = None,
) -> H2ScriptServer:
    """Once ``k`` requests are held on a connection (use ``/hold/<name>`` paths, or
    ``hold``), send GOAWAY with ``last_stream_id`` = id of the ``keep``-th held stream
    (default: the first). Streams above are never processed (``ignored``; or refused with
    ``refuse_above``); those at/below are answered (at once, or when released with
    ``answer_kept=False``), then the connection is closed. Events ``"goaway-sent"``,
    ``"goaway-done"``; ``srv.goaways``, ``srv.answered``, stream outcomes in
    ``srv.streams``."""
    return H2ScriptServer(
        max_streams=max_streams,
        hold=hold,
        goaway_after=k,
        goaway_keep=keep,
        goaway_answer_kept=answer_kept,
        goaway_refuse_above=refuse_above,
    )


def never_ping(
    max_streams: int | None = DEFAULT_MAX_STREAMS, hold: str | None = None
) -> H2ScriptServer:
    """Serves normally but never ACKs a PING (event ``"ping-received"``, ``srv.pings``)."""
    return H2ScriptServer(max_streams=max_streams, hold=hold, ack_pings=False)


def reset_stream(
    path: str,
    code: int = h2.errors.ErrorCodes.INTERNAL_ERROR,
    *,
    after_headers: bool = False,
    times: int | None = None,
    max_streams: int | None = DEFAULT_MAX_STREAMS,
) -> H2ScriptServer:
    """RST_STREAM ``code`` (default INTERNAL_ERROR) for requests to ``path`` -- after a
    ``200`` head with ``after_headers``; only the first ``times`` ones if given.
    Other paths are served normally on the same connection."""
    reset = H2Reset(code=code, after_headers=after_headers, times=times)
    return H2ScriptServer(max_streams=max_streams, resets={path: reset})


def refuse_stream(
    path: str, *, times: int | None = None, max_streams: int | None = DEFAULT_MAX_STREAMS
) -> H2ScriptServer:
    """:func:`reset_stream` with REFUSED_STREAM (the request was not processed, so a
    client may retry it, RFC 9113 §8.7)."""
    return reset_stream(
        path, h2.errors.ErrorCodes.REFUSED_STREAM, times=times, max_streams=max_streams
    )


def settings_zero(max_streams: int | None = DEFAULT_MAX_STREAMS) -> H2ScriptServer:
    """After the first response on each connection, advertise MAX_CONCURRENT_STREAMS=0 on
    it (event ``"settings-acked-0"`` once the client ACKs). Later streams the client
    opens there anyway are ``violations`` and refused."""
    return H2ScriptServer(max_streams=max_streams, settings_zero=True)
