"""One server span per request, continuing the caller's W3C ``traceparent``, drawn from
the request's event-log lines (so the engine's inference thread does no more than it
does for the JSONL log, and nothing per token).

The span (kind SERVER, named ``{gen_ai.operation.name} {gen_ai.request.model}``)
carries the GenAI attributes and, as span events named ``edge_llm.<event>`` with
``edge_llm.<field>`` attributes, every line the engine or the relay logs for the
request (``edge-llm blame`` reads them back from an OTLP export). Beside them, child
spans draw the phases: ``queue`` (admitted to scheduled), ``prefill`` (scheduled to
first token, with the cached tokens), one ``paused <cause>`` per pause (``client``,
``socket_full``, ``preempted``, ``disconnected``) from pause to resume, and on the
relay path the upstream call as a CLIENT span. The span ends with the request's
``end`` line, which also records the GenAI histograms (:mod:`.genai_metrics`).

:class:`RequestTracer` is the event sink: it finds a request's span by request id.
The id is learnt from the request's first line (``admitted`` locally, ``routed``
when relayed), logged while the server admits it inside :meth:`RequestTracer.admitting`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from edge_llm.observability.events import Event
from edge_llm.observability.otel.genai_metrics import Attributes, AttributeValue, GenAiMetrics

PROVIDER = "edge_llm"  # gen_ai.provider.name of this server (a custom value)
UPSTREAM_PROVIDER = "openai"  # what an upstream speaks: the OpenAI API
EVENT_PREFIX = "edge_llm."
MAX_LIVE_SPANS = 4096  # requests traced at once; beyond, a request is not traced
_FIRST_LINES = (Event.ADMITTED, Event.ROUTED)
_UNTRACED = (Event.PREFILL_PROGRESS,)  # many per long prompt; the prefill span says it
UpstreamAddress = Callable[[str], tuple[str, int] | None]


class RequestSpan:
    """One request's span and its children, fed the request's lines (any thread)."""

    def __init__(self, tracer: Tracer, span: Span, start_ns: int, owner: RequestTracer) -> None:
        self.tracer = tracer
        self.span = span
        self.start_ns = start_ns
        self.owner = owner
        self.request_id: str | None = None
        self.attributes: dict[str, AttributeValue] = {}  # those the metrics carry too
        self._lock = threading.Lock()
        self._ended = False
        self._phase_ns = start_ns  # where the next phase span starts
        self._first_token_ns: int | None = None
        self._cached = 0
        self._pauses: dict[str, Span] = {}
        self._upstream: Span | None = None
        self._upstream_ns = 0

    def set(self, attributes: Mapping[str, AttributeValue | None]) -> None:
        """GenAI attributes learnt along the way (None: not known, left out)."""
        given = {k: v for k, v in attributes.items() if v is not None}
        with self._lock:
            self.attributes.update({k: v for k, v in given.items() if k in _METRIC_ATTRIBUTES})
            self.span.set_attributes(given)
            if "gen_ai.request.model" in given:
                operation = self.attributes.get("gen_ai.operation.name", "chat")
                self.span.update_name(f"{operation} {given['gen_ai.request.model']}")

    # -- lines -------------------------------------------------------------------------

    def on(self, event: str, fields: Mapping[str, Any], now_ns: int) -> None:
        with self._lock:
            if self._ended:
                return
            if event not in _UNTRACED:
                self.span.add_event(EVENT_PREFIX + event, _event_attributes(fields), now_ns)
            handler = _HANDLERS.get(event)
            if handler is not None:
                handler(self, fields, now_ns)

    def _scheduled(self, fields: Mapping[str, Any], now_ns: int) -> None:
        """From the request's arrival (parsing, tokenizing, the engine's queue) to a slot."""
        slot, queue_ms = fields.get("slot"), fields.get("queue_ms")
        attributes = {"edge_llm.slot": slot, "edge_llm.queue_ms": queue_ms}
        self._child("queue", self._phase_ns, now_ns, attributes)
        self._phase_ns = now_ns

    def _cache_hit(self, fields: Mapping[str, Any], now_ns: int) -> None:
        cached = fields.get("n_cached_tokens")
        self._cached = cached if isinstance(cached, int) else 0

    def _first_token(self, fields: Mapping[str, Any], now_ns: int) -> None:
        self._first_token_ns = now_ns
        if self._upstream is not None:
            return  # relayed: the upstream call shows the wait
        attributes = {"gen_ai.usage.cache_read.input_tokens": self._cached}
        self._child("prefill", self._phase_ns, now_ns, attributes)

    def _paused(self, fields: Mapping[str, Any], now_ns: int) -> None:
        cause = str(fields.get("cause") or "client")
        if cause not in self._pauses:
            attributes = {
                "edge_llm.pause.cause": cause,
                "edge_llm.ring_fill": fields.get("ring_fill"),
            }
            self._pauses[cause] = self._start_child(f"paused {cause}", now_ns, attributes)

    def _resumed(self, fields: Mapping[str, Any], now_ns: int) -> None:
        cause = fields.get("cause")
        causes = [str(cause)] if cause is not None else list(self._pauses)  # relay: no cause
        for name in causes:
            if (pause := self._pauses.pop(name, None)) is not None:
                pause.set_attribute("edge_llm.paused_ms", (now_ns - _start_of(pause, now_ns)) / 1e6)
                pause.end(now_ns)

    def _routed(self, fields: Mapping[str, Any], now_ns: int) -> None:
        backend = str(fields.get("backend") or "none")
        address = self.owner.upstream_address(backend)
        attributes: dict[str, AttributeValue | None] = {
            "gen_ai.operation.name": self.attributes.get("gen_ai.operation.name", "chat"),
            "gen_ai.provider.name": UPSTREAM_PROVIDER,
            "gen_ai.request.model": self.attributes.get("gen_ai.request.model"),
            "edge_llm.upstream": backend,
            "server.address": address[0] if address else None,
            "server.port": address[1] if address else None,
        }
        self._upstream = self._start_child(
            f"{attributes['gen_ai.operation.name']} {backend}", now_ns, attributes, SpanKind.CLIENT
        )
        self._upstream_ns = now_ns

    def _end(self, fields: Mapping[str, Any], now_ns: int) -> None:
        error = fields.get("error")
        outputs = fields.get("n_generated") if isinstance(fields.get("n_generated"), int) else None
        inputs = (
            fields.get("n_prompt_tokens")
            if isinstance(fields.get("n_prompt_tokens"), int)
            else None
        )
        reason = fields.get("finish_reason")
        attributes: dict[str, AttributeValue | None] = {
            "gen_ai.response.finish_reasons": [str(reason)] if reason else None,
            "gen_ai.usage.output_tokens": outputs,
            "gen_ai.usage.input_tokens": inputs,
            "gen_ai.usage.cache_read.input_tokens": self._cached if inputs is not None else None,
            "edge_llm.ttft_ms": fields.get("ttft_ms"),
            "edge_llm.pauses": fields.get("pauses"),
            "edge_llm.paused_ms": fields.get("paused_ms"),
        }
        self.span.set_attributes({k: v for k, v in attributes.items() if v is not None})
        self._finish_upstream(now_ns, error, inputs, outputs)
        self._close(now_ns, str(error) if error else None)
        self._record(now_ns, fields, outputs, str(error) if error else None)

    def _finish_upstream(
        self, now_ns: int, error: object, inputs: int | None, outputs: int | None
    ) -> None:
        """``inputs``: the prompt tokens the upstream's usage reported (None: none came)."""
        upstream = self._upstream
        if upstream is None:
            return
        for name, count in (("input", inputs), ("output", outputs)):
            if count is not None:
                upstream.set_attribute(f"gen_ai.usage.{name}_tokens", count)
        if error:
            upstream.set_attribute("error.type", str(error))
            upstream.set_status(Status(StatusCode.ERROR, str(error)))
        upstream.end(now_ns)
        metrics = self.owner.metrics
        if metrics is not None:
            attributes = {**self.attributes, "gen_ai.provider.name": UPSTREAM_PROVIDER}
            metrics.record_client(
                attributes,
                duration_s=(now_ns - self._upstream_ns) / 1e9,
                input_tokens=inputs,
                output_tokens=outputs,
                error_type=str(error) if error else None,
            )

    def _record(
        self, now_ns: int, fields: Mapping[str, Any], outputs: int | None, error: str | None
    ) -> None:
        metrics = self.owner.metrics
        if metrics is None:
            return
        first = self._first_token_ns
        ttft_s = (first - self.start_ns) / 1e9 if first is not None else None
        tpot_s = None
        paused_ms = fields.get("paused_ms")
        if first is not None and outputs is not None and outputs > 1:
            # The decode time: pauses excluded (nothing is generated then).
            paused_s = paused_ms / 1000.0 if isinstance(paused_ms, int | float) else 0.0
            tpot_s = max(0.0, (now_ns - first) / 1e9 - paused_s) / (outputs - 1)
        metrics.record_server(
            self.attributes,
            duration_s=(now_ns - self.start_ns) / 1e9,
            ttft_s=ttft_s,
            tpot_s=tpot_s,
            error_type=error,
        )

    # -- the end -------------------------------------------------------------------------

    def fail(self, error_type: str, message: str) -> None:
        """Refused before it ran (no ``end`` line will come): ends the span as an error."""
        now_ns = time.time_ns()
        with self._lock:
            if self._ended:
                return
            self._close(now_ns, error_type, message)
            self._record(now_ns, {}, None, error_type)

    def close(self) -> None:
        """The server is done with the request; a span its lines never ended ends now."""
        with self._lock:
            if not self._ended:
                self._close(time.time_ns(), None)

    def _close(self, now_ns: int, error: str | None, message: str | None = None) -> None:
        self._ended = True
        for pause in self._pauses.values():
            pause.end(now_ns)
        self._pauses.clear()
        if self._upstream is not None and self._upstream.is_recording():
            self._upstream.end(now_ns)
        if error is not None:
            self.span.set_attribute("error.type", error)
            self.span.set_status(Status(StatusCode.ERROR, message or error))
        self.span.end(now_ns)
        self.owner.forget(self)

    def trace_headers(self) -> dict[str, str]:
        """W3C trace context for an upstream call: the relay's CLIENT span once the
        request was routed, else this request's span."""
        carrier: dict[str, str] = {}
        with self._lock:
            span = self._upstream if self._upstream is not None else self.span
        self.owner.propagator.inject(carrier, trace.set_span_in_context(span))
        return carrier

    # -- children ------------------------------------------------------------------------

    def _start_child(
        self,
        name: str,
        start_ns: int,
        attributes: Mapping[str, AttributeValue | None],
        kind: SpanKind = SpanKind.INTERNAL,
    ) -> Span:
        context = trace.set_span_in_context(self.span)
        given = {k: v for k, v in attributes.items() if v is not None}
        return self.tracer.start_span(
            name, context, kind=kind, attributes=given, start_time=start_ns
        )

    def _child(
        self, name: str, start_ns: int, end_ns: int, attributes: Mapping[str, AttributeValue | None]
    ) -> None:
        self._start_child(name, start_ns, attributes).end(end_ns)


_HANDLERS: dict[str, Callable[[RequestSpan, Mapping[str, Any], int], None]] = {
    Event.SCHEDULED: RequestSpan._scheduled,
    Event.CACHE_HIT: RequestSpan._cache_hit,
    Event.FIRST_TOKEN: RequestSpan._first_token,
    Event.PAUSED: RequestSpan._paused,
    Event.RESUMED: RequestSpan._resumed,
    Event.ROUTED: RequestSpan._routed,
    Event.END: RequestSpan._end,
}
_METRIC_ATTRIBUTES = frozenset(
    {"gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model",
     "gen_ai.response.model", "server.address", "server.port"}
)  # fmt: skip


class RequestTracer:
    """The server's request spans by request id; it is the event sink the engine, the
    relay and the server log through (beside the JSONL log)."""

    def __init__(
        self,
        tracer: Tracer,
        metrics: GenAiMetrics | None,
        upstream_address: UpstreamAddress = lambda name: None,
    ) -> None:
        self.tracer = tracer
        self.metrics = metrics
        self.upstream_address = upstream_address
        self.propagator = TraceContextTextMapPropagator()
        self._spans: dict[str, RequestSpan] = {}
        self._admitting: ContextVar[RequestSpan | None] = ContextVar(
            "edge_llm_admitting", default=None
        )

    def begin(
        self,
        carrier: Mapping[str, str],
        *,
        operation: str,
        start_ns: int,
        attributes: Mapping[str, AttributeValue | None],
    ) -> RequestSpan:
        """A request arrived (at ``start_ns``) with ``carrier``'s headers: its span,
        the child of the caller's ``traceparent`` when it sent one."""
        parent = self.propagator.extract(carrier)
        given: dict[str, AttributeValue | None] = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": PROVIDER,
            **attributes,
        }
        span = self.tracer.start_span(operation, parent, kind=SpanKind.SERVER, start_time=start_ns)
        request = RequestSpan(self.tracer, span, start_ns, self)
        request.set(given)
        return request

    @contextlib.contextmanager
    def admitting(self, request: RequestSpan) -> Iterator[None]:
        """While the server admits the request: its first line names its id."""
        token = self._admitting.set(request)
        try:
            yield
        finally:
            self._admitting.reset(token)

    def __call__(self, event: Event, request_id: str | None = None, /, **fields: Any) -> None:
        if request_id is None:
            return
        request = self._spans.get(request_id)
        if request is None:
            request = self._bind(event, request_id)
            if request is None:
                return
        request.on(event, fields, time.time_ns())

    def _bind(self, event: Event, request_id: str) -> RequestSpan | None:
        request = self._admitting.get()
        if (
            request is None
            or event not in _FIRST_LINES
            or request.request_id is not None
            or len(self._spans) >= MAX_LIVE_SPANS
        ):
            return None
        request.request_id = request_id
        request.set({"gen_ai.response.id": request_id, "edge_llm.request_id": request_id})
        self._spans[request_id] = request
        return request

    def forget(self, request: RequestSpan) -> None:
        if request.request_id is not None:
            self._spans.pop(request.request_id, None)

    def __len__(self) -> int:
        return len(self._spans)


def _event_attributes(fields: Mapping[str, Any]) -> Attributes:
    """A line's fields as span-event attributes (``edge_llm.<field>``); values an
    attribute cannot hold (None, nested objects) are left out or given as text."""
    out: dict[str, AttributeValue] = {}
    for key, value in fields.items():
        if value is None:
            continue
        if isinstance(value, str | int | float | bool):
            out[EVENT_PREFIX + key] = value
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            out[EVENT_PREFIX + key] = ",".join(value)
        else:
            out[EVENT_PREFIX + key] = str(value)
    return out


def _start_of(span: Span, default: int) -> int:
    start = getattr(span, "start_time", None)
    return start if isinstance(start, int) else default
