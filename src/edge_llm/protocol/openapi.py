"""The OpenAPI 3.1 document served at ``/openapi.json`` (used by fuzzing in CI).

Request schemas come from the same pydantic models that validate requests, so
the document cannot drift from what the server accepts.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from edge_llm.protocol.anthropic import CountTokensRequest, MessagesRequest
from edge_llm.protocol.openai import ChatCompletionRequest, CompletionRequest
from edge_llm.protocol.responses import ResponsesRequest

# Every request model, by the path that takes it.
_BODIES: dict[str, tuple[str, type[BaseModel]]] = {
    "/v1/chat/completions": ("Chat completion", ChatCompletionRequest),
    "/v1/completions": ("Text completion", CompletionRequest),
    "/v1/responses": ("OpenAI Responses API", ResponsesRequest),
    "/v1/messages": ("Anthropic Messages API", MessagesRequest),
    "/v1/messages/count_tokens": ("Anthropic token count (JSON only)", CountTokensRequest),
}

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "code": {"type": "string"},
                "param": {"type": ["string", "null"]},
            },
        }
    },
}


def _json_body(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _responses(success: dict[str, Any]) -> dict[str, Any]:
    error = {"content": {"application/json": {"schema": _ERROR}}}
    return {
        "200": success,
        **{
            str(status): {"description": description, **error}
            for status, description in (
                (400, "invalid request"),
                (401, "missing or wrong API key"),
                (404, "unknown model"),
                (409, "superseded by a newer request of the same session"),
                (413, "body too large"),
                (503, "queue full, KV budget in use, or shutting down"),
                (504, "no first token within ttft_timeout_ms"),
            )
        },
    }


def _generation(summary: str, model: type[BaseModel]) -> dict[str, Any]:
    success = {
        "description": "a completion (JSON) or, with stream: true, server-sent events",
        "content": {"application/json": {}, "text/event-stream": {}},
    }
    return {
        "post": {
            "summary": summary,
            "requestBody": _json_body(model),
            "responses": _responses(success),
        }
    }


def _get(summary: str) -> dict[str, Any]:
    return {"get": {"summary": summary, "responses": {"200": {"description": summary}}}}


def openapi_document(version: str) -> dict[str, Any]:
    components: dict[str, Any] = {}
    for _, model in _BODIES.values():
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(schema.pop("$defs", {}))
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "edge-llm", "version": version},
        "paths": {
            **{path: _generation(*described) for path, described in _BODIES.items()},
            "/v1/models": _get("Models served"),
            "/health": _get("Engine health"),
            "/debug/streams": _get("Live streams, ring and KV cursors"),
        },
        "components": {"schemas": components},
    }
    for path in _BODIES:
        body = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        body["schema"].pop("$defs", None)
    return document
