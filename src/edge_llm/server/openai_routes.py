"""OpenAI-compatible routes: chat completions, completions, models."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from aiohttp import web

from edge_llm.errors import InvalidRequest
from edge_llm.protocol import openai, sse
from edge_llm.protocol.sampling import SamplingParams, TokenLogprob
from edge_llm.protocol.stream_events import Delta, Finished, Heartbeat
from edge_llm.protocol.tools import OutputEvent, TextOut, ToolOutputParser, ToolSetup
from edge_llm.server import upstream_routes
from edge_llm.server.access_log import answering
from edge_llm.server.context import ServerContext, context_of
from edge_llm.server.dispatch import Answer, Job, Relay
from edge_llm.server.http import read_json, session_of
from edge_llm.server.service import GenerationService, Prepared
from edge_llm.server.sse_writer import SseWriter


@dataclass
class _Shape:
    """How one endpoint's objects look (chat or text completion)."""

    chat: bool
    token_bytes: openai.TokenBytes | None = None  # set: the request asked for logprobs
    _text_offset: int = field(default=0, init=False)

    def chunk(
        self, ids: _Ids, text: str, finish_reason: str | None, records: Sequence[TokenLogprob] = ()
    ) -> dict[str, Any]:
        logprobs = self.logprobs(records) if records else None
        if self.chat:
            return openai.chat_chunk(
                *ids, content=text, finish_reason=finish_reason, logprobs=logprobs
            )
        return openai.completion_chunk(
            *ids, text=text, finish_reason=finish_reason, logprobs=logprobs
        )

    def logprobs(self, records: Sequence[TokenLogprob]) -> dict[str, Any] | None:
        """The endpoint's logprobs object for these tokens (the next ones of the
        completion), or None if the request did not ask for logprobs."""
        if self.token_bytes is None:
            return None
        if self.chat:
            return openai.chat_logprobs(records, self.token_bytes)
        result = openai.completion_logprobs(records, self.token_bytes, self._text_offset)
        self._text_offset += sum(len(token) for token in result["tokens"])
        return result

    def first(self, ids: _Ids) -> dict[str, Any] | None:
        """The role-only chunk chat streams start with."""
        return openai.chat_chunk(*ids, role="assistant", content="") if self.chat else None

    def whole(
        self,
        ids: _Ids,
        text: str,
        finish_reason: str,
        usage: dict[str, Any],
        records: Sequence[TokenLogprob],
    ) -> dict[str, Any]:
        build = openai.chat_completion if self.chat else openai.text_completion
        logprobs = self.logprobs(records)
        return build(*ids, text=text, finish_reason=finish_reason, usage=usage, logprobs=logprobs)


_Ids = tuple[str, str, int]  # request id, model, created


async def chat_completions(request: web.Request) -> web.StreamResponse:
    ctx = context_of(request)
    body = await read_json(request, ctx.connection)
    req = openai.parse_request(openai.ChatCompletionRequest, body)
    session = session_of(request, req.user)
    priority = ctx.priorities.resolve(request, req.explicit_priority)
    job = Job(
        req.model,
        session,
        prepare_local=lambda service: _start_chat(service, req, session, priority),
        relay=lambda: Relay(request.path, body),
        progress=req.stream and req.include_progress,
    )
    answer = await ctx.dispatcher.start(job)
    with answer, answering(request, answer):
        if answer.relayed:
            return await upstream_routes.respond(request, ctx, answer, body)
        setup = req.tool_setup()
        if setup is not None and setup.active:
            return await _respond_with_tools(request, ctx, answer, req, setup)
        return await _respond(request, ctx, answer, req, _shape(answer, req, chat=True))


async def completions(request: web.Request) -> web.StreamResponse:
    ctx = context_of(request)
    body = await read_json(request, ctx.connection)
    req = openai.parse_request(openai.CompletionRequest, body)
    session = session_of(request, req.user)
    priority = ctx.priorities.resolve(request, req.explicit_priority)
    job = Job(
        req.model,
        session,
        prepare_local=lambda service: service.prepare_text(
            req.prompt_text(),
            max_tokens=req.requested_max_tokens,
            sampling=request_sampling(service, req),
            session=session,
            priority=priority,
        ),
        relay=lambda: Relay(request.path, body),
        progress=req.stream and req.include_progress,
    )
    answer = await ctx.dispatcher.start(job)
    with answer, answering(request, answer):
        if answer.relayed:
            return await upstream_routes.respond(request, ctx, answer, body)
        return await _respond(request, ctx, answer, req, _shape(answer, req, chat=False))


async def _start_chat(
    service: GenerationService,
    req: openai.ChatCompletionRequest,
    session: str | None,
    priority: int,
) -> Prepared:
    setup = req.tool_setup()
    if setup is not None and setup.active and req.n_logprobs is not None:
        raise InvalidRequest("logprobs cannot be combined with tools", param="logprobs")
    return await service.prepare_chat(
        req.chat_messages(),
        max_tokens=req.requested_max_tokens,
        sampling=request_sampling(service, req),
        session=session,
        tools=setup,
        prefill=req.prefill,
        priority=priority,
    )


def request_sampling(
    service: GenerationService, req: openai.ChatCompletionRequest | openai.CompletionRequest
) -> SamplingParams:
    """The request's sampling, with a grammar when ``response_format`` asks for JSON
    (a schema that cannot be enforced is refused here, before admission)."""
    sampling = req.sampling(service.sampling_defaults)
    if req.wants_json:
        grammar = service.json_grammar(req.output_schema, param="response_format")
        sampling = replace(sampling, grammar=grammar)
    return sampling


def _shape(
    answer: Answer, req: openai.ChatCompletionRequest | openai.CompletionRequest, *, chat: bool
) -> _Shape:
    return _Shape(chat, answer.token_bytes if req.n_logprobs is not None else None)


async def _respond(
    request: web.Request,
    ctx: ServerContext,
    answer: Answer,
    req: openai.ChatCompletionRequest | openai.CompletionRequest,
    shape: _Shape,
) -> web.StreamResponse:
    ids: _Ids = (answer.id, answer.model, int(time.time()))
    if req.stream:
        return await _stream_sse(request, ctx, answer, ids, shape, req=req)
    records: list[TokenLogprob] = []
    text, outcome = await answer.collect(records)
    whole = shape.whole(ids, text, outcome.finish_reason or "stop", answer.usage(), records)
    return web.json_response(whole, headers=answer.headers)


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
    relayed = [
        openai.model_object(model, ctx.started_at, owned_by=backend)
        for model, backend in ctx.router.model_entries()
        if model not in pool.names
    ]
    return web.json_response({"object": "list", "data": local + relayed})


async def _stream_sse(
    request: web.Request,
    ctx: ServerContext,
    answer: Answer,
    ids: _Ids,
    shape: _Shape,
    *,
    req: openai.ChatCompletionRequest | openai.CompletionRequest,
) -> web.StreamResponse:
    writer = SseWriter(request, ctx, answer.id, answer.headers)
    first = shape.first(ids)
    usage = _usage_so_far(answer, req)
    async for event in answer.events():
        if isinstance(event, Delta):
            prefix = b""
            if first is not None:
                prefix, first = sse.encode_data(usage(first)), None
            chunk = usage(shape.chunk(ids, event.text, None, event.logprobs))
            await writer.send(prefix + sse.encode_data(chunk))
        elif isinstance(event, Heartbeat):
            await writer.send(_beat(ids, event, req, chat=shape.chat))
        elif isinstance(event, Finished):
            outcome = event.outcome
            if outcome.error is not None:
                return await writer.fail(outcome.error, sse.encode_data(outcome.error.to_dict()))
            tail = [usage(shape.chunk(ids, "", outcome.finish_reason or "stop"))]
            if req.include_usage:
                tail.append(openai.usage_chunk(*ids, answer.usage(), chat=shape.chat))
            await writer.send(b"".join(sse.encode_data(c) for c in tail) + sse.DONE)
    return await writer.finish()


def _usage_so_far(
    answer: Answer, req: openai.ChatCompletionRequest | openai.CompletionRequest
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Adds the usage so far to a chunk when the request asked for it on every chunk
    (``stream_options.continuous_usage_stats``, as vLLM; guidellm reads it)."""
    if not req.continuous_usage:
        return lambda chunk: chunk
    return lambda chunk: chunk | {"usage": answer.usage()}


def _beat(
    ids: _Ids,
    heartbeat: Heartbeat,
    req: openai.ChatCompletionRequest | openai.CompletionRequest,
    *,
    chat: bool,
) -> bytes:
    """A ``: ping`` comment, or a progress chunk for a request that asked for them."""
    if not req.include_progress:
        return sse.PING
    return sse.encode_data(openai.progress_chunk(*ids, heartbeat.progress(), chat=chat))


# -- chat with tools: the answer goes through the tool-call parser ----------------------


async def _respond_with_tools(
    request: web.Request,
    ctx: ServerContext,
    answer: Answer,
    req: openai.ChatCompletionRequest,
    setup: ToolSetup,
) -> web.StreamResponse:
    ids: _Ids = (answer.id, answer.model, int(time.time()))
    parser = ToolOutputParser(setup, openai.new_call_id)
    if req.stream:
        return await _stream_tools(request, ctx, answer, ids, parser, req=req)
    reason = "stop"
    async for event in answer.events():
        if isinstance(event, Delta):
            parser.feed(event.text)
        elif isinstance(event, Finished):
            if event.outcome.error is not None:
                raise event.outcome.error
            parser.finish()
            reason = _finish_reason(parser, event.outcome.finish_reason)
    body = openai.chat_completion(
        *ids, text=parser.text, finish_reason=reason, usage=answer.usage(), tool_calls=parser.calls
    )
    return web.json_response(body, headers=answer.headers)


async def _stream_tools(
    request: web.Request,
    ctx: ServerContext,
    answer: Answer,
    ids: _Ids,
    parser: ToolOutputParser,
    *,
    req: openai.ChatCompletionRequest,
) -> web.StreamResponse:
    writer = SseWriter(request, ctx, answer.id, answer.headers)
    usage = _usage_so_far(answer, req)
    first = sse.encode_data(usage(openai.chat_chunk(*ids, role="assistant", content="")))
    async for event in answer.events():
        if isinstance(event, Delta):
            chunks = _tool_chunks(ids, parser.feed(event.text), usage)
            if chunks or first:
                await writer.send(first + chunks)
                first = b""
        elif isinstance(event, Heartbeat):
            beat = _beat(ids, event, req, chat=True)
            await writer.send(first + beat if req.include_progress else first or beat)
            first = b""
        elif isinstance(event, Finished):
            outcome = event.outcome
            if outcome.error is not None:
                return await writer.fail(outcome.error, sse.encode_data(outcome.error.to_dict()))
            tail = _tool_chunks(ids, parser.finish(), usage)
            reason = _finish_reason(parser, outcome.finish_reason)
            tail += sse.encode_data(usage(openai.chat_chunk(*ids, finish_reason=reason)))
            if req.include_usage:
                tail += sse.encode_data(openai.usage_chunk(*ids, answer.usage(), chat=True))
            await writer.send(first + tail + sse.DONE)
    return await writer.finish()


def _tool_chunks(
    ids: _Ids, events: list[OutputEvent], usage: Callable[[dict[str, Any]], dict[str, Any]]
) -> bytes:
    chunks = []
    for event in events:
        if isinstance(event, TextOut):
            chunk = openai.chat_chunk(*ids, content=event.text)
        else:
            chunk = openai.chat_chunk(*ids, tool_calls=openai.tool_call_delta(event))
        chunks.append(sse.encode_data(usage(chunk)))
    return b"".join(chunks)


def _finish_reason(parser: ToolOutputParser, finish_reason: str | None) -> str:
    if parser.calls and finish_reason != "length":
        return "tool_calls"
    return finish_reason or "stop"
