"""Anthropic-compatible ``POST /v1/messages``, streaming and not.

It shares the engine, the admission limits and the backpressure contract with
the OpenAI routes: the same dispatch and pump, the same socket tuning and the
same drain after every write (``SseWriter``), so a stalled reader pauses its own
sequence here too. What the request may hold is described in
:mod:`edge_llm.protocol.anthropic`; authentication (``x-api-key`` or Bearer) and
errors in Anthropic's shape (chosen by path) are the application's middleware.

Stream: ``message_start``, ``content_block_start``, ``ping`` (sent with the first
token or the first heartbeat, so that an error before then is still a plain HTTP
error), ``content_block_delta``..., ``ping`` while no token flows,
``content_block_stop``, ``message_delta``, ``message_stop``. An error after the
stream started is an ``error`` event, then the stream ends.

A request naming an upstream's model (any other id runs locally), or one the
device refuses when an upstream has ``fallback = true`` (see
:mod:`edge_llm.server.dispatch`), is relayed to the upstream as a chat
completion (:mod:`edge_llm.upstream.translate`); its answer
is encoded as content blocks by the same code as a local answer with tools.
``message_start`` then reports 0 input tokens (the upstream counts them at the
end), and ``message_delta`` the upstream's counts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from aiohttp import web

from edge_llm.protocol import anthropic
from edge_llm.protocol.sse import encode_event
from edge_llm.protocol.stream_events import Delta, Finished, Heartbeat
from edge_llm.protocol.tools import ToolSetup
from edge_llm.server.access_log import answering
from edge_llm.server.context import ServerContext, context_of
from edge_llm.server.dispatch import Answer, Job, Relay
from edge_llm.server.generation import (
    Ended,
    Failed,
    GenerationEvent,
    Produced,
    generation_events,
)
from edge_llm.server.http import read_json, session_of
from edge_llm.server.service import GenerationService, Prepared
from edge_llm.server.sse_writer import SseWriter
from edge_llm.upstream.translate import CHAT_PATH, messages_chat_body

_PING = encode_event("ping", anthropic.ping())


async def count_tokens(request: web.Request) -> web.Response:
    """``POST /v1/messages/count_tokens``: the prompt's tokens as the model would
    see them (chat template, tools, prefill); counted even over the prompt limit."""
    ctx = context_of(request)
    req = anthropic.parse_count_request(await read_json(request, ctx.connection))
    name = req.model if req.model in ctx.pool.names else ctx.pool.default
    with await ctx.pool.acquire(name) as lease:
        service = lease.model.service
        service.check_messages(len(req.messages))
        prompt = service.render_chat(req.chat_messages(), req.tool_setup())
        count = await service.count_tokens(prompt + (req.prefill or ""))
    return web.json_response({"input_tokens": count})


async def messages(request: web.Request) -> web.StreamResponse:
    ctx = context_of(request)
    body = await read_json(request, ctx.connection)
    req = anthropic.parse_request(body)
    setup = req.tool_setup()
    session = session_of(request, None)
    priority = ctx.priorities.resolve(request, req.explicit_priority)
    job = Job(
        req.model,
        session,
        prepare_local=lambda service: _start(service, req, session, setup, priority),
        relay=lambda: Relay(CHAT_PATH, messages_chat_body(req, session)),
        any_model_runs_locally=True,
    )
    answer = await ctx.dispatcher.start(job)
    with answer, answering(request, answer):
        headers = _ignored_header(req, dict(answer.headers))
        if answer.relayed or (setup is not None and setup.active):
            return await _respond_blocks(request, ctx, req, answer, tools=setup, headers=headers)
        if req.stream:
            return await _stream(request, ctx, answer, headers)
        return await _reply(answer, headers)


async def _start(
    service: GenerationService,
    req: anthropic.MessagesRequest,
    session: str | None,
    setup: ToolSetup | None,
    priority: int,
) -> Prepared:
    sampling = req.sampling(service.sampling_defaults)
    if req.output_schema is not None:
        grammar = service.json_grammar(req.output_schema, param="output_config.format")
        sampling = replace(sampling, grammar=grammar)
    return await service.prepare_chat(
        req.chat_messages(),
        max_tokens=req.max_tokens,
        sampling=sampling,
        session=session,
        tools=setup,
        prefill=req.prefill or "",
        priority=priority,
    )


def _ignored_header(req: anthropic.MessagesRequest, headers: dict[str, str]) -> dict[str, str]:
    ignored = req.ignored()
    if ignored:
        headers["X-Edge-LLM-Ignored"] = ",".join(ignored)
    return headers


async def _reply(answer: Answer, headers: dict[str, str]) -> web.Response:
    text, outcome = await answer.collect()
    body = anthropic.message(
        anthropic.message_id(answer.id),
        answer.model,
        text,
        anthropic.stop_reason(outcome.finish_reason, outcome.stop_sequence),
        _counted(answer.usage()),
    )
    return web.json_response(body, headers=headers)


async def _stream(
    request: web.Request, ctx: ServerContext, answer: Answer, headers: dict[str, str]
) -> web.StreamResponse:
    writer = SseWriter(request, ctx, answer.id, headers)
    opening = _opening(answer)
    async for event in answer.events():
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
                return await writer.fail(outcome.error, error_event)
            stop = anthropic.stop_reason(outcome.finish_reason, outcome.stop_sequence)
            await writer.send(opening + _closing(stop, _counted(answer.usage())))
    return await writer.finish()


def _opening(answer: Answer) -> bytes:
    start = anthropic.message_start(anthropic.message_id(answer.id), answer.model, answer.n_prompt)
    return b"".join(
        [
            encode_event("message_start", start),
            encode_event("content_block_start", anthropic.content_block_start()),
            _PING,
        ]
    )


def _closing(stop: tuple[str, str | None], usage: dict[str, int]) -> bytes:
    return b"".join(
        [
            encode_event("content_block_stop", anthropic.content_block_stop()),
            encode_event("message_delta", anthropic.message_delta(stop, usage)),
            encode_event("message_stop", anthropic.message_stop()),
        ]
    )


# -- answers as content blocks: tools (local) and every upstream answer -----------------


async def _respond_blocks(
    request: web.Request,
    ctx: ServerContext,
    req: anthropic.MessagesRequest,
    answer: Answer,
    *,
    tools: ToolSetup | None,
    headers: dict[str, str],
) -> web.StreamResponse:
    events = generation_events(answer, tools, anthropic.new_tool_use_id)
    if req.stream:
        return await _stream_blocks(request, ctx, answer, events, headers)
    return await _reply_blocks(answer, events, headers)


async def _reply_blocks(
    answer: Answer, events: AsyncIterator[GenerationEvent], headers: dict[str, str]
) -> web.Response:
    async for event in events:
        if isinstance(event, Failed):
            raise event.error
        if isinstance(event, Ended):
            body = anthropic.message(
                anthropic.message_id(answer.id),
                answer.model,
                event.text,
                _ended_stop(event),
                _counted(event.usage),
                calls=event.calls,
            )
            return web.json_response(body, headers=headers)
    raise RuntimeError("answer ended without Ended or Failed")  # both generators end so


async def _stream_blocks(
    request: web.Request,
    ctx: ServerContext,
    answer: Answer,
    events: AsyncIterator[GenerationEvent],
    headers: dict[str, str],
) -> web.StreamResponse:
    writer = SseWriter(request, ctx, answer.id, headers)
    blocks = anthropic.BlockStream()
    start = anthropic.message_start(anthropic.message_id(answer.id), answer.model, answer.n_prompt)
    opening = encode_event("message_start", start) + _PING
    async for event in events:
        if isinstance(event, Produced):
            block_events = [e for out in event.events for e in blocks.on(out)]
            if block_events or opening:
                await writer.send(opening + _encode(block_events))
                opening = b""
        elif isinstance(event, Heartbeat):
            await writer.send(opening or _PING)
            opening = b""
        elif isinstance(event, Failed):
            error_event = encode_event("error", anthropic.error_body(event.error))
            return await writer.fail(event.error, error_event)
        elif isinstance(event, Ended):
            delta = anthropic.message_delta(_ended_stop(event), _counted(event.usage))
            closing = [
                *blocks.close(),
                ("message_delta", delta),
                ("message_stop", anthropic.message_stop()),
            ]
            await writer.send(opening + _encode(closing))
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
