"""Event lines read back from an OTLP JSON export of edge-llm's spans, for ``blame``.

The engine's request span and the client SDK's span carry every line of their event
logs as span events named ``edge_llm.<event>`` with ``edge_llm.<field>`` attributes
(:mod:`edge_llm.observability.otel.spans`, :mod:`edge_llm.client.tracing`). An
OpenTelemetry Collector's file exporter (or any OTLP/JSON dump: one
``{"resourceSpans": ...}`` document per line, or one document) holds them; here they
become the lines the JSONL logs would hold: ``ts`` from the event's time, ``source``
``engine`` (the server's span) or ``client`` (the client SDK's), ``event``,
``request_id`` and the fields.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

PREFIX = "edge_llm."
CLIENT_SCOPE = "edge_llm.client"
SERVER_KIND = (2, "SPAN_KIND_SERVER")


def is_otlp(text: str) -> bool:
    """Whether ``text`` looks like an OTLP JSON export rather than a JSONL event log."""
    head = text.lstrip()[:4096]
    return head.startswith("{") and '"resourceSpans"' in head


def otlp_event_lines(text: str) -> list[dict[str, Any]]:
    """The event lines of every edge-llm span in the export ``text``, oldest first."""
    lines = [line for doc in _documents(text) for line in _lines_of(doc)]
    return sorted(lines, key=lambda line: line["ts"])


def _documents(text: str) -> Iterator[Mapping[str, Any]]:
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        for raw in text.splitlines():
            try:
                doc = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if isinstance(doc, dict):
                yield doc
        return
    if isinstance(whole, dict):
        yield whole


def _lines_of(doc: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for resource in doc.get("resourceSpans") or []:
        for scope in resource.get("scopeSpans") or []:
            scope_name = (scope.get("scope") or {}).get("name", "")
            for span in scope.get("spans") or []:
                source = _source(scope_name, span)
                if source is not None:
                    yield from _span_lines(span, source)


def _source(scope_name: str, span: Mapping[str, Any]) -> str | None:
    if scope_name == CLIENT_SCOPE:
        return "client"
    if span.get("kind") in SERVER_KIND and PREFIX + "request_id" in _attributes(span):
        return "engine"
    return None


def _span_lines(span: Mapping[str, Any], source: str) -> Iterator[dict[str, Any]]:
    request_id = _attributes(span).get(PREFIX + "request_id")
    for event in span.get("events") or []:
        name = str(event.get("name", ""))
        if not name.startswith(PREFIX):
            continue
        fields = {key.removeprefix(PREFIX): value for key, value in _attributes(event).items()}
        line = {
            "ts": int(event.get("timeUnixNano", 0)) / 1e9,
            "source": source,
            "event": name.removeprefix(PREFIX),
            "request_id": fields.pop("request_id", request_id),
            **fields,
        }
        yield line


def _attributes(item: Mapping[str, Any]) -> dict[str, Any]:
    return {pair["key"]: _value(pair.get("value") or {}) for pair in item.get("attributes") or []}


def _value(value: Mapping[str, Any]) -> Any:
    """An OTLP JSON ``AnyValue`` as a Python value (int64s come as strings)."""
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "arrayValue" in value:
        return [_value(v) for v in value["arrayValue"].get("values") or []]
    return None
