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
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from aiohttp import web

from edge_llm.engine.backend import SamplingParams
from edge_llm.engine.stream import StreamHandle
from edge_llm.errors import NotFound
from edge_llm.protocol import openai, responses, sse
from edge_llm.protocol.tools import ToolOutputParser
from edge_llm.server.context import ServerContext, context_of
from edge_llm.server.http import read_json, session_of
from edge_llm.server.pump import Delta, Finished, Heartbeat, pump
from edge_llm.server.service import response_headers
from edge_llm.server.sse_writer import SseWriter


async def create_response(request: web.Request) -> web.StreamResponse:
    ctx = context_of(request)
    req = responses.parse(await read_json(request, ctx.connection))
    ctx.router.refuse_upstream_model(req.model, "/v1/responses")
    ctx.service.check_model(req.model)
    history = _conversation(ctx, req)
    setup = req.tool_setup()
    handle = await ctx.service.start_chat(
        _with_instructions(req, history),
        max_tokens=req.max_output_tokens,
        sampling=_sampling(ctx, req),
        session=session_of(request, req.user),
        tools=setup,
    )
    builder = responses.ResponseBuilder(
        responses.response_id(handle.id), ctx.service.model_id, int(time.time()), req
    )
    parser = ToolOutputParser(setup, openai.new_call_id)
    headers = response_headers(handle)
    if req.hosted_tools():
        headers["X-Edge-LLM-Ignored"] = ",".join(f"tools.{t}" for t in req.hosted_tools())
    with ctx.guard(handle):
        if req.stream:
            response = await _stream(request, ctx, handle, builder, parser, headers=headers)
        else:
            response = await _reply(ctx, handle, builder, parser, headers=headers)
    if req.stores and builder.status in ("completed", "incomplete"):
        ctx.responses.put(builder.id, history + builder.output_messages())
    return response


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


def _sampling(ctx: ServerContext, req: responses.ResponsesRequest) -> SamplingParams:
    defaults = ctx.service.sampling_defaults
    sampling = SamplingParams(
        temperature=defaults.temperature if req.temperature is None else req.temperature,
        top_p=defaults.top_p if req.top_p is None else req.top_p,
        top_k=defaults.top_k,
        min_p=defaults.min_p,
    )
    constrained, schema = req.format_schema()
    if not constrained:
        return sampling
    return replace(sampling, grammar=ctx.service.json_grammar(schema, param="text.format"))


async def _reply(
    ctx: ServerContext,
    handle: StreamHandle,
    builder: responses.ResponseBuilder,
    parser: ToolOutputParser,
    *,
    headers: dict[str, str],
) -> web.Response:
    async for event in pump(ctx.engine, handle, ctx.pump_settings):
        if isinstance(event, Delta):
            for out in parser.feed(event.text):
                builder.on(out)
        elif isinstance(event, Finished):
            if event.outcome.error is not None:
                raise event.outcome.error
            for out in parser.finish():
                builder.on(out)
            builder.finish(event.outcome.finish_reason or "stop", handle.usage())
    return web.json_response(builder.snapshot(), headers=headers)


async def _stream(
    request: web.Request,
    ctx: ServerContext,
    handle: StreamHandle,
    builder: responses.ResponseBuilder,
    parser: ToolOutputParser,
    *,
    headers: dict[str, str],
) -> web.StreamResponse:
    writer = SseWriter(request, ctx, handle.id)
    writer.response.headers.update(headers)
    opening = _encode(builder.opening())
    async for event in pump(ctx.engine, handle, ctx.pump_settings):
        if isinstance(event, Delta):
            events = [e for out in parser.feed(event.text) for e in builder.on(out)]
            if events or opening:
                await writer.send(opening + _encode(events))
                opening = b""
        elif isinstance(event, Heartbeat):
            await writer.send(opening or sse.PING)
            opening = b""
        elif isinstance(event, Finished):
            outcome = event.outcome
            if outcome.error is not None:
                return await writer.fail(
                    outcome.error, opening + _encode(builder.failed(outcome.error))
                )
            events = [e for out in parser.finish() for e in builder.on(out)]
            events += builder.finish(outcome.finish_reason or "stop", handle.usage())
            await writer.send(opening + _encode(events))
    return await writer.finish()


def _encode(events: list[dict[str, Any]]) -> bytes:
    return b"".join(sse.encode_event(event["type"], event) for event in events)
