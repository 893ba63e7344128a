"""Ollama's API on the same port: ``/api/chat``, ``/api/generate`` (NDJSON streams),
``/api/embed``, ``/api/tags``, ``/api/ps``, ``/api/show``, ``/api/version`` (``/api/pull``
and ``/api/delete``: :mod:`edge_llm.server.pull_routes`).

Chat and generate start like every other route (dispatch, the model's lease, the
same admission limits) and stream through the same pump and writer as SSE: one
JSON object per line, written and drained before the next token is taken, so a
reader that stops reading pauses its own sequence. No heartbeat lines are sent
(Ollama sends none). ``keep_alive`` sets how long the model stays loaded once
idle; a request with no prompt or messages loads the model (or, with
``keep_alive: 0``, unloads it) as Ollama's does. Requests and objects are
:mod:`edge_llm.protocol.ollama`'s; errors are ``{"error": "..."}``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from aiohttp import web

from edge_llm.errors import InvalidRequest, ModelNotFound
from edge_llm.generation.dispatch import Answer
from edge_llm.generation.events import Ended, Failed, Produced
from edge_llm.generation.job import ChatPrompt, GenerationJob, JsonOutput, Prompt, TextPrompt
from edge_llm.generation.service import ServedModel
from edge_llm.models.gguf import FILE_TYPES
from edge_llm.models.pool import ModelPool
from edge_llm.protocol import ollama, openai
from edge_llm.protocol.sampling import SamplingDefaults, SamplingParams
from edge_llm.protocol.tools import TextOut, ToolSetup
from edge_llm.server.context import ServerContext, answer_to, caller_of, context_of
from edge_llm.server.http import read_json
from edge_llm.server.model_routes import embed as embed_inputs
from edge_llm.server.sse_writer import SseWriter

NDJSON = "application/x-ndjson"
_Request = ollama.ChatRequest | ollama.GenerateRequest


async def chat(request: web.Request) -> web.StreamResponse:
    return await _answer(request, chat=True)


async def generate(request: web.Request) -> web.StreamResponse:
    return await _answer(request, chat=False)


async def _answer(request: web.Request, *, chat: bool) -> web.StreamResponse:
    ctx = context_of(request)
    started = time.monotonic()
    body = await read_json(request, ctx.connection)
    req: _Request = (
        ollama.parse(ollama.ChatRequest, body)
        if chat
        else ollama.parse(ollama.GenerateRequest, body)
    )
    name = served_name(ctx.pool, req.model)
    keep = _keep_alive(ctx.pool, name, req.keep_alive)
    if (not req.messages) if isinstance(req, ollama.ChatRequest) else not req.prompt:
        return await _load_or_unload(ctx.pool, name, unload=keep == 0.0, chat=chat)
    setup = req.tool_setup() if isinstance(req, ollama.ChatRequest) else None
    # A model without a chat template (a base model) completes /api/generate's prompt
    # as written, as Ollama's default template ({{ .Prompt }}) does; /api/chat is refused.
    templated = bool((await ctx.pool.metadata(name)).get("tokenizer.chat_template"))
    job = GenerationJob(
        name,
        *caller_of(request),  # X-Priority, key or route default
        prompt=lambda: _prompt(req, setup, templated=templated),
        **_local_settings(req, ctx.config.scheduler.max_tokens_cap),
        relay=InvalidRequest("the Ollama API serves this device's models only", param="model"),
    )
    async with answer_to(request, job) as answer:
        clock = _Clock(started, time.monotonic() - started)
        if req.stream:
            return await _stream(request, ctx, answer, chat=chat, clock=clock)
        return await _whole(answer, chat=chat, clock=clock)


def served_name(pool: ModelPool[ServedModel], model: str) -> str:
    """The served model ``model`` names (``NAME:latest`` is ``NAME``), else 404."""
    if (served := pool.served_name(model)) is not None:
        return served
    base, _, tag = model.partition(":")
    if tag == "latest" and (served := pool.served_name(base)) is not None:
        return served
    raise ModelNotFound(f'model "{model}" not found', param="model")


def _keep_alive(pool: ModelPool[ServedModel], name: str, value: float | str | None) -> float | None:
    """The request's keep-alive for the model from now on; left out: the model's
    configured one (as Ollama falls back to its default)."""
    keep = ollama.keep_alive_s(value)
    seconds = pool.spec(name).keep_alive_s if keep == "default" else keep
    pool.set_keep_alive(name, seconds)
    return seconds


async def _load_or_unload(
    pool: ModelPool[ServedModel], name: str, *, unload: bool, chat: bool
) -> web.Response:
    if unload:
        await pool.unload(name)
    else:
        await pool.load(name)
    reason = "unload" if unload else "load"
    return web.json_response(ollama.final(name, chat=chat, text="", done_reason=reason,
                                          timings=None))  # fmt: skip


class _LocalSettings(TypedDict):
    sampling: Callable[[SamplingDefaults], SamplingParams]
    json_output: JsonOutput | None
    max_tokens: int | None
    context: int | None


def _local_settings(req: _Request, max_tokens_cap: int) -> _LocalSettings:
    """``options`` and ``format`` as the local model takes them (``options`` are
    checked here; the model's defaults fill what they leave out)."""
    opts = ollama.options(req.options, SamplingDefaults(), max_tokens_cap)
    constrained, schema = ollama.json_format(req.format)
    return _LocalSettings(
        sampling=lambda defaults: ollama.options(req.options, defaults, max_tokens_cap).sampling,
        json_output=JsonOutput(schema, "format") if constrained else None,
        max_tokens=opts.max_tokens,
        context=opts.num_ctx,
    )


def _prompt(req: _Request, setup: ToolSetup | None, *, templated: bool) -> Prompt:
    if isinstance(req, ollama.GenerateRequest) and (req.raw or not templated):
        return TextPrompt(req.prompt)
    messages = (
        req.template_messages() if isinstance(req, ollama.ChatRequest) else req.chat_messages()
    )
    return ChatPrompt(messages, setup)


@dataclass(frozen=True)
class _Clock:
    started: float
    load_s: float

    def timings(self, answer: Answer) -> ollama.Timings:
        usage, stats = answer.usage(), answer.stats()
        total = time.monotonic() - self.started
        ttft_s = (stats.get("ttft_ms") or 0.0) / 1000.0
        eval_tokens = int(usage.get("completion_tokens") or 0)
        return ollama.Timings(
            total_s=total,
            load_s=self.load_s,
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            prompt_s=ttft_s,
            eval_tokens=eval_tokens,
            # At least a nanosecond a token: clients divide eval_count by it (the first
            # token comes with the prompt's last chunk, and the clocks are read apart).
            eval_s=max(eval_tokens * 1e-9, total - self.load_s - ttft_s),
        )


async def _stream(
    request: web.Request,
    ctx: ServerContext,
    answer: Answer,
    *,
    chat: bool,
    clock: _Clock,
) -> web.StreamResponse:
    writer = SseWriter(request, ctx, answer.id, answer.headers, content_type=NDJSON)
    chunk = ollama.chat_chunk if chat else ollama.generate_chunk
    async for event in answer.events(openai.new_call_id):
        if isinstance(event, Produced):
            text = "".join(e.text for e in event.events if isinstance(e, TextOut))
            if text:
                await writer.send(_line(chunk(answer.model, text)))
        elif isinstance(event, Ended):
            tail = b""
            if event.calls:  # Ollama sends calls in a chunk of their own, then the end
                calls = [ollama.tool_call(call) for call in event.calls]
                tail = _line({**chunk(answer.model, ""), "message": {
                    "role": "assistant", "content": "", "tool_calls": calls}})  # fmt: skip
            done = ollama.final(answer.model, chat=chat, text="", done_reason=event.finish_reason,
                                timings=clock.timings(answer))  # fmt: skip
            await writer.send(tail + _line(done))
        elif isinstance(event, Failed):
            return await writer.fail(event.error, _line(ollama.error_body(event.error.message)))
    return await writer.finish()


async def _whole(answer: Answer, *, chat: bool, clock: _Clock) -> web.Response:
    async for event in answer.events(openai.new_call_id):
        if isinstance(event, Failed):
            raise event.error
        if isinstance(event, Ended):
            body = ollama.final(
                answer.model, chat=chat, text=event.text, done_reason=event.finish_reason,
                timings=clock.timings(answer), calls=event.calls,
            )  # fmt: skip
            return web.json_response(body, headers=answer.headers)
    raise RuntimeError("answer ended without Ended")  # answer_events always ends so


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode() + b"\n"


# -- embeddings ------------------------------------------------------------------------------


async def embed(request: web.Request) -> web.Response:
    ctx = context_of(request)
    started = time.monotonic()
    req = ollama.parse(ollama.EmbedRequest, await read_json(request, ctx.connection))
    name = served_name(ctx.pool, req.model)
    _keep_alive(ctx.pool, name, req.keep_alive)
    inputs = req.inputs()
    if not inputs:  # Ollama loads the model and answers with no vectors
        await ctx.pool.load(name)
        return web.json_response({"model": name, "embeddings": []})
    _, result = await embed_inputs(ctx.pool, name, list(inputs), truncate=req.truncate)
    if req.dimensions is not None and req.dimensions != len(result.vectors[0]):
        raise InvalidRequest(
            f"dimensions: this model's embeddings have {len(result.vectors[0])}, "
            f"got {req.dimensions}",
            param="dimensions",
        )
    total_ns = round((time.monotonic() - started) * 1e9)
    return web.json_response({
        "model": name, "embeddings": result.vectors, "total_duration": total_ns,
        "load_duration": 0, "prompt_eval_count": result.n_tokens,
    })  # fmt: skip


# -- listings ----------------------------------------------------------------------------------


async def tags(request: web.Request) -> web.Response:
    pool = context_of(request).pool
    models = [ollama.tag(await _facts(pool, name)) for name in pool.names]
    return web.json_response({"models": models})


async def ps(request: web.Request) -> web.Response:
    """The loaded models, their memory and when their keep-alive unloads them."""
    pool = context_of(request).pool
    models = []
    for model in pool.loaded_models():
        name = model.spec.name
        facts = await _facts(pool, name)
        models.append(ollama.running(facts, model.footprint_bytes, pool.expires_in(name)))
    return web.json_response({"models": models})


async def show(request: web.Request) -> web.Response:
    ctx = context_of(request)
    req = ollama.parse(ollama.ShowRequest, await read_json(request, ctx.connection))
    name = served_name(ctx.pool, req.model_name)
    metadata = await ctx.pool.metadata(name)
    info = {k: v for k, v in metadata.items() if not k.startswith("tokenizer.")}
    template = str(metadata.get("tokenizer.chat_template") or "")
    loaded = ctx.pool.loaded(name)
    if loaded is not None:
        defaults = loaded.service.sampling_defaults
        parameters = {"temperature": defaults.temperature, "top_p": defaults.top_p}
        if defaults.top_k:
            parameters["top_k"] = defaults.top_k
    else:
        parameters = dict(ctx.pool.spec(name).sampling)
    facts = await _facts(ctx.pool, name)
    return web.json_response(ollama.show(facts, info, template, parameters))


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": ollama.API_VERSION})


async def _facts(pool: ModelPool[ServedModel], name: str) -> ollama.ModelFacts:
    """What the listings say about model ``name``, from its file and GGUF metadata."""
    spec = pool.spec(name)
    metadata = await pool.metadata(name)
    arch = str(metadata.get("general.architecture") or "")
    modified = dt.datetime.fromtimestamp(spec.modified_at, dt.UTC)
    file_type = metadata.get("general.file_type")
    context = metadata.get(f"{arch}.context_length")
    return ollama.ModelFacts(
        name=name,
        size_bytes=spec.size_bytes,
        digest=_digest(spec.path, spec.size_bytes, modified),
        modified_at=modified,
        architecture=arch,
        parameter_size=str(metadata.get("general.size_label") or ""),
        quantization=FILE_TYPES.get(file_type, "") if isinstance(file_type, int) else "",
        context_length=context if isinstance(context, int) else None,
    )


def _digest(path: str | None, size: int, modified: dt.datetime) -> str:
    """A pulled model's sha256 (its blob's name); else a hash of where the file is."""
    blob = Path(path or "").name
    if blob.startswith("sha256-") and len(blob) == 71:
        return blob.removeprefix("sha256-")
    return hashlib.sha256(f"{path}:{size}:{modified}".encode()).hexdigest()
