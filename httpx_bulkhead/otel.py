"""OpenTelemetry: the bulkheads' metrics as observable instruments, and span attributes.

Needs ``pip install 'httpx-bulkhead[otel]'`` (``opentelemetry-api`` only; the SDK, the
exporters and their configuration are the application's choice)::

    from httpx_bulkhead import otel

    instrumentation = otel.instrument(transport)  # the global MeterProvider, or give one
    ...
    instrumentation.uninstrument()

**Metrics are pulled.**  ``instrument`` registers *observable* instruments: their callbacks
run when the SDK collects (every export interval, or a Prometheus scrape), and together
take one ``transport.statistics()`` snapshot per collection.  Nothing is called per
request, so an attached meter costs the request path nothing.  The instruments, their
units and descriptions are those of ``_metrics.FIGURES``:

* ``http.client.open_connections`` (``{connection}``, ``http.connection.state`` =
  ``active``/``idle``) and ``http.client.active_requests`` (``{request}``: holding a slot
  or queued for one), from the HTTP semantic conventions as .NET's ``System.Net.Http``
  meter reports them.  They carry ``server.address``, ``server.port`` and ``url.scheme``
  as far as the compartment's key names them (a ``"host"`` key names only the address;
  ``"(evicted)"`` none), and ``network.protocol.version`` (``1.1``/``2``) on
  ``open_connections`` when every connection of the compartment speaks the same one.
* ``httpx_bulkhead.*``: slots in use, waiting requests, configured limits, acquire-wait
  quantiles, rejections, acquire timeouts, outcomes, stale retries, leaked responses,
  connections created and discarded by reason, HTTP/2 connections, streams in use and
  stream caps, GOAWAYs, resets, replays.

Every data point carries ``httpx_bulkhead.compartment``: compartments are bounded by the
transport, and evicted ones fold into ``"(evicted)"``, which reports counters only.

**Histograms are recorded per event** with ``histograms=True`` (off by default: the SDK's
``Histogram.record`` costs 10-30 µs, about 13% of a request through this transport in
``benchmarks/exporters.py``; the Prometheus collector's own histograms cost ~1 µs), where the event
already happens (``_events.py``): ``http.client.request.time_in_queue`` (seconds waited
for a slot and a connection, every acquire that got a response or timed out, 0 included,
so its count and the acquire-wait quantiles describe the same acquires) and
``http.client.connection.duration`` (seconds a connection was open, when it closes).  They
carry the compartment, ``server.*``/``url.scheme`` as above and
``network.protocol.version`` (absent on a queue time that ended in ``AcquireTimeout``).
The attribute dicts are cached per compartment (three at most), so they are bounded like
the compartments.  The SDK keeps a series per compartment name it has seen (for
cumulative temporality), up to its cardinality limit (2,000 per instrument, then the
``otel.metric.overflow`` series): with many short-lived origins, use delta temporality or
a ``View`` dropping ``httpx_bulkhead.compartment``.  A meter provider that raises is logged
once (ERROR) and never fails a request.  Without ``instrument`` (or after
``uninstrument``) nothing is recorded and the request path allocates nothing.

**Tracing.**  ``opentelemetry-instrumentation-httpx`` wraps the client's transport, so
``HTTPXClientInstrumentor.instrument_client(client)`` produces a span per request through
``BulkheadTransport``.  Its global ``HTTPXClientInstrumentor().instrument()`` patches
``httpx.AsyncHTTPTransport`` only, which ``BulkheadTransport`` is not: call
``follow_global_instrumentor()`` once as well, and requests through every
``BulkheadTransport`` get that instrumentor's spans while it is on.  Pass
``response_hook`` to add the bulkhead's facts to each span::

    HTTPXClientInstrumentor.instrument_client(client, response_hook=otel.response_hook)

    HTTPXClientInstrumentor().instrument(async_response_hook=otel.response_hook)
    otel.follow_global_instrumentor()

``HTTPXClientInstrumentor.uninstrument_client`` leaves ``BulkheadTransport``'s
``handle_async_request`` wrapped (it unwraps only ``handle_request``, which our transport
defines to refuse synchronous clients): use ``otel.uninstrument_client(client)``.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any

import httpx
from opentelemetry.metrics import (
    CallbackOptions,
    Histogram,
    MeterProvider,
    Observation,
    get_meter_provider,
)
from opentelemetry.trace import Span

from ._log import logger
from ._metrics import (
    CONNECTION_DURATION,
    FIGURES,
    QUEUE_TIME,
    Figure,
    Kind,
    protocol_version,
    server_attributes,
)
from ._metrics import Histogram as HistogramSpec
from ._stats import EVICTED, CompartmentStats, ExchangeInfo
from ._sync_transport import BulkheadHTTPTransport
from ._transport import BulkheadTransport

__all__ = [
    "METER_NAME",
    "SPAN_ATTRIBUTES",
    "GlobalInstrumentorBridge",
    "Instrumentation",
    "follow_global_instrumentor",
    "instrument",
    "response_hook",
    "uninstrument_client",
]

#: Name of the meter (instrumentation scope) the instruments belong to.
METER_NAME = "httpx_bulkhead"
#: Attribute naming the compartment, on every data point and on spans.
COMPARTMENT = "httpx_bulkhead.compartment"

_Snapshot = dict[str, CompartmentStats]


class _Snapshots:
    """One ``statistics()`` snapshot per collection, shared by every instrument's callback.

    The SDK calls each callback once per collection, in an order of its choosing: a
    callback that finds the snapshot it already read takes a new one (a new collection has
    begun); the others read the one taken.  So the transport is asked once per collection
    whatever the order, and never from the request path.
    """

    def __init__(self, transport: BulkheadTransport | BulkheadHTTPTransport) -> None:
        self._transport: BulkheadTransport | BulkheadHTTPTransport | None = transport
        self._lock = threading.Lock()
        self._generation = -1  # the readers' ``seen``: the first read takes a snapshot
        self._snapshot: _Snapshot = {}

    def detach(self, transport: BulkheadTransport | BulkheadHTTPTransport) -> None:
        """Report nothing from now on, if ``transport`` is the one reported."""
        with self._lock:
            if self._transport is transport:
                self._transport = None
                self._snapshot = {}

    def attach(self, transport: BulkheadTransport | BulkheadHTTPTransport) -> bool:
        """Report ``transport`` from now on, unless another one is attached."""
        with self._lock:
            if self._transport is not None and self._transport is not transport:
                return False
            self._transport = transport
            return True

    def reader(self) -> Callable[[], _Snapshot]:
        """A reader for one callback (it remembers which snapshot it saw last)."""
        seen = -1

        def read() -> _Snapshot:
            nonlocal seen
            with self._lock:
                transport = self._transport
                if transport is None:
                    return {}
                if seen == self._generation:
                    self._snapshot = transport.statistics()
                    self._generation += 1
                seen = self._generation
                return self._snapshot

        return read


def _observations(figure: Figure, snapshot: _Snapshot) -> list[Observation]:
    label = figure.otel_label()
    out: list[Observation] = []
    for name, stats in snapshot.items():
        if name == EVICTED and figure.kind is not Kind.COUNTER:
            continue  # the evicted entry holds no gauges
        base: dict[str, str | int] = {COMPARTMENT: name}
        if figure.semconv:
            base.update(server_attributes(name))
            if figure.otel == "http.client.open_connections":
                version = protocol_version(stats)
                if version is not None:
                    base["network.protocol.version"] = version
        for value_label, value in figure.read(stats):
            attributes = base if label is None else {**base, label: str(value_label)}
            out.append(Observation(value, attributes))
    return out


def _callback(
    figure: Figure, read: Callable[[], _Snapshot]
) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        return _observations(figure, read())

    return callback


class Instrumentation:
    """What ``instrument`` returns: ``uninstrument()`` stops the instruments reporting.

    OpenTelemetry's API cannot remove an instrument from a meter, so after
    ``uninstrument()`` the callbacks stay registered but report nothing and no longer
    hold the transport, and the histograms are no longer fed; instrumenting again on the
    same meter provider reuses them.
    """

    def __init__(
        self,
        snapshots: _Snapshots,
        instruments: list[object],
        transport: BulkheadTransport | BulkheadHTTPTransport,
        histograms: _Histograms | None = None,
    ) -> None:
        self._snapshots = snapshots
        self._transport: BulkheadTransport | BulkheadHTTPTransport | None = transport
        self._histograms = histograms
        #: The observable instruments, in ``FIGURES`` order.
        self.instruments = instruments
        #: The histograms (``time_in_queue``, ``connection.duration``), when recorded.
        self.histograms: list[object] = [] if histograms is None else histograms.instruments()

    def uninstrument(self) -> None:
        """Stop reporting (idempotent)."""
        if self._transport is not None:
            self._snapshots.detach(self._transport)
            if self._histograms is not None:
                self._transport._listen(self._histograms, on=False)
        self._transport = None


class _Provided:
    """What ``instrument`` made on one meter provider: a provider refuses a second
    instrument of the same name, so instrumenting again reuses them."""

    def __init__(self, provider: MeterProvider, snapshots: _Snapshots) -> None:
        self.provider = provider
        self.snapshots = snapshots
        self.instruments = _create(provider, snapshots)
        self._histograms: _Histograms | None = None

    def histograms(self) -> _Histograms:
        if self._histograms is None:
            self._histograms = _Histograms(_meter(self.provider))
        return self._histograms


_instrumented: weakref.WeakKeyDictionary[object, _Provided] = weakref.WeakKeyDictionary()
_instrumented_lock = threading.Lock()


def instrument(
    transport: BulkheadTransport | BulkheadHTTPTransport,
    meter_provider: MeterProvider | None = None,
    *,
    histograms: bool = False,
) -> Instrumentation:
    """Publish ``transport``'s statistics as observable OpenTelemetry instruments, and
    record its per-event histograms.

    Args:
        transport: the transport whose compartments are reported.
        meter_provider: where the instruments are created; ``None`` (default) means the
            global one (``opentelemetry.metrics.get_meter_provider()``).
        histograms: also record ``http.client.request.time_in_queue`` and
            ``http.client.connection.duration`` per event (default ``False``: the
            observable instruments only, nothing on the request path; the SDK's
            ``record`` costs 10-30 µs per request).

    Returns:
        A handle whose ``uninstrument()`` stops the reporting.

    Raises:
        TypeError: ``transport`` is not a ``BulkheadTransport``.
        ValueError: another transport is instrumented on this meter provider (its
            instruments have the same names: uninstrument it first, or give each
            transport its own provider).
    """
    if not isinstance(transport, BulkheadTransport | BulkheadHTTPTransport):
        raise TypeError(f"transport must be a BulkheadTransport, got {type(transport).__name__}")
    provider = get_meter_provider() if meter_provider is None else meter_provider
    with _instrumented_lock:
        known = _instrumented.get(provider)
        if known is None:
            known = _instrumented[provider] = _Provided(provider, _Snapshots(transport))
        elif not known.snapshots.attach(transport):
            raise ValueError(
                "another BulkheadTransport is instrumented on this meter provider:"
                " uninstrument it first, or give each transport its own MeterProvider"
            )
        recorded = known.histograms() if histograms else None
    if recorded is not None:
        transport._listen(recorded)
    return Instrumentation(known.snapshots, known.instruments, transport, recorded)


def _meter(provider: MeterProvider) -> Any:
    from . import __version__

    return provider.get_meter(METER_NAME, __version__)


def _create(provider: MeterProvider, snapshots: _Snapshots) -> list[object]:
    meter = _meter(provider)
    create: dict[Kind, Callable[..., object]] = {
        Kind.COUNTER: meter.create_observable_counter,
        Kind.LEVEL: meter.create_observable_up_down_counter,
        Kind.QUANTILES: meter.create_observable_gauge,
    }
    return [
        create[figure.kind](
            figure.otel,
            callbacks=[_callback(figure, snapshots.reader())],
            unit=figure.unit,
            description=figure.description,
        )
        for figure in FIGURES
    ]


class _Histograms:
    """The per-event histograms of one meter provider: an ``_events.Listener``."""

    def __init__(self, meter: Any) -> None:
        self.queue_time: Histogram = _histogram(meter, QUEUE_TIME)
        self.connection_duration: Histogram = _histogram(meter, CONNECTION_DURATION)
        self._failed = False

    def instruments(self) -> list[object]:
        return [self.queue_time, self.connection_duration]

    def recorder(self, compartment: str) -> _Recorder:
        return _Recorder(self, compartment)

    def retire(self, compartment: str) -> None:
        pass  # the SDK keeps the compartment's series; nothing of ours to fold

    def failed(self) -> None:
        """A record raised (a broken SDK or exporter): log it once, never fail a request."""
        if not self._failed:
            self._failed = True
            logger.error(
                "httpx_bulkhead: recording an OpenTelemetry histogram failed (further"
                " failures are not logged; requests are not affected)",
                exc_info=True,
            )


def _histogram(meter: Any, spec: HistogramSpec) -> Histogram:
    try:  # bucket boundaries as an advisory (opentelemetry-api >= 1.23)
        histogram: Histogram = meter.create_histogram(
            spec.otel,
            unit=spec.unit,
            description=spec.description,
            explicit_bucket_boundaries_advisory=list(spec.buckets),
        )
    except TypeError:  # pragma: no cover - an older API
        histogram = meter.create_histogram(spec.otel, unit=spec.unit, description=spec.description)
    return histogram


class _Recorder:
    """One compartment's histograms, with its attribute dicts (one per protocol version:
    three at most, dropped with the compartment)."""

    __slots__ = ("_attributes", "_base", "_owner")

    def __init__(self, owner: _Histograms, compartment: str) -> None:
        self._owner = owner
        self._base: dict[str, str | int] = {COMPARTMENT: compartment}
        self._base.update(server_attributes(compartment))
        self._attributes: dict[str | None, dict[str, str | int]] = {}

    def _for(self, protocol: str | None) -> dict[str, str | int]:
        attributes = self._attributes.get(protocol)
        if attributes is None:
            attributes = dict(self._base)
            if protocol is not None:
                attributes["network.protocol.version"] = protocol
            self._attributes[protocol] = attributes
        return attributes

    def queue_time(self, seconds: float, protocol: str | None) -> None:
        try:
            self._owner.queue_time.record(seconds, self._for(protocol))
        except Exception:
            self._owner.failed()

    def connection_closed(self, seconds: float, protocol: str, reason: str) -> None:
        try:
            self._owner.connection_duration.record(seconds, self._for(protocol))
        except Exception:
            self._owner.failed()


#: Span attributes ``response_hook`` sets (all from ``response.extensions["bulkhead"]``).
SPAN_ATTRIBUTES = (
    COMPARTMENT,
    "httpx_bulkhead.queue_wait",
    "httpx_bulkhead.connection.reused",
    "httpx_bulkhead.connection.id",
    "httpx_bulkhead.retried",
)


async def response_hook(span: Span, request: Any, response: Any) -> None:
    """Add the bulkhead's facts about a request to its span (a response hook for
    ``opentelemetry-instrumentation-httpx``, which calls it before the span ends).

    Sets ``httpx_bulkhead.compartment`` (str), ``httpx_bulkhead.queue_wait`` (seconds spent
    waiting for a slot and a connection), ``httpx_bulkhead.connection.reused`` and
    ``httpx_bulkhead.connection.id`` (which connection carried it) and
    ``httpx_bulkhead.retried`` (sent again after a stale connection or an HTTP/2 refusal).
    Does nothing when the span is not recording or the response did not pass a bulkhead
    (e.g. a respx mock).  A coroutine function, as the instrumentor wants for
    ``httpx.AsyncClient``: give it as ``instrument_client(client, response_hook=...)``,
    ``instrument(async_response_hook=...)`` or
    ``AsyncOpenTelemetryTransport(transport, response_hook=...)``.
    """
    if not span.is_recording():
        return
    extensions = getattr(response, "extensions", None)
    info = extensions.get("bulkhead") if isinstance(extensions, dict) else None
    if not isinstance(info, ExchangeInfo):
        return
    span.set_attributes(
        {
            COMPARTMENT: info.compartment,
            "httpx_bulkhead.queue_wait": info.queue_wait,
            "httpx_bulkhead.connection.reused": info.reused,
            "httpx_bulkhead.connection.id": info.connection_id,
            "httpx_bulkhead.retried": info.retried,
        }
    )


# -- the global httpx instrumentor ----------------------------------------------------------

_Handler = Callable[[BulkheadTransport, httpx.Request], Coroutine[Any, Any, httpx.Response]]
#: Module of the wrapper ``HTTPXClientInstrumentor().instrument()`` installs.
_INSTRUMENTOR_MODULE = "opentelemetry.instrumentation.httpx"


def _instrumentor_wrapper() -> Callable[..., Awaitable[httpx.Response]] | None:
    """The span-making wrapper the global httpx instrumentor put on
    ``httpx.AsyncHTTPTransport.handle_async_request``, if it is on (a wrapt wrapper whose
    ``_self_wrapper`` is a ``partial`` of the instrumentor's function)."""
    patched = vars(httpx.AsyncHTTPTransport).get("handle_async_request")
    wrapper = getattr(patched, "_self_wrapper", None)
    func = getattr(wrapper, "func", None)
    if getattr(func, "__module__", None) != _INSTRUMENTOR_MODULE:
        return None  # not instrumented, or patched by someone else: theirs may need httpcore
    return wrapper


class GlobalInstrumentorBridge:
    """What ``follow_global_instrumentor`` returns; ``uninstrument()`` undoes it."""

    def __init__(self, original: _Handler) -> None:
        self._original: _Handler | None = original

    def uninstrument(self) -> None:
        """Restore ``BulkheadTransport.handle_async_request`` (idempotent)."""
        global _bridge
        with _bridge_lock:
            if self._original is not None and _bridge is self:
                BulkheadTransport.handle_async_request = self._original  # type: ignore[method-assign,assignment]
                _bridge = None
            self._original = None


_bridge: GlobalInstrumentorBridge | None = None
_bridge_lock = threading.Lock()


def follow_global_instrumentor() -> GlobalInstrumentorBridge:
    """Let ``HTTPXClientInstrumentor().instrument()`` trace requests through every
    ``BulkheadTransport``, as it does those through ``httpx.AsyncHTTPTransport``.

    The global instrumentor wraps ``httpx.AsyncHTTPTransport.handle_async_request``;
    after this call, ``BulkheadTransport.handle_async_request`` looks that wrapper up on
    each request and, while the instrumentor is on, runs the request inside it (its span,
    its hooks, its duration metric, its header propagation); while it is off, the request
    goes straight through.  Only the OpenTelemetry instrumentor's wrapper is followed.
    Idempotent: a second call returns the same bridge.  Costs a dictionary lookup per
    request while followed, nothing otherwise.

    Returns:
        A handle whose ``uninstrument()`` restores the transport class.
    """
    global _bridge
    with _bridge_lock:
        if _bridge is not None:
            return _bridge
        original: _Handler = BulkheadTransport.handle_async_request

        @functools.wraps(original)
        async def handle_async_request(
            self: BulkheadTransport, request: httpx.Request
        ) -> httpx.Response:
            wrapper = _instrumentor_wrapper()
            if wrapper is None:
                return await original(self, request)
            return await wrapper(functools.partial(original, self), self, (request,), {})

        BulkheadTransport.handle_async_request = handle_async_request  # type: ignore[method-assign]
        _bridge = GlobalInstrumentorBridge(original)
        return _bridge


def uninstrument_client(client: httpx.AsyncClient) -> None:
    """Undo ``HTTPXClientInstrumentor.instrument_client(client)`` for a client whose
    transport is a ``BulkheadTransport``: the instrumentor's own ``uninstrument_client``
    unwraps ``handle_request`` only (our transport defines it, to refuse synchronous
    clients) and leaves ``handle_async_request`` wrapped."""
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    HTTPXClientInstrumentor.uninstrument_client(client)
    transport = client._transport
    wrapped = vars(transport).get("handle_async_request")
    if wrapped is not None and hasattr(wrapped, "__wrapped__"):
        del transport.handle_async_request  # the instance attribute: the class's shows again
