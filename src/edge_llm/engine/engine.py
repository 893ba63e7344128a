"""The engine: one inference thread that owns the backend.

Each step reads expire/offload → schedule → apply KV operations (prefix copies,
frees, saves, restores) → decode (drafts verified) → record tokens. The thread never touches a
socket: tokens go into each stream's bounded ring and the event loop is woken once
per step. Public methods are called from
the event loop; they take the engine lock briefly and never wait on a decode.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from edge_llm.engine.admission import ServiceRates, predict_ttft_s, queue_view, retry_after_s
from edge_llm.engine.backend import Backend, BackendError, BatchItem, Sampled
from edge_llm.engine.kv_apply import KvApplier
from edge_llm.engine.kv_cache import KvCache, KvOp
from edge_llm.engine.offload import HostStore
from edge_llm.engine.outbound import TokenRing
from edge_llm.engine.scheduler import ScheduledChunk, Scheduler, SchedulerLimits, StepPlan
from edge_llm.engine.sequence import GenerationRequest, PauseCause, Sequence, SequenceState
from edge_llm.engine.stream import Outcome, StreamHandle
from edge_llm.errors import (
    BackendFailure,
    Cancelled,
    EdgeLLMError,
    EngineUnavailable,
    PauseTimeout,
    QueueFull,
    TtftTimeout,
)
from edge_llm.observability.events import EventSink, null_sink
from edge_llm.observability.metrics import EngineMetrics

# A decoded chunk: its accepted run of sampled tokens (when it samples) or the
# error that failed it.
_ChunkResult = tuple[ScheduledChunk, list[Sampled] | None, Exception | None]
RECENT_SECONDS = 60.0
_MAX_RECENT = 256
_IDLE_WAIT_S = 5.0
URGENT_TTFT_FRACTION = 0.5


@dataclass(frozen=True)
class EngineSettings:
    """The part of the configuration the engine thread enforces."""

    max_queue: int = 16
    prefill_chunk_tokens: int = 512
    itl_target_s: float | None = 0.1  # None: every step prefills up to prefill_chunk_tokens
    speculative: bool = False
    max_draft_tokens: int = 8
    outbound_buffer_tokens: int = 32
    pause_on_socket_full: bool = True
    resume_threshold: float = 0.3
    cancel_release_kv: bool = True
    ttft_timeout_s: float | None = 10.0
    max_pause_s: float | None = 60.0
    prefix_cache: bool = True
    host_offload_bytes: int = 512 << 20  # 0: no offload
    offload_paused_after_s: float = 1.0
    supersede_sessions: bool = True
    deadline_admission: bool = False


class Engine:
    def __init__(
        self,
        backend: Backend,
        settings: EngineSettings,
        *,
        metrics: EngineMetrics | None = None,
        events: EventSink = null_sink,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self.settings = settings
        self.metrics = metrics or EngineMetrics()
        self.events = events
        self.clock = clock
        limits = scheduler_limits(backend.max_sequences, settings)
        self.kv = _kv_cache(backend, settings.prefix_cache)
        self.host = HostStore(settings.host_offload_bytes)
        self.kv_ops = KvApplier(
            backend, self.host, self.metrics, events, lambda: self.kv_used_bytes
        )
        self.scheduler = Scheduler(limits, self.kv)
        self.rates = ServiceRates()  # measured service times, for deadline_admission
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._draining = False
        self._crash: BaseException | None = None
        self._live: dict[str, StreamHandle] = {}
        self._sessions: dict[str, StreamHandle] = {}
        self._recent: deque[StreamHandle] = deque(maxlen=_MAX_RECENT)
        self._touched: set[StreamHandle] = set()
        self._ended_samplers: list[str] = []
        self.backpressure = 0
        self.backpressure_peak = 0
        self.steps = 0
        self.metrics.bind_gauges(
            running=lambda: self.scheduler.num_running,
            waiting=lambda: self.scheduler.num_waiting,
            paused=self._count_paused,
            kv_used=lambda: self.kv_used_bytes,
            backpressure_peak=lambda: self.backpressure_peak,
        )

    # -- life cycle -----------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="edge-llm-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Cancel everything, stop the thread, and close the backend."""
        self.cancel_all("shutdown")
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.backend.close()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._crash is None

    @property
    def crash(self) -> BaseException | None:
        return self._crash

    def begin_drain(self) -> None:
        """Stop admitting; running streams go on."""
        self._draining = True

    @property
    def num_live(self) -> int:
        return len(self._live)

    def live_handles(self) -> list[StreamHandle]:
        with self._lock:
            return list(self._live.values())

    # -- requests (event-loop side) ----------------------------------------------------

    def new_request_id(self) -> str:
        return "chatcmpl-" + uuid.uuid4().hex[:24]

    def submit(self, request: GenerationRequest) -> StreamHandle:
        """Admit a tokenized request or raise the error the client must get."""
        if not self.alive or self._draining:
            reason = "shutting down" if self._draining else "engine thread is not running"
            self.metrics.rejections.labels("shutting_down").inc()
            raise EngineUnavailable(f"engine unavailable: {reason}", retry_after_s=5)
        now = self.clock()
        seq = Sequence(request, request.request_id or self.new_request_id(), now)
        handle = StreamHandle(seq, self._new_ring(request.max_tokens), request.sampling.stop)
        with self._lock:
            self._supersede(request.session)
            try:
                self._check_deadline(seq)
                self.scheduler.add(seq, now)
            except EdgeLLMError as exc:
                self.metrics.rejections.labels(exc.code).inc()
                self.events("rejected", seq.id, code=exc.code, n_prompt_tokens=seq.n_prompt)
                raise
            self._live[seq.id] = handle
            if request.session:
                self._sessions[request.session] = handle
            self.events(
                "admitted",
                seq.id,
                session=request.session,
                n_prompt_tokens=seq.n_prompt,
                max_tokens=request.max_tokens,
                kv_reserved_bytes=self.scheduler.reservation(seq) * self.kv.bytes_per_token,
                queue_position=self.scheduler.num_waiting,
            )
        self._wake.set()
        return handle

    def _check_deadline(self, seq: Sequence) -> None:
        """Lock held: with ``deadline_admission``, refuse at once (503 ``queue_full``) a
        request whose predicted TTFT exceeds ``ttft_timeout`` (engine/admission.py)."""
        deadline = self.settings.ttft_timeout_s
        if not (self.settings.deadline_admission and deadline):
            return
        sched = self.scheduler
        admitted_now = (
            not sched.waiting and sched.num_running < sched.limits.max_sequences and sched.fits(seq)
        )
        running = [
            (s.prefill_remaining, s.request.max_tokens - s.n_generated if s.runnable else 0)
            for s in sched.running
        ]
        waiting = [s.n_prompt for s in sched.waiting]
        to_prefill = seq.n_prompt - self.kv.cached_length(seq.request.prompt_tokens)
        view = queue_view(to_prefill, admitted_now, running, waiting)
        predicted = predict_ttft_s(view, self.rates)
        if predicted > deadline:
            raise QueueFull(
                f"predicted time to first token {predicted:.1f} s exceeds ttft_timeout_ms "
                f"({deadline * 1000:.0f}): {view.prefill_ahead_tokens} prompt tokens ahead",
                retry_after_s=retry_after_s(predicted, deadline),
                predicted_ttft_ms=round(predicted * 1000.0),
            )

    def _new_ring(self, max_tokens: int) -> TokenRing:
        capacity = self.settings.outbound_buffer_tokens
        if self.settings.pause_on_socket_full:
            return TokenRing(capacity)
        # Not pausing: a slow reader's tokens wait in the ring, at most all of them.
        return TokenRing(capacity, hard_limit=max_tokens)

    def _supersede(self, session: str | None) -> None:
        if not self.settings.supersede_sessions:
            return  # switched off: a session's requests run side by side
        old = self._sessions.get(session) if session else None
        if old is not None:
            self._finish(old, Cancelled("superseded"), SequenceState.CANCELLED)

    def cancel(self, handle: StreamHandle, reason: str) -> None:
        """End a stream now; its KV cells are freed before the next decode."""
        with self._lock:
            self._finish(handle, Cancelled(reason), SequenceState.CANCELLED)
        self._wake.set()

    def cancel_all(self, reason: str) -> None:
        with self._lock:
            for handle in list(self._live.values()):
                self._finish(handle, Cancelled(reason), SequenceState.CANCELLED)
        self._wake.set()
        self._signal_touched()

    def pause(self, handle: StreamHandle, cause: PauseCause = PauseCause.CLIENT) -> bool:
        """Stop scheduling this sequence. The step already in flight may still
        produce one token; nothing after it. Returns False if already paused so."""
        with self._lock:
            if handle.finished:
                return False
            if cause is PauseCause.CLIENT:
                self.events("pause_received", handle.id, n_generated=handle.seq.n_generated)
            return self._add_pause(handle, cause)

    def resume(self, handle: StreamHandle, cause: PauseCause = PauseCause.CLIENT) -> bool:
        with self._lock:
            if handle.finished:
                return False
            if cause is PauseCause.CLIENT:
                self.events("resume_received", handle.id, n_generated=handle.seq.n_generated)
            resumed = self._remove_pause(handle, cause)
        if resumed:
            self._wake.set()
        return resumed

    def consumed(self, handle: StreamHandle, n_tokens: int) -> None:
        """The connection sent ``n_tokens`` more; resume a socket-full pause once
        the ring has drained to ``resume_threshold``."""
        fill = handle.ring.commit(n_tokens)
        seq = handle.seq
        if PauseCause.SOCKET_FULL in seq.pause_causes and fill <= self.settings.resume_threshold:
            self.resume(handle, PauseCause.SOCKET_FULL)

    # -- pause bookkeeping (lock held) -----------------------------------------------------

    def _add_pause(self, handle: StreamHandle, cause: PauseCause) -> bool:
        seq = handle.seq
        if not seq.add_pause(cause, self.clock()):
            return False
        self.backpressure += 1
        self.backpressure_peak = max(self.backpressure_peak, self.backpressure)
        self.metrics.pauses.labels(cause.value).inc()
        self.events("paused", handle.id, cause=cause.value, **self._ring_fields(handle))
        self._touched.add(handle)
        return True

    def _remove_pause(self, handle: StreamHandle, cause: PauseCause) -> bool:
        elapsed = handle.seq.remove_pause(cause, self.clock())
        if elapsed is None:
            return False
        self.backpressure -= 1
        self.metrics.paused_seconds.labels(cause.value).inc(elapsed)
        self.events(
            "resumed",
            handle.id,
            cause=cause.value,
            paused_ms=round(elapsed * 1000.0, 3),
            **self._ring_fields(handle),
        )
        self._touched.add(handle)
        return True

    @staticmethod
    def _ring_fields(handle: StreamHandle) -> dict[str, Any]:
        ring = handle.ring
        return {
            "ring_fill": round(ring.fill(), 3),
            "ring_write": ring.write_cursor,
            "ring_read": ring.read_cursor,
            "n_generated": handle.seq.n_generated,
        }

    # -- ending a stream (lock held) --------------------------------------------------------

    def _finish(
        self,
        handle: StreamHandle,
        error: EdgeLLMError | None,
        state: SequenceState,
        finish_reason: str | None = None,
    ) -> None:
        seq = handle.seq
        if handle.finished:
            return
        now = self.clock()
        for cause in list(seq.pause_causes):
            self._remove_pause(handle, cause)
        # A finished answer stays in the cache (the next turn starts with it); a
        # cancelled stream keeps only its cached prefix unless cancel_release_kv is off.
        if state is SequenceState.CANCELLED:
            keep = not self.settings.cancel_release_kv
        else:
            keep = self.kv.reuses_prefixes
        self.scheduler.finish(seq, state, now, keep=keep)
        self.host.pop(seq.id)
        self._ended_samplers.append(seq.id)
        tail = "" if error else handle.detokenizer.flush() + handle.stop_matcher.flush()
        handle.outcome = Outcome(finish_reason, error, tail, handle.stop_matcher.matched)
        self._live.pop(seq.id, None)
        if seq.session and self._sessions.get(seq.session) is handle:
            del self._sessions[seq.session]
        self._recent.append(handle)
        self._touched.add(handle)
        self._log_end(handle, error, now)

    def _log_end(self, handle: StreamHandle, error: EdgeLLMError | None, now: float) -> None:
        reason = error.extra.get("reason") if error else None
        if reason:
            self.metrics.cancellations.labels(reason).inc()
            self.events("cancel", handle.id, reason=reason, state=handle.seq.state.value)
        self.events(
            "end",
            handle.id,
            finish_reason=handle.outcome.finish_reason if handle.outcome else None,
            error=error.code if error else None,
            n_prompt_tokens=handle.seq.n_prompt,
            n_generated=handle.seq.n_generated,
            **handle.stats(now),
        )

    # -- the inference thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._step()
        except BaseException as exc:  # the thread must not die silently
            self._crash = exc
            self._fail_all(BackendFailure(f"engine thread died: {exc!r}"))

    def _step(self) -> None:
        self._wake.clear()
        with self._lock:
            now = self.clock()
            self._expire(now)
            self._offload_paused(now)
            plan = self.scheduler.schedule(now, self._draft_room)
            ops = self._take_kv_work()
            idle_timeout = self._idle_timeout() if not plan else 0.0
        self._apply_kv(*ops)
        if not plan:
            self._signal_touched()
            self._wake.wait(idle_timeout)
            return
        self._start(plan.started)
        for seq, n_gained in plan.attached:
            self._cache_hit(seq, n_gained)
        n_prefill = sum(len(c.tokens) for c in plan.chunks if c.seq.state is SequenceState.PREFILL)
        n_decode = sum(len(c.tokens) for c in plan.chunks) - n_prefill
        began = self.clock()
        results = self._decode(plan)
        took = self.clock() - began
        self.rates.observe(n_prefill, sum(1 for c in plan.chunks if c.tokens), took)
        self.scheduler.observe_step(n_prefill, n_decode, took)
        with self._lock:
            self._record(plan, results)
            ops = self._take_kv_work()
        self._apply_kv(*ops)  # sequences that just finished free their cells now
        self.steps += 1
        self._signal_touched()

    def _draft_room(self, seq: Sequence) -> int:
        """Lock held: tokens the sequence may emit in one step without overrunning
        its ring (a socket-full pause comes only after its step's last token)."""
        handle = self._live.get(seq.id)
        if handle is None:
            return 0
        ring = handle.ring
        limit = ring.capacity if self.settings.pause_on_socket_full else ring.hard_limit
        return limit - len(ring)

    def _take_kv_work(self) -> tuple[list[KvOp], list[str]]:
        """Lock held: KV operations and samplers to free, for the engine thread."""
        ended, self._ended_samplers = self._ended_samplers, []
        return self.scheduler.take_kv_ops(), ended

    def _apply_kv(self, ops: list[KvOp], ended_samplers: list[str]) -> None:
        for key in ended_samplers:
            self.backend.end_sequence(key)
        failed = self.kv_ops.apply(ops)
        if failed:
            with self._lock:
                for key, error in failed:
                    if handle := self._live.get(key):
                        self._finish(
                            handle, BackendFailure(str(error)), SequenceState.DONE, "error"
                        )

    def _start(self, started: list[Sequence]) -> None:
        for seq in started:
            self.backend.start_sequence(seq.id, seq.request.sampling)
            if seq.admitted_at is not None:
                self.metrics.queue_time.observe(seq.admitted_at - seq.created_at)
            self.events(
                "scheduled", seq.id, slot=seq.slot,
                queue_ms=round(((seq.admitted_at or seq.created_at) - seq.created_at) * 1000, 3),
            )  # fmt: skip
            if seq.num_cached:
                self._cache_hit(seq, seq.num_cached)

    def _cache_hit(self, seq: Sequence, n_gained: int) -> None:
        self.metrics.prompt_tokens_cached.inc(n_gained)
        self.events(
            "cache_hit", seq.id, n_cached_tokens=seq.num_cached, n_prompt_tokens=seq.n_prompt
        )

    # -- offload of paused streams (lock held) ----------------------------------------------

    def _offload_paused(self, now: float) -> None:
        """While requests wait for KV or a slot, save streams paused for longer than
        ``offload_paused_after_s`` to host memory, oldest pause first."""
        if not self.host.enabled or not self.scheduler.head_blocked:
            return
        after = self.settings.offload_paused_after_s
        paused = [
            s for s in self.scheduler.running
            if s.paused_since is not None and now - s.paused_since >= after and s.num_computed
        ]  # fmt: skip
        for seq in sorted(paused, key=lambda s: s.paused_since or now):
            if not self.scheduler.head_blocked:
                return
            self._offload(seq)

    def _offload(self, seq: Sequence) -> None:
        size = self.backend.state_size(seq.require_slot())
        if size > self.host.capacity_bytes:
            return
        while not self.host.fits(size):
            self._cancel_oldest_offloaded()
        self.host.reserve(seq.id, size)
        n_tokens, slot = seq.num_computed, seq.slot
        self.scheduler.offload(seq)
        self.metrics.kv_offloads.inc()
        self.events("offloaded", seq.id, slot=slot, kv_tokens=n_tokens, state_bytes=size)
        if handle := self._live.get(seq.id):
            self._touched.add(handle)

    def _cancel_oldest_offloaded(self) -> None:
        """Host memory is full: the stream offloaded first ends (reason pause_timeout)."""
        key = self.host.oldest()
        handle = self._live.get(key) if key else None
        if handle is None:
            self.host.pop(key or "")
            return
        error = PauseTimeout("offloaded and host memory is full", reason="pause_timeout")
        self.events("pause_timeout", key, state="offloaded", host_offload_bytes=self.host.num_bytes)
        self._finish(handle, error, SequenceState.CANCELLED)

    def _idle_timeout(self) -> float:
        """Lock held: how long to sleep before the next deadline is due."""
        deadlines = [when for when, _, _ in self._deadlines()]
        deadlines.extend(self._offload_times())
        if not deadlines:
            return _IDLE_WAIT_S
        return max(0.0, min(_IDLE_WAIT_S, min(deadlines) - self.clock()))

    def _offload_times(self) -> Iterator[float]:
        """Lock held: when paused streams become due for offload, while requests wait
        (without these the idle thread slept until the next timeout, measured: 5 s)."""
        if not self.host.enabled or not self.scheduler.head_blocked:
            return
        after, now = self.settings.offload_paused_after_s, self.clock()
        for seq in self.scheduler.running:
            due = None if seq.paused_since is None else seq.paused_since + after
            # Past due and still here: it cannot be offloaded (too large), no wake-up.
            if due is not None and due > now and seq.num_computed:
                yield due

    def _deadlines(self) -> Iterator[tuple[float, StreamHandle, str]]:
        """(when, stream, reason) for every timeout that applies now."""
        ttft, max_pause = self.settings.ttft_timeout_s, self.settings.max_pause_s
        for handle in self._live.values():
            seq = handle.seq
            if ttft and seq.first_token_at is None:
                yield seq.created_at + ttft, handle, "ttft_timeout"
            if max_pause and seq.paused_since is not None:
                yield seq.paused_since + max_pause, handle, "pause_timeout"

    def _expire(self, now: float) -> None:
        """Lock held: cancel streams whose first token or pause took too long."""
        for when, handle, reason in list(self._deadlines()):
            if when <= now and not handle.finished:
                self._finish(handle, self._timeout_error(handle, reason), SequenceState.CANCELLED)

    def _timeout_error(self, handle: StreamHandle, reason: str) -> EdgeLLMError:
        seq = handle.seq
        self.events(
            reason, seq.id, state=seq.state.value,
            prefill_done=seq.n_prefilled, prefill_total=seq.n_prompt,
        )  # fmt: skip
        if reason == "pause_timeout":
            limit_ms = (self.settings.max_pause_s or 0) * 1000
            return PauseTimeout(f"paused for more than {limit_ms:.0f} ms", reason=reason)
        limit_ms = (self.settings.ttft_timeout_s or 0) * 1000
        return TtftTimeout(
            f"no first token within {limit_ms:.0f} ms "
            f"(prefilled {seq.n_prefilled}/{seq.n_prompt} prompt tokens)",
            reason=reason,
        )

    def _decode(self, plan: StepPlan) -> list[_ChunkResult]:
        """Decode the whole plan; on failure, retry each chunk alone so one bad
        sequence fails by itself and the others go on."""
        try:
            return self._decode_chunks(plan.chunks)
        except BackendError as exc:
            if len(plan.chunks) == 1:
                return [(plan.chunks[0], None, exc)]
        return [result for chunk in plan.chunks for result in self._decode_alone(chunk)]

    def _decode_chunks(self, chunks: list[ScheduledChunk]) -> list[_ChunkResult]:
        items = [self._batch_item(c) for c in chunks if c.logits is None]
        runs = iter(self.backend.decode_runs(items, self._unpaused) if items else ())
        return [(c, self._run_of(c, runs), None) for c in chunks]

    def _batch_item(self, chunk: ScheduledChunk) -> BatchItem:
        seq = chunk.seq
        # A prompt's last logits are kept for its regenerate (first_logits.py).
        keep = self.kv.reuses_prefixes and chunk.sample and seq.state is SequenceState.PREFILL
        return BatchItem(
            seq.require_slot(), chunk.tokens, chunk.start_pos, chunk.sample, seq.id,
            chunk.n_draft, keep_logits=keep,
        )  # fmt: skip

    def _run_of(self, chunk: ScheduledChunk, runs: Iterator[list[Sampled]]) -> list[Sampled] | None:
        if chunk.logits is not None:
            return [self.backend.sample_from(chunk.seq.id, chunk.logits)]
        return next(runs) if chunk.sample else None

    def _unpaused(self, key: str) -> bool:
        """Asked without the lock between the tokens of an accepted run: a stream
        paused while its step ran gets that step's first token only (SPEC §6: at
        most one token after PAUSE). A dict lookup and a bool are atomic reads."""
        handle = self._live.get(key)
        return handle is not None and not handle.seq.paused

    def _decode_alone(self, chunk: ScheduledChunk) -> list[_ChunkResult]:
        try:
            return self._decode_chunks([chunk])
        except BackendError as exc:
            return [(chunk, None, exc)]

    def _record(self, plan: StepPlan, results: list[_ChunkResult]) -> None:
        now = self.clock()
        for chunk, run, error in results:
            handle = self._live.get(chunk.seq.id)
            if handle is None:
                continue  # cancelled while the step ran: its cells are freed next step
            if error is not None:
                self._finish(handle, BackendFailure(str(error)), SequenceState.DONE, "error")
                continue
            if chunk.seq.state is SequenceState.PREFILL:
                self.scheduler.complete(chunk)
                self._record_prefill(handle, chunk)
                if run and run[0].logits is not None:
                    self.scheduler.first_logits.put(chunk.seq.request.prompt_tokens, run[0].logits)
            else:
                self._record_verified(chunk, len(run or ()))
            for sampled in run or ():
                if handle.finished:
                    break  # a stop, EOG or max_tokens inside the run: the rest is dropped
                self._record_token(handle, sampled, now)

    def _record_verified(self, chunk: ScheduledChunk, n_accepted: int) -> None:
        self.scheduler.complete_run(chunk, n_accepted)
        if chunk.n_draft:
            self.metrics.spec_draft_tokens.inc(chunk.n_draft)
            self.metrics.spec_accepted_tokens.inc(n_accepted - 1)

    def _record_prefill(self, handle: StreamHandle, chunk: ScheduledChunk) -> None:
        seq = handle.seq
        self.metrics.prompt_tokens.inc(len(chunk.tokens))
        self.events(
            "prefill_progress", seq.id, prefill_done=seq.n_prefilled, prefill_total=seq.n_prompt
        )
        self._touched.add(handle)

    def _record_token(self, handle: StreamHandle, sampled: Sampled, now: float) -> None:
        seq, token = handle.seq, sampled.token
        cause = seq.pause_cause
        if cause is not None:
            seq.tokens_while_paused += 1
            self.events(
                "token_while_paused", seq.id, cause=cause.value, n_generated=seq.n_generated + 1
            )
        self.scheduler.record_token(seq, token, now)
        self._observe_latency(handle, now)
        self._touched.add(handle)
        if self.backend.is_end_of_generation(token):
            self._finish(handle, None, SequenceState.DONE, "stop")
            return
        text = handle.detokenizer.push(self.backend.token_bytes(token))
        text, hit_stop = handle.stop_matcher.push(text)
        handle.ring.push(text, sampled.logprob)
        if hit_stop:
            self._finish(handle, None, SequenceState.DONE, "stop")
        elif seq.n_generated >= seq.request.max_tokens:
            self._finish(handle, None, SequenceState.DONE, "length")
        elif handle.ring.is_full() and self.settings.pause_on_socket_full:
            self._add_pause(handle, PauseCause.SOCKET_FULL)

    def _observe_latency(self, handle: StreamHandle, now: float) -> None:
        seq = handle.seq
        self.metrics.generated_tokens.inc()
        if handle.last_token_at is None:
            ttft = now - seq.created_at
            self.metrics.ttft.observe(ttft)
            self.events("first_token", seq.id, ttft_ms=round(ttft * 1000.0, 3))
        else:
            self.metrics.itl.observe(now - handle.last_token_at)
        handle.last_token_at = now

    def _fail_all(self, error: EdgeLLMError) -> None:
        with self._lock:
            for handle in list(self._live.values()):
                self._finish(handle, error, SequenceState.CANCELLED)
        self._signal_touched()

    # -- waking the event loop ---------------------------------------------------------------

    def _signal_touched(self) -> None:
        with self._lock:
            touched, self._touched = self._touched, set()
        if touched and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(_signal_all, touched)

    # -- introspection -------------------------------------------------------------------------

    @property
    def kv_used_bytes(self) -> int:
        """Bytes of KV cells live streams hold, shared cells counted once."""
        with self._lock:
            return self.kv.stats().used_tokens * self.kv.bytes_per_token

    @property
    def kv_cached_bytes(self) -> int:
        """Bytes of KV cells only the prefix cache holds (evicted when needed)."""
        with self._lock:
            return self.kv.stats().cached_tokens * self.kv.bytes_per_token

    def _count_paused(self) -> int:
        with self._lock:
            return sum(1 for h in self._live.values() if h.seq.paused)

    def snapshot(self) -> dict[str, Any]:
        """The /debug/streams document."""
        with self._lock:
            now = self.clock()
            recent = [h for h in self._recent if now - (h.seq.finished_at or now) <= RECENT_SECONDS]
            streams = [_describe(h, now) for h in [*self._live.values(), *recent]]
            return {
                "streams": streams,
                "kv_used_bytes": self.kv_used_bytes,
                "kv_cached_bytes": self.kv_cached_bytes,
                "kv_offloaded_bytes": self.host.num_bytes,
                "kv_budget_bytes": self.kv.capacity_bytes,
                "kv_reserved_bytes": self.kv.reserved_bytes,
                "kv_bytes_per_token": self.kv.bytes_per_token,
                "kv_sequence_tokens": self.kv.sequence_tokens,
                "requests_running": self.scheduler.num_running,
                "requests_waiting": self.scheduler.num_waiting,
                "backpressure": self.backpressure,
                "backpressure_peak": self.backpressure_peak,
                "engine_alive": self.alive,
                "steps": self.steps,
            }


def scheduler_limits(max_sequences: int, settings: EngineSettings) -> SchedulerLimits:
    """The scheduler's limits; their ``max_batch_tokens`` sizes the backend's batch."""
    return SchedulerLimits(
        max_sequences,
        settings.max_queue,
        settings.prefill_chunk_tokens,
        settings.itl_target_s,
        settings.max_draft_tokens if settings.speculative else 0,
        _urgent_after_s(settings),
    )


def _urgent_after_s(settings: EngineSettings) -> float | None:
    """Half the TTFT time-out: a prompt still prefilling then gets whole batches, so
    that several long prompts arriving beside decoding streams are not timed out."""
    if settings.itl_target_s is None or not settings.ttft_timeout_s:
        return None
    return URGENT_TTFT_FRACTION * settings.ttft_timeout_s


def _kv_cache(backend: Backend, prefix_cache: bool) -> KvCache:
    """Prefixes are shared only in the unified pool: between per-slot KV streams
    llama.cpp cannot copy part of a sequence, so there a slot is continued instead."""
    unified = backend.kv_sequence_tokens >= backend.kv_capacity_tokens
    return KvCache(
        backend.kv_capacity_tokens,
        backend.info.kv_bytes_per_token,
        backend.num_seq_ids,
        sequence_tokens=backend.kv_sequence_tokens,
        share=prefix_cache and unified,
        reuse_slots=prefix_cache and not unified,
    )


def _signal_all(handles: Iterable[StreamHandle]) -> None:
    for handle in handles:
        handle.signal()


def _describe(handle: StreamHandle, now: float) -> dict[str, Any]:
    seq = handle.seq
    cause = seq.pause_cause
    return {
        "id": seq.id,
        "session": seq.session,
        "state": seq.public_state(),
        "pause_cause": cause.value if cause else None,
        "ring_write": handle.ring.write_cursor,
        "ring_read": handle.ring.read_cursor,
        "ring_capacity": handle.ring.capacity,
        "kv_tokens": 0 if seq.state.finished else seq.kv_tokens,
        "n_prompt_tokens": seq.n_prompt,
        "prefill_done": seq.n_prefilled,
        "n_cached_tokens": seq.num_cached,
        "n_generated": seq.n_generated,
        "max_tokens": seq.request.max_tokens,
        "pauses": seq.pauses,
        "paused_ms": round(seq.paused_ms(now), 3),
        "backpressure": seq.backpressure,
        "backpressure_peak": seq.backpressure_peak,
        "tokens_while_paused": seq.tokens_while_paused,
        "ttft_ms": _ttft_ms(seq),
        "finish_reason": handle.outcome.finish_reason if handle.outcome else None,
        "cancel_reason": _cancel_reason(handle.outcome),
        "age_ms": round((now - seq.created_at) * 1000.0, 3),
    }


def _ttft_ms(seq: Sequence) -> float | None:
    if seq.first_token_at is None:
        return None
    return round((seq.first_token_at - seq.created_at) * 1000.0, 3)


def _cancel_reason(outcome: Outcome | None) -> str | None:
    if outcome is None or outcome.error is None:
        return None
    reason = outcome.error.extra.get("reason")
    return str(reason) if reason else None
