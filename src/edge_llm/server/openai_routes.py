"""OpenAI-compatible routes: chat completions, completions, models."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from edge_llm.engine.stream import StreamHandle
from edge_llm.protocol import openai, sse
from edge_llm.server.context import ServerContext, context_of
from edge_llm.server.http import read_json, session_of
from edge_llm.server.pump import Delta, Finished, Heartbeat, collect, pump
from edge_llm.server.sse_writer import SseWriter

ChunkFactory = Callable[[str, str | None], dict[str, Any]]
UsageFactory = Callable[[], dict[str, Any]]


async def chat_completions(request: web.Request) -> web.StreamResponse:
    ctx = context_of(request)
    body = await read_json(request, ctx.connection)
    req = openai.parse_request(openai.ChatCompletionRequest, body)
    ctx.service.check_model(req.model)
    handle = await ctx.service.start_chat(
        req.chat_messages(),
        max_tokens=req.requested_max_tokens,
        sampling=req.sampling(),
        session=session_of(request, req.user),
    )
    model, created = ctx.service.model_id, int(time.time())

    def chunk(text: str, finish_reason: str | None) -> dict[str, Any]:
        return openai.chat_chunk(
            handle.id, model, created, content=text, finish_reason=finish_reason
        )

    def usage() -> dict[str, Any]:
        return openai.usage_chunk(handle.id, model, created, handle.usage(), chat=True)

    first = openai.chat_chunk(handle.id, model, created, role="assistant", content="")
    with ctx.guard(handle):
        if req.stream:
            usage_factory = usage if req.include_usage else None
            return await _stream_sse(request, ctx, handle, chunk, first=first, usage=usage_factory)
        text, finish_reason = await collect(ctx.engine, handle, ctx.pump_settings)
        return web.json_response(
            openai.chat_completion(handle.id, model, text, finish_reason, handle.usage()),
            headers={"X-Request-Id": handle.id},
        )


async def completions(request: web.Request) -> web.StreamResponse:
    ctx = context_of(request)
    body = await read_json(request, ctx.connection)
    req = openai.parse_request(openai.CompletionRequest, body)
    ctx.service.check_model(req.model)
    handle = await ctx.service.start_text(
        req.prompt_text(),
        max_tokens=req.requested_max_tokens,
        sampling=req.sampling(),
        session=session_of(request, req.user),
    )
    model, created = ctx.service.model_id, int(time.time())

    def chunk(text: str, finish_reason: str | None) -> dict[str, Any]:
        return openai.completion_chunk(
            handle.id, model, created, text=text, finish_reason=finish_reason
        )

    def usage() -> dict[str, Any]:
        return openai.usage_chunk(handle.id, model, created, handle.usage(), chat=False)

    with ctx.guard(handle):
        if req.stream:
            usage_factory = usage if req.include_usage else None
            return await _stream_sse(request, ctx, handle, chunk, first=None, usage=usage_factory)
        text, finish_reason = await collect(ctx.engine, handle, ctx.pump_settings)
        return web.json_response(
            openai.text_completion(handle.id, model, text, finish_reason, handle.usage()),
            headers={"X-Request-Id": handle.id},
        )


async def models(request: web.Request) -> web.Response:
    ctx = context_of(request)
    return web.json_response(openai.model_list(ctx.service.model_id, ctx.started_at))


async def _stream_sse(
    request: web.Request,
    ctx: ServerContext,
    handle: StreamHandle,
    chunk: ChunkFactory,
    *,
    first: dict[str, Any] | None,
    usage: UsageFactory | None,
) -> web.StreamResponse:
    writer = SseWriter(request, ctx, handle.id)
    async for event in pump(ctx.engine, handle, ctx.pump_settings):
        if isinstance(event, Delta):
            prefix = b""
            if first is not None:
                prefix, first = sse.encode_data(first), None
            await writer.send(prefix + sse.encode_data(chunk(event.text, None)))
        elif isinstance(event, Heartbeat):
            await writer.send(sse.PING)
        elif isinstance(event, Finished):
            outcome = event.outcome
            if outcome.error is not None:
                return await writer.fail(outcome.error, sse.encode_data(outcome.error.to_dict()))
            tail = [chunk("", outcome.finish_reason or "stop")]
            if usage is not None:
                tail.append(usage())
            await writer.send(b"".join(sse.encode_data(c) for c in tail) + sse.DONE)
    return await writer.finish()
