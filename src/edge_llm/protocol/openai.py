"""OpenAI request validation and response objects (no I/O).

Requests are validated strictly: wrong types, unknown fields, NaN or
out-of-range numbers give :class:`InvalidRequest` naming the field, never a 500.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from edge_llm.errors import InvalidRequest
from edge_llm.protocol.field_names import did_you_mean
from edge_llm.protocol.priority import OPENAI_TIERS, OpenAITier, Priority, body_priority
from edge_llm.protocol.sampling import SamplingDefaults, SamplingParams, TokenLogprob
from edge_llm.protocol.tools import (
    ArgumentsOut,
    CallStarted,
    FunctionTool,
    ToolCall,
    ToolChoice,
    ToolSetup,
)

_M = TypeVar("_M", bound=BaseModel)
_V = TypeVar("_V", int, float)
_MAX_SEED = 2**63 - 1
_MAX_STOP = 4
_MAX_STOP_CHARS = 256
_MAX_LOGIT_BIAS = 1024
_MAX_TOP_LOGPROBS = 20
_Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
_Repetition = Annotated[float, Field(ge=0.01, le=10.0)]  # logits stay finite
_MAX_STOP_TOKEN_IDS = 64


_UNSUPPORTED_PARTS = {
    "image_url": "this model has no vision input",
    "input_audio": "this model has no audio input",
    "file": "this model has no file input",
}
_CONTENT_REQUIRED = frozenset({"system", "developer", "user", "tool"})


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


class TextPart(Strict):
    type: Literal["text"]
    text: str


class RefusalPart(Strict):
    type: Literal["refusal"]
    refusal: str


def check_content_parts(
    value: object, unsupported: dict[str, str], allowed: tuple[str, ...] = ("text", "refusal")
) -> object:
    """Name the content part that cannot be used instead of pydantic's union
    errors ("Input should be a valid string")."""
    if isinstance(value, list):
        for part in value:
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind in unsupported:
                raise ValueError(f"{unsupported[kind]} (content part type {kind!r})")
            if isinstance(kind, str) and kind not in allowed:
                raise ValueError(
                    f"content part type {kind!r} is not supported ({', '.join(allowed)})"
                )
    return value


class FunctionCall(Strict):
    name: Annotated[str, Field(min_length=1)]
    arguments: str


class ToolCallParam(Strict):
    id: Annotated[str, Field(min_length=1)]
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(Strict):
    """One message; what OpenAI requires of each role is required here too."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart | RefusalPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: Annotated[list[ToolCallParam], Field(min_length=1)] | None = None
    refusal: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _parts(cls, value: object) -> object:
        return check_content_parts(value, _UNSUPPORTED_PARTS)

    @model_validator(mode="after")
    def _shape_of_role(self) -> ChatMessage:
        if self.role in _CONTENT_REQUIRED and self.content is None:
            raise ValueError(f"a {self.role} message needs content")
        if self.role == "assistant" and self.content is None and not self.tool_calls:
            raise ValueError("an assistant message needs content or tool_calls")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        parts = self.content if isinstance(self.content, list) else []
        if self.role != "assistant" and any(isinstance(p, RefusalPart) for p in parts):
            raise ValueError("refusal parts belong to assistant messages")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(
            part.text if isinstance(part, TextPart) else part.refusal for part in self.content
        )

    def template_dict(self) -> dict[str, Any]:
        """The message as chat templates take it."""
        message: dict[str, Any] = {"role": _template_role(self.role), "content": self.text()}
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            message["name"] = self.name
        return message


class FunctionDefinition(Strict):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolParam(Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: Annotated[dict[str, str], Field(min_length=1, max_length=1)]

    @field_validator("function")
    @classmethod
    def _named(cls, value: dict[str, str]) -> dict[str, str]:
        if "name" not in value:
            raise ValueError("function.name is required")
        return value


class StreamOptions(Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage (so far) on every chunk
    include_progress: bool = False  # this engine's: progress chunks while no token flows
    resumable: bool = False  # this engine's: a dropped connection may resume the stream


class TextFormat(Strict):
    type: Literal["text"]


class JsonObjectFormat(Strict):
    type: Literal["json_object"]


class JsonSchemaSpec(Strict):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: str | None = None
    # "schema" would shadow a BaseModel attribute: the field is renamed, the key is not.
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None  # the grammar enforces the schema either way


class JsonSchemaFormat(Strict):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[
    TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")
]


class _Sampling(Strict):
    model: str | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=-1, le=100000)] | None = None  # vLLM's -1: off, as 0
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    seed: Annotated[int, Field(ge=-_MAX_SEED, le=_MAX_SEED)] | None = None
    stop: str | list[str] | None = None
    n: Annotated[int, Field(ge=1, le=1)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: Annotated[str, Field(max_length=256)] | None = None
    presence_penalty: _Penalty | None = None
    frequency_penalty: _Penalty | None = None
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    response_format: ResponseFormat | None = None
    # Scheduling (see edge_llm.protocol.priority): vLLM's field, OpenAI's tiers mapped.
    priority: Priority | None = None
    service_tier: OpenAITier | None = None
    return_progress: bool = False  # llama-server's name for include_progress
    # The dialects of vLLM, SGLang and llama-server (docs/http-api.md#request-dialects).
    ignore_eos: bool = False
    min_tokens: Annotated[int, Field(ge=0)] = 0
    repetition_penalty: _Repetition | None = None  # vLLM / SGLang
    repeat_penalty: _Repetition | None = None  # llama-server: the same penalty here
    stop_token_ids: (
        Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=_MAX_STOP_TOKEN_IDS)] | None
    ) = None
    include_stop_str_in_output: bool = False
    no_stop_trim: bool = False  # SGLang's name for include_stop_str_in_output
    skip_special_tokens: bool = True
    cache_prompt: bool = True  # llama-server's; false: the prompt reuses no cached cells
    # SGLang's, sent by its gateway at these defaults: no reasoning, no hidden states here.
    separate_reasoning: bool = True
    stream_reasoning: bool = True
    return_hidden_states: bool = False

    @field_validator("return_hidden_states")
    @classmethod
    def _no_hidden_states(cls, value: bool) -> bool:
        if value:
            raise ValueError("true is not supported: this engine does not return hidden states")
        return value

    @model_validator(mode="after")
    def _dialects_agree(self) -> _Sampling:
        """Combinations that cannot be honoured, named (vLLM refuses the first too)."""
        limit = self.requested_max_tokens
        if limit is not None and self.min_tokens > limit:
            raise InvalidRequest(
                f"min_tokens: {self.min_tokens} is above max_tokens ({limit})", param="min_tokens"
            )
        given = [p for p in (self.repetition_penalty, self.repeat_penalty) if p is not None]
        if len(set(given)) > 1:
            raise InvalidRequest(
                "repeat_penalty: differs from repetition_penalty (the same penalty: give one)",
                param="repeat_penalty",
            )
        if self.wants_json:
            self._check_no_end_hold("response_format")
        return self

    def _check_no_end_hold(self, grammar_field: str) -> None:
        """A grammar ends the output where it is complete: it cannot wait for an end
        token kept from being sampled."""
        for name, held in (("ignore_eos", self.ignore_eos), ("min_tokens", self.min_tokens)):
            if held:
                raise InvalidRequest(
                    f"{name}: cannot be combined with {grammar_field} (its grammar ends the "
                    "output where it is complete)",
                    param=name,
                )

    @field_validator("logit_bias")
    @classmethod
    def _token_id_keys(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is not None:
            if len(value) > _MAX_LOGIT_BIAS:
                raise ValueError(f"at most {_MAX_LOGIT_BIAS} tokens")
            if not all(key.isascii() and key.isdigit() for key in value):
                raise ValueError("keys must be token ids (non-negative integers)")
        return value

    @field_validator("stop")
    @classmethod
    def _bounded_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > _MAX_STOP or any(len(s) > _MAX_STOP_CHARS for s in stops):
            raise ValueError(f"at most {_MAX_STOP} stop strings of {_MAX_STOP_CHARS} characters")
        return value

    def sampling(self, defaults: SamplingDefaults) -> SamplingParams:
        """The request's sampling; ``defaults`` fill each field it leaves out."""
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return SamplingParams(
            temperature=_given(self.temperature, defaults.temperature),
            top_p=_given(self.top_p, defaults.top_p),
            top_k=max(_given(self.top_k, defaults.top_k), 0),
            min_p=_given(self.min_p, defaults.min_p),
            seed=self.seed,
            stop=tuple(stops),
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            logit_bias=tuple((int(k), v) for k, v in (self.logit_bias or {}).items()),
            n_logprobs=self.n_logprobs,
            ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens,
            repetition_penalty=_given(self.repetition_penalty, self.repeat_penalty or 1.0),
            stop_token_ids=tuple(self.stop_token_ids or ()),
            include_stop_str=self.include_stop_str_in_output or self.no_stop_trim,
            skip_special_tokens=self.skip_special_tokens,
        )

    @property
    def n_logprobs(self) -> int | None:
        return None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def continuous_usage(self) -> bool:
        """Usage (so far) on every streamed chunk."""
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)

    @property
    def wants_json(self) -> bool:
        """``response_format`` asks for JSON: grammar from :attr:`output_schema`."""
        return self.response_format is not None and self.response_format.type != "text"

    @property
    def output_schema(self) -> dict[str, Any] | None:
        """The JSON schema the output must follow; None: any JSON object."""
        if isinstance(self.response_format, JsonSchemaFormat):
            return self.response_format.json_schema.json_schema
        return None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def resumable(self) -> bool:
        """A resumable stream asked for (``stream_options.resumable``)."""
        return self.stream and bool(self.stream_options and self.stream_options.resumable)

    @property
    def include_progress(self) -> bool:
        """Progress chunks asked for (``return_progress`` or the stream option)."""
        option = bool(self.stream_options and self.stream_options.include_progress)
        return self.return_progress or option

    @property
    def explicit_priority(self) -> int | None:
        """The class the body asks for: ``priority``, else its service tier's."""
        return body_priority(self.priority, self.service_tier, OPENAI_TIERS)


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    tools: Annotated[list[ToolParam], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # Accepted, no effect on this engine (see the compatibility tables in docs/http-api.md).
    store: bool | None = None
    metadata: Annotated[dict[str, str], Field(max_length=16)] | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    prediction: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    modalities: list[Literal["text"]] | None = None
    # vLLM's: the answer continues the last (assistant) message instead of a new turn.
    continue_final_message: bool = False
    add_generation_prompt: bool | None = None  # default true; false only when continuing

    @model_validator(mode="after")
    def _continuation(self) -> ChatCompletionRequest:
        if self.continue_final_message:
            last = self.messages[-1]
            if last.role != "assistant" or last.tool_calls:
                raise InvalidRequest(
                    "continue_final_message: the last message must be an assistant's text",
                    param="continue_final_message",
                )
            if self.add_generation_prompt:
                raise InvalidRequest(
                    "add_generation_prompt: cannot be true with continue_final_message "
                    "(the answer continues the last message, no new turn is opened)",
                    param="add_generation_prompt",
                )
        elif self.add_generation_prompt is False:
            raise InvalidRequest(
                "add_generation_prompt: false is supported only with "
                "continue_final_message: true (an answer always follows a generation prompt "
                "or continues the last assistant message)",
                param="add_generation_prompt",
            )
        return self

    @field_validator("tools", mode="before")
    @classmethod
    def _function_tools(cls, value: object) -> object:
        if isinstance(value, list):
            for tool in value:
                kind = tool.get("type") if isinstance(tool, dict) else None
                if isinstance(kind, str) and kind != "function":
                    raise ValueError(f"tool type {kind!r} is not supported (function only)")
        return value

    @field_validator("n", mode="before")
    @classmethod
    def _one_choice(cls, value: object) -> object:
        """See docs/http-api.md: n requests give the same, each with its own backpressure."""
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            raise ValueError(
                "n > 1 is not supported: send n requests (they stream and pause independently)"
            )
        return value

    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=_MAX_TOP_LOGPROBS)] | None = None

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and not info.data.get("logprobs"):
            raise ValueError("needs logprobs: true")
        return value

    @property
    def n_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def chat_messages(self) -> list[dict[str, Any]]:
        """The conversation rendered before the answer (without the message the
        answer continues, see :attr:`prefill`)."""
        messages = self.messages[:-1] if self.continue_final_message else self.messages
        return [m.template_dict() for m in messages]

    @property
    def prefill(self) -> str:
        """Text the answer continues: the last message's with ``continue_final_message``."""
        return self.messages[-1].text() if self.continue_final_message else ""

    def tool_setup(self) -> ToolSetup | None:
        """The tools and what is asked of them; raises InvalidRequest when
        ``tool_choice`` names a function that is not given."""
        if not self.tools:
            if self.tool_choice not in (None, "none", "auto"):
                raise InvalidRequest("tool_choice needs tools", param="tool_choice")
            return None
        tools = tuple(
            FunctionTool.of(t.function.name, t.function.description, t.function.parameters)
            for t in self.tools
        )
        if isinstance(self.tool_choice, NamedToolChoice):
            choice = ToolChoice("required", self.tool_choice.function["name"])
        else:
            choice = ToolChoice(self.tool_choice or "auto")
        setup = ToolSetup(tools, choice, self.parallel_tool_calls is not False)
        if setup.forced:
            self._check_no_end_hold("tool_choice")
        return setup


class CompletionRequest(_Sampling):
    prompt: str | list[str]
    echo: Literal[False] | None = None
    # An int here; false (as SGLang's gateway sends on chat) is no logprobs.
    logprobs: Annotated[int, Field(ge=0, le=_MAX_TOP_LOGPROBS)] | Literal[False] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None

    @property
    def n_logprobs(self) -> int | None:
        return None if self.logprobs is False else self.logprobs

    @field_validator("prompt")
    @classmethod
    def _single_prompt(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and len(value) != 1:
            raise ValueError("exactly one prompt per request")
        return value

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


def _given(value: _V | None, default: _V) -> _V:
    return default if value is None else value


def _template_role(role: str) -> str:
    return "system" if role == "developer" else role


def parse_request(model: type[_M], body: object) -> _M:
    """Validate a decoded JSON body, or raise InvalidRequest naming the field."""
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise _invalid(exc, model) from exc


def _invalid(exc: ValidationError, model: type[BaseModel]) -> InvalidRequest:
    errors = exc.errors()
    # Of a union's branches, the one that got furthest says what is wrong.
    first = max(errors, key=lambda error: len(error["loc"])) if len(errors) > 1 else errors[0]
    field = ".".join(str(p) for p in first["loc"] if not _is_union_branch(p))
    value = first.get("input")
    message = first["msg"].removeprefix("Value error, ")
    if isinstance(value, float) and not math.isfinite(value):
        message = "must be a finite number"
    if first["type"] == "extra_forbidden":
        message = "unknown field" + did_you_mean(model, first["loc"])
    return InvalidRequest(f"{field}: {message}", param=field or None)


def _is_union_branch(part: object) -> bool:
    """Pydantic names the union member tried (``str``, ``list[TextPart]``,
    ``function-after[...]``, a model name or a discriminator tag)."""
    if not isinstance(part, str):
        return False
    return part in ("str", "int", "float", "bool") or "[" in part or part[:1].isupper()


# -- responses ----------------------------------------------------------------------


def _response(
    kind: str, request_id: str, model: str, created: int, choices: list[dict[str, Any]]
) -> dict[str, Any]:
    """The envelope every completion object and chunk shares."""
    return {
        "id": request_id,
        "object": kind,
        "created": created,
        "model": model,
        "choices": choices,
    }


def chat_chunk(
    request_id: str,
    model: str,
    created: int,
    *,
    content: str | None = None,
    role: str | None = None,
    finish_reason: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
    if logprobs is not None:
        choice["logprobs"] = logprobs
    return _response("chat.completion.chunk", request_id, model, created, [choice])


def completion_chunk(
    request_id: str,
    model: str,
    created: int,
    *,
    text: str,
    finish_reason: str | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": logprobs}
    return _response("text_completion", request_id, model, created, [choice])


def usage_chunk(
    request_id: str, model: str, created: int, usage: dict[str, Any], *, chat: bool
) -> dict[str, Any]:
    kind = "chat.completion.chunk" if chat else "text_completion"
    return _response(kind, request_id, model, created, []) | {"usage": usage}


def progress_chunk(
    request_id: str, model: str, created: int, progress: dict[str, Any], *, chat: bool
) -> dict[str, Any]:
    """A chunk without choices that tells a client waiting for its first token where
    its request stands (sent only to a request that asked: ``include_progress``)."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    return _response(kind, request_id, model, created, []) | {"progress": progress}


def chat_completion(
    request_id: str,
    model: str,
    created: int,
    *,
    text: str,
    finish_reason: str,
    usage: dict[str, Any],
    tool_calls: list[ToolCall] | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message["content"] = text or None
        message["tool_calls"] = [tool_call_dict(call) for call in tool_calls]
    choice = {
        "index": 0,
        "message": message,
        "finish_reason": finish_reason,
        "logprobs": logprobs,
    }
    return _response("chat.completion", request_id, model, created, [choice]) | {"usage": usage}


def tool_call_dict(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def tool_call_delta(event: CallStarted | ArgumentsOut) -> list[dict[str, Any]]:
    """``delta.tool_calls`` of a stream chunk: the call's id and name first,
    then its arguments piece by piece."""
    if isinstance(event, CallStarted):
        function = {"name": event.name, "arguments": ""}
        return [{"index": event.index, "id": event.id, "type": "function", "function": function}]
    return [{"index": event.index, "function": {"arguments": event.text}}]


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def text_completion(
    request_id: str,
    model: str,
    created: int,
    *,
    text: str,
    finish_reason: str,
    usage: dict[str, Any],
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": logprobs}
    return _response("text_completion", request_id, model, created, [choice]) | {"usage": usage}


TokenBytes = Callable[[int], bytes]


def chat_logprobs(records: Sequence[TokenLogprob], token_bytes: TokenBytes) -> dict[str, Any]:
    """``choices[].logprobs`` of Chat Completions: one entry per token."""
    content = [
        _token_entry(r.token, r.logprob, token_bytes)
        | {"top_logprobs": [_token_entry(t, lp, token_bytes) for t, lp in r.top]}
        for r in records
    ]
    return {"content": content, "refusal": None}


def _token_entry(token: int, logprob: float, token_bytes: TokenBytes) -> dict[str, Any]:
    data = token_bytes(token)
    return {"token": data.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(data)}


def completion_logprobs(
    records: Sequence[TokenLogprob], token_bytes: TokenBytes, text_offset: int = 0
) -> dict[str, Any]:
    """``choices[].logprobs`` of (legacy) Completions; ``text_offset`` is where the
    first of these tokens starts in the completion."""
    tokens = [token_bytes(r.token).decode("utf-8", "replace") for r in records]
    offsets = []
    for token in tokens:
        offsets.append(text_offset)
        text_offset += len(token)
    top = [{token_bytes(t).decode("utf-8", "replace"): lp for t, lp in r.top} for r in records]
    return {
        "tokens": tokens,
        "token_logprobs": [r.logprob for r in records],
        "top_logprobs": top,
        "text_offset": offsets,
    }


def model_list(model_id: str, created: int) -> dict[str, Any]:
    return {"object": "list", "data": [model_object(model_id, created)]}


def model_object(model_id: str, created: int, owned_by: str = "edge-llm") -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": created, "owned_by": owned_by}
