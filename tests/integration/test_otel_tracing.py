"""``opentelemetry-instrumentation-httpx`` spans for requests through ``BulkheadTransport``,
with the bulkhead's facts as span attributes (``httpx_bulkhead.otel.response_hook``), for a
client instrumented alone and for the global instrumentor."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest

from httpx_bulkhead import BulkheadTransport, ExchangeInfo, Policy
from tests.conftest import until
from tests.servers import HypercornServer, TestApp

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.instrumentation.httpx")

from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind

from httpx_bulkhead import otel

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.anyio


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def _url(span: ReadableSpan) -> str:
    attributes = span.attributes or {}
    return str(attributes.get("http.url", attributes.get("url.full")))


def assert_span_tells(span: ReadableSpan, response: httpx.Response) -> None:
    """The instrumentor's own attributes, and ours equal to ``extensions["bulkhead"]``."""
    info = response.extensions["bulkhead"]
    assert isinstance(info, ExchangeInfo)
    attributes = dict(span.attributes or {})
    assert span.kind is SpanKind.CLIENT and span.name == "GET"
    assert attributes.get("http.status_code", attributes.get("http.response.status_code")) == 200
    assert {k: v for k, v in attributes.items() if k.startswith("httpx_bulkhead.")} == {
        "httpx_bulkhead.compartment": info.compartment,
        "httpx_bulkhead.queue_wait": info.queue_wait,
        "httpx_bulkhead.connection.reused": info.reused,
        "httpx_bulkhead.connection.id": info.connection_id,
        "httpx_bulkhead.retried": info.retried,
    }


async def queued_requests(
    client: httpx.AsyncClient, transport: BulkheadTransport, app: TestApp, url: str, name: str
) -> list[httpx.Response]:
    """Three requests through a one-slot compartment: the 2nd and 3rd queue behind the 1st
    (a queue wait, then a reused connection)."""
    gate = app.gate(name)
    responses: dict[int, httpx.Response] = {}

    async def call(i: int) -> None:
        responses[i] = await client.get(f"{url}/gate/{gate.name}?i={i}")

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, 0)
        await gate.until_entered(1)
        for i in (1, 2):
            tg.start_soon(call, i)
        await until(lambda: transport.statistics()["127.0.0.1"].waiting == 2)
        gate.open()
    return [responses[i] for i in range(3)]


def one_slot() -> BulkheadTransport:
    return BulkheadTransport(hosts={"127.0.0.1": Policy(max_concurrency=1)})


def check_spans(exporter: InMemorySpanExporter, responses: list[httpx.Response]) -> None:
    finished = {_url(span): span for span in exporter.get_finished_spans()}
    assert len(exporter.get_finished_spans()) == len(responses) == len(finished)
    for response in responses:
        assert_span_tells(finished[str(response.request.url)], response)
    infos = [r.extensions["bulkhead"] for r in responses]
    assert infos[0].queue_wait == 0.0 and min(i.queue_wait for i in infos[1:]) > 0
    assert infos[1].reused and infos[2].reused  # the connection the first one used


async def test_instrument_client_spans_carry_the_bulkhead_facts(
    server: HypercornServer,
    app: TestApp,
    unique: Callable[[str], str],
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    transport = one_slot()
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:
        HTTPXClientInstrumentor.instrument_client(
            client, tracer_provider=provider, response_hook=otel.response_hook
        )
        responses = await queued_requests(client, transport, app, server.url, unique("span"))
        check_spans(exporter, responses)
        # The instrumentor's uninstrument_client leaves handle_async_request wrapped for a
        # transport that also defines handle_request; ours unwraps both.
        otel.uninstrument_client(client)
        exporter.clear()
        await client.get(f"{server.url}/")
        assert exporter.get_finished_spans() == ()


async def test_global_instrumentor_traces_bulkhead_requests_when_followed(
    server: HypercornServer,
    app: TestApp,
    unique: Callable[[str], str],
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    instrumentor = HTTPXClientInstrumentor()
    original = BulkheadTransport.handle_async_request
    instrumentor.instrument(tracer_provider=provider, async_response_hook=otel.response_hook)
    try:
        transport = one_slot()
        async with httpx.AsyncClient(transport=transport, timeout=10) as client:
            await client.get(f"{server.url}/")
            # the instrumentor patches httpx.AsyncHTTPTransport only
            assert exporter.get_finished_spans() == ()
            bridge = otel.follow_global_instrumentor()
            try:
                assert otel.follow_global_instrumentor() is bridge
                responses = await queued_requests(
                    client, transport, app, server.url, unique("global")
                )
                check_spans(exporter, responses)
                instrumentor.uninstrument()  # followed: no span once it is off
                exporter.clear()
                await client.get(f"{server.url}/")
                assert exporter.get_finished_spans() == ()
            finally:
                bridge.uninstrument()
            assert BulkheadTransport.handle_async_request is original
    finally:
        instrumentor.uninstrument()


async def test_response_hook_ignores_responses_without_a_bulkhead(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("mocked") as span:
        response: Any = httpx.Response(200)  # e.g. answered by respx: no extensions["bulkhead"]
        await otel.response_hook(span, None, response)
    (finished,) = exporter.get_finished_spans()
    assert not [k for k in finished.attributes or {} if k.startswith("httpx_bulkhead.")]
