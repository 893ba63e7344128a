"""Time-outs: a stream without a first token after ``ttft_timeout`` or paused longer
than ``max_pause`` is cancelled and its KV freed. Called with the engine lock held."""

from __future__ import annotations

from collections.abc import Iterator

from edge_llm.engine.sequence import SequenceState
from edge_llm.engine.settings import EngineSettings
from edge_llm.engine.streams.book import Streams
from edge_llm.engine.streams.handle import StreamHandle
from edge_llm.errors import EdgeLLMError, PauseTimeout, TtftTimeout
from edge_llm.observability.events import Event


class Deadlines:
    def __init__(self, settings: EngineSettings, streams: Streams) -> None:
        self.settings = settings
        self.streams = streams

    def expire(self, now: float) -> None:
        """Cancel the streams whose first token or pause took too long."""
        for when, handle, reason in list(self._due()):
            if when <= now and not handle.finished:
                error = self._error(handle, reason)
                self.streams.finish(handle, error, SequenceState.CANCELLED)

    def next_due(self) -> float | None:
        """When the next time-out falls due (None: none pending)."""
        return min((when for when, _, _ in self._due()), default=None)

    def _due(self) -> Iterator[tuple[float, StreamHandle, Event]]:
        ttft, max_pause = self.settings.ttft_timeout_s, self.settings.max_pause_s
        for handle in self.streams.live.values():
            seq = handle.seq
            if ttft and seq.first_token_at is None:
                yield seq.created_at + ttft, handle, Event.TTFT_TIMEOUT
            paused_since = seq.reader_paused_since  # a preempted stream waits on the engine
            if max_pause and paused_since is not None:
                yield paused_since + max_pause, handle, Event.PAUSE_TIMEOUT

    def _error(self, handle: StreamHandle, reason: Event) -> EdgeLLMError:
        seq = handle.seq
        self.streams.events(
            reason, seq.id, state=seq.state.value,
            prefill_done=seq.n_prefilled, prefill_total=seq.n_prompt,
        )  # fmt: skip
        if reason is Event.PAUSE_TIMEOUT:
            limit_ms = (self.settings.max_pause_s or 0) * 1000
            return PauseTimeout(f"paused for more than {limit_ms:.0f} ms", reason=reason)
        limit_ms = (self.settings.ttft_timeout_s or 0) * 1000
        return TtftTimeout(
            f"no first token within {limit_ms:.0f} ms "
            f"(prefilled {seq.n_prefilled}/{seq.n_prompt} prompt tokens)",
            reason=reason,
        )
