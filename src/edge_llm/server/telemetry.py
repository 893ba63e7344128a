"""OpenTelemetry at the server: started from the standard ``OTEL_*`` variables, off
unless an OTLP endpoint is set (:mod:`edge_llm.observability.otel.settings`).

With it off nothing of OpenTelemetry is imported, and a request costs one ``None``
check. With it on, every generation request gets a server span from
:func:`begin_span` (called by :func:`~edge_llm.server.context.answer_to` for every
route), the engine's and the relay's lines reach it through the event sink, and the
GenAI histograms are recorded when it ends (:mod:`edge_llm.observability.otel.spans`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from aiohttp import web

from edge_llm.generation.dispatch import Answer, LocalAnswer
from edge_llm.generation.job import GenerationJob, Relay
from edge_llm.observability.events import Event, EventSink
from edge_llm.observability.otel.settings import otel_settings

if TYPE_CHECKING:
    from edge_llm.observability.otel.sdk import Telemetry
    from edge_llm.observability.otel.spans import RequestSpan, RequestTracer

ARRIVED_NS = web.RequestKey("edge_llm_arrived_ns", int)
# gen_ai.operation.name by route (the conventions' names; the Responses API is a chat).
OPERATIONS = {
    "/v1/completions": "text_completion",
    "/api/generate": "text_completion",
}
CHAT = "chat"


def start_otel(
    environ: Mapping[str, str], version: str, upstream_urls: Mapping[str, str]
) -> tuple[Telemetry, RequestTracer] | None:
    """The process's telemetry and its request tracer, or None when OpenTelemetry is
    off. Raises OtelConfigError (naming the variable) for a value it cannot honour."""
    settings = otel_settings(environ)
    if settings is None:
        return None
    # Imported here only: with OpenTelemetry off, none of it is loaded.
    from opentelemetry.trace import NoOpTracer  # noqa: PLC0415

    from edge_llm.observability.otel.genai_metrics import GenAiMetrics  # noqa: PLC0415
    from edge_llm.observability.otel.sdk import start_telemetry  # noqa: PLC0415
    from edge_llm.observability.otel.spans import RequestTracer  # noqa: PLC0415

    telemetry = start_telemetry(settings)
    meter = telemetry.meter(version)
    tracer = RequestTracer(
        telemetry.tracer(version) or NoOpTracer(),
        GenAiMetrics(meter) if meter is not None else None,
        upstream_address=lambda name: address_of(upstream_urls.get(name)),
    )
    return telemetry, tracer


def tee(first: EventSink, second: EventSink) -> EventSink:
    """One sink writing to both."""

    def emit(event: Event, request_id: str | None = None, /, **fields: Any) -> None:
        first(event, request_id, **fields)
        second(event, request_id, **fields)

    return emit


@web.middleware
async def arrival(request: web.Request, handler: Any) -> web.StreamResponse:
    """When the request arrived: its span starts there (installed with tracing only)."""
    request[ARRIVED_NS] = time.time_ns()
    response: web.StreamResponse = await handler(request)
    return response


TRACE_CONTEXT_HEADERS = ("traceparent", "tracestate")


def caller_trace(headers: Mapping[str, str]) -> Callable[[], dict[str, str]]:
    """Without tracing, the caller's W3C trace context, passed on to an upstream as sent."""
    passed = {name: headers[name] for name in TRACE_CONTEXT_HEADERS if name in headers}
    return lambda: dict(passed)


def begin_span(
    tracer: RequestTracer, request: web.Request, job: GenerationJob, start_ns: int | None = None
) -> RequestSpan:
    """The server span of the generation ``request`` asks for (the child of its
    ``traceparent``), from ``start_ns`` (else the request's arrival)."""
    relay = job.relay.body if isinstance(job.relay, Relay) else {}
    return tracer.begin(
        request.headers,
        operation=OPERATIONS.get(request.path, CHAT),
        start_ns=start_ns or request.get(ARRIVED_NS) or time.time_ns(),
        attributes={
            "gen_ai.request.model": job.model,
            "gen_ai.request.max_tokens": job.max_tokens,
            "gen_ai.request.temperature": relay.get("temperature"),
            "gen_ai.request.top_p": relay.get("top_p"),
            "edge_llm.priority": job.priority.value,
            "http.route": request.path,
        },
    )


def started(span: RequestSpan, answer: Answer) -> None:
    """What is known once the request was admitted: the model, the granted limits and
    the sampling the engine runs it with."""
    facts: dict[str, Any] = {
        "gen_ai.response.model": answer.model,
        "edge_llm.backend": answer.backend,
    }
    if "gen_ai.request.model" not in span.attributes:
        facts["gen_ai.request.model"] = answer.model
    if isinstance(answer, LocalAnswer):
        request = answer.handle.seq.request
        facts["gen_ai.request.max_tokens"] = request.max_tokens
        facts["gen_ai.request.temperature"] = request.sampling.temperature
        facts["gen_ai.request.top_p"] = request.sampling.top_p
    span.set(facts)


def address_of(url: str | None) -> tuple[str, int] | None:
    """The host and port of an upstream's base URL (server.address, server.port)."""
    if not url:
        return None
    parts = urlsplit(url)
    if parts.hostname is None:
        return None
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
