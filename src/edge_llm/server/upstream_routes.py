"""Chat and text completions served by an upstream, through the same contract.

The upstream is always asked to stream; a client that did not ask for a stream
gets the chunks assembled into one completion object. :func:`relayed` is the
relay's lifetime for every route (Responses and Messages too).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from edge_llm.errors import EdgeLLMError
from edge_llm.protocol import sse
from edge_llm.protocol.stream_events import Finished, Heartbeat
from edge_llm.server.context import ServerContext
from edge_llm.server.http import session_of
from edge_llm.server.sse_writer import SseWriter
from edge_llm.upstream.registry import Upstream
from edge_llm.upstream.stream import UpstreamChunk, UpstreamStream


async def respond(
    request: web.Request,
    ctx: ServerContext,
    body: dict[str, Any],
    candidates: list[Upstream],
    *,
    route: str,
    user: str | None,
) -> web.StreamResponse:
    """Relay ``body`` to the first usable of ``candidates``; ``route`` says why."""
    async with relayed(request, ctx, body, candidates, route=route, user=user) as stream:
        if body.get("stream"):
            return await _stream_sse(request, ctx, stream, include_usage=_include_usage(body))
        return await _whole(stream)


@asynccontextmanager
async def relayed(
    request: web.Request,
    ctx: ServerContext,
    body: dict[str, Any],
    candidates: list[Upstream],
    *,
    route: str,
    user: str | None,
    path: str | None = None,
) -> AsyncIterator[UpstreamStream]:
    """The upstream stream of ``body`` (sent to ``path``, by default the request's
    own); however the handler ends (a disconnect, a failed write), the upstream
    request is closed."""
    session = session_of(request, user)
    stream = ctx.router.open(path or request.path, body, candidates, route=route, session=session)
    try:
        yield stream
    finally:
        ctx.router.closed(stream)


async def fallback(
    request: web.Request,
    ctx: ServerContext,
    body: dict[str, Any],
    refused: EdgeLLMError,
    *,
    user: str | None,
) -> web.StreamResponse:
    """The device refused the request: an upstream with ``fallback`` takes it, or
    the client gets the refusal."""
    candidates = ctx.router.fallback_for(refused)
    if not candidates:
        raise refused
    return await respond(
        request, ctx, body, candidates, route=f"fallback_{refused.code}", user=user
    )


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


async def _stream_sse(
    request: web.Request, ctx: ServerContext, stream: UpstreamStream, *, include_usage: bool
) -> web.StreamResponse:
    writer = SseWriter(request, ctx, stream.id)
    async for event in stream.events():
        if isinstance(event, UpstreamChunk):
            if include_usage or not event.usage_only:
                await writer.send(sse.encode_data(event.data))
        elif isinstance(event, Heartbeat):
            await writer.send(sse.PING)
        elif isinstance(event, Finished):
            error = event.outcome.error
            if error is not None:
                return await writer.fail(error, sse.encode_data(error.to_dict()))
            await writer.send(sse.DONE)
    return await writer.finish()


async def _whole(stream: UpstreamStream) -> web.Response:
    merged = _Merged()
    async for event in stream.events():
        if isinstance(event, UpstreamChunk):
            merged.add(event.data)
        elif isinstance(event, Finished) and event.outcome.error is not None:
            raise event.outcome.error
    return web.json_response(
        merged.completion(stream.id, stream.client_model, stream.usage()),
        headers={"X-Request-Id": stream.id},
    )


class _Merged:
    """Chunks of a chat or text completion stream folded into the whole object."""

    def __init__(self) -> None:
        self.chat = True
        self.choices: dict[int, dict[str, Any]] = {}

    def add(self, chunk: dict[str, Any]) -> None:
        for choice in chunk.get("choices") or []:
            if isinstance(choice, dict):
                self._add_choice(choice)

    def _add_choice(self, choice: dict[str, Any]) -> None:
        index = int(choice.get("index") or 0)
        whole = self.choices.setdefault(index, {"index": index, "text": "", "tool_calls": {}})
        delta = choice.get("delta")
        if isinstance(delta, dict):
            whole["text"] += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                _merge_call(whole["tool_calls"], call)
        else:
            self.chat = False
            whole["text"] += choice.get("text") or ""
        if choice.get("finish_reason"):
            whole["finish_reason"] = choice["finish_reason"]
        if choice.get("logprobs"):
            _merge_logprobs(whole, choice["logprobs"])

    def completion(self, stream_id: str, model: str, usage: dict[str, Any]) -> dict[str, Any]:
        choices = [self._choice(c) for _, c in sorted(self.choices.items())]
        return {
            "id": stream_id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": choices,
            "usage": usage,
        }

    def _choice(self, whole: dict[str, Any]) -> dict[str, Any]:
        finish = whole.get("finish_reason") or "stop"
        logprobs = whole.get("logprobs")
        if not self.chat:
            return {"index": whole["index"], "text": whole["text"], "finish_reason": finish,
                    "logprobs": logprobs}  # fmt: skip
        message: dict[str, Any] = {"role": "assistant", "content": whole["text"] or None}
        calls = [whole["tool_calls"][i] for i in sorted(whole["tool_calls"])]
        if calls:
            message["tool_calls"] = calls
        elif message["content"] is None:
            message["content"] = ""
        return {"index": whole["index"], "message": message, "finish_reason": finish,
                "logprobs": logprobs}  # fmt: skip


def _merge_call(calls: dict[int, dict[str, Any]], delta: Any) -> None:
    if not isinstance(delta, dict):
        return
    index = int(delta.get("index") or 0)
    call = calls.setdefault(
        index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
    )
    if delta.get("id"):
        call["id"] = delta["id"]
    function = delta.get("function")
    if isinstance(function, dict):
        call["function"]["name"] += function.get("name") or ""
        call["function"]["arguments"] += function.get("arguments") or ""


def _merge_logprobs(whole: dict[str, Any], logprobs: Any) -> None:
    if not isinstance(logprobs, dict):
        return
    merged = whole.setdefault("logprobs", {})
    for key, value in logprobs.items():
        if isinstance(value, list):
            merged.setdefault(key, []).extend(value)
