"""Responses and Messages requests relayed to an upstream as Chat Completions (no I/O).

Every OpenAI-compatible engine (vLLM, llama-server, edge-llm, hosted APIs)
serves ``/v1/chat/completions``; few serve ``/v1/responses`` or ``/v1/messages``.
So a Responses or Messages request for an upstream is sent as a chat request,
and the upstream's chat chunks are read back as the tool-call parser's events
(:class:`ChatChunkReader`), which the local Responses and Messages encoders
take unchanged.

A field with a direct chat counterpart is passed on; a field the local engine
also accepts with no effect is left out; a field that changes the answer and
has no chat counterpart (an Anthropic prefill) is a 400 naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edge_llm.errors import InvalidRequest
from edge_llm.protocol import anthropic, responses
from edge_llm.protocol.tools import (
    ArgumentsOut,
    CallStarted,
    OutputEvent,
    TextOut,
    ToolCall,
    ToolSetup,
)

# The chat path every OpenAI-compatible engine serves.
CHAT_PATH = "/v1/chat/completions"
# response_format's json_schema needs a name; Responses and Messages may give none.
_DEFAULT_SCHEMA_NAME = "response"


def responses_chat_body(
    req: responses.ResponsesRequest, messages: list[dict[str, Any]]
) -> dict[str, Any]:
    """The chat request for a Responses request whose conversation (stored turns,
    ``instructions`` and ``input``) is ``messages``."""
    body: dict[str, Any] = {"model": req.model, "messages": _portable(messages)}
    _put(body, "max_tokens", req.max_output_tokens)
    _put(body, "temperature", req.temperature)
    _put(body, "top_p", req.top_p)
    _put(body, "user", req.user)
    _put(body, "priority", req.priority)  # vLLM's; the tiers are chat's too
    _put(body, "service_tier", req.service_tier)
    body.update(_tools(req.tool_setup()))
    _put(body, "response_format", _responses_format(req))
    return body


def messages_chat_body(req: anthropic.MessagesRequest, session: str | None) -> dict[str, Any]:
    """The chat request for an Anthropic Messages request of ``session`` (its
    X-Session-Id, sent as ``user``)."""
    if req.prefill is not None:
        raise InvalidRequest(
            "a trailing assistant message (a prefill) cannot be relayed to an upstream: "
            "Chat Completions has no way to continue a message",
            param="messages",
        )
    body: dict[str, Any] = {
        "model": req.model,
        "messages": _portable(req.chat_messages()),
        "max_tokens": req.max_tokens,
    }
    _put(body, "temperature", req.temperature)
    _put(body, "top_p", req.top_p)
    _put(body, "top_k", req.top_k)  # not OpenAI's, but vLLM, llama-server, edge-llm take it
    _put(body, "stop", list(req.stops) or None)
    _put(body, "priority", req.priority)  # vLLM's; Anthropic's tiers are not chat's
    # metadata.user_id names a user, whose requests run side by side (Claude Code's
    # subagents share one); the session that supersedes is X-Session-Id.
    _put(body, "user", session)
    body.update(_tools(req.tool_setup()))
    schema = req.output_schema
    if schema is not None:
        body["response_format"] = _json_schema_format(_DEFAULT_SCHEMA_NAME, schema)
    return body


def _put(body: dict[str, Any], key: str, value: object) -> None:
    if value is not None:
        body[key] = value


def _portable(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Without the ``name`` the local polyfill adds to tool results (OpenAI's
    tool messages have none: a strict upstream would refuse it)."""
    return [
        {k: v for k, v in m.items() if k != "name"} if m.get("role") == "tool" else m
        for m in messages
    ]


def _tools(setup: ToolSetup | None) -> dict[str, Any]:
    if setup is None:
        return {}
    fields: dict[str, Any] = {"tools": [tool.openai_dict() for tool in setup.tools]}
    choice = setup.choice
    if choice.name is not None:
        fields["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    else:
        fields["tool_choice"] = choice.mode
    if not setup.parallel:
        fields["parallel_tool_calls"] = False
    return fields


def _responses_format(req: responses.ResponsesRequest) -> dict[str, Any] | None:
    fmt = req.text.format if req.text else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    _, schema = req.format_schema()  # raises if the schema is missing
    spec = _json_schema_format(fmt.name or _DEFAULT_SCHEMA_NAME, schema or {})
    if fmt.description:
        spec["json_schema"]["description"] = fmt.description
    if fmt.strict is not None:
        spec["json_schema"]["strict"] = fmt.strict
    return spec


def _json_schema_format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


def usage_counts(usage: object) -> dict[str, Any]:
    """An upstream's usage in the local engine's shape (every count present; vLLM
    sends ``prompt_tokens_details: null``; anything malformed counts as 0)."""
    usage = usage if isinstance(usage, dict) else {}
    prompt = _count(usage.get("prompt_tokens"))
    completion = _count(usage.get("completion_tokens"))
    details = usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": _count(usage.get("total_tokens")) or prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class ChatChunkReader:
    """Chat completion chunks as :class:`~edge_llm.protocol.tools.ToolOutputParser`
    events: the same ``feed`` / ``finish`` / ``text`` / ``calls``.

    Only the first choice is read (the relay asks for one). A call's argument
    pieces go to the call started last, as the encoders expect: upstreams stream
    parallel calls one after another.
    """

    def __init__(self, new_id: Callable[[], str]) -> None:
        self.new_id = new_id
        self.text = ""
        self.calls: list[ToolCall] = []
        self.stop_sequence: str | None = None
        self._positions: dict[int, int] = {}  # upstream call index -> position in calls

    def feed(self, chunk: dict[str, Any]) -> list[OutputEvent]:
        choice = _first_choice(chunk)
        if choice is None:
            return []
        stop = choice.get("stop_reason")  # vLLM: the stop string that ended the answer
        if isinstance(stop, str):
            self.stop_sequence = stop
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return []
        events: list[OutputEvent] = []
        content = delta.get("content")
        if isinstance(content, str) and content:
            self.text += content
            events.append(TextOut(content))
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            if isinstance(call, dict):
                events += self._call_delta(call)
        return events

    def finish(self) -> list[OutputEvent]:
        return []  # nothing is held back: the upstream parsed its calls itself

    def _call_delta(self, call: dict[str, Any]) -> list[OutputEvent]:
        index = call.get("index")
        key = index if isinstance(index, int) else 0  # OpenAI always sends it
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        events: list[OutputEvent] = []
        position = self._positions.get(key)
        if position is None:
            position = self._positions[key] = len(self.calls)
            call_id = call.get("id") if isinstance(call.get("id"), str) else None
            name = str(function.get("name") or "")
            self.calls.append(ToolCall(call_id or self.new_id(), name, ""))
            events.append(CallStarted(position, self.calls[position].id, name))
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            old = self.calls[position]
            self.calls[position] = ToolCall(old.id, old.name, old.arguments + arguments)
            events.append(ArgumentsOut(position, arguments))
        return events


def _first_choice(chunk: dict[str, Any]) -> dict[str, Any] | None:
    choices = chunk.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    return choices[0]
