"""OpenTelemetry in the client SDK, when the application traces: one trace covers the
application, the client's render queue and watermarks, and the engine.

Nothing here imports OpenTelemetry: an application that does not use it pays one
``sys.modules`` look-up per stream. One that does (it imported ``opentelemetry.trace``
and set a tracer provider, or runs inside a span) gets, per stream, a CLIENT span
``chat {model}`` (a child of its current span) whose context goes to the server as
the W3C ``traceparent`` header, so the engine's span is its child; the client's own
event-log lines (``watermark_high``, ``pause_sent``, ``retry``, ...) become its span
events (``edge_llm.<event>``), and it ends with the stream.
"""

from __future__ import annotations

import sys
from typing import Any

from edge_llm.observability.events import Event, EventSink

_ENDS = (Event.END, Event.ERROR)


class ClientSpan:
    """The span of one stream, fed the client's event lines."""

    def __init__(self, span: Any, headers: dict[str, str]) -> None:
        self.span = span
        self.headers = headers  # traceparent (and tracestate) to send
        self._ended = False

    @classmethod
    def start(cls, model: str | None) -> ClientSpan | None:
        """A span when the application traces, else None."""
        api = sys.modules.get("opentelemetry.trace")
        if api is None:
            return None
        parent = api.get_current_span()
        provider = api.get_tracer_provider()
        if not parent.get_span_context().is_valid and type(provider).__name__.startswith(
            ("Proxy", "NoOp")
        ):
            return None  # OpenTelemetry imported, but no tracer set up and no span
        return cls._started(api, model)

    @classmethod
    def _started(cls, api: Any, model: str | None) -> ClientSpan:
        from opentelemetry.trace.propagation.tracecontext import (  # noqa: PLC0415
            TraceContextTextMapPropagator,
        )

        attributes = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "edge_llm"}
        if model:
            attributes["gen_ai.request.model"] = model
        tracer = api.get_tracer("edge_llm.client")
        span = tracer.start_span(
            f"chat {model or 'default'}", kind=api.SpanKind.CLIENT, attributes=attributes
        )
        headers: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(headers, api.set_span_in_context(span))
        return cls(span, headers)

    def sink(self, then: EventSink) -> EventSink:
        """An event sink that writes to ``then`` and to this span."""

        def emit(event: Event, request_id: str | None = None, /, **fields: Any) -> None:
            then(event, request_id, **fields)
            self.on(event, request_id, fields)

        return emit

    def on(self, event: Event, request_id: str | None, fields: dict[str, Any]) -> None:
        if self._ended:
            return
        attributes = {
            f"edge_llm.{key}": value
            for key, value in fields.items()
            if isinstance(value, str | int | float | bool)
        }
        if request_id is not None:
            attributes["edge_llm.request_id"] = request_id
        self.span.add_event(f"edge_llm.{event}", attributes)
        if event in _ENDS:
            self.end(fields)

    def end(self, fields: dict[str, Any]) -> None:
        if self._ended:
            return
        self._ended = True
        if fields.get("error") or fields.get("code"):
            from opentelemetry.trace import Status, StatusCode  # noqa: PLC0415

            error = str(fields.get("code") or fields.get("error"))
            self.span.set_attribute("error.type", error)
            self.span.set_status(Status(StatusCode.ERROR, error))
        self.span.end()
