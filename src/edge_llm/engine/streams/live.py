"""The book of streams: which are live, their pauses (the seed's backpressure counter)
and how each ends. Called with the engine lock held. A session's one live stream is
decided above the engines (``generation/sessions.py``)."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from edge_llm.engine.scheduling.scheduler import Scheduler
from edge_llm.engine.sequence import Sequence
from edge_llm.engine.settings import EngineSettings
from edge_llm.engine.streams.handle import Outcome, StreamHandle
from edge_llm.engine.streams.token_ring import TokenRing
from edge_llm.errors import BackendError, BackendFailure, EdgeLLMError
from edge_llm.observability.events import Event, EventSink
from edge_llm.observability.metrics import EngineMetrics
from edge_llm.protocol.stream_rules import Marks, PauseCause, StreamState

RECENT_SECONDS = 60.0
_MAX_RECENT = 256


class OffloadedStates(Protocol):
    """Where an offloaded stream's KV waits (``kv/host_offload.py``, a state tier): its
    state is dropped when the stream ends."""

    def evict(self, key: str) -> int: ...


class Streams:
    def __init__(
        self,
        scheduler: Scheduler,
        host_offload: OffloadedStates,
        settings: EngineSettings,
        *,
        metrics: EngineMetrics,
        events: EventSink,
        clock: Callable[[], float],
    ) -> None:
        self.scheduler = scheduler
        self.host_offload = host_offload
        self.settings = settings
        self.metrics = metrics
        self.events = events
        self.clock = clock
        self.live: dict[str, StreamHandle] = {}
        self._recent: deque[StreamHandle] = deque(maxlen=_MAX_RECENT)
        self._touched: set[StreamHandle] = set()
        self._ended_samplers: list[str] = []
        self.backpressure = 0
        self.backpressure_peak = 0

    def new_handle(self, seq: Sequence) -> StreamHandle:
        """A handle whose ring holds ``outbound_buffer_tokens``; live once ``add``-ed."""
        settings, request = self.settings, seq.request
        marks = Marks(settings.outbound_buffer_tokens, settings.resume_threshold)
        ring = TokenRing.for_stream(marks, settings.pause_on_socket_full, request.max_tokens)
        return StreamHandle(seq, ring, request.sampling.stop)

    def add(self, handle: StreamHandle) -> None:
        self.live[handle.id] = handle

    def touch(self, handle: StreamHandle) -> None:
        """Its connection is woken after the step."""
        self._touched.add(handle)

    def take_touched(self) -> set[StreamHandle]:
        touched, self._touched = self._touched, set()
        return touched

    def take_ended_samplers(self) -> list[str]:
        ended, self._ended_samplers = self._ended_samplers, []
        return ended

    def recent(self, now: float) -> list[StreamHandle]:
        """Streams that ended within the last minute."""
        return [h for h in self._recent if now - (h.seq.finished_at or now) <= RECENT_SECONDS]

    def draft_room(self, seq: Sequence) -> int:
        """Lock held: tokens the sequence may emit in one step without overrunning
        its ring (a socket-full pause comes only after its step's last token)."""
        handle = self.live.get(seq.id)
        if handle is None:
            return 0
        ring = handle.ring
        limit = ring.capacity if self.settings.pause_on_socket_full else ring.hard_limit
        return limit - len(ring)

    def unpaused(self, key: str) -> bool:
        """Asked between the tokens of an accepted run (engine lock held, see
        :class:`RunGuard`): a stream paused while its step ran gets that step's first
        token only (at most one token after PAUSE)."""
        handle = self.live.get(key)
        return handle is not None and not handle.seq.paused

    def count_paused(self) -> int:
        return sum(1 for handle in self.live.values() if handle.seq.paused)

    def count_detached(self) -> int:
        return sum(1 for handle in self.live.values() if handle.seq.detached)

    # -- pauses: the seed's counter, +1 per pause cause, -1 per resume ------------------------

    def add_pause(self, handle: StreamHandle, cause: PauseCause) -> bool:
        if not handle.seq.add_pause(cause, self.clock()):
            return False
        self.backpressure += 1
        self.backpressure_peak = max(self.backpressure_peak, self.backpressure)
        self.metrics.pauses.labels(cause.value).inc()
        self.events(Event.PAUSED, handle.id, cause=cause.value, **ring_fields(handle))
        self.touch(handle)
        return True

    def remove_pause(self, handle: StreamHandle, cause: PauseCause, **detail: Any) -> bool:
        """``detail``: more fields for the ``resumed`` event (a resume's replay gap)."""
        elapsed = handle.seq.remove_pause(cause, self.clock())
        if elapsed is None:
            return False
        self.backpressure -= 1
        self.metrics.paused_seconds.labels(cause.value).inc(elapsed)
        if cause is PauseCause.DISCONNECTED and not handle.finished:
            self.metrics.stream_resumes.inc()
        self.events(
            Event.RESUMED, handle.id, cause=cause.value, paused_ms=round(elapsed * 1000.0, 3),
            **ring_fields(handle), **detail,
        )  # fmt: skip
        self.touch(handle)
        return True

    # -- the end -----------------------------------------------------------------------------

    def finish(
        self,
        handle: StreamHandle,
        error: EdgeLLMError | None,
        state: StreamState,
        finish_reason: str | None = None,
    ) -> None:
        """End a stream once: its pauses end, its KV is released (freed before the next
        decode), its outcome is set and its connection woken."""
        if handle.finished:
            return
        seq = handle.seq
        now = self.clock()
        for cause in list(seq.pause_causes):
            self.remove_pause(handle, cause)
        seq.finish_reason = finish_reason
        seq.cancel_reason = _reason(error)
        self.scheduler.finish(seq, state, now, keep=self._keeps_cells(state))
        self.host_offload.evict(seq.id)
        self._ended_samplers.append(seq.id)
        tail = "" if error else handle.detokenizer.flush() + handle.stop_matcher.flush()
        handle.outcome = Outcome(finish_reason, error, tail, handle.stop_matcher.matched)
        self.live.pop(seq.id, None)
        self._recent.append(handle)
        self.touch(handle)
        self._log_end(handle, error, now)

    def finish_all(self, error: EdgeLLMError) -> None:
        for handle in list(self.live.values()):
            self.finish(handle, error, StreamState.CANCELLED)

    def fail_restores(self, failed: list[tuple[str, BackendError]]) -> None:
        """Streams whose KV could not be brought back end with the backend's error."""
        for key, error in failed:
            if handle := self.live.get(key):
                self.finish(handle, BackendFailure(str(error)), StreamState.DONE, "error")

    def _keeps_cells(self, state: StreamState) -> bool:
        """A finished answer stays in the cache (the next turn starts with it); a
        cancelled stream keeps only its cached prefix unless cancel_release_kv is off."""
        if state is StreamState.CANCELLED:
            return not self.settings.cancel_release_kv
        return self.scheduler.kv.reuses_prefixes

    def _log_end(self, handle: StreamHandle, error: EdgeLLMError | None, now: float) -> None:
        seq = handle.seq
        if seq.cancel_reason:
            self.metrics.cancellations.labels(seq.cancel_reason).inc()
            self.events(Event.CANCEL, seq.id, reason=seq.cancel_reason, state=seq.state.value)
        self.events(
            Event.END, seq.id, finish_reason=seq.finish_reason, error=error.code if error else None,
            n_prompt_tokens=seq.n_prompt, n_generated=seq.n_generated, **handle.stats(now),
        )  # fmt: skip


def ring_fields(handle: StreamHandle) -> dict[str, Any]:
    """The outbound ring's state, for pause and resume events."""
    ring = handle.ring
    return {
        "ring_fill": round(ring.fill(), 3),
        "ring_write": ring.write_cursor,
        "ring_read": ring.read_cursor,
        "n_generated": handle.seq.n_generated,
    }


def _reason(error: EdgeLLMError | None) -> str | None:
    reason = error.extra.get("reason") if error else None
    return str(reason) if reason else None


class RunGuard:
    """Holds the engine lock from the first question between a run's tokens until the
    step's output is recorded (:meth:`release`), so a PAUSE lands either before that
    question (the run stops at its first token) or after the run is recorded, never
    between its sampling and its recording. Steps without drafts never take it: their
    one token per stream is the step in flight."""

    def __init__(self, lock: threading.RLock, streams: Streams) -> None:
        self._lock = lock
        self._streams = streams
        self._held = False

    def unpaused(self, key: str) -> bool:
        if not self._held:
            self._lock.acquire()
            self._held = True
        return self._streams.unpaused(key)

    def release(self) -> None:
        if self._held:
            self._held = False
            self._lock.release()
