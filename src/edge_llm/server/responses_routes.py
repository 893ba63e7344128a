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

``background: true`` (:mod:`edge_llm.generation.background`): the answer runs
detached, in the lowest priority class unless the request names one, waiting its
turn for its first token (``background_ttft_timeout_ms``, none by default, in place
of ``ttft_timeout_ms``), and the POST returns at once (``queued``), or streams the
run's events as a follower does
(``response.created``, ``response.queued``, ``response.in_progress`` when it
leaves the queue, ...) without a drop ending it. ``GET /v1/responses/{id}``
returns the object now; with ``stream=true`` the events after ``starting_after``
(a ``sequence_number``; all without it), then the new ones live.
``POST /v1/responses/{id}/cancel`` ends it (``cancelled``; its KV is freed at the
engine's next step) and returns the object; ``DELETE`` cancels and forgets it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from edge_llm.errors import NotFound, ResumeGap
from edge_llm.generation.background import BackgroundRun
from edge_llm.generation.events import AnswerEvent, Ended, Failed, Produced
from edge_llm.generation.job import (
    ChatPrompt,
    GenerationJob,
    JsonOutput,
    Priority,
    PrioritySource,
    relay_of,
)
from edge_llm.protocol import openai, responses, sse
from edge_llm.protocol.priority import MAX_PRIORITY
from edge_llm.protocol.sampling import SamplingDefaults, SamplingParams
from edge_llm.protocol.stream_events import Heartbeat
from edge_llm.server.context import Caller, ServerContext, answer_to, caller_of, context_of
from edge_llm.server.http import presented_key, read_json
from edge_llm.server.resumable_sse import resume_posted, send_answer
from edge_llm.server.sse_writer import EventWriter, SseWriter
from edge_llm.upstream.translate import CHAT_PATH, responses_chat_body


async def create_response(request: web.Request) -> web.StreamResponse:
    if (resumed := await resume_posted(request)) is not None:
        return resumed
    ctx = context_of(request)
    req = responses.parse(await read_json(request, ctx.connection))
    req.check_background()
    history = _conversation(ctx, req)
    setup = req.tool_setup()  # refuses a bad tool_choice before anything runs
    messages = _with_instructions(req, history)
    constrained, schema = req.format_schema()
    job = GenerationJob(
        req.model,
        *_caller(request, req),
        prompt=lambda: ChatPrompt(messages, setup),
        sampling=lambda defaults: _sampling(defaults, req),
        json_output=JsonOutput(schema, "text.format") if constrained else None,
        max_tokens=req.max_output_tokens,
        relay=relay_of(CHAT_PATH, lambda: responses_chat_body(req, messages)),
        progress=bool(req.background),  # a heartbeat when it leaves the queue
        # In the lowest class it waits its turn: not the engine's ttft_timeout_ms.
        ttft_timeout_s=ctx.background.ttft_timeout_s if req.background else None,
    )
    if req.background:
        return await _start_background(request, ctx, req, job, history)
    async with answer_to(request, job) as answer:
        builder = responses.ResponseBuilder(
            responses.response_id(answer.id), answer.model, int(time.time()), req
        )
        events = answer.events(openai.new_call_id)
        headers = _headers(req, dict(answer.headers))

        async def produce(writer: EventWriter) -> web.StreamResponse:
            response = await _stream(writer, builder, events)
            _store(ctx, req, history, builder)
            return response

        async def whole() -> web.StreamResponse:
            response = await _reply(builder, events, headers=headers)
            _store(ctx, req, history, builder)
            return response

        return await send_answer(
            request, answer, headers, stream=req.stream, resumable=req.resumable,
            produce=produce, whole=whole, opening=_encode(builder.opening()),
        )  # fmt: skip


def _caller(request: web.Request, req: responses.ResponsesRequest) -> Caller:
    """Who asks. A background response runs in the lowest class unless a class is
    named (body, header, key or route), so that any foreground request preempts it,
    and in no session: a later request of the same user does not supersede it."""
    caller = caller_of(request, req.user, req.explicit_priority)
    if not req.background:
        return caller
    priority = caller.priority
    if priority.source is PrioritySource.DEFAULT:
        priority = Priority(MAX_PRIORITY, PrioritySource.DEFAULT)
    return Caller(None, priority)


# -- background responses ---------------------------------------------------------------


async def _start_background(
    request: web.Request,
    ctx: ServerContext,
    req: responses.ResponsesRequest,
    job: GenerationJob,
    history: list[dict[str, Any]],
) -> web.StreamResponse:
    ctx.background.check_room()  # before anything is admitted
    async with answer_to(request, job) as answer:
        builder = responses.ResponseBuilder(
            responses.response_id(answer.id), answer.model, int(time.time()), req
        )
        run = ctx.background.open(builder.id, presented_key(request), answer, builder)
        run.add(_frames(builder.queued()))
        events = answer.events(openai.new_call_id)
        run.start(_run_background(run, builder, events, lambda: _store(ctx, req, history, builder)))
        headers = _headers(req, dict(answer.headers))
    if req.stream:
        return await _follow(request, ctx, run, 0, headers)
    return web.json_response(builder.snapshot(), headers=headers)


async def _run_background(
    run: BackgroundRun,
    builder: responses.ResponseBuilder,
    answer: AsyncIterator[AnswerEvent],
    store: Callable[[], None],
) -> None:
    """Read the answer to its end, logging its events; nobody waits on a reader."""
    async for event in answer:
        if run.cancelled:
            return  # the object says cancelled; no event follows
        if isinstance(event, Produced):
            run.add(_frames([e for out in event.events for e in builder.on(out)]))
        elif isinstance(event, Heartbeat):
            if event.state != "queued":
                run.add(_frames(builder.started()))
        elif isinstance(event, Failed):
            run.add(_frames(builder.failed(event.error)))
        elif isinstance(event, Ended):
            run.add(_frames(builder.finish(event.finish_reason, event.usage)))
    store()


async def _follow(
    request: web.Request,
    ctx: ServerContext,
    run: BackgroundRun,
    after: int,
    headers: dict[str, str],
) -> web.StreamResponse:
    """Stream ``run``'s events after log frame ``after``, then live, to the end. A
    drop ends this connection only; the run goes on."""
    writer = SseWriter(request, ctx, run.answer.id, headers)
    try:
        async for frames in run.follow(after, ctx.pump_settings.heartbeat_interval_s):
            await (writer.send(b"".join(frames)) if frames else writer.beat(sse.PING))
    except ResumeGap:
        if not writer.started:
            raise
        return writer.response  # a follower too slow for the log: it ends here
    except ConnectionError:
        return writer.response
    return await writer.finish()


async def retrieve_response(request: web.Request) -> web.StreamResponse:
    """``GET /v1/responses/{id}``: the object now, or with ``stream=true`` its events
    after ``starting_after`` (all without it), then live."""
    ctx = context_of(request)
    run = ctx.background.find(request.match_info["response_id"], presented_key(request))
    stream, starting_after = responses.retrieve_query(request.query)
    headers = {"X-Request-Id": run.answer.id}
    if stream:
        after = 0 if starting_after is None else starting_after + 1  # frame n: event n - 1
        return await _follow(request, ctx, run, after, headers)
    return web.json_response(run.snapshot(), headers=headers)


async def cancel_response(request: web.Request) -> web.Response:
    """``POST /v1/responses/{id}/cancel``: cancelled now (its KV freed at the engine's
    next step); one that already ended is returned as it is."""
    ctx = context_of(request)
    run = ctx.background.find(request.match_info["response_id"], presented_key(request))
    await run.cancel()
    return web.json_response(run.snapshot(), headers={"X-Request-Id": run.answer.id})


async def delete_response(request: web.Request) -> web.Response:
    """``DELETE /v1/responses/{id}``: cancelled if running, and forgotten."""
    ctx = context_of(request)
    run = ctx.background.find(request.match_info["response_id"], presented_key(request))
    await run.cancel()
    ctx.background.forget(run.id)
    body = {"id": run.id, "object": "response.deleted", "deleted": True}
    return web.json_response(body, headers={"X-Request-Id": run.answer.id})


def _frames(events: list[dict[str, Any]]) -> list[bytes]:
    return [sse.encode_event(event["type"], event) for event in events]


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
