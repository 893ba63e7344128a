"""Anthropic Messages API: request validation and response objects (no I/O).

What ``POST /v1/messages`` accepts, beyond what the engine does with it:

- ``model`` is required (as in Anthropic's API) but any id is accepted: tools
  such as Claude Code send their own model ids (``claude-...``) unless
  ``ANTHROPIC_MODEL`` is set, so rejecting them would make those tools unusable.
  Every response names the model actually served.
- ``max_tokens`` is required; above the engine's ``max_tokens_cap`` it is lowered
  to the cap (clients send 32000 as a matter of course); hitting it gives
  ``stop_reason: "max_tokens"``.
- Content is a string or blocks: ``text``, ``tool_use`` (in assistant turns) and
  ``tool_result`` (in user turns); other block types (image, document, ...) get a
  400 naming the block.
- ``tools`` (client tools: ``name``, ``description``, ``input_schema``) and
  ``tool_choice`` (``auto``, ``any``, ``tool`` with ``name``, ``none``;
  ``disable_parallel_tool_use``) work as described in
  :mod:`edge_llm.protocol.tools`: ``any`` and ``tool`` constrain sampling to a
  call whose ``input`` validates against the tool's ``input_schema``. Answers
  with calls end with ``stop_reason: "tool_use"``; streamed calls arrive as
  ``tool_use`` blocks with ``input_json_delta`` deltas. Server tools (a
  ``type`` such as ``web_search_20250305``) get a 400 naming the type.
- A ``system`` message inside ``messages`` (Claude Code sends them mid-conversation)
  is a system turn at that place, after the top-level ``system``.
- ``thinking`` (``adaptive``, ``enabled`` with ``budget_tokens``, ``disabled``) is
  accepted and ignored: the model has no separate reasoning to show.
- A trailing ``assistant`` message is a prefill: the answer continues it.
- Fields of Anthropic's API that do not change what this engine generates are
  accepted and have no effect: ``thinking``, ``cache_control`` (top
  level and on blocks), ``citations`` on blocks, ``speed``,
  ``container``, ``context_management``, ``mcp_servers``, ``diagnostics``,
  ``inference_geo``, ``user_profile_id``, ``workspace_id``, ``output_config``
  (its ``effort``); the response header ``X-Edge-LLM-Ignored`` lists those given.
- ``output_config.format`` (``{"type": "json_schema", "schema": {...}}``,
  structured output) is enforced by a grammar built from the schema, as OpenAI's
  ``response_format``; a schema that cannot be converted is a 400.
- ``service_tier`` (``auto``, ``standard_only``) and this engine's ``priority``
  set the request's class (:mod:`edge_llm.protocol.priority`).
- ``temperature``, ``top_p`` and ``top_k`` are honoured (recent SDKs send them
  only through ``extra_body``).
- Unknown fields, wrong types and out-of-range numbers: 400 naming the field.

Errors have Anthropic's shape ``{"type": "error", "error": {"type", "message"}}``
plus the engine's ``code`` (and details such as ``n_prompt_tokens``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from edge_llm.errors import (
    AuthenticationFailed,
    BodyTooLarge,
    EdgeLLMError,
    InvalidRequest,
    NotFound,
    Overloaded,
    TtftTimeout,
)
from edge_llm.protocol.openai import parse_request as _parse
from edge_llm.protocol.priority import ANTHROPIC_TIERS, AnthropicTier, Priority, body_priority
from edge_llm.protocol.sampling import SamplingDefaults, SamplingParams
from edge_llm.protocol.tools import (
    CallStarted,
    ChoiceMode,
    FunctionTool,
    OutputEvent,
    TextOut,
    ToolCall,
    ToolChoice,
    ToolSetup,
)

MAX_STOP_SEQUENCES = 4
MAX_STOP_SEQUENCE_CHARS = 256
IGNORED_FIELDS = (
    "thinking",
    "cache_control",
    "speed",
    "container",
    "context_management",
    "mcp_servers",
    "diagnostics",
    "inference_geo",
    "user_profile_id",
    "workspace_id",
    "output_config",
)
_BLOCK_TYPES: dict[str, tuple[str, ...]] = {
    "user": ("text", "tool_result"),
    "assistant": ("text", "tool_use"),
}
_UNSUPPORTED_BLOCKS = {
    "image": "this model has no vision input",
    "document": "this model has no document input",
}
_ERROR_TYPES: tuple[tuple[type[EdgeLLMError], str], ...] = (
    (AuthenticationFailed, "authentication_error"),
    (NotFound, "not_found_error"),
    (BodyTooLarge, "request_too_large"),
    (TtftTimeout, "timeout_error"),
    (Overloaded, "overloaded_error"),
    (InvalidRequest, "invalid_request_error"),
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


class TextBlock(_Strict):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None  # a prompt-cache hint: no effect here
    citations: list[dict[str, Any]] | None = None


def _text_only(value: object, allowed: tuple[str, ...] = ("text",)) -> object:
    """Name the unsupported block instead of pydantic's "input should be 'text'"."""
    if isinstance(value, list):
        for block in value:
            kind = block.get("type") if isinstance(block, dict) else None
            if isinstance(kind, str) and kind not in allowed:
                reason = _UNSUPPORTED_BLOCKS.get(kind, f"only {', '.join(allowed)}")
                raise ValueError(f"content block type {kind!r} is not supported ({reason})")
    return value


class ToolUseBlock(_Strict):
    type: Literal["tool_use"]
    id: Annotated[str, Field(min_length=1)]
    name: Annotated[str, Field(min_length=1)]
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolResultBlock(_Strict):
    type: Literal["tool_result"]
    tool_use_id: Annotated[str, Field(min_length=1)]
    content: str | list[TextBlock] | None = None
    is_error: bool | None = None
    cache_control: dict[str, Any] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _blocks(cls, value: object) -> object:
        return _text_only(value)

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            text = self.content or ""
        else:
            text = "".join(block.text for block in self.content)
        return f"Error: {text}" if self.is_error else text


Block = TextBlock | ToolUseBlock | ToolResultBlock


class Message(_Strict):
    # "system" inside messages: Claude Code's mid-conversation system turns.
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]

    @field_validator("content", mode="before")
    @classmethod
    def _blocks(cls, value: object, info: ValidationInfo) -> object:
        role = str(info.data.get("role"))
        return _text_only(value, _BLOCK_TYPES.get(role, ("text",)))

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(block.text for block in self.content if isinstance(block, TextBlock))

    @property
    def has_tool_blocks(self) -> bool:
        return isinstance(self.content, list) and any(
            not isinstance(block, TextBlock) for block in self.content
        )

    def template_dicts(self) -> list[dict[str, Any]]:
        """This turn as chat messages: tool results become ``tool`` messages (before
        the user's text, as Anthropic orders them), calls an assistant's ``tool_calls``."""
        blocks = self.content if isinstance(self.content, list) else []
        results = [
            {"role": "tool", "tool_call_id": b.tool_use_id, "content": b.text()}
            for b in blocks
            if isinstance(b, ToolResultBlock)
        ]
        calls = [_tool_call(b) for b in blocks if isinstance(b, ToolUseBlock)]
        text = self.text()
        turn: dict[str, Any] = {"role": self.role, "content": text}
        if calls:
            turn["tool_calls"] = calls
        if results and not text:
            return results
        return [*results, turn]


def _tool_call(block: ToolUseBlock) -> dict[str, Any]:
    arguments = json.dumps(block.input)
    return {
        "id": block.id,
        "type": "function",
        "function": {"name": block.name, "arguments": arguments},
    }


class Tool(_Strict):
    """A client tool; server tools (``web_search_...``) cannot run here."""

    type: Literal["custom"] | None = None
    name: Annotated[str, Field(min_length=1, max_length=128)]
    description: str | None = None
    input_schema: dict[str, Any]
    cache_control: dict[str, Any] | None = None
    strict: bool | None = None
    input_examples: list[Any] | None = None


class ToolChoiceParam(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(BaseModel):
    """Extended thinking: accepted and ignored (this engine's models do not reason
    apart from their answer); only its kind is checked."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)
    type: Literal["adaptive", "enabled", "disabled"]
    budget_tokens: Annotated[int, Field(ge=0)] | None = None


class Metadata(_Strict):
    user_id: Annotated[str, Field(max_length=256)] | None = None


class MessagesRequest(_Strict):
    model: Annotated[str, Field(min_length=1, max_length=256)]
    max_tokens: Annotated[int, Field(ge=1)]
    messages: Annotated[list[Message], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=0, le=100000)] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    resumable: bool = False  # this engine's: a dropped connection may resume the stream
    metadata: Metadata | None = None
    tools: Annotated[list[Tool], Field(max_length=128)] | None = None
    tool_choice: ToolChoiceParam | None = None
    output_config: dict[str, Any] | None = None
    priority: Priority | None = None  # vLLM's field (see edge_llm.protocol.priority)
    service_tier: AnthropicTier | None = None
    # Accepted, no effect here (see the module docstring); any JSON value.
    thinking: Thinking | None = None
    cache_control: Any = None
    speed: Any = None
    container: Any = None
    context_management: Any = None
    mcp_servers: Any = None
    diagnostics: Any = None
    inference_geo: Any = None
    user_profile_id: Any = None
    workspace_id: Any = None

    @field_validator("system", mode="before")
    @classmethod
    def _system_blocks(cls, value: object) -> object:
        return _text_only(value)

    @field_validator("stop_sequences")
    @classmethod
    def _bounded_stops(cls, value: list[str] | None) -> list[str] | None:
        stops = value or []
        if len(stops) > MAX_STOP_SEQUENCES or any(len(s) > MAX_STOP_SEQUENCE_CHARS for s in stops):
            raise ValueError(
                f"at most {MAX_STOP_SEQUENCES} stop sequences of "
                f"{MAX_STOP_SEQUENCE_CHARS} characters"
            )
        return value

    @field_validator("tools", mode="before")
    @classmethod
    def _client_tools(cls, value: object) -> object:
        if isinstance(value, list):
            for tool in value:
                kind = tool.get("type") if isinstance(tool, dict) else None
                if isinstance(kind, str) and kind != "custom":
                    raise ValueError(f"tool type {kind!r} is not supported (client tools only)")
        return value

    def tool_setup(self) -> ToolSetup | None:
        choice = self.tool_choice
        if not self.tools:
            if choice is not None and choice.type in ("any", "tool"):
                raise InvalidRequest("tool_choice needs tools", param="tool_choice")
            return None
        tools = tuple(FunctionTool(t.name, t.description, t.input_schema) for t in self.tools)
        if choice is not None and choice.type == "tool":
            if choice.name is None:
                raise InvalidRequest("tool_choice.name is required", param="tool_choice.name")
            mode = ToolChoice("required", choice.name)
        else:
            kinds: dict[str, ChoiceMode] = {"any": "required", "none": "none", "auto": "auto"}
            mode = ToolChoice(kinds[choice.type] if choice else "auto")
        parallel = not (choice is not None and choice.disable_parallel_tool_use)
        return ToolSetup(tools, mode, parallel)

    @field_validator("output_config")
    @classmethod
    def _output_format(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        fmt = None if value is None else value.get("format")
        if fmt is None:
            return value
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
            raise ValueError("format must be {'type': 'json_schema', 'schema': {...}}")
        if not isinstance(fmt.get("schema"), dict) or set(fmt) - {"type", "schema"}:
            raise ValueError("format needs a 'schema' object (and nothing else)")
        return value

    @property
    def output_schema(self) -> dict[str, Any] | None:
        """The JSON schema of ``output_config.format`` (structured output), if any."""
        fmt = (self.output_config or {}).get("format")
        return dict(fmt["schema"]) if fmt else None

    @property
    def explicit_priority(self) -> int | None:
        """The class the body asks for: ``priority``, else its service tier's."""
        return body_priority(self.priority, self.service_tier, ANTHROPIC_TIERS)

    @property
    def stops(self) -> tuple[str, ...]:
        return tuple(self.stop_sequences or ())

    @property
    def prefill(self) -> str | None:
        """Text of a trailing assistant message, which the answer continues."""
        last = self.messages[-1]
        if last.role != "assistant" or last.has_tool_blocks:
            return None
        return last.text()

    def chat_messages(self) -> list[dict[str, Any]]:
        """The conversation for the chat template, without a trailing prefill."""
        turns = self.messages[:-1] if self.prefill is not None else self.messages
        system = self._system_text()
        head = [{"role": "system", "content": system}] if system else []
        return head + [d for m in turns for d in m.template_dicts()]

    def sampling(self, defaults: SamplingDefaults) -> SamplingParams:
        """The request's sampling; ``defaults`` fill each field it leaves out."""
        return SamplingParams(
            temperature=defaults.temperature if self.temperature is None else self.temperature,
            top_p=defaults.top_p if self.top_p is None else self.top_p,
            top_k=defaults.top_k if self.top_k is None else self.top_k,
            min_p=defaults.min_p,
            stop=self.stops,
        )

    def ignored(self) -> list[str]:
        """Fields given that have no effect on this engine."""
        names = [name for name in IGNORED_FIELDS if getattr(self, name) is not None]
        if self.output_config is not None and set(self.output_config) <= {"format"}:
            names.remove("output_config")  # a format alone is honoured
        if self._blocks_have("cache_control") and "cache_control" not in names:
            names.append("cache_control")
        if self._blocks_have("citations"):
            names.append("citations")
        return names

    def _system_text(self) -> str:
        if self.system is None or isinstance(self.system, str):
            return self.system or ""
        return "".join(block.text for block in self.system)

    def _blocks_have(self, name: str) -> bool:
        blocks: list[Any] = [] if not isinstance(self.system, list) else list(self.system)
        for message in self.messages:
            if isinstance(message.content, list):
                blocks += message.content
        return any(getattr(block, name, None) is not None for block in blocks)


class CountTokensRequest(MessagesRequest):
    """``POST /v1/messages/count_tokens``: a Messages request without ``max_tokens``
    (given anyway, it is accepted)."""

    max_tokens: Annotated[int, Field(ge=1)] | None = None  # type: ignore[assignment]


def parse_request(body: object) -> MessagesRequest:
    """Validate a decoded JSON body, or raise InvalidRequest naming the field."""
    return _parse(MessagesRequest, body)


def parse_count_request(body: object) -> CountTokensRequest:
    return _parse(CountTokensRequest, body)


# -- how a generation ended ------------------------------------------------------------


def stop_reason(
    finish_reason: str | None, stop_sequence: str | None, *, tool_use: bool = False
) -> tuple[str, str | None]:
    """Anthropic's ``(stop_reason, stop_sequence)`` for how the engine ended."""
    if finish_reason == "length":
        return "max_tokens", None
    if tool_use:
        return "tool_use", None
    if stop_sequence is not None:
        return "stop_sequence", stop_sequence
    return "end_turn", None


# -- responses -------------------------------------------------------------------------


def message_id(request_id: str) -> str:
    return "msg_" + request_id.rsplit("-", 1)[-1]


def usage(prompt_tokens: int, output_tokens: int, cached_tokens: int = 0) -> dict[str, int]:
    """As Anthropic counts: ``input_tokens`` excludes what was read from the cache."""
    return {
        "input_tokens": prompt_tokens - cached_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached_tokens,
    }


def new_tool_use_id() -> str:
    return "toolu_" + uuid.uuid4().hex[:24]


def tool_use_block(call: ToolCall) -> dict[str, Any]:
    """A finished call; ``input`` is ``{}`` if max_tokens cut its JSON short."""
    try:
        arguments = json.loads(call.arguments)
    except ValueError:
        arguments = {}
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": arguments}


def message(
    msg_id: str,
    model: str,
    text: str,
    stop: tuple[str | None, str | None],
    usage_: dict[str, int],
    *,
    calls: Sequence[ToolCall] = (),
) -> dict[str, Any]:
    """A whole message: the non-streaming response, or (empty) inside message_start."""
    content = [{"type": "text", "text": text}] if text else []
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content + [tool_use_block(call) for call in calls],
        "stop_reason": stop[0],
        "stop_sequence": stop[1],
        "usage": usage_,
    }


def message_start(msg_id: str, model: str, input_tokens: int) -> dict[str, Any]:
    empty = message(msg_id, model, "", (None, None), usage(input_tokens, 0))
    return {"type": "message_start", "message": empty}


def content_block_start(index: int = 0) -> dict[str, Any]:
    return {
        "type": "content_block_start",
        "index": index,
        "content_block": {"type": "text", "text": ""},
    }


def tool_use_start(index: int, call_id: str, name: str) -> dict[str, Any]:
    block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
    return {"type": "content_block_start", "index": index, "content_block": block}


def text_delta(text: str, index: int = 0) -> dict[str, Any]:
    return {
        "type": "content_block_delta",
        "index": index,
        "delta": {"type": "text_delta", "text": text},
    }


def input_json_delta(partial_json: str, index: int) -> dict[str, Any]:
    return {
        "type": "content_block_delta",
        "index": index,
        "delta": {"type": "input_json_delta", "partial_json": partial_json},
    }


def content_block_stop(index: int = 0) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


@dataclass
class BlockStream:
    """Content blocks of a streamed answer with tools: a text block for text, a
    ``tool_use`` block per call, each closed before the next one opens."""

    index: int = -1
    open_kind: str | None = None

    def on(self, event: OutputEvent) -> list[tuple[str, dict[str, Any]]]:
        """``(event name, payload)`` pairs to send for one parser event."""
        if isinstance(event, TextOut):
            events = [] if self.open_kind == "text" else self._open("text")
            events += [("content_block_delta", text_delta(event.text, self.index))]
            return events
        if isinstance(event, CallStarted):
            events = self._open("tool_use")
            start = tool_use_start(self.index, event.id, event.name)
            return [*events, ("content_block_start", start)]
        return [("content_block_delta", input_json_delta(event.text, self.index))]

    def open_text(self) -> list[tuple[str, dict[str, Any]]]:
        """Open a text block now (a text-only answer's one block, open from the start)."""
        return self._open("text")

    def close(self) -> list[tuple[str, dict[str, Any]]]:
        if self.open_kind is None:
            return []
        self.open_kind = None
        return [("content_block_stop", content_block_stop(self.index))]

    def _open(self, kind: str) -> list[tuple[str, dict[str, Any]]]:
        events = self.close()
        self.index += 1
        self.open_kind = kind
        if kind == "text":
            events.append(("content_block_start", content_block_start(self.index)))
        return events


def message_delta(stop: tuple[str, str | None], usage_: dict[str, int]) -> dict[str, Any]:
    return {
        "type": "message_delta",
        "delta": {"stop_reason": stop[0], "stop_sequence": stop[1]},
        "usage": {"input_tokens": usage_["input_tokens"], "output_tokens": usage_["output_tokens"]},
    }


def message_stop() -> dict[str, Any]:
    return {"type": "message_stop"}


def ping() -> dict[str, Any]:
    return {"type": "ping"}


def error_type(error: EdgeLLMError) -> str:
    """Anthropic's error type for an engine error (most specific class first)."""
    for cls, name in _ERROR_TYPES:
        if isinstance(error, cls):
            return name
    return "invalid_request_error" if error.status < 500 else "api_error"


def error_body(error: EdgeLLMError) -> dict[str, Any]:
    detail: dict[str, Any] = {"type": error_type(error), "message": error.message}
    detail["code"] = error.code
    if error.param is not None:
        detail["param"] = error.param
    detail.update(error.extra)
    return {"type": "error", "error": detail}
