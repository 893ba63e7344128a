"""Errors the engine reports to clients, each mapped to an HTTP status and code.

EdgeLLMError                      500 internal_error
├── InvalidRequest                400 invalid_request (param names the field)
│   ├── PromptTooLong             400 prompt_too_long
│   ├── KvBudgetNeverFits         400 kv_budget_exceeded (larger than the whole budget)
│   ├── TemplateRefused           400 invalid_request (the chat template's raise_exception)
│   └── NoChatTemplate            400 no_chat_template (a base model: chat cannot be formatted)
├── AuthenticationFailed          401 invalid_api_key
├── ForbiddenOrigin               403 forbidden_origin (a WebSocket from another site)
├── NotFound                      404 not_found
│   ├── ModelNotFound             404 model_not_found
│   └── StreamNotFound            404 stream_not_found (no resumable stream by that id, or expired)
├── ResumeGap                     409 resume_gap (the replay log no longer reaches back)
├── BodyTooLarge                  413 request_too_large
├── TtftTimeout                   504 ttft_timeout
├── Overloaded                    503 (with Retry-After)
│   ├── QueueFull                 503 queue_full
│   ├── KvBudgetExceeded          503 kv_budget_exceeded
│   ├── EngineUnavailable         503 engine_unavailable
│   ├── MemoryPressure            503 memory_pressure (the device is short of memory)
│   ├── ModelMemory               503 model_memory (no idle model to unload for another)
│   ├── ModelBusy                 503 model_busy (an unload waits for its streams to end)
│   ├── TooManyConnections        503 too_many_connections
│   └── UpstreamUnavailable       503 upstream_unavailable (no upstream could take it)
├── UpstreamRejected              the upstream's own 4xx status and code, passed on
├── BackendError                  500 backend_error (the model runtime failed: engine side)
│   └── KvSlotUnavailable         500 backend_error (llama_decode found no free KV cell)
└── StreamEnded                   final events of a stream (status if nothing was sent yet)
    ├── Cancelled                 409 cancelled; 503 on shutdown (reason field says why)
    ├── PauseTimeout              408 pause_timeout (paused longer than max_pause_ms)
    ├── BackendFailure            500 backend_error
    └── UpstreamFailure           502 upstream_error (the upstream broke off its stream)
"""

from __future__ import annotations

from typing import Any

# An error may quote the request (a field name, a value): bounded, so a hostile
# 1 MB key is not echoed back whole.
MAX_MESSAGE_CHARS = 1000
MAX_PARAM_CHARS = 200


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


class EdgeLLMError(Exception):
    status = 500
    code = "internal_error"
    type = "server_error"

    def __init__(self, message: str, *, param: str | None = None, **extra: Any) -> None:
        message = _shorten(message, MAX_MESSAGE_CHARS)
        super().__init__(message)
        self.message = message
        self.param = None if param is None else _shorten(param, MAX_PARAM_CHARS)
        self.extra = extra

    def to_dict(self) -> dict[str, Any]:
        """OpenAI's error shape: ``{"error": {message, type, code, param, ...}}``."""
        body: dict[str, Any] = {
            "message": self.message,
            "type": self.type,
            "code": self.code,
            "param": self.param,
        }
        body.update(self.extra)
        return {"error": body}


class InvalidRequest(EdgeLLMError):
    status = 400
    code = "invalid_request"
    type = "invalid_request_error"


_PROMPT_LIMITS = {
    "max_prompt_tokens": "max_prompt_tokens",
    "context": "the model's context leaves room for",
    "kv": "one sequence's share of the KV cache holds",
}


class PromptTooLong(InvalidRequest):
    """The prompt is over the limit. ``limited_by`` says which limit
    (``max_prompt_tokens``, the model's ``context``, one sequence's ``kv`` share);
    ``server_fix`` names the server setting that raises it, if one does."""

    code = "prompt_too_long"

    def __init__(
        self,
        n_prompt_tokens: int,
        max_prompt_tokens: int,
        *,
        limited_by: str = "max_prompt_tokens",
        server_fix: str | None = None,
    ) -> None:
        limit = _PROMPT_LIMITS.get(limited_by, limited_by)
        message = (
            f"prompt has {n_prompt_tokens} tokens, more than {limit} ({max_prompt_tokens}): "
            "shorten the prompt (nothing is truncated)"
        )
        super().__init__(
            message + (f", or {server_fix}" if server_fix else ""),
            param="messages",
            n_prompt_tokens=n_prompt_tokens,
            max_prompt_tokens=max_prompt_tokens,
            limited_by=limited_by,
        )


class KvBudgetNeverFits(InvalidRequest):
    code = "kv_budget_exceeded"


class TemplateRefused(InvalidRequest):
    """The model's chat template refused the messages (its ``raise_exception``)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"the model's chat template refused the messages: {message}",
                         param="messages")  # fmt: skip


class NoChatTemplate(InvalidRequest):
    """The model's GGUF has no chat template (a base model): a transcript in an invented
    format would be answered with junk, so chat is refused and the completions
    endpoints named."""

    code = "no_chat_template"

    def __init__(self) -> None:
        super().__init__(
            "this model has no chat template (a base model): chat messages cannot be "
            "formatted for it; send the text to complete to /v1/completions "
            "(Ollama: /api/generate)",
            param="messages",
        )


class AuthenticationFailed(EdgeLLMError):
    status = 401
    code = "invalid_api_key"
    type = "authentication_error"


class ForbiddenOrigin(EdgeLLMError):
    status = 403
    code = "forbidden_origin"
    type = "permission_error"


class NotFound(EdgeLLMError):
    status = 404
    code = "not_found"
    type = "invalid_request_error"


class ModelNotFound(NotFound):
    code = "model_not_found"


class StreamNotFound(NotFound):
    """No resumable stream by that id for this caller: unknown, expired, or another
    API key's (which must not learn that it exists)."""

    code = "stream_not_found"


class ResumeGap(EdgeLLMError):
    """A resume asked for events the stream's replay log no longer holds."""

    status = 409
    code = "resume_gap"
    type = "invalid_request_error"


class BodyTooLarge(EdgeLLMError):
    status = 413
    code = "request_too_large"
    type = "invalid_request_error"


class TtftTimeout(EdgeLLMError):
    status = 504
    code = "ttft_timeout"
    type = "timeout_error"


class Overloaded(EdgeLLMError):
    status = 503
    code = "overloaded"
    type = "server_error"

    def __init__(self, message: str, *, retry_after_s: int = 1, **extra: Any) -> None:
        super().__init__(message, **extra)
        self.retry_after_s = retry_after_s


class QueueFull(Overloaded):
    code = "queue_full"


class KvBudgetExceeded(Overloaded):
    code = "kv_budget_exceeded"


class EngineUnavailable(Overloaded):
    code = "engine_unavailable"


class MemoryPressure(Overloaded):
    """The device's available memory is under ``min_available_mb``: a new request is
    refused, or a paused stream cancelled (``reason`` says so)."""

    code = "memory_pressure"


class ModelMemory(Overloaded):
    """Loading the model would exceed ``max_model_memory_mb`` and no loaded model is
    idle, so none can be unloaded for it."""

    code = "model_memory"


class ModelBusy(Overloaded):
    """An unload asked for a model whose streams did not end in time."""

    code = "model_busy"


class TooManyConnections(Overloaded):
    code = "too_many_connections"


class UpstreamUnavailable(Overloaded):
    code = "upstream_unavailable"


class UpstreamRejected(EdgeLLMError):
    """An upstream refused the request (4xx): its status and code reach the client."""

    type = "invalid_request_error"

    def __init__(self, status: int, code: str, message: str, *, backend: str) -> None:
        super().__init__(message, backend=backend)
        self.status = status
        self.code = code


class BackendError(EdgeLLMError):
    """The model runtime failed to load, decode or set up a sequence. Raised inside
    the engine; a stream it fails ends with :class:`BackendFailure`."""

    code = "backend_error"


class KvSlotUnavailable(BackendError):
    """llama_decode found no free KV cells (return code 1); retry after freeing some."""


class StreamEnded(EdgeLLMError):
    """Why a stream stopped early; sent as its final event."""


class Cancelled(StreamEnded):
    """409 when nothing was sent yet (e.g. superseded); 503 when the server shuts down."""

    status = 409
    code = "cancelled"
    type = "cancelled"

    def __init__(self, reason: str) -> None:
        super().__init__(f"stream cancelled: {reason}", reason=reason)
        self.reason = reason
        if reason == "shutdown":
            self.status = 503


class PauseTimeout(StreamEnded):
    """A stream stayed paused longer than max_pause_ms: its KV is given back."""

    status = 408
    code = "pause_timeout"
    type = "timeout_error"


class BackendFailure(StreamEnded):
    code = "backend_error"


class UpstreamFailure(StreamEnded):
    status = 502
    code = "upstream_error"
