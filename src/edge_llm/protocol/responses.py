"""OpenAI Responses API (``POST /v1/responses``): request, objects, events (no I/O).
One module for the one API, as ``openai.py`` and ``anthropic.py`` are (hence its length).

What a request may hold:

- ``input``: a string, or a list of items: messages (roles ``user``,
  ``assistant``, ``system``, ``developer``; content a string or ``input_text`` /
  ``output_text`` / ``refusal`` parts), ``function_call`` and
  ``function_call_output`` items; ``reasoning`` items are accepted and skipped
  (this model does not reason). Image, file and audio parts: 400.
- ``instructions`` (a system message), ``max_output_tokens``, ``temperature``,
  ``top_p``, ``tools`` (``function``; a ``namespace`` of functions is flattened;
  tools OpenAI hosts, such as ``web_search``, are accepted and not offered to the
  model, and the ``X-Edge-LLM-Ignored`` header names them), ``tool_choice``,
  ``parallel_tool_calls``, ``text.format`` (``text``, ``json_object``,
  ``json_schema``: enforced by a grammar), ``stream``, ``priority`` and
  ``service_tier`` (the request's class: :mod:`edge_llm.protocol.priority`).
- ``previous_response_id``: the conversation of a stored response continues
  (``store`` defaults to true; a bounded in-memory store, oldest dropped first);
  an unknown or dropped id is a 404.
- Accepted with no effect: ``store`` (beyond the above), ``metadata``,
  ``reasoning``, ``include``, ``prompt_cache_key``, ``client_metadata``,
  ``user`` (it names the session, as on chat completions),
  ``truncation``, ``safety_identifier``, ``stream_options``, ``top_logprobs``,
  ``max_tool_calls``, ``text.verbosity``. The ``prompt``/``conversation``
  objects cannot be honoured: 400.
- ``background: true``: the response runs detached from the connection
  (:mod:`edge_llm.generation.background`); it starts ``queued`` and needs ``store``.
"""

from __future__ import annotations

import json
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

from edge_llm.errors import EdgeLLMError, InvalidRequest
from edge_llm.protocol.openai import (
    RefusalPart,
    Strict,
    TextPart,
    check_content_parts,
    parse_request,
)
from edge_llm.protocol.priority import OPENAI_TIERS, OpenAITier, Priority, body_priority
from edge_llm.protocol.tools import (
    ArgumentsOut,
    CallStarted,
    FunctionTool,
    OutputEvent,
    TextOut,
    ToolChoice,
    ToolSetup,
)

HostedToolType = Literal[
    "web_search",
    "web_search_preview",
    "file_search",
    "code_interpreter",
    "image_generation",
    "computer_use_preview",
    "mcp",
]
HOSTED_TOOLS: tuple[str, ...] = get_args(HostedToolType)
_TOOL_TYPES = ("function", "namespace", *HOSTED_TOOLS)
_ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
_PART_TYPES = ("input_text", "output_text", "refusal", "text")
_UNSUPPORTED_PARTS = {
    "input_image": "this model has no vision input",
    "input_file": "this model has no file input",
    "input_audio": "this model has no audio input",
}


class OutputTextPart(Strict):
    type: Literal["output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class InputTextPart(Strict):
    type: Literal["input_text"]
    text: str


ContentPart = InputTextPart | OutputTextPart | RefusalPart | TextPart


class MessageItem(Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    id: str | None = None
    status: str | None = None
    phase: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _parts(cls, value: object) -> object:
        return check_content_parts(value, _UNSUPPORTED_PARTS, _PART_TYPES)

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(
            part.refusal if isinstance(part, RefusalPart) else part.text for part in self.content
        )


class FunctionCallItem(Strict):
    type: Literal["function_call"]
    call_id: Annotated[str, Field(min_length=1)]
    name: Annotated[str, Field(min_length=1)]
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(Strict):
    type: Literal["function_call_output"]
    call_id: Annotated[str, Field(min_length=1)]
    output: str | list[ContentPart]
    id: str | None = None
    status: str | None = None

    @field_validator("output", mode="before")
    @classmethod
    def _parts(cls, value: object) -> object:
        return check_content_parts(value, _UNSUPPORTED_PARTS, _PART_TYPES)

    def text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "".join(getattr(part, "text", "") for part in self.output)


class ReasoningItem(Strict):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[Any] | None = None
    content: list[Any] | None = None
    encrypted_content: str | None = None
    status: str | None = None


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem


class FunctionToolParam(Strict):
    type: Literal["function"]
    name: Annotated[str, Field(min_length=1, max_length=256)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamespaceTool(Strict):
    """A group of functions (Codex sends its sub-agent tools so); flattened."""

    type: Literal["namespace"]
    name: str
    description: str | None = None
    tools: list[FunctionToolParam]


class HostedTool(BaseModel):
    """A tool OpenAI runs on its side (web search, ...): not offered to the model."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)
    type: HostedToolType


class NamedFunction(Strict):
    type: Literal["function"]
    name: str


class ResponsesTextFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: Annotated[dict[str, Any] | None, Field(alias="schema")] = None
    description: str | None = None
    strict: bool | None = None


class TextConfig(Strict):
    format: ResponsesTextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesRequest(Strict):
    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    tools: list[FunctionToolParam | NamespaceTool | HostedTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    stream: bool = False
    previous_response_id: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    store: bool | None = None
    background: bool | None = None
    priority: Priority | None = None  # vLLM's field (see edge_llm.protocol.priority)
    service_tier: OpenAITier | None = None
    # Accepted, no effect here (see the module docstring).
    metadata: dict[str, str] | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    prompt_cache_key: str | None = None
    client_metadata: dict[str, Any] | None = None
    user: Annotated[str, Field(max_length=256)] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    safety_identifier: str | None = None
    stream_options: dict[str, Any] | None = None  # only "resumable" is read
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    max_tool_calls: Annotated[int, Field(ge=1)] | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _item_types(cls, value: object) -> object:
        """Name an unsupported item type instead of listing every union branch."""
        if isinstance(value, list):
            for item in value:
                kind = item.get("type", "message") if isinstance(item, dict) else None
                if kind is not None and kind not in _ITEM_TYPES:
                    raise ValueError(
                        f"input item type {kind!r} is not supported ({', '.join(_ITEM_TYPES)})"
                    )
        return value

    @field_validator("tools", mode="before")
    @classmethod
    def _function_tools(cls, value: object) -> object:
        if isinstance(value, list):
            for tool in value:
                kind = tool.get("type") if isinstance(tool, dict) else None
                if isinstance(kind, str) and kind not in _TOOL_TYPES:
                    raise ValueError(
                        f"tool type {kind!r} is not supported (function, namespace; "
                        f"hosted tools are accepted and not offered: {', '.join(HOSTED_TOOLS)})"
                    )
        return value

    def functions(self) -> list[FunctionToolParam]:
        """The function tools, namespaces flattened; hosted tools left out."""
        out: list[FunctionToolParam] = []
        for tool in self.tools or []:
            if isinstance(tool, FunctionToolParam):
                out.append(tool)
            elif isinstance(tool, NamespaceTool):
                out += tool.tools
        return out

    def hosted_tools(self) -> list[str]:
        return [t.type for t in self.tools or [] if isinstance(t, HostedTool)]

    def tool_setup(self) -> ToolSetup | None:
        functions = self.functions()
        if not functions:
            if isinstance(self.tool_choice, NamedFunction) or self.tool_choice == "required":
                raise InvalidRequest("tool_choice needs function tools", param="tool_choice")
            return None
        tools = tuple(
            FunctionTool(
                t.name, t.description, t.parameters or {"type": "object", "properties": {}}
            )
            for t in functions
        )
        if isinstance(self.tool_choice, NamedFunction):
            choice = ToolChoice("required", self.tool_choice.name)
        else:
            choice = ToolChoice(self.tool_choice or "auto")
        return ToolSetup(tools, choice, self.parallel_tool_calls is not False)

    def format_schema(self) -> tuple[bool, dict[str, Any] | None]:
        """``(constrained, schema)``: json_object gives ``(True, None)``."""
        fmt = self.text.format if self.text else None
        if fmt is None or fmt.type == "text":
            return False, None
        if fmt.type == "json_schema" and fmt.schema_ is None:
            raise InvalidRequest("text.format.schema is required", param="text.format.schema")
        return True, fmt.schema_

    def input_messages(self) -> list[dict[str, Any]]:
        """This request's input as chat messages (without ``instructions``)."""
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        return conversation(self.input)

    @property
    def resumable(self) -> bool:
        """A resumable stream asked for (``stream_options.resumable``)."""
        return self.stream and bool((self.stream_options or {}).get("resumable"))

    @property
    def stores(self) -> bool:
        return self.store is not False

    def check_background(self) -> None:
        """A background response is read back later: it must be stored."""
        if self.background and not self.stores:
            raise InvalidRequest("background responses need store: true", param="store")

    @property
    def explicit_priority(self) -> int | None:
        """The class the body asks for: ``priority``, else its service tier's."""
        return body_priority(self.priority, self.service_tier, OPENAI_TIERS)


def parse(body: object) -> ResponsesRequest:
    """Validate a decoded JSON body, or raise InvalidRequest naming the field."""
    return parse_request(ResponsesRequest, body)


def conversation(items: list[InputItem]) -> list[dict[str, Any]]:
    """Input items as chat messages; consecutive calls join one assistant turn."""
    messages: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for item in items:
        if isinstance(item, MessageItem):
            role = "system" if item.role == "developer" else item.role
            messages.append({"role": role, "content": item.text()})
        elif isinstance(item, FunctionCallItem):
            names[item.call_id] = item.name
            _add_call(messages, item)
        elif isinstance(item, FunctionCallOutputItem):
            tool = {"role": "tool", "tool_call_id": item.call_id, "content": item.text()}
            if item.call_id in names:
                tool["name"] = names[item.call_id]
            messages.append(tool)
    return messages


def _add_call(messages: list[dict[str, Any]], item: FunctionCallItem) -> None:
    call = {
        "id": item.call_id,
        "type": "function",
        "function": {"name": item.name, "arguments": item.arguments},
    }
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def retrieve_query(query: Mapping[str, str]) -> tuple[bool, int | None]:
    """``GET /v1/responses/{id}``'s query: ``(stream, starting_after)``; other
    parameters (``include``, ``include_obfuscation``) change nothing here."""
    stream = query.get("stream", "false").strip().lower()
    if stream not in ("true", "false"):
        raise InvalidRequest(f"stream must be true or false, got {stream[:20]!r}", param="stream")
    after = query.get("starting_after")
    if after is None:
        return stream == "true", None
    if not after.strip().isdigit() or len(after.strip()) > 9:
        raise InvalidRequest(
            f"starting_after must be a sequence number (0 or more), got {after[:20]!r}",
            param="starting_after",
        )
    return stream == "true", int(after)


# -- the store behind previous_response_id --------------------------------------------


class ResponseStore:
    """The conversations of recent responses, bounded in count and in characters;
    the least recently used is dropped first."""

    def __init__(self, max_responses: int = 256, max_chars: int = 8 * 1024 * 1024) -> None:
        self.max_responses = max_responses
        self.max_chars = max_chars
        self._items: OrderedDict[str, tuple[list[dict[str, Any]], int]] = OrderedDict()
        self._chars = 0

    def get(self, response_id: str) -> list[dict[str, Any]] | None:
        entry = self._items.get(response_id)
        if entry is None:
            return None
        self._items.move_to_end(response_id)
        return [dict(m) for m in entry[0]]

    def put(self, response_id: str, messages: list[dict[str, Any]]) -> None:
        size = len(json.dumps(messages))
        if size > self.max_chars:
            return
        self._items[response_id] = (messages, size)
        self._chars += size
        while len(self._items) > self.max_responses or self._chars > self.max_chars:
            _, (_, dropped) = self._items.popitem(last=False)
            self._chars -= dropped

    def __len__(self) -> int:
        return len(self._items)


# -- the response object and its events ----------------------------------------------


def response_id(request_id: str) -> str:
    return "resp_" + request_id.rsplit("-", 1)[-1]


@dataclass
class _Item:
    """One output item being built: a message or a function call."""

    kind: str
    id: str
    text: str = ""
    call_id: str = ""
    name: str = ""
    done: bool = False

    def body(self, status: str) -> dict[str, Any]:
        if self.kind == "message":
            content = [_text_part(self.text)] if status == "completed" or self.text else []
            return {
                "id": self.id,
                "type": "message",
                "role": "assistant",
                "status": status,
                "content": content,
            }
        return {
            "id": self.id,
            "type": "function_call",
            "call_id": self.call_id,
            "name": self.name,
            "arguments": self.text,
            "status": status,
        }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


@dataclass
class ResponseBuilder:
    """Builds the response object and the stream's events from the text and
    tool-call events of one generation. Events carry ``sequence_number``."""

    id: str
    model: str
    created_at: int
    request: ResponsesRequest
    items: list[_Item] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    status: str = "in_progress"
    error: dict[str, Any] | None = None
    _sequence: int = 0

    def opening(self) -> list[dict[str, Any]]:
        return [
            self._event("response.created", response=self.snapshot()),
            self._event("response.in_progress", response=self.snapshot()),
        ]

    def queued(self) -> list[dict[str, Any]]:
        """A background response's first events: it waits for the engine."""
        self.status = "queued"
        return [
            self._event("response.created", response=self.snapshot()),
            self._event("response.queued", response=self.snapshot()),
        ]

    def started(self) -> list[dict[str, Any]]:
        """A queued response left the queue (nothing when it already had)."""
        if self.status != "queued":
            return []
        self.status = "in_progress"
        return [self._event("response.in_progress", response=self.snapshot())]

    def cancel(self) -> None:
        """Cancelled (``POST /v1/responses/{id}/cancel``): no event follows."""
        self.status = "cancelled"

    def on(self, event: OutputEvent) -> list[dict[str, Any]]:
        started = self.started()
        if isinstance(event, TextOut):
            return started + self._text(event.text)
        if isinstance(event, CallStarted):
            return started + self._call(event)
        return started + self._arguments(event)

    def finish(self, finish_reason: str, usage: dict[str, Any]) -> list[dict[str, Any]]:
        events = self.started() + self._close_open()
        self.usage = _usage(usage)
        if finish_reason == "length":
            self.status = "incomplete"
            return [*events, self._event("response.incomplete", response=self.snapshot())]
        self.status = "completed"
        return [*events, self._event("response.completed", response=self.snapshot())]

    def failed(self, error: EdgeLLMError) -> list[dict[str, Any]]:
        self.status = "failed"
        self.error = {"code": error.code, "message": error.message}
        return [
            self._event("error", code=error.code, message=error.message, param=error.param),
            self._event("response.failed", response=self.snapshot()),
        ]

    def snapshot(self) -> dict[str, Any]:
        req = self.request
        fmt = req.text.format if req.text and req.text.format else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "background": bool(req.background),
            "error": self.error,
            "incomplete_details": (
                {"reason": "max_output_tokens"} if self.status == "incomplete" else None
            ),
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "model": self.model,
            "output": [item.body(_item_status(item, self.status)) for item in self.items],
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "store": req.stores,
            "temperature": req.temperature if req.temperature is not None else 1.0,
            "text": {
                "format": (
                    fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}
                )
            },
            "tool_choice": _tool_choice(req),
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
            "top_p": req.top_p if req.top_p is not None else 1.0,
            "truncation": req.truncation or "disabled",
            "usage": self.usage,
            "user": req.user,
            "metadata": req.metadata or {},
        }

    def output_messages(self) -> list[dict[str, Any]]:
        """The answer as chat messages, for the store."""
        message: dict[str, Any] = {"role": "assistant", "content": None}
        for item in self.items:
            if item.kind == "message":
                message["content"] = (message["content"] or "") + item.text
            else:
                call = {"name": item.name, "arguments": item.text}
                entry = {"id": item.call_id, "type": "function", "function": call}
                message.setdefault("tool_calls", []).append(entry)
        return [message]

    # -- items ------------------------------------------------------------------

    def _text(self, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        item = self.items[-1] if self.items else None
        if item is None or item.kind != "message" or item.done:
            events += self._close_open()
            item = _Item("message", "msg_" + uuid.uuid4().hex[:24])
            self.items.append(item)
            events.append(self._item_event("response.output_item.added", item))
            events.append(self._part_event("response.content_part.added", item, ""))
        item.text += text
        events.append(
            self._event(
                "response.output_text.delta",
                item_id=item.id,
                output_index=len(self.items) - 1,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return events

    def _call(self, event: CallStarted) -> list[dict[str, Any]]:
        events = self._close_open()
        item = _Item("function_call", "fc_" + uuid.uuid4().hex[:24])
        item.call_id, item.name = event.id, event.name
        self.items.append(item)
        events.append(self._item_event("response.output_item.added", item))
        return events

    def _arguments(self, event: ArgumentsOut) -> list[dict[str, Any]]:
        item = self.items[-1]
        item.text += event.text
        return [
            self._event(
                "response.function_call_arguments.delta",
                item_id=item.id,
                output_index=len(self.items) - 1,
                delta=event.text,
            )
        ]

    def _close_open(self) -> list[dict[str, Any]]:
        if not self.items or self.items[-1].done:
            return []
        item = self.items[-1]
        item.done = True
        index = len(self.items) - 1
        if item.kind == "message":
            events = [
                self._event(
                    "response.output_text.done",
                    item_id=item.id,
                    output_index=index,
                    content_index=0,
                    text=item.text,
                    logprobs=[],
                ),
                self._part_event("response.content_part.done", item, item.text),
            ]
        else:
            events = [
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item.id,
                    output_index=index,
                    name=item.name,
                    arguments=item.text,
                )
            ]
        return [*events, self._item_event("response.output_item.done", item)]

    def _item_event(self, kind: str, item: _Item) -> dict[str, Any]:
        status = "completed" if item.done else "in_progress"
        return self._event(kind, output_index=self.items.index(item), item=item.body(status))

    def _part_event(self, kind: str, item: _Item, text: str) -> dict[str, Any]:
        return self._event(
            kind,
            item_id=item.id,
            output_index=self.items.index(item),
            content_index=0,
            part=_text_part(text),
        )

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event


def _item_status(item: _Item, response_status: str) -> str:
    if item.done:
        return "completed" if response_status != "incomplete" else "incomplete"
    return "in_progress"


def _tool_choice(req: ResponsesRequest) -> Any:
    if isinstance(req.tool_choice, NamedFunction):
        return req.tool_choice.model_dump()
    return req.tool_choice or "auto"


def _usage(counts: dict[str, Any]) -> dict[str, Any]:
    cached = counts.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    return {
        "input_tokens": counts["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": counts["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": counts["total_tokens"],
    }
