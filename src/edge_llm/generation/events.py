"""One answer-event stream, for a local answer and a relayed one alike.

Every route reads an answer as these events (:meth:`Answer.events
<edge_llm.generation.dispatch.Answer.events>`): :class:`Produced` (text and
tool-call events), ``Heartbeat`` and ``PauseChanged`` while no token flows, then
:class:`Ended` or :class:`Failed`. The tool-call parse happens here, once: the
local engine's text goes through :class:`~edge_llm.protocol.tools.ToolOutputParser`
(with the tools the request was generated with), an upstream's chat chunks through
:class:`~edge_llm.upstream.translate.ChatChunkReader` (the upstream parsed its
calls). PAUSE, CANCEL, time-outs and failover stay with the pump or the relay
underneath.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from edge_llm.errors import EdgeLLMError
from edge_llm.protocol.sampling import TokenLogprob
from edge_llm.protocol.stream_events import Delta, Finished, Heartbeat, PauseChanged
from edge_llm.protocol.tools import OutputEvent, ToolCall, ToolOutputParser, ToolSetup
from edge_llm.upstream.stream import UpstreamChunk
from edge_llm.upstream.translate import ChatChunkReader, usage_counts


@dataclass(frozen=True)
class Produced:
    """Text and tool-call events generated since the last ones (may be empty)."""

    events: list[OutputEvent]
    text: str  # the text they were read from (a call's markup included)
    n_tokens: int
    seq: int  # this one's place among those with text
    logprobs: tuple[TokenLogprob, ...] = ()  # of these tokens, when the request asked
    # An upstream's chat or text completion chunk they were read from, as it sent it
    # (``id`` and ``model`` ours): already an OpenAI chunk, which an OpenAI route
    # passes on untouched (its extra fields, choices and logprobs with it).
    chunk: dict[str, Any] | None = None
    usage_only: bool = False  # the chunk carries usage alone (no choice)


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


AnswerEvent = Produced | Heartbeat | PauseChanged | Ended | Failed
Piece = TypeVar("Piece", Delta, UpstreamChunk)
_Piece_contra = TypeVar("_Piece_contra", Delta, UpstreamChunk, contravariant=True)


class Reader(Protocol[_Piece_contra]):
    """Reads one backend's output pieces as :class:`Produced` events."""

    @property
    def text(self) -> str: ...

    @property
    def calls(self) -> list[ToolCall]: ...

    @property
    def stop_sequence(self) -> str | None: ...

    def read(self, piece: _Piece_contra) -> Produced: ...

    def finish(self) -> list[OutputEvent]: ...


@dataclass
class EngineReader:
    """The local engine's deltas through the tool-call parser."""

    parser: ToolOutputParser
    stop_sequence: str | None = None

    @classmethod
    def of(cls, tools: ToolSetup | None, new_id: Callable[[], str]) -> EngineReader:
        return cls(ToolOutputParser(tools, new_id))

    @property
    def text(self) -> str:
        return self.parser.text

    @property
    def calls(self) -> list[ToolCall]:
        return self.parser.calls

    def read(self, piece: Delta) -> Produced:
        events = self.parser.feed(piece.text)
        return Produced(events, piece.text, piece.n_tokens, piece.seq, piece.logprobs)

    def finish(self) -> list[OutputEvent]:
        return self.parser.finish()


@dataclass
class ChunkReader:
    """An upstream's chat chunks (tool calls parsed by the upstream)."""

    reader: ChatChunkReader
    n_with_text: int = field(default=0)

    @classmethod
    def of(cls, new_id: Callable[[], str]) -> ChunkReader:
        return cls(ChatChunkReader(new_id))

    @property
    def text(self) -> str:
        return self.reader.text

    @property
    def calls(self) -> list[ToolCall]:
        return self.reader.calls

    @property
    def stop_sequence(self) -> str | None:
        return self.reader.stop_sequence

    def read(self, piece: UpstreamChunk) -> Produced:
        seq = self.n_with_text
        self.n_with_text += 1 if piece.text else 0
        events = self.reader.feed(piece.data)
        return Produced(events, piece.text, 1, seq, chunk=piece.data, usage_only=piece.usage_only)

    def finish(self) -> list[OutputEvent]:
        return self.reader.finish()


async def answer_events(
    source: AsyncIterator[Piece | Heartbeat | PauseChanged | Finished],
    reader: Reader[Piece],
    usage: Callable[[], dict[str, Any]],
) -> AsyncIterator[AnswerEvent]:
    """The answer's events until (and including) Ended or Failed: ``source``'s
    pieces read by ``reader``; ``usage`` is the backend's usage object at the end."""
    async for event in source:
        if isinstance(event, Heartbeat | PauseChanged):
            yield event
        elif isinstance(event, Finished):
            outcome = event.outcome
            if outcome.error is not None:
                yield Failed(outcome.error)
                return
            if held := reader.finish():  # what the parser held back (a call's block)
                yield Produced(held, "", 0, 0)
            reason = outcome.finish_reason or "stop"
            stop = outcome.stop_sequence or reader.stop_sequence
            calls = tuple(reader.calls)
            yield Ended(reason, stop, usage_counts(usage()), reader.text, calls)
            return
        else:
            yield reader.read(event)
