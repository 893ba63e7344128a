"""One answer as the Responses and Messages encoders take it, from either backend.

The local engine's stream goes through the tool-call parser; an upstream's chat
stream through :class:`~edge_llm.upstream.translate.ChatChunkReader`. Both give
the parser's text and tool-call events, so a route encodes them the same way
whoever generated them; PAUSE, CANCEL, time-outs and failover stay with the
pump or the relay underneath.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from edge_llm.errors import EdgeLLMError
from edge_llm.protocol.stream_events import Delta, Finished, Heartbeat
from edge_llm.protocol.tools import OutputEvent, ToolCall, ToolOutputParser, ToolSetup
from edge_llm.server.dispatch import Answer
from edge_llm.upstream.stream import UpstreamChunk
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


async def generation_events(
    answer: Answer, tools: ToolSetup | None, new_id: Callable[[], str]
) -> AsyncIterator[GenerationEvent]:
    """The answer's text and tool-call events until (and including) Ended or Failed.

    Local text goes through the tool-call parser (``tools``); a relayed answer's
    chunks through :class:`ChatChunkReader` (the upstream parsed its calls).
    ``new_id`` names the calls that come without an id.
    """
    parser = ToolOutputParser(tools, new_id)
    reader = ChatChunkReader(new_id)
    async for event in answer.events():
        if isinstance(event, Delta):
            yield Produced(parser.feed(event.text))
        elif isinstance(event, UpstreamChunk):
            yield Produced(reader.feed(event.data))
        elif isinstance(event, Heartbeat):
            yield event
        elif isinstance(event, Finished):
            outcome = event.outcome
            if outcome.error is not None:
                yield Failed(outcome.error)
                return
            source = reader if answer.relayed else parser
            yield Produced(source.finish())
            reason = outcome.finish_reason or "stop"
            stop = outcome.stop_sequence or reader.stop_sequence
            usage = usage_counts(answer.usage())
            yield Ended(reason, stop, usage, source.text, tuple(source.calls))
