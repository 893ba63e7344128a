"""Chat and text completions relayed from an upstream, as the OpenAI routes send them.

The upstream was asked to stream (see :func:`~edge_llm.upstream.router.upstream_body`);
its chunks are passed on untouched but for ``id`` and ``model``, or, for a client
that did not ask for a stream, folded into one completion object (:class:`_Merged`).
Which upstream answers, and the relay's lifetime, are the dispatcher's
(:mod:`edge_llm.server.dispatch`).
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from edge_llm.protocol import sse
from edge_llm.protocol.stream_events import Finished, Heartbeat
from edge_llm.server.context import ServerContext
from edge_llm.server.dispatch import Answer
from edge_llm.server.sse_writer import SseWriter
from edge_llm.upstream.stream import UpstreamChunk


async def respond(
    request: web.Request, ctx: ServerContext, answer: Answer, body: dict[str, Any]
) -> web.StreamResponse:
    """Send the relayed ``answer`` to the client's request ``body``."""
    if body.get("stream"):
        return await _stream_sse(request, ctx, answer, include_usage=_include_usage(body))
    return await _whole(answer)


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


async def _stream_sse(
    request: web.Request, ctx: ServerContext, answer: Answer, *, include_usage: bool
) -> web.StreamResponse:
    writer = SseWriter(request, ctx, answer.id, answer.headers)
    async for event in answer.events():
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


async def _whole(answer: Answer) -> web.Response:
    merged = _Merged()
    async for event in answer.events():
        if isinstance(event, UpstreamChunk):
            merged.add(event.data)
        elif isinstance(event, Finished) and event.outcome.error is not None:
            raise event.outcome.error
    return web.json_response(
        merged.completion(answer.id, answer.model, answer.usage()), headers=answer.headers
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
