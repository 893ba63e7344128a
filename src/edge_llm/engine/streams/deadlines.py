"""Time-outs of the engine's streams: the rules are :class:`~edge_llm.protocol.
stream_rules.TimeLimits`'; here they are asked for every live stream, and a stream
whose time-out fell due is cancelled and its KV freed. A request may carry a TTFT
time-out of its own (a background response's). Called with the engine lock held."""

from __future__ import annotations

from dataclasses import replace

from edge_llm.engine.sequence import Sequence
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
            limits = self.limits_of(seq)
            expired = limits.expired(seq.created_at, seq.first_token_at, seq.pauses, now)
            if expired is not None and not handle.finished:
                self._end(handle, expired)

    def next_due(self) -> float | None:
        """When the next time-out falls due (None: none pending)."""
        due = (
            self.limits_of(seq).next_due(seq.created_at, seq.first_token_at, seq.pauses)
            for seq in (h.seq for h in self.streams.live.values())
        )
        return min((when for when in due if when is not None), default=None)

    def limits_of(self, seq: Sequence) -> TimeLimits:
        """The engine's limits, with the request's own TTFT time-out if it has one."""
        if seq.request.ttft_timeout_s is None:
            return self.limits
        return replace(self.limits, ttft_timeout_s=seq.request.ttft_timeout(None))

    def _end(self, handle: StreamHandle, expired: TimeOut) -> None:
        seq = handle.seq
        self.streams.events(
            expired.value, seq.id, state=seq.state.value,
            prefill_done=seq.n_prefilled, prefill_total=seq.n_prompt,
        )  # fmt: skip
        detail = "" if expired is TimeOut.PAUSE else (
            f"; prefilled {seq.n_prefilled}/{seq.n_prompt} prompt tokens"
        )  # fmt: skip
        error = expired.error(self.limits_of(seq), detail)
        self.streams.finish(handle, error, StreamState.CANCELLED)
