"""What every route reads, whoever answers: :class:`Answer`.

One answer-event stream (:mod:`edge_llm.generation.events`: text and tool-call
events, heartbeats, the end), the ids and headers to send, usage and stats, and
pause / resume / cancel. The dispatcher (:mod:`edge_llm.generation.dispatch`) makes
them: a local stream, a relayed one, or one waiting for its model's pull
(:mod:`edge_llm.generation.pending`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any

from edge_llm.generation.events import AnswerEvent
from edge_llm.protocol.stream_events import Ending


class Answer(ABC):
    """One request's answer, from the local engine or relayed from an upstream."""

    id: str
    model: str  # as the client is told
    n_prompt: int  # 0 when relayed: the upstream counts them at the end
    headers: dict[str, str]

    @property
    @abstractmethod
    def backend(self) -> str:
        """``local`` or the upstream's name."""

    @property
    @abstractmethod
    def outcome(self) -> Ending | None:
        """How the stream ended; None while it runs (or while its cancel is under way)."""

    @property
    def finished(self) -> bool:
        return self.outcome is not None

    @abstractmethod
    def events(self, new_id: Callable[[], str]) -> AsyncIterator[AnswerEvent]:
        """The answer's events until (and including) Ended or Failed (see
        :mod:`edge_llm.generation.events`); ``new_id`` names the calls that come
        without an id. Read them once."""

    @property
    def text_only(self) -> bool:
        """Known before it starts: the answer holds text alone, no tool call (an
        upstream's answer may hold the calls it parsed)."""
        return False

    @property
    def token_bytes(self) -> Callable[[int], bytes] | None:
        """The model's token bytes, for logprobs (None: the upstream sends its own)."""
        return None

    @abstractmethod
    def usage(self) -> dict[str, Any]:
        """The backend's usage object (OpenAI's names; an upstream's as it sent it)."""

    @abstractmethod
    def stats(self) -> dict[str, Any]:
        """ttft_ms, pauses, paused_ms (and what else the backend knows) for ``done``."""

    @abstractmethod
    def pause(self) -> None:
        """The client asked to pause (cause ``client``)."""

    @abstractmethod
    def resume(self) -> None:
        """The client asked to resume."""

    @abstractmethod
    def cancel(self, reason: str) -> None:
        """End the stream now with ``reason`` (``client``, ``disconnect``, ...)."""

    @abstractmethod
    def detach(self) -> None:
        """A resumable stream's connection dropped: nothing more is generated (pause
        cause ``disconnected``) until :meth:`reattach`; its KV is kept."""

    @abstractmethod
    def reattach(self, **detail: Any) -> None:
        """A new connection resumed the stream (``detail``: the resume's gap, for the
        ``resumed`` event)."""

    @abstractmethod
    def close(self) -> None:
        """The connection is done with the answer; a stream still running ends
        (reason ``disconnect``). Closing again does nothing."""

    handed_over = False  # a resumable stream owns it now: the route must not close it

    def hand_over(self) -> None:
        """From now on the resumable stream that carries the answer closes it, not the
        connection that started it (:func:`~edge_llm.server.context.answer_to`)."""
        self.handed_over = True

    def __enter__(self) -> Answer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
