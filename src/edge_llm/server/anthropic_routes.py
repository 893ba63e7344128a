"""Anthropic-compatible ``POST /v1/messages``, streaming and not.

It shares the engine, the admission limits and the backpressure contract with
the OpenAI routes: the same :func:`pump`, the same socket tuning and the same
drain after every write (``SseWriter``), so a stalled reader pauses its own
sequence here too. What the request may hold is described in
:mod:`edge_llm.protocol.anthropic`; authentication (``x-api-key`` or Bearer) is
the application's middleware.

Stream: ``message_start``, ``content_block_start``, ``ping`` (sent with the first
token or the first heartbeat, so that an error before then is still a plain HTTP
error), ``content_block_delta``..., ``ping`` while no token flows,
``content_block_stop``, ``message_delta``, ``message_stop``. An error after the
stream started is an ``error`` event, then the stream ends.

A request naming an upstream's model (any other id runs locally), or one the
device refuses when an upstream has ``fallback = true``, is relayed to the
upstream as a chat completion (:mod:`edge_llm.upstream.translate`); its answer
is encoded as content blocks by the same code as a local answer with tools.
``message_start`` then reports 0 input tokens (the upstream counts them at the
end), and ``message_delta`` the upstream's counts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web

from edge_llm.engine.stream import StreamHandle
from edge_llm.errors import EdgeLLMError, Overloaded
from edge_llm.protocol import anthropic
from edge_llm.protocol.sse import encode_event
from edge_llm.protocol.stream_events import Delta, Finished, Heartbeat
from edge_llm.protocol.tools import ToolOutputParser, ToolSetup
from edge_llm.server import upstream_routes
from edge_llm.server.context import ServerContext, context_of
from edge_llm.server.generation import (
    Ended,
    Failed,
    GenerationEvent,
    Produced,
    local_answer,
    upstream_answer,
)
from edge_llm.server.http import read_json, session_of
from edge_llm.server.pump import collect, pump
from edge_llm.server.service import response_headers
from edge_llm.server.sse_writer import SseWriter
from edge_llm.upstream.registry import Upstream
from edge_llm.upstream.router import FALLBACK_ERRORS
from edge_llm.upstream.translate import CHAT_PATH, ChatChunkReader, messages_chat_body

_PING = encode_event("ping", anthropic.ping())


async def messages(request: web.Request) -> web.StreamResponse:
    ctx = context_of(request)
    try:
        return await _messages(request, ctx)
    except EdgeLLMError as exc:
        return error_response(exc)


async def count_tokens(request: web.Request) -> web.Response:
    """``POST /v1/messages/count_tokens``: the prompt's tokens as the model would
    see them (chat template, tools, prefill); counted even over the prompt limit."""
    ctx = context_of(request)
    try:
        req = anthropic.parse_count_request(await read_json(request, ctx.connection))
        ctx.service.check_messages(len(req.messages))
        prompt = ctx.service.render_chat(req.chat_messages(), req.tool_setup())
        count = await ctx.service.count_tokens(prompt + (req.prefill or ""))
    except EdgeLLMError as exc:
        return error_response(exc)
    return web.json_response({"input_tokens": count})


def error_response(error: EdgeLLMError) -> web.Response:
    headers = {}
    if isinstance(error, Overloaded):
        headers["Retry-After"] = str(error.retry_after_s)
    return web.json_response(anthropic.error_body(error), status=error.status, headers=headers)


@dataclass(frozen=True)
class _Answerer:
    """Who answers, as the response names it before the first token."""

    request_id: str
    model: str
    n_prompt: int  # 0 from an upstream: it counts them at the end
    headers: dict[str, str]


async def _messages(request: web.Request, ctx: ServerContext) -> web.StreamResponse:
    body = await read_json(request, ctx.connection)
    req = anthropic.parse_request(body)
    setup = req.tool_setup()
    upstreams = ctx.router.upstreams_naming(req.model)
    if upstreams is not None:
        return await _relay(request, ctx, req, upstreams, route="model")
    try:
        handle = await _start(ctx, req, session_of(request, None), setup)
    except FALLBACK_ERRORS as exc:
        candidates = ctx.router.fallback_for(exc)
        if not candidates or req.prefill is not None:
            raise  # a prefill cannot be relayed (see translate): the refusal stands
        return await _relay(request, ctx, req, candidates, route=f"fallback_{exc.code}")
    ctx.router.note_local(handle.id, handle.seq.session)
    headers = _headers(handle, req)
    with ctx.guard(handle):
        if setup is not None and setup.active:
            parser = ToolOutputParser(setup, anthropic.new_tool_use_id)
            answerer = _Answerer(handle.id, ctx.service.model_id, handle.seq.n_prompt, headers)
            answer = local_answer(ctx, handle, parser)
            return await _respond_blocks(request, ctx, req, answerer, answer)
        if req.stream:
            return await _stream(request, ctx, handle, req, headers)
        return await _reply(ctx, handle, req, headers)


async def _start(
    ctx: ServerContext,
    req: anthropic.MessagesRequest,
    session: str | None,
    setup: ToolSetup | None,
) -> StreamHandle:
    service = ctx.service
    sampling = req.sampling(service.sampling_defaults)
    if req.output_schema is not None:
        grammar = service.json_grammar(req.output_schema, param="output_config.format")
        sampling = replace(sampling, grammar=grammar)
    return await service.start_chat(
        req.chat_messages(),
        max_tokens=req.max_tokens,
        sampling=sampling,
        session=session,
        tools=setup,
        prefill=req.prefill or "",
    )


async def _relay(
    request: web.Request,
    ctx: ServerContext,
    req: anthropic.MessagesRequest,
    candidates: list[Upstream],
    *,
    route: str,
) -> web.StreamResponse:
    """Served by an upstream, asked as a chat completion."""
    body = messages_chat_body(req, session_of(request, None))
    async with upstream_routes.relayed(
        request, ctx, body, candidates, route=route, user=None, path=CHAT_PATH
    ) as stream:
        headers = _ignored_header(req, {"X-Request-Id": stream.id})
        answerer = _Answerer(stream.id, stream.client_model, 0, headers)
        answer = upstream_answer(stream, ChatChunkReader(anthropic.new_tool_use_id))
        return await _respond_blocks(request, ctx, req, answerer, answer)


def _headers(handle: StreamHandle, req: anthropic.MessagesRequest) -> dict[str, str]:
    return _ignored_header(req, response_headers(handle))


def _ignored_header(req: anthropic.MessagesRequest, headers: dict[str, str]) -> dict[str, str]:
    ignored = req.ignored()
    if ignored:
        headers["X-Edge-LLM-Ignored"] = ",".join(ignored)
    return headers


async def _reply(
    ctx: ServerContext,
    handle: StreamHandle,
    req: anthropic.MessagesRequest,
    headers: dict[str, str],
) -> web.Response:
    text, _ = await collect(ctx.engine, handle, ctx.pump_settings)
    body = anthropic.message(
        anthropic.message_id(handle.id),
        ctx.service.model_id,
        text,
        _stop(handle),
        _usage(handle),
    )
    return web.json_response(body, headers=headers)


async def _stream(
    request: web.Request,
    ctx: ServerContext,
    handle: StreamHandle,
    req: anthropic.MessagesRequest,
    headers: dict[str, str],
) -> web.StreamResponse:
    writer = SseWriter(request, ctx, handle.id)
    writer.response.headers.update(headers)
    opening = _opening(ctx, handle)
    async for event in pump(ctx.engine, handle, ctx.pump_settings):
        if isinstance(event, Delta):
            delta = encode_event("content_block_delta", anthropic.text_delta(event.text))
            await writer.send(opening + delta)
            opening = b""
        elif isinstance(event, Heartbeat):
            await writer.send(opening or _PING)
            opening = b""
        elif isinstance(event, Finished):
            outcome = event.outcome
            if outcome.error is not None:
                error_event = encode_event("error", anthropic.error_body(outcome.error))
                return await writer.fail(outcome.error, error_event, error_response)
            stop = _stop(handle)
            await writer.send(opening + _closing(stop, _usage(handle)))
    return await writer.finish()


def _opening(ctx: ServerContext, handle: StreamHandle) -> bytes:
    return b"".join(
        [
            _message_start(ctx, handle),
            encode_event("content_block_start", anthropic.content_block_start()),
            _PING,
        ]
    )


def _message_start(ctx: ServerContext, handle: StreamHandle) -> bytes:
    start = anthropic.message_start(
        anthropic.message_id(handle.id), ctx.service.model_id, handle.seq.n_prompt
    )
    return encode_event("message_start", start)


def _closing(stop: tuple[str, str | None], usage: dict[str, int]) -> bytes:
    return b"".join(
        [
            encode_event("content_block_stop", anthropic.content_block_stop()),
            encode_event("message_delta", anthropic.message_delta(stop, usage)),
            encode_event("message_stop", anthropic.message_stop()),
        ]
    )


def _stop(handle: StreamHandle) -> tuple[str, str | None]:
    outcome = handle.outcome
    if outcome is None:
        return anthropic.stop_reason(None, None)
    return anthropic.stop_reason(outcome.finish_reason, outcome.stop_sequence)


def _usage(handle: StreamHandle) -> dict[str, int]:
    return _counted(handle.usage())


# -- answers as content blocks: tools (local) and every upstream answer -----------------


async def _respond_blocks(
    request: web.Request,
    ctx: ServerContext,
    req: anthropic.MessagesRequest,
    answerer: _Answerer,
    answer: AsyncIterator[GenerationEvent],
) -> web.StreamResponse:
    if req.stream:
        return await _stream_blocks(request, ctx, answerer, answer)
    return await _reply_blocks(answerer, answer)


async def _reply_blocks(
    answerer: _Answerer, answer: AsyncIterator[GenerationEvent]
) -> web.Response:
    async for event in answer:
        if isinstance(event, Failed):
            raise event.error
        if isinstance(event, Ended):
            body = anthropic.message(
                anthropic.message_id(answerer.request_id),
                answerer.model,
                event.text,
                _ended_stop(event),
                _counted(event.usage),
                calls=event.calls,
            )
            return web.json_response(body, headers=answerer.headers)
    raise RuntimeError("answer ended without Ended or Failed")  # both generators end so


async def _stream_blocks(
    request: web.Request,
    ctx: ServerContext,
    answerer: _Answerer,
    answer: AsyncIterator[GenerationEvent],
) -> web.StreamResponse:
    writer = SseWriter(request, ctx, answerer.request_id, answerer.headers)
    blocks = anthropic.BlockStream()
    start = anthropic.message_start(
        anthropic.message_id(answerer.request_id), answerer.model, answerer.n_prompt
    )
    opening = encode_event("message_start", start) + _PING
    async for event in answer:
        if isinstance(event, Produced):
            events = [e for out in event.events for e in blocks.on(out)]
            if events or opening:
                await writer.send(opening + _encode(events))
                opening = b""
        elif isinstance(event, Heartbeat):
            await writer.send(opening or _PING)
            opening = b""
        elif isinstance(event, Failed):
            error_event = encode_event("error", anthropic.error_body(event.error))
            return await writer.fail(event.error, error_event, error_response)
        elif isinstance(event, Ended):
            delta = anthropic.message_delta(_ended_stop(event), _counted(event.usage))
            events = [
                *blocks.close(),
                ("message_delta", delta),
                ("message_stop", anthropic.message_stop()),
            ]
            await writer.send(opening + _encode(events))
    return await writer.finish()


def _ended_stop(ended: Ended) -> tuple[str, str | None]:
    return anthropic.stop_reason(
        ended.finish_reason, ended.stop_sequence, tool_use=bool(ended.calls)
    )


def _counted(counts: dict[str, Any]) -> dict[str, int]:
    cached = counts["prompt_tokens_details"]["cached_tokens"]
    return anthropic.usage(counts["prompt_tokens"], counts["completion_tokens"], cached)


def _encode(events: list[tuple[str, dict[str, Any]]]) -> bytes:
    return b"".join(encode_event(name, payload) for name, payload in events)
