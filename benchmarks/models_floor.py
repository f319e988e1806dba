"""The parsers' floors called as a transport is: floor + httpx's models.

``h11-floor`` and ``httptools-floor`` (``harness.H11FloorDriver``,
``contestants.HttptoolsFloorDriver``) are a bare asyncio ``Protocol`` plus the parser; they
build no ``httpx.Request`` and no ``httpx.Response``.  A transport must: ``TransportDriver``
builds an ``httpx.Request`` per call and reads and closes the ``httpx.Response`` it gets
back.  ``FloorModelsTransport`` is the same Protocol behind ``handle_async_request``:

* the request line and headers come from the ``httpx.Request`` (method, ``raw_path``,
  ``headers.raw``), as any transport must take them;
* the whole response is parsed by the Protocol as in the floor (status, reason, headers,
  body chunks), then handed over as ``httpx.Response(status, headers, stream,
  extensions={"http_version", "reason_phrase"})`` with an iterator-object body stream (no
  async generator), so ``aread()``/``aclose()`` cost what httpx's models cost, no more;
* connections: one per worker, opened before the clock starts and kept in a free list
  (``list.pop``/``append``); no limits, no timeouts, no statistics, no error mapping.

So ``transport / floor+models`` is the part of the gap to the bare floor that is *ours*
(the pool, the slot, timeouts, the exchange's layers), and ``floor+models / floor`` the
part that httpx's transport contract costs any transport.  The contestants are
``h11-floor+models`` and ``httptools-floor+models``; like every transport they run at the
client level too (inside ``httpx.AsyncClient``).
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

import h11
import httpx

__all__ = [
    "H11_MODELS",
    "HTTPTOOLS_MODELS",
    "MODELS_FLOORS",
    "FloorModelsTransport",
    "floor_models_transport",
    "models_available",
]

H11_MODELS = "h11-floor+models"
HTTPTOOLS_MODELS = "httptools-floor+models"
#: The floor-plus-models contestants (the overhead suite adds them when their parser is
#: installed: ``models_available``).
MODELS_FLOORS = (H11_MODELS, HTTPTOOLS_MODELS)


def models_available(name: str) -> bool:
    """Whether the parser of ``name`` is installed (h11 always is)."""
    return name == H11_MODELS or importlib.util.find_spec("httptools") is not None


#: What one exchange hands back: status, reason, headers, body chunks.
Parsed = tuple[int, bytes, list[tuple[bytes, bytes]], list[bytes]]


class _Body(httpx.AsyncByteStream):
    """The parsed body chunks as a response stream: an iterator object, nothing to close."""

    __slots__ = ("_chunks",)

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        if not self._chunks:
            raise StopAsyncIteration
        return self._chunks.pop(0)


class _Conn(asyncio.Protocol):
    """One keep-alive connection; ``exchange`` writes a request and waits for the whole
    response, which ``data_received`` parses (a subclass per parser)."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[Parsed] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # (uvloop's: not a subclass)

    def connection_lost(self, exc: Exception | None) -> None:
        self._resolve_error(ConnectionError("connection lost"))

    def _resolve(self, parsed: Parsed) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(parsed)

    def _resolve_error(self, exc: Exception) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)

    def encode(self, request: httpx.Request) -> bytes:
        raise NotImplementedError

    async def exchange(self, request: httpx.Request) -> Parsed:
        assert self._transport is not None
        data = self.encode(request)
        self._waiter = asyncio.get_running_loop().create_future()
        self._transport.write(data)
        return await self._waiter

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class _H11Conn(_Conn):
    def __init__(self) -> None:
        super().__init__()
        self._h11 = h11.Connection(h11.CLIENT)
        self._head: h11.Response | None = None
        self._body: list[bytes] = []

    def encode(self, request: httpx.Request) -> bytes:
        h = self._h11
        data = h.send(
            h11.Request(
                method=request.method.encode("ascii"),
                target=request.url.raw_path,
                headers=request.headers.raw,
            )
        )
        return (data or b"") + (h.send(h11.EndOfMessage()) or b"")

    def data_received(self, data: bytes) -> None:
        h = self._h11
        h.receive_data(data)
        while True:
            event = h.next_event()
            if event is h11.NEED_DATA:
                return
            if isinstance(event, h11.Response):
                self._head, self._body = event, []
            elif isinstance(event, h11.Data):
                self._body.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                h.start_next_cycle()
                head = self._head
                assert head is not None
                self._resolve((head.status_code, head.reason, head.headers.raw_items(), self._body))
                return
            elif isinstance(event, h11.ConnectionClosed):
                return


class _HttptoolsConn(_Conn):
    def __init__(self) -> None:
        import httptools

        super().__init__()
        self._parser = httptools.HttpResponseParser(self)
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._reason = b""

    def encode(self, request: httpx.Request) -> bytes:
        fields = b"".join(k + b": " + v + b"\r\n" for k, v in request.headers.raw)
        head = request.method.encode("ascii") + b" " + request.url.raw_path + b" HTTP/1.1\r\n"
        return head + fields + b"\r\n"

    # httptools callbacks (the parser calls the ones its protocol object has)
    def on_message_begin(self) -> None:
        self._headers, self._body = [], []

    def on_status(self, reason: bytes) -> None:
        self._reason = reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        status = self._parser.get_status_code()
        self._resolve((status, self._reason, self._headers, self._body))

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)


class FloorModelsTransport(httpx.AsyncBaseTransport):
    """A parser's floor behind ``handle_async_request`` (see the module docstring): one
    origin, ``connections`` keep-alive connections opened by ``start``."""

    def __init__(self, name: str, url: str, connections: int) -> None:
        self.name = name
        parsed = httpx.URL(url)
        self._host, self._port = parsed.host, parsed.port or 80
        self._want = connections
        self._make: type[_Conn] = _H11Conn if name == H11_MODELS else _HttptoolsConn
        self._idle: list[_Conn] = []
        self._all: list[_Conn] = []

    async def start(self) -> FloorModelsTransport:
        loop = asyncio.get_running_loop()
        for _ in range(self._want):
            _, conn = await loop.create_connection(self._make, self._host, self._port)
            self._all.append(conn)
        self._idle = list(self._all)
        return self

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        conn = self._idle.pop()  # (as many connections as workers: never empty)
        try:
            status, reason, headers, body = await conn.exchange(request)
        finally:
            self._idle.append(conn)
        extensions: dict[str, Any] = {"http_version": b"HTTP/1.1", "reason_phrase": reason}
        return httpx.Response(status, headers=headers, stream=_Body(body), extensions=extensions)

    async def aclose(self) -> None:
        for conn in self._all:
            conn.close()
        self._all.clear()
        self._idle.clear()
        await asyncio.sleep(0)  # let the loop run the transports' close callbacks


async def floor_models_transport(
    name: str, urls: Sequence[str], concurrency: int
) -> FloorModelsTransport:
    """The ``name`` contestant (``MODELS_FLOORS``) for ``concurrency`` workers, started."""
    if name not in MODELS_FLOORS:
        raise ValueError(f"unknown floor+models contestant {name!r}")
    if len(urls) != 1:
        raise ValueError(f"{name} serves one origin")
    return await FloorModelsTransport(name, urls[0], concurrency).start()


def pairs() -> list[tuple[str, str]]:
    """The same-round ratios the overhead suites record for ``models_table``."""
    from benchmarks import harness as h  # (harness imports this module)

    return [
        (h.BULKHEAD, H11_MODELS),
        (H11_MODELS, h.FLOOR),
        (h.HTTPTOOLS, HTTPTOOLS_MODELS),
        (HTTPTOOLS_MODELS, h.HTTPTOOLS_FLOOR),
    ]


def _median(row: dict[str, Any], a: str, b: str) -> float | None:
    ratio = row.get("paired", {}).get(f"{a}/{b}")
    return None if ratio is None else float(ratio[0])


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def models_table(rows: Sequence[dict[str, Any]]) -> str:
    """Per codec: floor+models CPU per request, what the models cost over the bare floor,
    the transport against floor+models (the part that is ours), the issue's target
    against the bare floor (met or not), and the share of the gap to the bare floor that
    is ours: ``(transport - floor+models) / (transport - floor)``, from the medians."""
    from benchmarks import harness as h

    bounds = {1: 1.25, 64: 1.4}  # issue 18's targets, transport level, against the bare floor
    lines = [
        "| level | codec | conc. | floor+models µs/req | floor+models / floor | transport /"
        " (floor+models) | transport / floor | target (vs floor) | ours, share of the gap |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    codecs = (("h11", h.BULKHEAD, H11_MODELS, h.FLOOR),
              ("httptools", h.HTTPTOOLS, HTTPTOOLS_MODELS, h.HTTPTOOLS_FLOOR))  # fmt: skip
    for row in rows:
        for codec, ours, models, floor in codecs:
            summary = row["summary"].get(models)
            if summary is None:
                continue
            vs_models = _median(row, ours, models)
            models_vs_floor = _median(row, models, floor)
            whole = _median(row, ours, floor)
            bound = bounds.get(row["concurrency"])
            if whole is None or bound is None or row["level"] != "transport":
                target = "-"
            else:
                target = f"<= {bound:.2f}x: " + ("**met**" if whole <= bound else "not met")
            share = "-"
            if vs_models is not None and models_vs_floor is not None and whole not in (None, 1.0):
                share = f"{(whole - models_vs_floor) / (whole - 1.0):.0%}"
            lines.append(
                f"| {row['level']} | {codec} | {row['concurrency']} | {summary['cpu_us']:,.0f}"
                f" | {_x(models_vs_floor)} | {_x(vs_models)} | {_x(whole)} | {target}"
                f" | {share} |"
            )
    return "\n".join(lines)
