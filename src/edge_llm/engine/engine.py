"""The engine: one inference thread that owns the backend.

Each step reads: time-outs and offload → schedule → apply the KV plan → decode →
publish. Each name is a module that owns one noun: ``deadlines``, ``offload``,
``scheduler`` (who runs, which prompt chunks and drafts, the KV operations that
implies, decided by ``kv_cache``), ``runner`` (the backend, with failures isolated per
sequence), ``output`` (tokens, text, stop strings, rings and the end of a stream). The
thread never touches a socket: tokens go into each stream's bounded ring and the event
loop is woken once per step (``streams/waker.py``, without handing it the GIL). Public
methods are called from the event loop; they take the engine lock briefly and never
wait on a decode.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from edge_llm.engine.kv.book import KvOp
from edge_llm.engine.parts import EngineParts
from edge_llm.engine.scheduling.admission import refuse_if_late
from edge_llm.engine.scheduling.scheduler import StepPlan
from edge_llm.engine.sequence import GenerationRequest, Sequence
from edge_llm.engine.snapshot import (
    bind_gauges,
    count_waiting,
    ledger_lines,
    progress,
    snapshot,
    tier_bytes,
)
from edge_llm.engine.step.runner import ChunkResult
from edge_llm.engine.streams.handle import StreamHandle
from edge_llm.engine.streams.live import RunGuard
from edge_llm.engine.streams.waker import LoopWaker
from edge_llm.errors import BackendFailure, Cancelled, EdgeLLMError, EngineUnavailable
from edge_llm.observability.events import Event
from edge_llm.protocol.stream_rules import PauseCause, StreamState

__all__ = ["Engine"]

_IDLE_WAIT_S = 5.0


class Engine(EngineParts):
    """The inference thread and its public face over its parts (``parts.py``; wired by
    ``build.py``). Every public method (submit, pause, resume, cancel, consumed, ...)
    takes the lock briefly; the step's phases are named methods; what each capability
    decides lives in the part the step calls."""

    def __init__(self, parts: EngineParts) -> None:
        """``parts``: from ``build.build_parts`` (``build_engine`` does both)."""
        super().__init__(**vars(parts))
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._waker: LoopWaker[StreamHandle] | None = None  # the event loop's, from start()
        self._stopping = False
        self._draining = False
        self._crash: BaseException | None = None
        self.steps = 0
        bind_gauges(self)

    # -- life cycle -----------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._waker = LoopWaker(loop, _signal_all)
        self._thread = threading.Thread(target=self._run, name="edge-llm-engine", daemon=True)
        self._thread.start()
        if self.kv.per_slot:
            self.disk.read_back(self.host_cache, self._lock)

    def stop(self) -> None:
        """Cancel everything, stop the thread, and close the backend."""
        self.cancel_all("shutdown")
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._waker is not None:
            self._waker.close()  # after the thread's last signal
        # what the book kept (the per-slot layout: its slots): the next start has it
        self.disk.save_kept(self.kv.kept(), self.backend.save_state)
        self.backend.close()
        for tier in self.tiers:
            tier.close()  # its memory is back: the other models' tiers may use it

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
        return len(self.streams.live)

    def live_handles(self) -> list[StreamHandle]:
        with self._lock:
            return list(self.streams.live.values())

    @property
    def backpressure(self) -> int:
        return self.streams.backpressure

    @property
    def backpressure_peak(self) -> int:
        return self.streams.backpressure_peak

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
        handle = self.streams.new_handle(seq)
        with self._lock:
            try:
                self.memory.refuse_if_short()
                self._refuse_if_late(seq)
                self.scheduler.add(seq, now)
            except EdgeLLMError as exc:
                self.metrics.rejections.labels(exc.code).inc()
                self.events(Event.REJECTED, seq.id, code=exc.code, n_prompt_tokens=seq.n_prompt)
                raise
            self.streams.add(handle)
            self.events(
                Event.ADMITTED, seq.id, session=request.session, n_prompt_tokens=seq.n_prompt,
                max_tokens=request.max_tokens,
                kv_reserved_bytes=self.scheduler.reservation(seq) * self.kv.bytes_per_token,
                queue_position=self.scheduler.num_waiting,
            )  # fmt: skip
        self._wake.set()
        return handle

    def _refuse_if_late(self, seq: Sequence) -> None:
        """Lock held: with ``deadline_admission``, a request predicted to miss its TTFT
        time-out (its own, else the engine's) is refused at once (``admission.py``)."""
        deadline = seq.request.ttft_timeout(self.settings.ttft_timeout_s)
        if self.settings.deadline_admission and deadline:
            costs = self.scheduler.prefill_budget.costs
            refuse_if_late(self.scheduler.queue_view(seq), costs, deadline)

    def cancel(self, handle: StreamHandle, reason: str) -> None:
        """End a stream now; its KV cells are freed before the next decode."""
        with self._lock:
            self.streams.finish(handle, Cancelled(reason), StreamState.CANCELLED)
        self._wake.set()

    def cancel_all(self, reason: str) -> None:
        with self._lock:
            self.streams.finish_all(Cancelled(reason))
        self._wake.set()
        self._signal_touched()

    def pause(self, handle: StreamHandle, cause: PauseCause = PauseCause.CLIENT) -> bool:
        """Stop scheduling this sequence. The step already in flight may still
        produce one token; nothing after it. Returns False if already paused so."""
        with self._lock:
            if handle.finished:
                return False
            if cause is PauseCause.CLIENT:
                self.events(Event.PAUSE_RECEIVED, handle.id, n_generated=handle.seq.n_generated)
            return self.streams.add_pause(handle, cause)

    def resume(
        self, handle: StreamHandle, cause: PauseCause = PauseCause.CLIENT, **detail: Any
    ) -> bool:
        """``detail``: more fields for the ``resumed`` event."""
        with self._lock:
            if handle.finished:
                return False
            if cause is PauseCause.CLIENT:
                self.events(Event.RESUME_RECEIVED, handle.id, n_generated=handle.seq.n_generated)
            resumed = self.streams.remove_pause(handle, cause, **detail)
        if resumed:
            self._wake.set()
        return resumed

    def consumed(self, handle: StreamHandle, n_tokens: int) -> None:
        """The connection sent ``n_tokens`` more; resume a socket-full pause once
        the ring has drained to ``resume_threshold``."""
        handle.ring.commit(n_tokens)
        if PauseCause.SOCKET_FULL in handle.seq.pause_causes and handle.ring.drained():
            self.resume(handle, PauseCause.SOCKET_FULL)

    # -- the inference thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._step()
        except BaseException as exc:  # the thread must not die silently
            logging.getLogger("edge_llm.engine").exception("engine thread died")
            self._crash = exc
            with self._lock:
                self.streams.finish_all(BackendFailure(f"engine thread died: {exc!r}"))
            self._signal_touched()

    def _step(self) -> None:
        self._wake.clear()
        with self._lock:
            plan = self._plan(self.clock())  # time-outs, memory, offloads, the schedule
        self._apply(plan.kv_ops, plan.ended_samplers)  # its KV plan, before the decode
        # Samplers of the sequences it admitted, decoded now or not (one paused before
        # its first step is decoded after its resume: issue 59's harness found it).
        self.runner.start(plan.sampling)
        if not plan:
            return self._idle()
        guard = RunGuard(self._lock, self.streams)
        try:
            results = self._decode(plan, guard)
            with self._lock:
                self.output.publish(plan, results)  # tokens, text, rings, the ends of streams
                pending = self._pending()
        finally:
            guard.release()
        self._apply(*pending)  # streams that just ended free their cells now
        self._signal_touched()

    def _plan(self, now: float) -> StepPlan:
        """Lock held: time-outs and offloads first, then the scheduler's plan, with the
        KV operations and sampler frees due before its decode."""
        self.deadlines.expire(now)
        self.memory.relieve()
        self.preemption.run(now)
        self.offload.run(now)
        plan = self.scheduler.schedule(now, self.streams.draft_room)
        # One cancelled since its admission gets no sampler: nothing would end it. Decided
        # here, under the lock: a cancel between this plan and its decode must not take
        # the sampler of a chunk that samples (the engine thread died of it in CI).
        plan.sampling = [seq for seq in plan.started if not seq.state.finished]
        plan.kv_ops, plan.ended_samplers = self._pending()
        count_waiting(self)
        return plan

    def _pending(self) -> tuple[list[KvOp], list[str]]:
        """Lock held: KV operations and sampler frees not applied yet, in order."""
        return self.scheduler.take_kv_ops(), self.streams.take_ended_samplers()

    def _decode(self, plan: StepPlan, guard: RunGuard) -> list[ChunkResult]:
        """Decode, timing the step for the cost model."""
        if self.threads is not None:
            self.threads.before_step()
        began = self.clock()
        results = self.runner.decode(plan, guard.unpaused)
        took = self.clock() - began
        self.scheduler.observe_step(plan, took)
        if self.threads is not None:
            self.threads.observe(took)
        self.steps += 1
        return results

    def _apply(self, ops: list[KvOp], ended_samplers: list[str]) -> None:
        if failed := self.runner.apply(ops, ended_samplers):
            with self._lock:
                self.streams.fail_restores(failed)

    def _idle(self) -> None:
        """Nothing to decode: sleep until woken or the next time-out or offload is due."""
        self._signal_touched()
        with self._lock:
            timeout = self._idle_timeout()
        self._wake.wait(timeout)

    def _idle_timeout(self) -> float:
        """Lock held: seconds until the next time-out or offload falls due."""
        now = self.clock()
        due = [self.deadlines.next_due(), self.offload.next_due(now), self.memory.next_check(now)]
        wait = min([when - now for when in due if when is not None], default=_IDLE_WAIT_S)
        return max(0.0, min(_IDLE_WAIT_S, wait))

    # -- waking the event loop ---------------------------------------------------------------

    def _signal_touched(self) -> None:
        with self._lock:
            touched = self.streams.take_touched()
        if touched and self._waker is not None:
            self._waker.wake(touched)  # keeps the GIL: the loop runs while we decode

    # -- introspection -------------------------------------------------------------------------

    @property
    def kv_used_bytes(self) -> int:
        """Bytes of KV cells live streams hold, shared cells counted once."""
        return self.tier_bytes()["device_live"]

    @property
    def kv_cached_bytes(self) -> int:
        """Bytes of KV cells only the prefix cache holds (evicted when needed)."""
        return self.tier_bytes()["device_cached"]

    def tier_bytes(self) -> dict[str, int]:
        with self._lock:
            return tier_bytes(self)

    def ledger_lines(self) -> dict[str, int | None]:
        """The memory ledger's lines (``snapshot.ledger_lines``)."""
        with self._lock:
            return ledger_lines(self)

    def snapshot(self) -> dict[str, Any]:
        """The /debug/streams document."""
        with self._lock:
            return snapshot(self, self.clock())

    def progress(self, handle: StreamHandle) -> dict[str, Any]:
        """A stream's state, queue position, prefill progress and predicted wait."""
        with self._lock:
            return progress(self, handle)

    def locked(self, read: Callable[[Engine], float]) -> Callable[[], float]:
        """``read(engine)`` under the engine lock: what a scraped gauge calls."""

        def gauge() -> float:
            with self._lock:
                return read(self)

        return gauge


def _signal_all(handles: Iterable[StreamHandle]) -> None:
    for handle in handles:
        handle.signal()
