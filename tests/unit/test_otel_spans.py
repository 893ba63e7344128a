"""OpenTelemetry over the fake backend, with the SDK's in-memory exporters: the server
span continues the caller's traceparent and carries the GenAI attributes, the engine's
lines become span events and child spans (queue, prefill, a pause, a cancel), a refusal
ends its span as an error, the GenAI histograms get their buckets; the variables decide
whether it is on; with it off nothing of OpenTelemetry is imported (the real model and a
real OTLP receiver: tests/e2e/test_otel_e2e.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from google.protobuf import json_format
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from edge_llm.cli.blame import load_logs
from edge_llm.client import ClientConfig, StreamClient
from edge_llm.config.tree import load_config
from edge_llm.engine.sequence import PauseCause
from edge_llm.observability.blame import blame
from edge_llm.observability.otel.genai_metrics import TTFT_BUCKETS, GenAiMetrics
from edge_llm.observability.otel.settings import OtelConfigError, otel_settings
from edge_llm.observability.otel.spans import RequestTracer
from edge_llm.server.context import CONTEXT
from edge_llm.server.telemetry import address_of, tee

from conftest import app_engine, app_over, stop_app_engine
from fakes import FakeBackend, text_script
from helpers import Recorder

ANSWER = "One two three four five six seven eight nine ten."
APP_TRACE = "0af7651916cd43dd8448eb211c80319c"
APP_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{APP_TRACE}-{APP_SPAN}-01"
CHAT = {"messages": [{"role": "user", "content": "Count"}], "max_tokens": 30, "temperature": 0.5}


class Traced:
    def __init__(self, client: TestClient, spans: InMemorySpanExporter, metrics: Any) -> None:
        self.client = client
        self.exporter = spans
        self.reader = metrics

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def server_span(self) -> ReadableSpan:
        (span,) = [s for s in self.spans() if s.kind is SpanKind.SERVER]
        return span

    def children(self, parent: ReadableSpan) -> dict[str, ReadableSpan]:
        return {
            s.name: s
            for s in self.spans()
            if s.parent is not None and s.parent.span_id == parent.context.span_id
        }

    def histograms(self) -> dict[str, Any]:
        data = self.reader.get_metrics_data()
        found = {}
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    found[metric.name] = metric.data.data_points
        return found


@pytest.fixture
async def traced() -> AsyncIterator[Callable[..., Any]]:
    made: list[TestClient] = []

    async def make(backend: FakeBackend | None = None, **overrides: Any) -> Traced:
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        reader = InMemoryMetricReader()
        meter = MeterProvider(metric_readers=[reader]).get_meter("test")
        config = load_config(None, env={}, overrides=overrides)
        urls = {name: upstream.url for name, upstream in config.upstream.items()}
        tracer = RequestTracer(
            provider.get_tracer("test"),
            GenAiMetrics(meter),
            upstream_address=lambda name: address_of(urls.get(name)),
        )
        recorder = Recorder()
        app = app_over(backend or FakeBackend(text_script(ANSWER)), config, tee(recorder, tracer))
        app[CONTEXT].tracing = tracer
        await app[CONTEXT].router.registry.start()
        client = TestClient(TestServer(app))
        await client.start_server()
        made.append(client)
        return Traced(client, exporter, reader)

    yield make
    for client in made:
        await client.close()
        await stop_app_engine(client.app)


async def test_a_server_span_in_the_callers_trace_with_the_genai_attributes(traced) -> None:
    t = await traced()
    response = await t.client.post(
        "/v1/chat/completions", json=CHAT, headers={"traceparent": TRACEPARENT}
    )
    body = await response.json()
    span = t.server_span()
    assert f"{span.context.trace_id:032x}" == APP_TRACE
    assert span.parent is not None and f"{span.parent.span_id:016x}" == APP_SPAN
    assert span.name == "chat fake"
    attributes = dict(span.attributes or {})
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.provider.name"] == "edge_llm"
    assert attributes["gen_ai.request.model"] == "fake"
    assert attributes["gen_ai.request.max_tokens"] == 30
    assert attributes["gen_ai.request.temperature"] == 0.5
    assert attributes["gen_ai.response.id"] == body["id"]
    assert attributes["gen_ai.response.finish_reasons"] == (body["choices"][0]["finish_reason"],)
    assert attributes["gen_ai.usage.input_tokens"] == body["usage"]["prompt_tokens"]
    assert attributes["gen_ai.usage.output_tokens"] == body["usage"]["completion_tokens"]
    names = [event.name for event in span.events]
    assert names[:2] == ["edge_llm.admitted", "edge_llm.scheduled"]
    assert "edge_llm.first_token" in names and names[-1] == "edge_llm.end"
    children = t.children(span)
    assert set(children) >= {"queue", "prefill"}
    assert children["queue"].end_time <= children["prefill"].start_time + 1
    points = t.histograms()
    for name in (
        "gen_ai.server.time_to_first_token",
        "gen_ai.server.time_per_output_token",
        "gen_ai.server.request.duration",
    ):
        (point,) = points[name]
        assert point.count == 1, name
        assert point.attributes["gen_ai.operation.name"] == "chat"
        assert point.attributes["gen_ai.provider.name"] == "edge_llm"
    assert tuple(points["gen_ai.server.time_to_first_token"][0].explicit_bounds) == TTFT_BUCKETS


async def test_a_pause_and_a_cancel_read_as_one_trace(traced) -> None:
    backend = FakeBackend(text_script(ANSWER * 4))
    backend.gate = threading.Semaphore(0)
    t = await traced(backend)
    engine = app_engine(t.client.app)
    response = await t.client.post(
        "/v1/chat/completions",
        json={**CHAT, "stream": True, "max_tokens": 100},
        headers={"traceparent": TRACEPARENT},
    )
    backend.gate.release(4)
    await response.content.readuntil(b"\n\n")
    (handle,) = engine.streams.live.values()
    engine.pause(handle, PauseCause.CLIENT)
    await asyncio.sleep(0.05)
    engine.resume(handle, PauseCause.CLIENT)
    engine.cancel(handle, "client")
    backend.gate.release(10_000)
    await response.read()
    span = t.server_span()
    assert f"{span.context.trace_id:032x}" == APP_TRACE
    pause = t.children(span)["paused client"]
    assert pause.attributes is not None and pause.attributes["edge_llm.pause.cause"] == "client"
    assert pause.end_time - pause.start_time >= 40_000_000  # ns: the 50 ms it was paused
    events = {event.name: event for event in span.events}
    assert events["edge_llm.cancel"].attributes["edge_llm.reason"] == "client"
    assert span.status.status_code is StatusCode.ERROR
    assert (span.attributes or {})["error.type"] == "cancelled"
    durations = t.histograms()["gen_ai.server.request.duration"]
    assert [p.attributes.get("error.type") for p in durations] == ["cancelled"]
    assert "gen_ai.server.time_to_first_token" not in t.histograms()  # successful ones only


async def test_a_refused_request_ends_its_span_as_an_error(traced) -> None:
    t = await traced(max_prompt_tokens=4)
    response = await t.client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "a long prompt " * 20}]},
    )
    assert response.status == 400
    span = t.server_span()
    assert span.status.status_code is StatusCode.ERROR
    assert (span.attributes or {})["error.type"] == "prompt_too_long"
    (point,) = t.histograms()["gen_ai.server.request.duration"]
    assert point.attributes["error.type"] == "prompt_too_long"


def test_the_standard_variables_decide() -> None:
    assert otel_settings({}) is None
    assert (
        otel_settings({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_SDK_DISABLED": "true"})
        is None
    )
    both = otel_settings({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"})
    assert both is not None and (both.traces, both.metrics) == ("http/protobuf", "http/protobuf")
    assert both.default_service_name == "edge-llm"
    mixed = otel_settings(
        {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x:4317",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_SERVICE_NAME": "car",
        }
    )
    assert mixed is not None and (mixed.traces, mixed.metrics) == ("grpc", None)
    assert mixed.default_service_name is None  # the SDK reads OTEL_SERVICE_NAME
    none = otel_settings(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_TRACES_EXPORTER": "none"}
    )
    assert none is not None and none.traces is None and none.metrics == "http/protobuf"
    for bad, var in (
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
        ({"OTEL_METRICS_EXPORTER": "prometheus"}, "OTEL_METRICS_EXPORTER"),
    ):
        with pytest.raises(OtelConfigError, match=var):
            otel_settings({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", **bad})


def test_with_it_off_nothing_of_opentelemetry_is_imported(tmp_path: Path) -> None:
    """A request served end to end in a fresh interpreter, without the variables."""
    script = textwrap.dedent(
        """
        import asyncio, sys
        from aiohttp.test_utils import TestClient, TestServer
        from edge_llm.config.tree import load_config
        from edge_llm.server.telemetry import start_otel
        from conftest import app_over, stop_app_engine
        from fakes import FakeBackend
        from edge_llm.client import ClientConfig, StreamClient

        async def main():
            assert start_otel({}, "0", {}) is None
            app = app_over(FakeBackend(), load_config(None, env={}))
            async with TestClient(TestServer(app)) as client:
                body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
                response = await client.post("/v1/chat/completions", json=body)
                assert response.status == 200
                url = str(client.make_url("/v1"))
                async with StreamClient(ClientConfig(base_url=url, api_key="")) as sdk:
                    result = await sdk.complete([{"role": "user", "content": "hi"}], max_tokens=3)
                    assert result.n_tokens == 3
            await stop_app_engine(app)
            print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))

        asyncio.run(main())
        """
    )
    tests = Path(__file__).parents[1]
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": f"{tests}:{tests / 'unit'}", "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_a_span_is_forgotten_at_its_end() -> None:
    provider = TracerProvider()
    tracer = RequestTracer(provider.get_tracer("test"), None)
    span = tracer.begin({}, operation="chat", start_ns=1, attributes={})
    with tracer.admitting(span):
        tracer("admitted", "r1", queue_position=1)  # type: ignore[arg-type]
    assert len(tracer) == 1
    tracer("end", "r1", finish_reason="stop", n_generated=1)  # type: ignore[arg-type]
    assert len(tracer) == 0
    assert trace.get_current_span() is trace.INVALID_SPAN


@pytest.fixture(scope="module")
def app_spans() -> Iterator[InMemorySpanExporter]:
    """The application's tracer, as an application sets it up (the global provider)."""
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()


async def test_the_client_sdk_puts_its_span_between_the_application_and_the_engine(
    traced, app_spans: InMemorySpanExporter
) -> None:
    t = await traced()
    config = ClientConfig(base_url=str(t.client.make_url("/v1")), api_key="")
    with trace.get_tracer("app").start_as_current_span("app request") as app:
        async with StreamClient(config) as sdk:
            result = await sdk.complete([{"role": "user", "content": "Count"}], max_tokens=8)
    assert result.n_tokens == 8
    (client,) = [s for s in app_spans.get_finished_spans() if s.kind is SpanKind.CLIENT]
    assert client.parent is not None and client.parent.span_id == app.get_span_context().span_id
    server = t.server_span()
    assert server.context.trace_id == app.get_span_context().trace_id
    assert server.parent is not None and server.parent.span_id == client.context.span_id
    names = [event.name for event in client.events]
    assert names[0] == "edge_llm.request_sent" and names[-1] == "edge_llm.end"
    assert "edge_llm.first_token" in names


async def test_blame_reads_an_otlp_export_as_it_reads_the_event_log(tmp_path: Path) -> None:
    """The same paused stream, judged from the engine's event lines and from an OTLP JSON
    export of its spans (the protocol's JSON mapping, as a Collector's file exporter
    writes it): the same requests, verdicts, outcomes and pauses."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = RequestTracer(provider.get_tracer("edge_llm"), None)
    logged: list[dict[str, Any]] = []  # the lines the JSONL log would hold

    def log(event: str, request_id: str | None = None, /, **fields: Any) -> None:
        line = {"ts": time.time(), "source": "engine", "event": event, "request_id": request_id}
        logged.append({**line, **fields})

    backend = FakeBackend(text_script(ANSWER * 2))
    app = app_over(backend, load_config(None, env={}), tee(log, tracer))  # type: ignore[arg-type]
    app[CONTEXT].tracing = tracer
    async with TestClient(TestServer(app)) as client:
        engine = app_engine(app)
        backend.gate = threading.Semaphore(0)
        body = {**CHAT, "stream": True, "max_tokens": 40}
        response = await client.post("/v1/chat/completions", json=body)
        backend.gate.release(3)
        await response.content.readuntil(b"\n\n")
        (handle,) = engine.streams.live.values()
        engine.pause(handle, PauseCause.CLIENT)
        await asyncio.sleep(0.02)
        engine.resume(handle, PauseCause.CLIENT)
        backend.gate.release(10_000)
        await response.read()
        await client.post("/v1/chat/completions", json=CHAT)  # a second, plain one
    await stop_app_engine(app)
    export = json_format.MessageToJson(encode_spans(exporter.get_finished_spans()))
    (tmp_path / "spans.json").write_text(export.replace("\n", " ") + "\n")
    from_otlp = load_logs(str(tmp_path / "spans.json"), None).engine
    judged = [
        blame(lines, [], have_engine_log=True, have_client_log=False)
        for lines in (logged, from_otlp)
    ]
    summary = [
        [(r.request_id, r.verdict, r.outcome, r.stats.pauses) for r in report.requests]
        for report in judged
    ]
    assert len(summary[0]) == 2 and summary[0][0][3] >= 1
    assert summary[1] == summary[0]


async def test_a_websocket_stream_is_a_span_too(traced) -> None:
    t = await traced()
    async with t.client.ws_connect("/v1/stream", headers={"traceparent": TRACEPARENT}) as ws:
        await ws.send_json({"type": "start", "request": CHAT})
        while (frame := await ws.receive_json(timeout=30))["type"] not in ("done", "error"):
            pass
    assert frame["type"] == "done"
    span = t.server_span()
    assert f"{span.context.trace_id:032x}" == APP_TRACE
    assert (span.attributes or {})["gen_ai.response.id"] == frame["id"]
    assert (span.attributes or {})["http.route"] == "/v1/stream"


async def _upstream_chat(request: web.Request) -> web.StreamResponse:
    """An OpenAI-compatible upstream's streamed answer: three words, usage, [DONE]."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for text in ("from", " the", " upstream"):
        choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
        chunk = {"id": "u", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}
        await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    last = {"id": "u", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}  # fmt: skip
    await response.write(b"data: " + json.dumps(last).encode() + b"\n\ndata: [DONE]\n\n")
    return response


async def test_a_relayed_request_shows_the_upstream_call_as_a_client_span(traced) -> None:
    upstream = web.Application()
    sent: list[str | None] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        sent.append(request.headers.get("traceparent"))
        return await _upstream_chat(request)

    upstream.router.add_post("/v1/chat/completions", chat)

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    upstream.router.add_get("/v1/models", models)
    async with TestServer(upstream) as server:
        url = str(server.make_url("")).rstrip("/")
        t = await traced(upstream=[f"up={url}"])
        response = await t.client.post(
            "/v1/chat/completions",
            json={**CHAT, "model": "m"},
            headers={"traceparent": TRACEPARENT},
        )
        assert (await response.json())["choices"][0]["message"]["content"] == "from the upstream"
    span = t.server_span()
    (client,) = [s for s in t.spans() if s.kind is SpanKind.CLIENT]
    assert client.parent is not None and client.parent.span_id == span.context.span_id
    assert client.name == "chat up"
    attributes = dict(client.attributes or {})
    assert attributes["gen_ai.provider.name"] == "openai"
    assert attributes["server.address"] == "127.0.0.1"
    assert url.endswith(f":{attributes['server.port']}")
    assert attributes["gen_ai.usage.output_tokens"] == 3
    assert attributes["gen_ai.usage.input_tokens"] == 5  # the upstream's usage
    assert (span.attributes or {})["gen_ai.usage.input_tokens"] == 5
    assert (span.attributes or {})["edge_llm.backend"] == "up"
    # The upstream's own span would be the child of the CLIENT span, in the caller's trace.
    assert client.context is not None
    context = f"00-{client.context.trace_id:032x}-{client.context.span_id:016x}-01"
    assert sent == [context] and context[3:35] == APP_TRACE
    usage = t.histograms()["gen_ai.client.token.usage"]
    assert sorted(p.attributes["gen_ai.token.type"] for p in usage) == ["input", "output"]
    assert sorted(p.sum for p in usage) == [3, 5]


def test_grpc_is_a_protocol_that_works(monkeypatch: pytest.MonkeyPatch) -> None:
    """OTEL_EXPORTER_OTLP_PROTOCOL=grpc: the SDK's gRPC exporters, to a real gRPC
    receiver (opentelemetry-proto's service) on 127.0.0.1."""
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as metrics_pb
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as metrics_rpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as trace_pb
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as trace_rpc

    from edge_llm.observability.otel.sdk import start_telemetry

    received: dict[str, list[str]] = {"spans": [], "metrics": []}

    class Traces(trace_rpc.TraceServiceServicer):  # type: ignore[misc]
        def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC's name
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    received["spans"] += [span.name for span in scope.spans]
            return trace_pb.ExportTraceServiceResponse()

    class Metrics(metrics_rpc.MetricsServiceServicer):  # type: ignore[misc]
        def Export(self, request: Any, context: Any) -> Any:  # noqa: N802
            for resource in request.resource_metrics:
                for scope in resource.scope_metrics:
                    received["metrics"] += [metric.name for metric in scope.metrics]
            return metrics_pb.ExportMetricsServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_rpc.add_TraceServiceServicer_to_server(Traces(), server)
    metrics_rpc.add_MetricsServiceServicer_to_server(Metrics(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        environ = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
        }
        for name, value in environ.items():
            monkeypatch.setenv(name, value)
        settings = otel_settings(environ)
        assert settings is not None and settings.traces == settings.metrics == "grpc"
        telemetry = start_telemetry(settings)
        tracer = RequestTracer(telemetry.tracer("0") or trace.NoOpTracer(), None)
        meter = telemetry.meter("0")
        assert meter is not None
        metrics = GenAiMetrics(meter)
        span = tracer.begin({}, operation="chat", start_ns=time.time_ns(), attributes={})
        span.close()
        metrics.record_server({"gen_ai.operation.name": "chat"}, duration_s=0.5, ttft_s=0.1,
                              tpot_s=0.01, error_type=None)  # fmt: skip
        telemetry.shutdown()  # exports what is held
    finally:
        server.stop(None)
    assert received["spans"] == ["chat"]
    assert "gen_ai.server.request.duration" in received["metrics"]
