"""OpenAI-compatible routes: chat completions, completions, models.

A route reads parse → job → encode: the request becomes a
:class:`~edge_llm.generation.job.GenerationJob`, the dispatcher answers it (a local
model or an upstream), :mod:`edge_llm.server.openai_answer` encodes the answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from aiohttp import web

from edge_llm.generation.job import ChatPrompt, GenerationJob, JsonOutput, Prompt, Relay, TextPrompt
from edge_llm.protocol import openai
from edge_llm.server.context import answer_to, caller_of, context_of
from edge_llm.server.http import read_json
from edge_llm.server.openai_answer import respond
from edge_llm.server.resumable_sse import resume_posted

_Request = openai.ChatCompletionRequest | openai.CompletionRequest
_R = TypeVar("_R", openai.ChatCompletionRequest, openai.CompletionRequest)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    if (resumed := await resume_posted(request)) is not None:
        return resumed
    body, req = await _parsed(request, openai.ChatCompletionRequest)
    job = openai_job(
        request,
        req,
        Relay(request.path, _relayable(body)),
        lambda: ChatPrompt(req.chat_messages(), req.tool_setup(), req.prefill),
    )
    return await _respond(request, req, job)


async def completions(request: web.Request) -> web.StreamResponse:
    if (resumed := await resume_posted(request)) is not None:
        return resumed
    body, req = await _parsed(request, openai.CompletionRequest)
    relay = Relay(request.path, _relayable(body))
    job = openai_job(request, req, relay, lambda: TextPrompt(req.prompt_text()))
    return await _respond(request, req, job)


def _relayable(body: dict[str, Any]) -> dict[str, Any]:
    """The body an upstream gets: without ``stream_options.resumable``, this server's
    own option (it resumes the stream it relays itself; an upstream may refuse it)."""
    options = body.get("stream_options")
    if not isinstance(options, dict) or "resumable" not in options:
        return body
    kept = {k: v for k, v in options.items() if k != "resumable"}
    return {**body, "stream_options": kept}


async def _parsed(request: web.Request, kind: type[_R]) -> tuple[dict[str, Any], _R]:
    body = await read_json(request, context_of(request).connection)
    return body, openai.parse_request(kind, body)


async def _respond(request: web.Request, req: _Request, job: GenerationJob) -> web.StreamResponse:
    async with answer_to(request, job) as answer:
        return await respond(request, context_of(request), answer, req)


def openai_job(
    request: web.Request,
    req: _Request,
    relay: Relay,
    prompt: Callable[[], Prompt],
    *,
    progress: bool | None = None,
    streamed: bool | None = None,
) -> GenerationJob:
    """The job of a chat or text completion request (also the WebSocket's, which
    streams), its progress heartbeats on when it streams and asked for them."""
    wants = JsonOutput(req.output_schema, "response_format") if req.wants_json else None
    return GenerationJob(
        req.model,
        *caller_of(request, req.user, req.explicit_priority),
        prompt=prompt,
        sampling=req.sampling,
        json_output=wants,
        max_tokens=req.requested_max_tokens,
        relay=relay,
        progress=req.stream and req.include_progress if progress is None else progress,
        cache_prompt=req.cache_prompt,
        streamed=req.stream if streamed is None else streamed,
    )


async def models(request: web.Request) -> web.Response:
    """The local models first, the default one leading, each with its ``state``
    (loaded, loading, unloaded) and whether its GGUF has a ``chat_template`` (without
    one, chat is refused); then every upstream's (``owned_by`` names it)."""
    ctx = context_of(request)
    pool = ctx.pool
    local = [
        {
            **openai.model_object(name, ctx.started_at),
            "state": pool.state(name).value,
            "chat_template": bool((await pool.metadata(name)).get("tokenizer.chat_template")),
        }
        for name in pool.names
    ]
    upstream_models = [
        openai.model_object(model, ctx.started_at, owned_by=backend)
        for model, backend in ctx.router.model_entries()
        if model not in pool.names
    ]
    return web.json_response({"object": "list", "data": local + upstream_models})
