"""OpenAI-compatible routes: chat completions, completions, models."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from edge_llm.engine.stream import StreamHandle
from edge_llm.errors import EdgeLLMError
from edge_llm.protocol import openai, sse
from edge_llm.server.context import ServerContext, context_of
from edge_llm.server.http import error_response, read_json, session_of, tune_connection
from edge_llm.server.pump import Delta, Finished, Heartbeat, pump

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
        text, finish_reason = await _collect(ctx, handle)
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
        text, finish_reason = await _collect(ctx, handle)
        return web.json_response(
            openai.text_completion(handle.id, model, text, finish_reason, handle.usage()),
            headers={"X-Request-Id": handle.id},
        )


async def models(request: web.Request) -> web.Response:
    ctx = context_of(request)
    return web.json_response(openai.model_list(ctx.service.model_id, ctx.started_at))


async def _collect(ctx: ServerContext, handle: StreamHandle) -> tuple[str, str]:
    parts: list[str] = []
    async for event in pump(ctx.engine, handle, ctx.pump_settings):
        if isinstance(event, Delta):
            parts.append(event.text)
        elif isinstance(event, Finished):
            if event.outcome.error is not None:
                raise event.outcome.error
            return "".join(parts), event.outcome.finish_reason or "stop"
    raise RuntimeError("stream ended without an outcome")  # pump always ends with Finished


class _SseWriter:
    """Prepares the response on the first write, so an error before any byte
    can still be a plain HTTP error."""

    def __init__(self, request: web.Request, ctx: ServerContext, request_id: str) -> None:
        self.request = request
        self.ctx = ctx
        self.response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                "X-Request-Id": request_id,
                "X-Accel-Buffering": "no",
            }
        )

    @property
    def started(self) -> bool:
        return self.response.prepared

    async def send(self, data: bytes) -> None:
        if not self.response.prepared:
            tune_connection(self.request, self.ctx.connection)
            await self.response.prepare(self.request)
        await self.response.write(data)
        # aiohttp drains only every 64 KiB; wait whenever the transport is above
        # its (small) high-water mark so a stalled reader stops this stream now.
        await self.request.writer.drain()


async def _stream_sse(
    request: web.Request,
    ctx: ServerContext,
    handle: StreamHandle,
    chunk: ChunkFactory,
    *,
    first: dict[str, Any] | None,
    usage: UsageFactory | None,
) -> web.StreamResponse:
    writer = _SseWriter(request, ctx, handle.id)
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
                return await _fail(writer, outcome.error)
            tail = [chunk("", outcome.finish_reason or "stop")]
            if usage is not None:
                tail.append(usage())
            await writer.send(b"".join(sse.encode_data(c) for c in tail) + sse.DONE)
    await writer.response.write_eof()
    return writer.response


async def _fail(writer: _SseWriter, error: EdgeLLMError) -> web.StreamResponse:
    if not writer.started:
        return error_response(error)
    await writer.send(sse.encode_data(error.to_dict()))
    await writer.response.write_eof()
    return writer.response
