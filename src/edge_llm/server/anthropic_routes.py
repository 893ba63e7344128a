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
:mod:`edge_llm.generation.dispatch`), is relayed to the upstream as a chat
completion (:mod:`edge_llm.upstream.translate`); its answer
is encoded as content blocks by the same code as a local answer with tools.
``message_start`` then reports 0 input tokens (the upstream counts them at the
end), and ``message_delta`` the upstream's counts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from edge_llm.generation.dispatch import Answer
from edge_llm.generation.events import AnswerEvent, Ended, Failed, Produced
from edge_llm.generation.job import ChatPrompt, GenerationJob, JsonOutput, relay_of
from edge_llm.protocol import anthropic
from edge_llm.protocol.sse import encode_event
from edge_llm.protocol.stream_events import Heartbeat
from edge_llm.server.context import answer_to, caller_of, context_of
from edge_llm.server.http import read_json
from edge_llm.server.resumable_sse import resume_posted, send_answer
from edge_llm.server.sse_writer import EventWriter
from edge_llm.upstream.translate import CHAT_PATH, messages_chat_body

_PING = encode_event("ping", anthropic.ping())
_FORMAT_PARAM = "output_config.format"


async def count_tokens(request: web.Request) -> web.Response:
    """``POST /v1/messages/count_tokens``: the prompt's tokens as the model would
    see them (chat template, tools, prefill); counted even over the prompt limit."""
    ctx = context_of(request)
    req = anthropic.parse_count_request(await read_json(request, ctx.connection))
    name = ctx.pool.served_name(req.model) or ctx.pool.default
    with await ctx.pool.acquire(name) as lease:
        service = lease.model.service
        service.check_messages(len(req.messages))
        prompt = service.render_chat(req.chat_messages(), req.tool_setup())
        count = await service.count_tokens(prompt + (req.prefill or ""))
    return web.json_response({"input_tokens": count})


async def messages(request: web.Request) -> web.StreamResponse:
    if (resumed := await resume_posted(request)) is not None:
        return resumed
    ctx = context_of(request)
    body = await read_json(request, ctx.connection)
    req = anthropic.parse_request(body)
    setup = req.tool_setup()
    session, priority = caller_of(request, None, req.explicit_priority)
    wants = None if req.output_schema is None else JsonOutput(req.output_schema, _FORMAT_PARAM)
    job = GenerationJob(
        req.model,
        session,
        priority,
        prompt=lambda: ChatPrompt(req.chat_messages(), setup, req.prefill or ""),
        sampling=req.sampling,
        json_output=wants,
        max_tokens=req.max_tokens,
        relay=relay_of(CHAT_PATH, lambda: messages_chat_body(req, session)),
        any_model_runs_locally=True,
    )
    async with answer_to(request, job) as answer:
        headers = _ignored_header(req, dict(answer.headers))
        events = answer.events(anthropic.new_tool_use_id)
        blocks, opening = _opening(answer)

        async def produce(writer: EventWriter) -> web.StreamResponse:
            return await _stream(writer, blocks, events)

        async def whole() -> web.StreamResponse:
            return await _reply(answer, events, headers)

        return await send_answer(
            request, answer, headers, stream=req.stream, resumable=req.resumable,
            produce=produce, whole=whole, opening=opening,
        )  # fmt: skip


def _ignored_header(req: anthropic.MessagesRequest, headers: dict[str, str]) -> dict[str, str]:
    ignored = req.ignored()
    if ignored:
        headers["X-Edge-LLM-Ignored"] = ",".join(ignored)
    return headers


async def _reply(
    answer: Answer, events: AsyncIterator[AnswerEvent], headers: dict[str, str]
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


async def _stream(
    writer: EventWriter, blocks: anthropic.BlockStream, events: AsyncIterator[AnswerEvent]
) -> web.StreamResponse:
    async for event in events:
        if isinstance(event, Produced):
            await writer.send(_encode([e for out in event.events for e in blocks.on(out)]))
        elif isinstance(event, Heartbeat):
            await writer.beat(_PING)
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
            await writer.send(_encode(closing))
    return await writer.finish()


def _opening(answer: Answer) -> tuple[anthropic.BlockStream, bytes]:
    """The content blocks to come and what the stream starts with: a text-only
    answer's one text block opens at once, before the ping (clients that read text
    alone expect it first); else each block opens with its first event."""
    blocks = anthropic.BlockStream()
    start = anthropic.message_start(anthropic.message_id(answer.id), answer.model, answer.n_prompt)
    opening = [("message_start", start)]
    if answer.text_only:
        opening += blocks.open_text()
    return blocks, _encode(opening) + _PING


def _ended_stop(ended: Ended) -> tuple[str, str | None]:
    return anthropic.stop_reason(
        ended.finish_reason, ended.stop_sequence, tool_use=bool(ended.calls)
    )


def _counted(counts: dict[str, Any]) -> dict[str, int]:
    cached = counts["prompt_tokens_details"]["cached_tokens"]
    return anthropic.usage(counts["prompt_tokens"], counts["completion_tokens"], cached)


def _encode(events: list[tuple[str, dict[str, Any]]]) -> bytes:
    return b"".join(encode_event(name, payload) for name, payload in events)
