"""Ollama's API (``/api/chat``, ``/api/generate``, ``/api/embed``, ``/api/tags``,
``/api/ps``, ``/api/show``, ``/api/version``): requests and objects, no I/O.

Requests are validated as Ollama reads them: unknown top-level fields are ignored,
and so are the ``options`` that tune how Ollama runs a model (GPU layers, threads,
mmap, batch size), which mean nothing here. A sampling option that cannot be
honoured with a value other than its neutral one (``mirostat``, ``typical_p``,
``tfs_z``) is refused, naming it, as is a field that asks for
something this engine does not do (``images``, ``suffix``, ``template``,
``context``, ``think``, ``logprobs``). Errors are ``{"error": "..."}``.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edge_llm.errors import InvalidRequest
from edge_llm.protocol.sampling import SamplingDefaults, SamplingParams
from edge_llm.protocol.tools import FunctionTool, ToolCall, ToolChoice, ToolSetup

# The Ollama API level these routes follow (clients compare it with what they need).
API_VERSION = "0.12.0"
NO_TEMPLATE_NOTE = "no chat template (a base model): /api/chat is refused; use /api/generate"
_FOREVER = dt.datetime(2318, 1, 1, tzinfo=dt.UTC)  # Ollama's expires_at of keep_alive -1
# Options about how Ollama runs a model: accepted, nothing to do here.
_RUNNER_OPTIONS = frozenset({
    "numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all",
    "vocab_only", "use_mmap", "use_mlock", "embedding_only", "num_thread", "num_keep",
    "penalize_newline", "repeat_last_n",
})  # fmt: skip
# Sampling options this engine does not have: refused unless neutral.
_NEUTRAL_OPTIONS = {"mirostat": 0, "typical_p": 1.0, "tfs_z": 1.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNITS_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    model: Annotated[str, Field(min_length=1, max_length=256)]
    options: dict[str, Any] | None = None
    keep_alive: float | str | None = None


class _Generating(_Request):
    stream: bool = True
    format: Literal["", "json"] | dict[str, Any] | None = None
    think: bool | str | None = None
    logprobs: bool | None = None


class ToolFunction(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-.]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    type: Literal["function"] = "function"
    function: ToolFunction


class CallFunction(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class CallParam(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    function: CallFunction


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: list[str] | None = None
    tool_calls: list[CallParam] | None = None
    tool_name: str | None = None
    thinking: str | None = None


class ChatRequest(_Generating):
    messages: list[Message] = Field(default_factory=list)
    tools: Annotated[list[Tool], Field(max_length=128)] | None = None

    def template_messages(self) -> list[dict[str, Any]]:
        """The messages as chat templates take them (Chat Completions' shape): calls
        get ids, tool results name their tool."""
        out: list[dict[str, Any]] = []
        for message in self.messages:
            turn: dict[str, Any] = {"role": message.role, "content": message.content}
            if message.tool_calls:
                turn["tool_calls"] = [_template_call(len(out), i, c)
                                      for i, c in enumerate(message.tool_calls)]  # fmt: skip
            if message.role == "tool" and message.tool_name:
                turn["name"] = message.tool_name
            out.append(turn)
        return out

    def tool_setup(self) -> ToolSetup | None:
        if not self.tools:
            return None
        tools = tuple(
            FunctionTool.of(t.function.name, t.function.description, t.function.parameters)
            for t in self.tools
        )
        return ToolSetup(tools, ToolChoice("auto"))


class GenerateRequest(_Generating):
    prompt: str = ""
    system: str | None = None
    raw: bool = False
    suffix: str | None = None
    template: str | None = None
    context: list[int] | None = None
    images: list[str] | None = None

    def chat_messages(self) -> list[dict[str, Any]]:
        messages = [{"role": "system", "content": self.system}] if self.system else []
        return [*messages, {"role": "user", "content": self.prompt}]


class EmbedRequest(_Request):
    input: str | list[str] = Field(default_factory=list)
    truncate: bool = True
    dimensions: Annotated[int, Field(ge=1)] | None = None

    def inputs(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


class ShowRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    model: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    name: Annotated[str, Field(min_length=1, max_length=256)] | None = None  # older clients

    @property
    def model_name(self) -> str:
        if self.model is None and self.name is None:
            raise InvalidRequest("model is required", param="model")
        return self.model or self.name or ""


def _template_call(turn: int, index: int, call: CallParam) -> dict[str, Any]:
    arguments = call.function.arguments
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    function = {"name": call.function.name, "arguments": text}
    return {"id": f"call_{turn}_{index}", "type": "function", "function": function}


_R = TypeVar("_R", bound=BaseModel)


def parse(model: type[_R], body: object) -> _R:
    """A request, or InvalidRequest naming the field (sent as Ollama's error)."""
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    try:
        request = model.model_validate(body)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(p) for p in error["loc"] if not str(p)[:1].isupper())
        raise InvalidRequest(f"{field}: {error['msg']}", param=field or None) from exc
    _refuse_unsupported(request)
    return request


def _refuse_unsupported(request: BaseModel) -> None:
    """Fields that ask for what this engine does not do."""
    unsupported = {
        "images": "this model has no vision input",
        "suffix": "fill-in-the-middle is not supported",
        "template": "the model's own chat template is used",
        "context": "send the conversation to /api/chat instead",
        "logprobs": "logprobs are not returned here",
    }
    for field, why in unsupported.items():
        if getattr(request, field, None):
            raise InvalidRequest(f"{field}: {why}", param=field)
    messages = getattr(request, "messages", None) or []
    if any(m.images for m in messages):
        raise InvalidRequest("messages.images: this model has no vision input", param="images")
    think = getattr(request, "think", None)
    if think not in (None, False):
        model = getattr(request, "model", "")
        raise InvalidRequest(f'"{model}" does not support thinking', param="think")


# -- options -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """``options`` as this engine uses them."""

    sampling: SamplingParams
    max_tokens: int | None  # None: the server's default_max_tokens
    num_ctx: int | None


def options(
    raw: Mapping[str, Any] | None, defaults: SamplingDefaults, max_tokens_cap: int
) -> Options:
    """Validate ``options``: each value's type and range, neutral values of the
    options not honoured here; ``num_predict`` -1 is the default, -2 the cap."""
    given = dict(raw or {})
    for name, neutral in _NEUTRAL_OPTIONS.items():
        value = given.get(name)
        if value is not None and _number(name, value) != neutral:
            raise InvalidRequest(
                f"options.{name}: not supported here (only {neutral})", param=f"options.{name}"
            )
    stop = given.get("stop")
    stops = [stop] if isinstance(stop, str) else stop or []
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise InvalidRequest("options.stop: must be a list of strings", param="options.stop")
    sampling = SamplingParams(
        temperature=_ranged(given, "temperature", 0.0, 2.0, defaults.temperature),
        top_p=_ranged(given, "top_p", 0.0, 1.0, defaults.top_p) or 1.0,
        top_k=int(_ranged(given, "top_k", 0, 1 << 20, defaults.top_k, integer=True)),
        min_p=_ranged(given, "min_p", 0.0, 1.0, defaults.min_p),
        seed=_optional_int(given, "seed"),
        stop=tuple(stops),
        presence_penalty=_ranged(given, "presence_penalty", -2.0, 2.0, 0.0),
        frequency_penalty=_ranged(given, "frequency_penalty", -2.0, 2.0, 0.0),
        repetition_penalty=_ranged(given, "repeat_penalty", 0.01, 10.0, 1.0),
    )
    return Options(sampling, _num_predict(given, max_tokens_cap), _num_ctx(given))


def _number(name: str, value: object, *, integer: bool = False) -> float:
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok or not math.isfinite(float(value)):  # type: ignore[arg-type]
        kind = "an integer" if integer else "a number"
        raise InvalidRequest(f"options.{name}: must be {kind}", param=f"options.{name}")
    return float(value)  # type: ignore[arg-type]


def _ranged(
    given: Mapping[str, Any],
    name: str,
    low: float,
    high: float,
    default: float,
    *,
    integer: bool = False,
) -> float:
    value = given.get(name)
    if value is None:
        return default
    number = _number(name, value, integer=integer)
    if not low <= number <= high:
        raise InvalidRequest(
            f"options.{name}: must be between {low:g} and {high:g}", param=f"options.{name}"
        )
    return number


def _optional_int(given: Mapping[str, Any], name: str) -> int | None:
    value = given.get(name)
    return None if value is None else int(_number(name, value, integer=True))


def _num_predict(given: Mapping[str, Any], cap: int) -> int | None:
    value = _optional_int(given, "num_predict")
    if value is None or value == -1:
        return None
    if value == -2:
        return cap  # "fill the context": as much as the limits grant
    if value < 1:
        raise InvalidRequest(
            "options.num_predict: must be -2, -1 or at least 1", param="options.num_predict"
        )
    return value


def _num_ctx(given: Mapping[str, Any]) -> int | None:
    value = _optional_int(given, "num_ctx")
    if value is not None and value < 2:
        raise InvalidRequest("options.num_ctx: must be at least 2", param="options.num_ctx")
    return value


def ignored_options(raw: Mapping[str, Any] | None) -> list[str]:
    """The options accepted without effect (Ollama's runner settings, unknown keys)."""
    known = {"temperature", "top_p", "top_k", "min_p", "seed", "stop", "num_predict",
             "num_ctx", "presence_penalty", "frequency_penalty", "repeat_penalty",
             *_NEUTRAL_OPTIONS}  # fmt: skip
    return sorted(name for name in raw or {} if name not in known)


def keep_alive_s(value: float | str | None) -> float | Literal["default"] | None:
    """Ollama's ``keep_alive``: seconds, or a Go duration (``5m``, ``1h30m``);
    negative: forever (None); not given: ``"default"``."""
    if value is None:
        return "default"
    seconds = float(value) if isinstance(value, int | float) else _duration_s(value.strip())
    return None if seconds < 0 else seconds


def _duration_s(text: str) -> float:
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    try:
        return sign * float(body)  # a bare number: seconds
    except ValueError:
        pass
    parts = _DURATION.findall(body)
    if not parts or "".join(n + u for n, u in parts) != body:
        raise InvalidRequest(
            f"keep_alive: {text!r} is not a duration (like 5m, 30s, -1)", param="keep_alive"
        )
    return sign * sum(float(n) * _UNITS_S[u] for n, u in parts)


def json_format(value: str | dict[str, Any] | None) -> tuple[bool, dict[str, Any] | None]:
    """(constrained, schema): ``json`` is any JSON object, a dict is a JSON schema."""
    if isinstance(value, dict):
        return True, value
    return value == "json", None


# -- responses ------------------------------------------------------------------------------


def created_at(when: dt.datetime | None = None) -> str:
    """RFC 3339 in UTC with nanoseconds' digits, as Ollama writes it."""
    moment = (when or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


def chat_chunk(model: str, text: str) -> dict[str, Any]:
    message = {"role": "assistant", "content": text}
    return {"model": model, "created_at": created_at(), "message": message, "done": False}


def generate_chunk(model: str, text: str) -> dict[str, Any]:
    return {"model": model, "created_at": created_at(), "response": text, "done": False}


@dataclass(frozen=True)
class Timings:
    """What the final object reports, in nanoseconds as Ollama does."""

    total_s: float
    load_s: float
    prompt_tokens: int
    prompt_s: float
    eval_tokens: int
    eval_s: float

    def fields(self) -> dict[str, int]:
        return {
            "total_duration": _ns(self.total_s),
            "load_duration": _ns(self.load_s),
            "prompt_eval_count": self.prompt_tokens,
            "prompt_eval_duration": _ns(self.prompt_s),
            "eval_count": self.eval_tokens,
            "eval_duration": _ns(self.eval_s),
        }


def _ns(seconds: float) -> int:
    return max(0, round(seconds * 1e9))


def final(
    model: str,
    *,
    chat: bool,
    text: str,
    done_reason: str,
    timings: Timings | None,
    calls: Sequence[ToolCall] = (),
) -> dict[str, Any]:
    """The last object (``done: true``): the whole text when not streamed, the
    calls, why it ended and its timings."""
    body: dict[str, Any] = {"model": model, "created_at": created_at()}
    if chat:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = [tool_call(call) for call in calls]
        body["message"] = message
    else:
        body["response"] = text
    body.update(done=True, done_reason=done_reason)
    if timings is not None:
        body.update(timings.fields())
    return body


def tool_call(call: ToolCall) -> dict[str, Any]:
    """Ollama's call: ``arguments`` is an object, not JSON text."""
    try:
        arguments = json.loads(call.arguments)
    except ValueError:
        arguments = {}
    if not isinstance(arguments, dict):
        arguments = {"value": arguments}
    return {"function": {"name": call.name, "arguments": arguments}}


def error_body(message: str) -> dict[str, str]:
    return {"error": message}


@dataclass(frozen=True)
class ModelFacts:
    """What the listing routes say about a model (from its GGUF's metadata)."""

    name: str
    size_bytes: int
    digest: str
    modified_at: dt.datetime
    architecture: str
    parameter_size: str
    quantization: str
    context_length: int | None


def details(facts: ModelFacts) -> dict[str, Any]:
    family = facts.architecture
    return {
        "parent_model": "",
        "format": "gguf",
        "family": family,
        "families": [family] if family else None,
        "parameter_size": facts.parameter_size,
        "quantization_level": facts.quantization,
    }


def tag(facts: ModelFacts) -> dict[str, Any]:
    """One model of ``/api/tags``."""
    return {
        "name": facts.name,
        "model": facts.name,
        "modified_at": created_at(facts.modified_at),
        "size": facts.size_bytes,
        "digest": facts.digest,
        "details": details(facts),
    }


def running(facts: ModelFacts, size_bytes: int, expires_in_s: float | None) -> dict[str, Any]:
    """One model of ``/api/ps``: loaded, its memory, when its keep-alive ends."""
    if expires_in_s is None:
        expires = _FOREVER
    else:
        expires = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=expires_in_s)
    return {
        **tag(facts),
        "size": size_bytes,
        "size_vram": 0,
        "expires_at": created_at(expires),
        "context_length": facts.context_length,
    }


def show(
    facts: ModelFacts, model_info: dict[str, Any], template: str, parameters: dict[str, float]
) -> dict[str, Any]:
    """``/api/show``: details, the GGUF's metadata, template and default parameters.
    A model without a template says so in its modelfile and has no ``tools``."""
    lines = [f"{name} {value:g}" for name, value in sorted(parameters.items())]
    modelfile = f"# served by edge-llm\nFROM {facts.name}\n"
    if not template:
        modelfile += f"# {NO_TEMPLATE_NOTE}\n"
    return {
        "modelfile": modelfile,
        "parameters": "\n".join(lines),
        "template": template,
        "details": details(facts),
        "model_info": model_info,
        "capabilities": ["completion", "tools"] if template else ["completion"],
        "modified_at": created_at(facts.modified_at),
    }
