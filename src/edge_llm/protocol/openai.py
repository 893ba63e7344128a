"""OpenAI request validation and response objects (no I/O).

Requests are validated strictly: wrong types, unknown fields, NaN or
out-of-range numbers give :class:`InvalidRequest` naming the field, never a 500.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from edge_llm.engine.backend import SamplingDefaults, SamplingParams
from edge_llm.errors import InvalidRequest

_M = TypeVar("_M", bound=BaseModel)
_V = TypeVar("_V", int, float)
_MAX_SEED = 2**63 - 1
_MAX_STOP = 4
_MAX_STOP_CHARS = 256


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
    presence_penalty: Annotated[float, Field(ge=0.0, le=0.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=0.0, le=0.0)] | None = None
    logprobs: Literal[False] | None = None

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
            top_k=_given(self.top_k, defaults.top_k),
            min_p=_given(self.min_p, defaults.min_p),
            seed=self.seed,
            stop=tuple(stops),
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def chat_messages(self) -> list[dict[str, str]]:
        return [{"role": _template_role(m.role), "content": m.text()} for m in self.messages]


class CompletionRequest(_Sampling):
    prompt: str | list[str]
    echo: Literal[False] | None = None

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
) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
    return _response("chat.completion.chunk", request_id, model, created, [choice])


def completion_chunk(
    request_id: str, model: str, created: int, *, text: str, finish_reason: str | None = None
) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
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
) -> dict[str, Any]:
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "finish_reason": finish_reason,
        "logprobs": None,
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
) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
    return _response("text_completion", request_id, model, created, [choice]) | {"usage": usage}


def model_list(model_id: str, created: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": model_id, "object": "model", "created": created, "owned_by": "edge-llm"}],
    }
