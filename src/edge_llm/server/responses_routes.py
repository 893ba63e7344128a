"""OpenAI Responses API, ``POST /v1/responses``: a thin adapter.

What the request may hold and the objects it gets are in
:mod:`edge_llm.protocol.responses`. The stream goes through the same pump and
``SseWriter`` as chat completions, so the backpressure contract holds unchanged:
a stalled reader pauses its own sequence, a disconnect cancels it and frees its
KV, the TTFT timeout and session supersede (``X-Session-Id`` or ``user``) apply.

Stream: ``response.created`` and ``response.in_progress`` (sent with the first
token or heartbeat, so an error before then is still a plain HTTP error), then
per output item ``response.output_item.added``, its content or arguments events
and ``response.output_item.done``, and last ``response.completed`` (or
``response.incomplete`` when ``max_output_tokens`` was reached). ``: ping``
comments while no token flows. An error after the stream started is an
``error`` event followed by ``response.failed``.

A request naming an upstream's model, or one the device refuses when an
upstream has ``fallback = true``, is relayed to the upstream as a chat
completion (:mod:`edge_llm.upstream.translate`) and its answer encoded here by
the same builder, so the client sees the same events whoever answered.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from edge_llm.errors import NotFound
from edge_llm.generation.events import AnswerEvent, Ended, Failed, Produced
from edge_llm.generation.job import ChatPrompt, GenerationJob, JsonOutput, relay_of
from edge_llm.protocol import openai, responses, sse
from edge_llm.protocol.sampling import SamplingDefaults, SamplingParams
from edge_llm.protocol.stream_events import Heartbeat
from edge_llm.server.context import ServerContext, answer_to, caller_of, context_of
from edge_llm.server.http import read_json
from edge_llm.server.resumable_sse import resume_posted, stream_resumable, wants_resumable
from edge_llm.server.sse_writer import EventWriter, SseWriter
from edge_llm.upstream.translate import CHAT_PATH, responses_chat_body


async def create_response(request: web.Request) -> web.StreamResponse:
    if (resumed := await resume_posted(request)) is not None:
        return resumed
    ctx = context_of(request)
    req = responses.parse(await read_json(request, ctx.connection))
    history = _conversation(ctx, req)
    setup = req.tool_setup()  # refuses a bad tool_choice before anything runs
    messages = _with_instructions(req, history)
    constrained, schema = req.format_schema()
    job = GenerationJob(
        req.model,
        *caller_of(request, req.user, req.explicit_priority),
        prompt=lambda: ChatPrompt(messages, setup),
        sampling=lambda defaults: _sampling(defaults, req),
        json_output=JsonOutput(schema, "text.format") if constrained else None,
        max_tokens=req.max_output_tokens,
        relay=relay_of(CHAT_PATH, lambda: responses_chat_body(req, messages)),
    )
    async with answer_to(request, job) as answer:
        builder = responses.ResponseBuilder(
            responses.response_id(answer.id), answer.model, int(time.time()), req
        )
        events = answer.events(openai.new_call_id)
        headers = _headers(req, dict(answer.headers))
        if req.stream and wants_resumable(ctx, req.resumable):

            async def produce(writer: EventWriter) -> web.StreamResponse:
                response = await _stream(writer, builder, events)
                _store(ctx, req, history, builder)
                return response

            opening = _encode(builder.opening())
            return await stream_resumable(request, answer, headers, produce, opening=opening)
        response = await _respond(request, ctx, req, builder, events, headers=headers)
    _store(ctx, req, history, builder)
    return response


async def _respond(
    request: web.Request,
    ctx: ServerContext,
    req: responses.ResponsesRequest,
    builder: responses.ResponseBuilder,
    answer: AsyncIterator[AnswerEvent],
    *,
    headers: dict[str, str],
) -> web.StreamResponse:
    if req.stream:
        opening = _encode(builder.opening())
        writer = SseWriter(request, ctx, headers["X-Request-Id"], headers, opening=opening)
        return await _stream(writer, builder, answer)
    return await _reply(builder, answer, headers=headers)


def _headers(req: responses.ResponsesRequest, headers: dict[str, str]) -> dict[str, str]:
    if req.hosted_tools():
        headers["X-Edge-LLM-Ignored"] = ",".join(f"tools.{t}" for t in req.hosted_tools())
    return headers


def _store(
    ctx: ServerContext,
    req: responses.ResponsesRequest,
    history: list[dict[str, Any]],
    builder: responses.ResponseBuilder,
) -> None:
    """Keep the conversation for ``previous_response_id`` (either backend may
    continue it: it is stored as chat messages)."""
    if req.stores and builder.status in ("completed", "incomplete"):
        ctx.responses.put(builder.id, history + builder.output_messages())


def _conversation(ctx: ServerContext, req: responses.ResponsesRequest) -> list[dict[str, Any]]:
    """The stored conversation ``previous_response_id`` names, plus this input."""
    previous: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        stored = ctx.responses.get(req.previous_response_id)
        if stored is None:
            raise NotFound(
                f"response {req.previous_response_id!r} not found (never stored, stored "
                f"with store: false, or dropped: the store keeps the last "
                f"{ctx.responses.max_responses})",
                param="previous_response_id",
            )
        previous = stored
    return previous + req.input_messages()


def _with_instructions(
    req: responses.ResponsesRequest, history: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``instructions`` apply to this response only (they are not stored)."""
    if not req.instructions:
        return history
    return [{"role": "system", "content": req.instructions}, *history]


def _sampling(defaults: SamplingDefaults, req: responses.ResponsesRequest) -> SamplingParams:
    return SamplingParams(
        temperature=defaults.temperature if req.temperature is None else req.temperature,
        top_p=defaults.top_p if req.top_p is None else req.top_p,
        top_k=defaults.top_k,
        min_p=defaults.min_p,
    )


async def _reply(
    builder: responses.ResponseBuilder,
    answer: AsyncIterator[AnswerEvent],
    *,
    headers: dict[str, str],
) -> web.Response:
    async for event in answer:
        if isinstance(event, Produced):
            for out in event.events:
                builder.on(out)
        elif isinstance(event, Failed):
            raise event.error
        elif isinstance(event, Ended):
            builder.finish(event.finish_reason, event.usage)
    return web.json_response(builder.snapshot(), headers=headers)


async def _stream(
    writer: EventWriter,
    builder: responses.ResponseBuilder,
    answer: AsyncIterator[AnswerEvent],
) -> web.StreamResponse:
    async for event in answer:
        if isinstance(event, Produced):
            await writer.send(_encode([e for out in event.events for e in builder.on(out)]))
        elif isinstance(event, Heartbeat):
            await writer.beat(sse.PING)
        elif isinstance(event, Failed):
            return await writer.fail(event.error, _encode(builder.failed(event.error)))
        elif isinstance(event, Ended):
            await writer.send(_encode(builder.finish(event.finish_reason, event.usage)))
    return await writer.finish()


def _encode(events: list[dict[str, Any]]) -> bytes:
    return b"".join(sse.encode_event(event["type"], event) for event in events)
