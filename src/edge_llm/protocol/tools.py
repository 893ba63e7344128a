"""Function tools, shared by Chat Completions, Responses and Anthropic Messages (no I/O).

How a request's tools reach the model and how its answer becomes tool calls:

- A chat template that renders tools itself (it uses ``tools``; probed by the
  backend) gets them as ``tools=`` and the history with ``tool_calls`` and
  ``tool`` messages unchanged. Its model's own call format is parsed back:
  ``<tool_call>{...}</tool_call>`` blocks (Hermes, Qwen, SmolLM3) or a bare
  ``{"name": ..., "arguments"|"parameters": ...}`` object (Llama 3.x).
- A template without tools (SmolLM2) gets the tools as a system text that asks
  for one JSON object ``{"name": ..., "arguments": {...}}``; earlier calls in the
  history are rendered in that same form and tool results as user turns
  ``Result of NAME: ...`` (plain text: a small model repeats a JSON envelope).
- ``tool_choice`` ``required`` or a named function constrains sampling with a
  grammar built from the tools' JSON schemas, so the answer is always one call
  whose ``arguments`` validate against the function's ``parameters``. Its
  arguments are streamed as they are generated.
- ``auto``: no grammar. An answer that starts like a call is held back and parsed
  when complete: a call if it is one of the forms above naming a declared tool,
  else plain text. Any other answer streams as text.
- ``none``: tools are not shown to the model at all.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Self

from edge_llm.errors import InvalidRequest

ChoiceMode = Literal["none", "auto", "required"]
_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
_HERMES_OPEN = "<tool_call>"
_RESULT_PREFIX = "Result of "
_HERMES_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
# The forced form's head, up to where the arguments value starts.
_NAME_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*(?=\S)')


@dataclass(frozen=True)
class FunctionTool:
    name: str
    description: str | None = None
    parameters: dict[str, Any] = field(default_factory=lambda: dict(_EMPTY_PARAMETERS))

    @classmethod
    def of(cls, name: str, description: str | None, parameters: dict[str, Any] | None) -> Self:
        """A function as requests declare it (no ``parameters``: it takes none)."""
        return cls(name, description, parameters or dict(_EMPTY_PARAMETERS))

    def openai_dict(self) -> dict[str, Any]:
        """Chat Completions' shape, which chat templates expect."""
        function: dict[str, Any] = {"name": self.name, "parameters": self.parameters}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}

    def call_schema(self) -> dict[str, Any]:
        """JSON schema of one call of this function, in the polyfill's form."""
        return {
            "type": "object",
            "properties": {"name": {"const": self.name}, "arguments": self.parameters},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }


@dataclass(frozen=True)
class ToolChoice:
    mode: ChoiceMode = "auto"
    name: str | None = None  # a named function: mode is "required"


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it


@dataclass(frozen=True)
class ToolSetup:
    """The tools of one request and what it asks of them."""

    tools: tuple[FunctionTool, ...] = ()
    choice: ToolChoice = ToolChoice()
    parallel: bool = True

    def __post_init__(self) -> None:
        names = [tool.name for tool in self.tools]
        if len(set(names)) != len(names):
            raise InvalidRequest("tools: function names must be unique", param="tools")
        if self.choice.mode == "required" and not self.tools:
            raise InvalidRequest(
                "tool_choice requires a tool but none is given", param="tool_choice"
            )
        if self.choice.name is not None and self.choice.name not in names:
            raise InvalidRequest(
                f"tool_choice names {self.choice.name!r}, which is not in tools",
                param="tool_choice",
            )

    @property
    def active(self) -> bool:
        return bool(self.tools) and self.choice.mode != "none"

    @property
    def forced(self) -> bool:
        return self.active and self.choice.mode == "required"

    def offered(self) -> tuple[FunctionTool, ...]:
        if self.choice.name is not None:
            return tuple(t for t in self.tools if t.name == self.choice.name)
        return self.tools

    def forced_schema(self) -> dict[str, Any] | None:
        """The schema sampling is constrained to, or None when not forced."""
        if not self.forced:
            return None
        schemas = [tool.call_schema() for tool in self.offered()]
        return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}

    def instructions(self) -> str:
        """The system text that shows the tools to a template without tool support."""
        listing = json.dumps([t.openai_dict()["function"] for t in self.offered()])
        must = "You must call one of them." if self.forced else "Call one only when it helps."
        return (
            f"You can call these tools: {listing}\n{must} To call a tool, answer with only "
            'a JSON object {"name": "<tool name>", "arguments": {<arguments>}}.'
        )

    def names(self) -> frozenset[str]:
        return frozenset(tool.name for tool in self.tools)


# -- the conversation ------------------------------------------------------------------


def template_messages(
    messages: Sequence[dict[str, Any]], setup: ToolSetup | None, template_has_tools: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Messages (and tools) for the chat template: unchanged when the template
    renders tools itself, else with tool turns written as plain text."""
    active = setup is not None and setup.active
    if template_has_tools:
        tools = [t.openai_dict() for t in setup.offered()] if setup and active else None
        return [_with_parsed_arguments(m) for m in messages], tools
    out: list[dict[str, Any]] = []
    names = _call_names(messages)
    for message in messages:
        _append_plain(out, _plain_turn(message, names))
    if setup is not None and active:
        _add_system_text(out, setup.instructions())
    return out, None


def _with_parsed_arguments(message: dict[str, Any]) -> dict[str, Any]:
    """Templates index into ``arguments`` (``tool_call.arguments | tojson``)."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    parsed = []
    for call in calls:
        function = dict(call["function"])
        function["arguments"] = _loads_or_text(function["arguments"])
        parsed.append({**call, "function": function})
    return {**message, "tool_calls": parsed}


def _call_names(messages: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Function name of every call id in the history (tool results name only the id)."""
    return {
        call["id"]: call["function"]["name"]
        for message in messages
        for call in message.get("tool_calls") or []
    }


def _plain_turn(message: dict[str, Any], names: dict[str, str]) -> dict[str, str]:
    role, content = message["role"], message.get("content") or ""
    if role == "tool":
        name = message.get("name") or names.get(message.get("tool_call_id") or "", "the tool")
        return {"role": "user", "content": f"{_RESULT_PREFIX}{name}: {content}"}
    calls = message.get("tool_calls") or []
    lines = [content] if content else []
    for call in calls:
        function = call["function"]
        arguments = _loads_or_text(function["arguments"])
        lines.append(json.dumps({"name": function["name"], "arguments": arguments}))
    return {"role": role, "content": "\n".join(lines)}


def _append_plain(out: list[dict[str, Any]], turn: dict[str, str]) -> None:
    """Consecutive tool results become one user turn (templates that insist on
    alternating roles refuse two in a row)."""
    previous = out[-1] if out else None
    if previous is not None and previous["role"] == turn["role"] == "user":
        both = previous["content"].startswith(_RESULT_PREFIX)
        if both and turn["content"].startswith(_RESULT_PREFIX):
            out[-1] = {"role": "user", "content": previous["content"] + "\n" + turn["content"]}
            return
    out.append(turn)


def _add_system_text(out: list[dict[str, Any]], text: str) -> None:
    if out and out[0]["role"] == "system":
        out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{text}".strip()}
    else:
        out.insert(0, {"role": "system", "content": text})


def _loads_or_text(text: object) -> object:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


# -- the answer --------------------------------------------------------------------------


@dataclass(frozen=True)
class TextOut:
    text: str


@dataclass(frozen=True)
class CallStarted:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ArgumentsOut:
    index: int
    text: str


OutputEvent = TextOut | CallStarted | ArgumentsOut


class ToolOutputParser:
    """Turns the generated text into text and tool-call events, incrementally.

    Feed every delta to :meth:`feed`, then call :meth:`finish` once; both return
    the events to send. ``calls`` and ``text`` hold the whole answer afterwards.
    """

    def __init__(self, setup: ToolSetup | None, new_id: Callable[[], str]) -> None:
        self.setup = setup
        self.new_id = new_id
        self.calls: list[ToolCall] = []
        self.text = ""
        # plain: no tools; hold: may be a call; text: text that may still open a
        # <tool_call> block; forced: a call, streamed as it comes.
        self._mode = "plain" if setup is None or not setup.active else "hold"
        if setup is not None and setup.forced:
            self._mode = "forced"
        self._buffer = ""
        self._args_start: int | None = None
        self._scan = _ValueScanner()

    def feed(self, text: str) -> list[OutputEvent]:
        if self._mode == "plain":
            return self._emit_text(text)
        self._buffer += text
        if self._mode == "forced":
            return self._forced_progress()
        if self._mode == "hold":
            if _may_be_call(self._buffer):
                return []
            self._mode = "text"
        return self._text_until_block()

    def finish(self) -> list[OutputEvent]:
        if self._mode == "plain":
            return []
        if self._mode == "forced" and self.calls:
            return []  # streamed already (cut short only if max_tokens was reached)
        held, self._buffer = self._buffer, ""
        if self._mode == "text":
            return self._emit_text(held)
        parsed = parse_calls(held, self.setup.names() if self.setup else frozenset())
        if parsed is None:
            return self._emit_text(held)
        text, calls = parsed
        events = self._emit_text(text)
        for name, arguments in calls:
            events += self._new_call(name)
            self.calls[-1] = ToolCall(self.calls[-1].id, name, arguments)
            events.append(ArgumentsOut(len(self.calls) - 1, arguments))
        return events

    def _emit_text(self, text: str) -> list[OutputEvent]:
        self.text += text
        return [TextOut(text)] if text else []

    def _text_until_block(self) -> list[OutputEvent]:
        """Text streams, except what may open a ``<tool_call>`` block: from there
        on the answer is held and parsed at the end."""
        at = self._buffer.find(_HERMES_OPEN)
        if at >= 0:
            self._mode = "hold"
        else:
            at = len(self._buffer) - _open_tag_suffix(self._buffer)
        out, self._buffer = self._buffer[:at], self._buffer[at:]
        return self._emit_text(out)

    def _new_call(self, name: str) -> list[OutputEvent]:
        self.calls.append(ToolCall(self.new_id(), name, ""))
        return [CallStarted(len(self.calls) - 1, self.calls[-1].id, name)]

    def _forced_progress(self) -> list[OutputEvent]:
        events: list[OutputEvent] = []
        if self._args_start is None:
            head = _NAME_HEAD.match(self._buffer)
            if head is None:
                return events
            self._args_start = head.end()
            events += self._new_call(json.loads(head.group(1)))
        if self._scan.done:
            return events
        start = self._args_start + self._scan.consumed
        piece = self._scan.feed(self._buffer[start:])
        if piece:
            call = self.calls[0]
            self.calls[0] = ToolCall(call.id, call.name, call.arguments + piece)
            events.append(ArgumentsOut(0, piece))
        return events


def _may_be_call(buffer: str) -> bool:
    """Could this answer still turn out to be a tool call?"""
    head = buffer.lstrip()
    if not head:
        return True
    return head.startswith("{") or head.startswith("[") or _HERMES_OPEN.startswith(head[:11])


def _open_tag_suffix(text: str) -> int:
    """Length of the longest end of ``text`` that begins ``<tool_call>``."""
    for size in range(min(len(_HERMES_OPEN) - 1, len(text)), 0, -1):
        if _HERMES_OPEN.startswith(text[-size:]):
            return size
    return 0


class _ValueScanner:
    """Finds where one JSON value ends in text fed piece by piece."""

    def __init__(self) -> None:
        self.consumed = 0
        self.done = False
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._started = False

    def feed(self, text: str) -> str:
        """The part of ``text`` that belongs to the value."""
        for i, ch in enumerate(text):
            if self._step(ch):
                self.done = True
                self.consumed += i + 1
                return text[: i + 1]
        self.consumed += len(text)
        return text

    def _step(self, ch: str) -> bool:
        """True when ``ch`` completes the value."""
        if self._in_string:
            if self._escaped:
                self._escaped = False
            elif ch == "\\":
                self._escaped = True
            elif ch == '"':
                self._in_string = False
                return self._depth == 0
            return False
        if ch == '"':
            self._in_string = self._started = True
        elif ch in "{[":
            self._depth += 1
            self._started = True
        elif ch in "}]":
            self._depth -= 1
            return self._depth == 0
        return False


def parse_calls(text: str, names: frozenset[str]) -> tuple[str, list[tuple[str, str]]] | None:
    """``(text outside the calls, [(name, arguments JSON)])``, or None if ``text``
    holds no call of a declared tool in a known form."""
    if _HERMES_OPEN in text:
        blocks = [_call_of(_loads_or_text(b), names) for b in _HERMES_BLOCK.findall(text)]
        if blocks and all(b is not None for b in blocks):
            outside = _HERMES_BLOCK.sub("", text).strip()
            return outside, [b for b in blocks if b is not None]
        return None
    items = _call_items(_loads_or_text(text.strip()))
    calls = [_call_of(item, names) for item in items]
    if calls and all(c is not None for c in calls):
        return "", [c for c in calls if c is not None]
    return None


def _call_items(value: object) -> list[object]:
    """One call object, a list of them, or the polyfill's ``{"tool_calls": [...]}``."""
    if isinstance(value, list):
        return value
    if isinstance(value, dict):
        calls = value.get("tool_calls", [value])
        return calls if isinstance(calls, list) else []
    return []


def _call_of(value: object, names: frozenset[str]) -> tuple[str, str] | None:
    if not isinstance(value, dict):
        return None
    name = value.get("name")
    arguments = value.get("arguments", value.get("parameters"))
    if isinstance(arguments, str):
        arguments = _loads_or_text(arguments)
    if not isinstance(name, str) or name not in names or not isinstance(arguments, dict):
        return None
    return name, json.dumps(arguments)
