"""What a decoded step produced, turned into each stream's output (engine thread, lock
held): tokens recorded, text detokenized, stop strings matched, rings written, and the
end of a stream decided, all before its KV cursor moves, so that cells of tokens after
the end are never counted as its own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from edge_llm.engine.runtime.backend import Backend, Sampled
from edge_llm.engine.scheduling.scheduler import ScheduledChunk, StepPlan
from edge_llm.engine.sequence import PauseCause, Sequence
from edge_llm.engine.settings import EngineSettings
from edge_llm.engine.step.runner import ChunkResult
from edge_llm.engine.streams.handle import StreamHandle
from edge_llm.engine.streams.live import Streams
from edge_llm.errors import BackendFailure
from edge_llm.observability.events import Event
from edge_llm.protocol.stream_rules import StreamState


@dataclass(frozen=True)
class _End:
    finish_reason: str


class Output:
    def __init__(
        self,
        streams: Streams,
        backend: Backend,
        settings: EngineSettings,
        clock: Callable[[], float],
    ) -> None:
        self.streams = streams
        self.scheduler = streams.scheduler
        self.backend = backend
        self.settings = settings
        self.metrics = streams.metrics
        self.events = streams.events
        self.clock = clock

    def publish(self, plan: StepPlan, results: list[ChunkResult]) -> None:
        self._started(plan)
        now = self.clock()
        for result in results:
            handle = self.streams.live.get(result.chunk.seq.id)
            if handle is None:
                continue  # cancelled while the step ran: its cells are freed next step
            if result.error is not None:
                error = BackendFailure(str(result.error))
                self.streams.finish(handle, error, StreamState.DONE, "error")
            elif result.chunk.prompt:
                self._prefilled(handle, result.chunk, result.run or [], now)
            else:
                self._decoded(handle, result.chunk, result.run or [], now)

    def _started(self, plan: StepPlan) -> None:
        """Queue time, ``scheduled`` and ``cache_hit`` of the sequences the plan
        started, and the cells sequences attached from a prefill in flight."""
        for seq in plan.started:
            self.metrics.prefix_cache_queries.inc(seq.n_prompt)
            if seq.admitted_at is not None:
                self.metrics.queue_time.observe(seq.admitted_at - seq.created_at)
            queue_ms = round(((seq.admitted_at or seq.created_at) - seq.created_at) * 1000, 3)
            self.events(Event.SCHEDULED, seq.id, slot=seq.slot, queue_ms=queue_ms)
            if seq.num_cached:
                self._cache_hit(seq, seq.num_cached)
        for seq, n_gained in plan.attached:
            self._cache_hit(seq, n_gained)

    def _cache_hit(self, seq: Sequence, n_gained: int) -> None:
        self.metrics.prompt_tokens_cached.inc(n_gained)
        self.metrics.prompt_cache_hits.labels(seq.cache_tier).inc()
        self.events(
            Event.CACHE_HIT, seq.id, n_cached_tokens=seq.num_cached, n_prompt_tokens=seq.n_prompt,
            tier=seq.cache_tier,
        )  # fmt: skip

    def _prefilled(
        self, handle: StreamHandle, chunk: ScheduledChunk, run: list[Sampled], now: float
    ) -> None:
        """A prompt chunk: its cells are the prefix cache's at once; the chunk that
        ends the prompt brings the first token."""
        seq = handle.seq
        self.scheduler.complete(chunk)
        self.metrics.prompt_tokens.inc(len(chunk.tokens))
        self.events(
            Event.PREFILL_PROGRESS, seq.id, prefill_done=seq.n_prefilled, prefill_total=seq.n_prompt
        )
        self.streams.touch(handle)
        if run:
            _, end = self._emit(handle, run, now)
            if end is not None:
                self.streams.finish(handle, None, StreamState.DONE, end.finish_reason)

    def _decoded(
        self, handle: StreamHandle, chunk: ScheduledChunk, run: list[Sampled], now: float
    ) -> None:
        """A decode chunk (a first token from kept logits included): its accepted run
        becomes output up to the end of the stream, then its cursor moves."""
        n_kept, end = self._emit(handle, run, now)
        self.scheduler.complete_run(chunk, n_kept, n_accepted=len(run))
        if chunk.n_draft:
            self.metrics.spec_draft_tokens.inc(chunk.n_draft)
            self.metrics.spec_accepted_tokens.inc(max(len(run) - 1, 0))
        if end is not None:
            self.streams.finish(handle, None, StreamState.DONE, end.finish_reason)

    def _emit(
        self, handle: StreamHandle, run: list[Sampled], now: float
    ) -> tuple[int, _End | None]:
        """Record the run's tokens up to the first that ends the stream; returns how
        many were recorded and the end, if one came. The prompt's logits, kept with the
        first token, stay with its cells for a regenerate."""
        if run and run[0].logits is not None:
            self.scheduler.kv.keep_logits(handle.seq.request.prompt_tokens, run[0].logits)
        for n, sampled in enumerate(run, start=1):
            end = self._emit_token(handle, sampled, now)
            if end is not None:
                return n, end
        return len(run), None

    def _emit_token(self, handle: StreamHandle, sampled: Sampled, now: float) -> _End | None:
        seq, token = handle.seq, sampled.token
        sampling = seq.request.sampling
        cause = seq.pause_cause
        if cause is not None:
            seq.tokens_while_paused += 1
            self.events(
                Event.TOKEN_WHILE_PAUSED, seq.id, cause=cause.value, n_generated=seq.n_generated + 1
            )
        self.scheduler.record_token(seq, token, now)
        self._observe_latency(handle, now)
        self.streams.touch(handle)
        if self.backend.is_end_of_generation(token) or token in sampling.stop_token_ids:
            return _End("stop")
        piece = self.backend.token_bytes(token, special=not sampling.skip_special_tokens)
        text = handle.detokenizer.push(piece)
        text, hit_stop = handle.stop_matcher.push(text)
        handle.ring.push(text, sampled.logprob)
        if hit_stop:
            return _End("stop")
        if seq.n_generated >= seq.request.max_tokens:
            return _End("length")
        if handle.ring.is_full() and self.settings.pause_on_socket_full:
            self.streams.add_pause(handle, PauseCause.SOCKET_FULL)
        return None

    def _observe_latency(self, handle: StreamHandle, now: float) -> None:
        seq = handle.seq
        self.metrics.generated_tokens.inc()
        if handle.last_token_at is None:
            ttft = now - seq.created_at
            self.metrics.ttft.observe(ttft)
            self.events(Event.FIRST_TOKEN, seq.id, ttft_ms=round(ttft * 1000.0, 3))
        else:
            self.metrics.itl.observe(now - handle.last_token_at)
        handle.last_token_at = now
