"""An answer as OpenAI's chat or text completion objects: SSE chunks or one object.

One encoder reads the answer-event stream (:mod:`edge_llm.generation.events`)
whoever generated it. The chunks it builds: text (with logprobs when asked) in
a text-only answer; text and ``tool_calls`` deltas in an answer that may call
tools; the role chunk before the first chunk it builds; the finish chunk, the
usage chunk when ``include_usage`` asked, ``[DONE]``. An upstream's events come
with its own chunk (already OpenAI's, ``id`` and ``model`` ours): that is passed
on untouched (its extra fields, choices and logprobs with it; its usage chunk only
when asked), its finish and usage came as chunks too, and a reply that is not
streamed folds them into one object (:class:`_Merged`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from edge_llm.generation.dispatch import Answer
from edge_llm.generation.events import AnswerEvent, Ended, Failed, Produced
from edge_llm.protocol import openai, sse
from edge_llm.protocol.sampling import TokenLogprob
from edge_llm.protocol.stream_events import Heartbeat
from edge_llm.protocol.tools import OutputEvent, TextOut
from edge_llm.server.context import ServerContext
from edge_llm.server.resumable_sse import send_answer
from edge_llm.server.sse_writer import EventWriter

_Ids = tuple[str, str, int]  # request id, model, created
_Request = openai.ChatCompletionRequest | openai.CompletionRequest


async def respond(
    request: web.Request, ctx: ServerContext, answer: Answer, req: _Request
) -> web.StreamResponse:
    """Send ``answer`` to ``req`` (a chat completion request or a text one)."""
    chat = isinstance(req, openai.ChatCompletionRequest)
    token_bytes = answer.token_bytes if req.n_logprobs is not None else None
    encoder = _Encoder(
        (answer.id, answer.model, int(time.time())), _Shape(chat, token_bytes), answer, req
    )
    events = answer.events(openai.new_call_id)

    async def produce(writer: EventWriter) -> web.StreamResponse:
        return await _stream(writer, encoder, events)

    async def whole() -> web.StreamResponse:
        return web.json_response(await encoder.whole(events), headers=answer.headers)

    return await send_answer(
        request, answer, answer.headers,
        stream=req.stream, resumable=req.resumable, produce=produce, whole=whole,
    )  # fmt: skip


async def _stream(
    writer: EventWriter, encoder: _Encoder, events: AsyncIterator[AnswerEvent]
) -> web.StreamResponse:
    async for event in events:
        if isinstance(event, Failed):
            return await writer.fail(event.error, sse.encode_data(event.error.to_dict()))
        data = encoder.encode(event)
        if data:
            await writer.send(data)
    return await writer.finish()


@dataclass
class _Encoder:
    ids: _Ids
    shape: _Shape
    answer: Answer
    req: _Request
    role_sent: bool = False
    verbatim: bool = False  # the backend sent OpenAI chunks of its own

    def encode(self, event: AnswerEvent) -> bytes:
        """The bytes to send for one event of the stream (Failed aside)."""
        if isinstance(event, Produced):
            return self._produced(event)
        if isinstance(event, Heartbeat):
            return self._beat(event)
        if isinstance(event, Ended):
            return self._ended(event)
        return b""  # a pause change: the stream goes quiet, heartbeats tell

    def _produced(self, produced: Produced) -> bytes:
        if produced.chunk is not None:
            self.verbatim = True
            if produced.usage_only and not self.req.include_usage:
                return b""
            return sse.encode_data(produced.chunk)
        return self._built(self.shape.chunks(self.ids, produced, self.answer.text_only))

    def _built(self, chunks: list[dict[str, Any]]) -> bytes:
        """Chunks this server made, after the role chunk chat streams start with, each
        with the usage so far when the request asked for it on every chunk
        (``stream_options.continuous_usage_stats``, as vLLM; guidellm reads it)."""
        if chunks and not self.role_sent:
            self.role_sent = True
            first = self.shape.first(self.ids)
            chunks = [first, *chunks] if first is not None else chunks
        if self.req.continuous_usage:
            chunks = [chunk | {"usage": self.answer.usage()} for chunk in chunks]
        return b"".join(sse.encode_data(chunk) for chunk in chunks)

    def _beat(self, heartbeat: Heartbeat) -> bytes:
        """A ``: ping`` comment, or a progress chunk for a request that asked for them."""
        if not self.req.include_progress:
            return sse.PING
        chat = self.shape.chat
        return sse.encode_data(openai.progress_chunk(*self.ids, heartbeat.progress(), chat=chat))

    def _ended(self, ended: Ended) -> bytes:
        if self.verbatim:  # the upstream's finish and usage chunks went by already
            return sse.DONE
        reason = _finish_reason(ended)
        tail = self._built([self.shape.finish_chunk(self.ids, reason, self.answer.text_only)])
        if self.req.include_usage:
            usage = openai.usage_chunk(*self.ids, self.answer.usage(), chat=self.shape.chat)
            tail += sse.encode_data(usage)
        return tail + sse.DONE

    async def whole(self, events: AsyncIterator[AnswerEvent]) -> dict[str, Any]:
        """The answer as one completion object; raises the error that ended it."""
        merged = _Merged()
        records: list[TokenLogprob] = []
        async for event in events:
            if isinstance(event, Produced):
                if event.chunk is not None:
                    self.verbatim = True
                    merged.add(event.chunk)
                records.extend(event.logprobs)
            elif isinstance(event, Failed):
                raise event.error
            elif isinstance(event, Ended):
                usage = self.answer.usage()
                if self.verbatim:
                    return merged.completion(self.ids[0], self.ids[1], usage)
                return self.shape.whole(self.ids, ended=event, usage=usage, records=records)
        raise RuntimeError("answer ended without Ended or Failed")  # answer_events ends so


def _finish_reason(ended: Ended) -> str:
    if ended.calls and ended.finish_reason != "length":
        return "tool_calls"
    return ended.finish_reason


@dataclass
class _Shape:
    """How one endpoint's objects look (chat or text completion)."""

    chat: bool
    token_bytes: openai.TokenBytes | None = None  # set: the request asked for logprobs
    _text_offset: int = field(default=0, init=False)

    def chunks(self, ids: _Ids, produced: Produced, text_only: bool) -> list[dict[str, Any]]:
        """A text-only answer's delta as one chunk (with its logprobs); else its text
        and tool-call events, a chunk each."""
        if text_only:
            if not (produced.text or produced.logprobs):
                return []  # the parser's end: nothing held back without tools
            return [self.chunk(ids, produced.text, None, produced.logprobs)]
        return [_event_chunk(ids, event) for event in produced.events]

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

    def finish_chunk(self, ids: _Ids, reason: str, text_only: bool) -> dict[str, Any]:
        if text_only:
            return self.chunk(ids, "", reason)
        return openai.chat_chunk(*ids, finish_reason=reason)

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
        *,
        ended: Ended,
        usage: dict[str, Any],
        records: Sequence[TokenLogprob],
    ) -> dict[str, Any]:
        reason = _finish_reason(ended)
        logprobs = self.logprobs(records)
        if not self.chat:
            return openai.text_completion(
                *ids, text=ended.text, finish_reason=reason, usage=usage, logprobs=logprobs
            )
        return openai.chat_completion(
            *ids, text=ended.text, finish_reason=reason, usage=usage,
            tool_calls=list(ended.calls), logprobs=logprobs,
        )  # fmt: skip


def _event_chunk(ids: _Ids, event: OutputEvent) -> dict[str, Any]:
    if isinstance(event, TextOut):
        return openai.chat_chunk(*ids, content=event.text)
    return openai.chat_chunk(*ids, tool_calls=openai.tool_call_delta(event))


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
