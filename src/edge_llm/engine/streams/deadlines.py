"""Time-outs of the engine's streams: the rules are :class:`~edge_llm.protocol.
stream_rules.TimeLimits`'; here they are asked for every live stream, and a stream
whose time-out fell due is cancelled and its KV freed. Called with the engine lock held."""

from __future__ import annotations

from edge_llm.engine.settings import EngineSettings
from edge_llm.engine.streams.handle import StreamHandle
from edge_llm.engine.streams.live import Streams
from edge_llm.protocol.stream_rules import StreamState, TimeLimits, TimeOut


class Deadlines:
    def __init__(self, settings: EngineSettings, streams: Streams) -> None:
        self.limits = TimeLimits(settings.ttft_timeout_s, settings.max_pause_s)
        self.streams = streams

    def expire(self, now: float) -> None:
        """Cancel the streams whose first token or pause took too long."""
        for handle in list(self.streams.live.values()):
            seq = handle.seq
            expired = self.limits.expired(seq.created_at, seq.first_token_at, seq.pauses, now)
            if expired is not None and not handle.finished:
                self._end(handle, expired)

    def next_due(self) -> float | None:
        """When the next time-out falls due (None: none pending)."""
        due = (
            self.limits.next_due(h.seq.created_at, h.seq.first_token_at, h.seq.pauses)
            for h in self.streams.live.values()
        )
        return min((when for when in due if when is not None), default=None)

    def _end(self, handle: StreamHandle, expired: TimeOut) -> None:
        seq = handle.seq
        self.streams.events(
            expired.value, seq.id, state=seq.state.value,
            prefill_done=seq.n_prefilled, prefill_total=seq.n_prompt,
        )  # fmt: skip
        detail = "" if expired is TimeOut.PAUSE else (
            f"; prefilled {seq.n_prefilled}/{seq.n_prompt} prompt tokens"
        )  # fmt: skip
        self.streams.finish(handle, expired.error(self.limits, detail), StreamState.CANCELLED)
