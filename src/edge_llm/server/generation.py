"""One answer as the Responses and Messages encoders take it, from either backend.

The local engine's stream goes through the tool-call parser; an upstream's chat
stream through :class:`~edge_llm.upstream.translate.ChatChunkReader`. Both give
the parser's text and tool-call events, so a route encodes them the same way
whoever generated them; PAUSE, CANCEL, time-outs and failover stay with the
pump or the relay underneath.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from edge_llm.engine.stream import StreamHandle
from edge_llm.errors import EdgeLLMError
from edge_llm.protocol.stream_events import Delta, Finished, Heartbeat
from edge_llm.protocol.tools import OutputEvent, ToolCall, ToolOutputParser
from edge_llm.server.context import ServerContext
from edge_llm.server.pump import pump
from edge_llm.upstream.stream import UpstreamChunk, UpstreamStream
from edge_llm.upstream.translate import ChatChunkReader, usage_counts


@dataclass(frozen=True)
class Produced:
    """Text and tool-call events generated since the last ones (may be empty)."""

    events: list[OutputEvent]


@dataclass(frozen=True)
class Ended:
    finish_reason: str
    stop_sequence: str | None
    usage: dict[str, Any]  # the local engine's counts (OpenAI's names)
    text: str  # the whole answer outside tool calls
    calls: tuple[ToolCall, ...]


@dataclass(frozen=True)
class Failed:
    error: EdgeLLMError


GenerationEvent = Produced | Heartbeat | Ended | Failed


async def local_answer(
    ctx: ServerContext, handle: StreamHandle, parser: ToolOutputParser
) -> AsyncIterator[GenerationEvent]:
    """The local stream's events until (and including) Ended or Failed."""
    async for event in pump(ctx.engine, handle, ctx.pump_settings):
        if isinstance(event, Delta):
            yield Produced(parser.feed(event.text))
        elif isinstance(event, Heartbeat):
            yield event
        elif isinstance(event, Finished):
            outcome = event.outcome
            if outcome.error is not None:
                yield Failed(outcome.error)
                return
            yield Produced(parser.finish())
            reason = outcome.finish_reason or "stop"
            calls = tuple(parser.calls)
            yield Ended(reason, outcome.stop_sequence, handle.usage(), parser.text, calls)


async def upstream_answer(
    stream: UpstreamStream, reader: ChatChunkReader
) -> AsyncIterator[GenerationEvent]:
    """The relayed chat stream's events until (and including) Ended or Failed."""
    async for event in stream.events():
        if isinstance(event, UpstreamChunk):
            yield Produced(reader.feed(event.data))
        elif isinstance(event, Heartbeat):
            yield event
        elif isinstance(event, Finished):
            outcome = event.outcome
            if outcome.error is not None:
                yield Failed(outcome.error)
                return
            reason = outcome.finish_reason or "stop"
            usage = usage_counts(stream.usage())
            calls = tuple(reader.calls)
            yield Ended(reason, reader.stop_sequence, usage, reader.text, calls)
