"""OpenAI request validation and response objects (no I/O).

Requests are validated strictly: wrong types, unknown fields, NaN or
out-of-range numbers give :class:`InvalidRequest` naming the field, never a 500.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from edge_llm.engine.backend import SamplingParams, TokenLogprob
from edge_llm.errors import InvalidRequest

_M = TypeVar("_M", bound=BaseModel)
_MAX_SEED = 2**63 - 1
_MAX_STOP = 4
_MAX_STOP_CHARS = 256
_MAX_LOGIT_BIAS = 1024
_MAX_TOP_LOGPROBS = 20
_Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(_Strict):
    include_usage: bool = False


class TextFormat(_Strict):
    type: Literal["text"]


class JsonObjectFormat(_Strict):
    type: Literal["json_object"]


class JsonSchemaSpec(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: str | None = None
    # "schema" would shadow a BaseModel attribute: the field is renamed, the key is not.
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None  # the grammar enforces the schema either way


class JsonSchemaFormat(_Strict):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[
    TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")
]


class _Sampling(_Strict):
    model: str | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=0, le=100000)] | None = None
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

    def sampling(self) -> SamplingParams:
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return SamplingParams(
            temperature=self.temperature if self.temperature is not None else 1.0,
            top_p=self.top_p if self.top_p is not None else 1.0,
            top_k=self.top_k or 0,
            min_p=self.min_p or 0.0,
            seed=self.seed,
            stop=tuple(stops),
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            logit_bias=tuple((int(k), v) for k, v in (self.logit_bias or {}).items()),
            n_logprobs=self.n_logprobs,
        )

    @property
    def n_logprobs(self) -> int | None:
        return None

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


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
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

    def chat_messages(self) -> list[dict[str, str]]:
        return [{"role": _template_role(m.role), "content": m.text()} for m in self.messages]


class CompletionRequest(_Sampling):
    prompt: str | list[str]
    echo: Literal[False] | None = None
    logprobs: Annotated[int, Field(ge=0, le=_MAX_TOP_LOGPROBS)] | None = None

    @property
    def n_logprobs(self) -> int | None:
        return self.logprobs

    @field_validator("prompt")
    @classmethod
    def _single_prompt(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and len(value) != 1:
            raise ValueError("exactly one prompt per request")
        return value

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


def _template_role(role: str) -> str:
    return "system" if role == "developer" else role


def parse_request(model: type[_M], body: object) -> _M:
    """Validate a decoded JSON body, or raise InvalidRequest naming the field."""
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise _invalid(exc) from exc


def _invalid(exc: ValidationError) -> InvalidRequest:
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first["loc"] if not _is_union_branch(p))
    value = first.get("input")
    message = first["msg"]
    if isinstance(value, float) and not math.isfinite(value):
        message = "must be a finite number"
    if first["type"] == "extra_forbidden":
        message = "unknown field"
    return InvalidRequest(f"{field}: {message}", param=field or None)


def _is_union_branch(part: object) -> bool:
    """Pydantic names the union member tried (``str``, ``list[TextPart]``)."""
    return isinstance(part, str) and (part in ("str", "int", "float", "bool") or "[" in part)


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
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
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
    request_id: str, model: str, created: int, usage: dict[str, int], *, chat: bool
) -> dict[str, Any]:
    kind = "chat.completion.chunk" if chat else "text_completion"
    return _response(kind, request_id, model, created, []) | {"usage": usage}


def chat_completion(
    request_id: str,
    model: str,
    created: int,
    *,
    text: str,
    finish_reason: str,
    usage: dict[str, int],
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "finish_reason": finish_reason,
        "logprobs": logprobs,
    }
    return _response("chat.completion", request_id, model, created, [choice]) | {"usage": usage}


def text_completion(
    request_id: str,
    model: str,
    created: int,
    *,
    text: str,
    finish_reason: str,
    usage: dict[str, int],
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
    return {
        "object": "list",
        "data": [{"id": model_id, "object": "model", "created": created, "owned_by": "edge-llm"}],
    }
