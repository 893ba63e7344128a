"""From a validated API request to an admitted stream (shared by every route).

Limits are enforced here, the same way for every API. A prompt longer than
``max_prompt_tokens``, or one that leaves no room for a single token in the
model's context or in one sequence's KV share, is a 400 ``prompt_too_long`` with
both counts. ``max_tokens`` is an upper bound, as llama-server treats
``n_predict``: a value larger than ``max_tokens_cap`` or than what the context and
KV leave after the prompt is lowered to fit, the response says so in
``X-Max-Tokens-Clamped`` (the value granted) and the event log records a
``max_tokens_clamped`` event. Sampling fields a request leaves out get the
model's recommendation, else the engine's defaults (``sampling_defaults``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any

from edge_llm.config.tree import where_to_set
from edge_llm.engine import Backend, Engine, GenerationRequest, StreamHandle
from edge_llm.errors import InvalidRequest, ModelNotFound, PromptTooLong
from edge_llm.generation.job import ChatPrompt, GenerationJob
from edge_llm.models.pool import LoadedModel
from edge_llm.observability.events import Event, EventSink
from edge_llm.protocol.sampling import SamplingDefaults, SamplingParams
from edge_llm.protocol.tools import ToolSetup, template_messages

# Tokenizing a long text takes a few ms; beyond this size it leaves the event loop.
_TOKENIZE_INLINE_CHARS = 8192
MAX_TOKENS_CLAMPED_HEADER = "X-Max-Tokens-Clamped"


@dataclass(frozen=True)
class Limits:
    max_prompt_tokens: int
    default_max_tokens: int
    max_tokens_cap: int
    max_messages: int
    context_tokens: int | None = None  # a model's configured context (None: its trained one)


@dataclass(frozen=True)
class MaxTokens:
    """The ``max_tokens`` granted, and what lowered it below the wish (if anything)."""

    granted: int
    wanted: int
    limit: str | None = None  # "max_tokens_cap", "context" or "kv"


@dataclass
class ServedModel(LoadedModel):
    """A loaded model and the service that admits requests to it (what the pool
    serves to the generation layer)."""

    service: GenerationService


@dataclass(frozen=True)
class Prepared:
    """A request tokenized and checked against the limits, not yet submitted."""

    request: GenerationRequest
    prompt: str
    budget: MaxTokens
    tools: ToolSetup | None  # the calls the answer may hold (read by the tool-call parser)


class GenerationService:
    def __init__(
        self,
        engine: Engine,
        backend: Backend,
        limits: Limits,
        *,
        events: EventSink,
        log_prompts: bool = False,
        sampling_defaults: SamplingDefaults | None = None,
    ) -> None:
        self.engine = engine
        self.backend = backend
        self.limits = limits
        self.events = events
        self.log_prompts = log_prompts
        engine_defaults = sampling_defaults or SamplingDefaults()
        self.sampling_defaults = engine_defaults.overridden(backend.info.recommended_sampling)

    @property
    def model_id(self) -> str:
        return self.backend.info.model_id

    @property
    def context_tokens(self) -> int:
        """Most tokens of one sequence: the model's trained context, or less if configured."""
        trained = self.backend.info.n_ctx_train
        configured = self.limits.context_tokens
        return min(trained, configured) if configured else trained

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_id:
            raise ModelNotFound(
                f"model {model!r} is not served here; available: {self.model_id}",
                param="model",
                available=[self.model_id],
            )

    def json_grammar(self, schema: dict[str, Any] | None, *, param: str) -> str:
        """The grammar that keeps output to JSON valid against ``schema`` (None: any
        JSON object), or InvalidRequest naming the request field ``param``."""
        try:
            return self.backend.json_schema_grammar(schema)
        except InvalidRequest as exc:
            raise InvalidRequest(f"{param}: {exc.message}", param=param) from exc

    def _check_sampling(self, sampling: SamplingParams) -> None:
        n_vocab = self.backend.info.n_vocab
        named = [("logit_bias", t) for t, _ in sampling.logit_bias]
        for field, token in named + [("stop_token_ids", t) for t in sampling.stop_token_ids]:
            if token >= n_vocab:
                raise InvalidRequest(
                    f"{field}: token id {token} is not in the vocabulary (0..{n_vocab - 1})",
                    param=field,
                )

    async def prepare(self, job: GenerationJob) -> Prepared:
        """Check ``job`` against this model and its limits and tokenize it; raises
        the refusal the client must get. Nothing runs until :meth:`submit`."""
        sampling = job.sampling(self.sampling_defaults)
        prompt = job.prompt()
        tools = prompt.tools if isinstance(prompt, ChatPrompt) else None
        if tools is not None and tools.active and sampling.n_logprobs is not None:
            raise InvalidRequest("logprobs cannot be combined with tools", param="logprobs")
        if job.json_output is not None:
            grammar = self.json_grammar(job.json_output.schema, param=job.json_output.param)
            sampling = replace(sampling, grammar=grammar)
        if isinstance(prompt, ChatPrompt):
            self.check_messages(len(prompt.messages) + (1 if prompt.prefill else 0))
            text = self.render_chat(prompt.messages, tools) + prompt.prefill
            if tools is not None and tools.forced:
                sampling = self._tool_grammar(sampling, tools)
        else:
            text = prompt.text
        return await self._prepare_text(text, job, sampling, tools)

    def check_messages(self, count: int) -> None:
        if count > self.limits.max_messages:
            raise InvalidRequest(
                f"{count} messages, at most {self.limits.max_messages}", param="messages"
            )

    def render_chat(self, messages: list[dict[str, Any]], tools: ToolSetup | None = None) -> str:
        turns, template_tools = template_messages(messages, tools, self.backend.template_has_tools)
        return self.backend.render_chat(turns, template_tools)

    def _tool_grammar(self, sampling: SamplingParams, tools: ToolSetup) -> SamplingParams:
        """Constrain sampling to a call of the offered tools."""
        if sampling.grammar is not None:
            raise InvalidRequest(
                "a structured output format cannot be combined with a forced tool call",
                param="tool_choice",
            )
        grammar = self.json_grammar(tools.forced_schema(), param="tools")
        return replace(sampling, grammar=grammar)

    async def count_tokens(self, prompt: str) -> int:
        return len(await self._tokenize(prompt))

    async def _prepare_text(
        self, prompt: str, job: GenerationJob, sampling: SamplingParams, tools: ToolSetup | None
    ) -> Prepared:
        """Tokenize ``prompt`` and enforce the prompt and max_tokens limits, for a
        request in class ``job.priority`` (lower runs first). ``job.context``: the
        request's own bound on prompt and answer together (Ollama's ``num_ctx``),
        named ``num_ctx`` when it binds."""
        self._check_sampling(sampling)
        tokens = await self._tokenize(prompt)
        if not tokens:
            raise InvalidRequest("prompt is empty (it has no tokens)", param="prompt")
        self._check_prompt_fits(len(tokens), job.context)
        budget = self.max_tokens(job.max_tokens, len(tokens), job.context)
        request = GenerationRequest(
            prompt_tokens=tokens,
            max_tokens=budget.granted,
            sampling=sampling,
            session=job.session,
            request_id=job.request_id or self.engine.new_request_id(),
            priority=job.priority.value,
            max_tokens_limited_by=budget.limit,
            reuse_cache=job.cache_prompt,
            ttft_timeout_s=job.ttft_timeout_s,
        )
        return Prepared(request, prompt, budget, tools)

    def submit(self, prepared: Prepared) -> StreamHandle:
        """Admit the prepared request to the engine, or raise its refusal."""
        handle = self.engine.submit(prepared.request)
        budget = prepared.budget
        if budget.limit is not None:
            self.events(
                Event.MAX_TOKENS_CLAMPED,
                handle.id,
                requested=budget.wanted,
                max_tokens=budget.granted,
                limit=budget.limit,
            )
        if self.log_prompts:
            self.events(Event.PROMPT, handle.id, prompt=prepared.prompt)
        return handle

    async def _tokenize(self, text: str) -> list[int]:
        if len(text) <= _TOKENIZE_INLINE_CHARS:
            return self.backend.tokenize(text, add_special=True)
        return await asyncio.to_thread(self.backend.tokenize, text, add_special=True)

    def prompt_limit(self, context: int | None = None) -> tuple[str, int]:
        """The longest prompt admitted, and what sets it: ``max_prompt_tokens``, the
        model's ``context``, one sequence's ``kv`` share or ``num_ctx`` (each leaves
        room for a token)."""
        limits = self._context_limits(
            0, context, ("max_prompt_tokens", self.limits.max_prompt_tokens + 1)
        )
        return min(((name, bound - 1) for name, bound in limits), key=lambda item: item[1])

    def _check_prompt_fits(self, n_prompt: int, context: int | None = None) -> None:
        """A prompt over the configured limit, or with no room left for one token.
        The refusal names the limit and the server setting that raises it."""
        limited_by, limit = self.prompt_limit(context)
        if n_prompt > limit:
            self.engine.metrics.rejections.labels("prompt_too_long").inc()
            fix = _server_fix(limited_by)
            raise PromptTooLong(n_prompt, limit, limited_by=limited_by, server_fix=fix)

    def max_tokens(
        self, requested: int | None, n_prompt: int, context: int | None = None
    ) -> MaxTokens:
        """``requested`` (else the default) lowered to the cap and to the room
        the context and one sequence's KV share leave after the prompt."""
        wanted = requested if requested is not None else self.limits.default_max_tokens
        limits = self._context_limits(
            n_prompt, context, ("max_tokens_cap", self.limits.max_tokens_cap)
        )
        name, bound = min(limits, key=lambda item: item[1])
        if wanted <= bound:
            return MaxTokens(wanted, wanted)
        return MaxTokens(max(1, bound), wanted, name)

    def _context_limits(
        self, n_prompt: int, context: int | None, configured: tuple[str, int]
    ) -> tuple[tuple[str, int], ...]:
        """Room left after ``n_prompt`` tokens under each limit, ``configured`` first
        (a tie names it): the model's context, one sequence's KV share, ``num_ctx``."""
        limits = (
            configured,
            ("context", self.context_tokens - n_prompt),
            ("kv", self.engine.kv.sequence_tokens - n_prompt),
        )
        return limits + ((("num_ctx", context - n_prompt),) if context else ())


def _server_fix(limited_by: str) -> str:
    """What the operator changes so the refused prompt fits (the model's context
    cannot be raised; a model with a longer one can)."""
    if limited_by == "context":
        return "serve a model with a longer context"
    if limited_by == "num_ctx":
        return "raise options.num_ctx"
    key = "max_kv_cache_mb" if limited_by == "kv" else "max_prompt_tokens"
    return f"raise {key} on the server ({where_to_set(key)})"


def response_headers(handle: StreamHandle) -> dict[str, str]:
    """Headers every response for an admitted stream carries."""
    headers = {"X-Request-Id": handle.id}
    if handle.seq.request.max_tokens_limited_by is not None:
        headers[MAX_TOKENS_CLAMPED_HEADER] = str(handle.seq.request.max_tokens)
    return headers
