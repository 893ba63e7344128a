"""OpenAI-compatible routes: chat completions, completions, models."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from edge_llm.engine.stream import StreamHandle
from edge_llm.protocol import openai, sse
from edge_llm.server.context import ServerContext, context_of
from edge_llm.server.http import read_json, session_of
from edge_llm.server.pump import Delta, Finished, Heartbeat, collect, pump
from edge_llm.server.service import response_headers
from edge_llm.server.sse_writer import SseWriter


@dataclass(frozen=True)
class _Shape:
    """How one endpoint's objects look (chat or text completion)."""

    chat: bool

    def chunk(self, ids: _Ids, text: str, finish_reason: str | None) -> dict[str, Any]:
        if self.chat:
            return openai.chat_chunk(*ids, content=text, finish_reason=finish_reason)
        return openai.completion_chunk(*ids, text=text, finish_reason=finish_reason)

    def first(self, ids: _Ids) -> dict[str, Any] | None:
        """The role-only chunk chat streams start with."""
        return openai.chat_chunk(*ids, role="assistant", content="") if self.chat else None

    def whole(
        self, ids: _Ids, text: str, finish_reason: str, usage: dict[str, int]
    ) -> dict[str, Any]:
        build = openai.chat_completion if self.chat else openai.text_completion
        return build(*ids, text=text, finish_reason=finish_reason, usage=usage)


_Ids = tuple[str, str, int]  # request id, model, created


async def chat_completions(request: web.Request) -> web.StreamResponse:
    ctx = context_of(request)
    req = openai.parse_request(
        openai.ChatCompletionRequest, await read_json(request, ctx.connection)
    )
    ctx.service.check_model(req.model)
    handle = await ctx.service.start_chat(
        req.chat_messages(),
        max_tokens=req.requested_max_tokens,
        sampling=req.sampling(ctx.service.sampling_defaults),
        session=session_of(request, req.user),
    )
    return await _respond(request, ctx, handle, req, _Shape(chat=True))


async def completions(request: web.Request) -> web.StreamResponse:
    ctx = context_of(request)
    req = openai.parse_request(openai.CompletionRequest, await read_json(request, ctx.connection))
    ctx.service.check_model(req.model)
    handle = await ctx.service.start_text(
        req.prompt_text(),
        max_tokens=req.requested_max_tokens,
        sampling=req.sampling(ctx.service.sampling_defaults),
        session=session_of(request, req.user),
    )
    return await _respond(request, ctx, handle, req, _Shape(chat=False))


async def _respond(
    request: web.Request,
    ctx: ServerContext,
    handle: StreamHandle,
    req: openai.ChatCompletionRequest | openai.CompletionRequest,
    shape: _Shape,
) -> web.StreamResponse:
    ids: _Ids = (handle.id, ctx.service.model_id, int(time.time()))
    with ctx.guard(handle):
        if req.stream:
            return await _stream_sse(
                request, ctx, handle, ids, shape, include_usage=req.include_usage
            )
        text, finish_reason = await collect(ctx.engine, handle, ctx.pump_settings)
        return web.json_response(
            shape.whole(ids, text, finish_reason, handle.usage()),
            headers=response_headers(handle),
        )


async def models(request: web.Request) -> web.Response:
    ctx = context_of(request)
    return web.json_response(openai.model_list(ctx.service.model_id, ctx.started_at))


async def _stream_sse(
    request: web.Request,
    ctx: ServerContext,
    handle: StreamHandle,
    ids: _Ids,
    shape: _Shape,
    *,
    include_usage: bool,
) -> web.StreamResponse:
    writer = SseWriter(request, ctx, handle.id, response_headers(handle))
    first = shape.first(ids)
    async for event in pump(ctx.engine, handle, ctx.pump_settings):
        if isinstance(event, Delta):
            prefix = b""
            if first is not None:
                prefix, first = sse.encode_data(first), None
            await writer.send(prefix + sse.encode_data(shape.chunk(ids, event.text, None)))
        elif isinstance(event, Heartbeat):
            await writer.send(sse.PING)
        elif isinstance(event, Finished):
            outcome = event.outcome
            if outcome.error is not None:
                return await writer.fail(outcome.error, sse.encode_data(outcome.error.to_dict()))
            tail = [shape.chunk(ids, "", outcome.finish_reason or "stop")]
            if include_usage:
                tail.append(openai.usage_chunk(*ids, handle.usage(), chat=shape.chat))
            await writer.send(b"".join(sse.encode_data(c) for c in tail) + sse.DONE)
    return await writer.finish()
