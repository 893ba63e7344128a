"""Which sequences run in the next decode step: pure policy, no model, no I/O.

Each step holds one token of every decoding sequence that is not paused, and
then prompt chunks of prefilling sequences, shortest remaining prompt first, up
to ``prefill_chunk_tokens``. A long prompt is therefore prefilled over many
steps while the others keep decoding, and a short request that arrives during
it gets its first token after one chunk, not after the whole prompt.

Admission needs a free slot plus a KV reservation of prompt + max_tokens; it
happens on arrival when both are free, else the request waits in a bounded
FIFO. Freed slots are handed to the engine (``take_released``) so it can free
their KV cells before the next decode.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from edge_llm.engine.kv import KvBudget
from edge_llm.engine.sequence import Sequence, SequenceState
from edge_llm.errors import KvBudgetExceeded, KvBudgetNeverFits, QueueFull


@dataclass(frozen=True)
class SchedulerLimits:
    max_sequences: int
    max_queue: int
    prefill_chunk_tokens: int

    @property
    def max_batch_tokens(self) -> int:
        return self.max_sequences + self.prefill_chunk_tokens


@dataclass
class ScheduledChunk:
    seq: Sequence
    tokens: list[int]
    start_pos: int
    sample: bool


@dataclass
class StepPlan:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    started: list[Sequence] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.chunks)


class Scheduler:
    def __init__(self, limits: SchedulerLimits, kv: KvBudget) -> None:
        self.limits = limits
        self.kv = kv
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        # A heap: the lowest free slot goes first, keeping busy seq ids consecutive
        # (with per-slot KV, llama.cpp decodes each run of consecutive ids apart).
        self._free_slots = list(range(limits.max_sequences))
        self._released: list[int] = []
        self._started: list[Sequence] = []  # admitted since the last step

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    # -- admission ------------------------------------------------------------

    @staticmethod
    def reservation(seq: Sequence) -> int:
        return seq.n_prompt + seq.request.max_tokens

    def add(self, seq: Sequence, now: float) -> None:
        """Admit a new sequence at once if a slot and its KV are free, else queue
        it; or raise the admission error the client gets."""
        need = self.reservation(seq)
        if not self.kv.could_ever_fit(need):
            raise KvBudgetNeverFits(
                f"prompt + max_tokens needs {need} KV tokens but {self._never_fits_limit()}; "
                "lower max_tokens or raise max_kv_cache_mb",
                param="max_tokens",
                kv_tokens_needed=need,
                kv_tokens_budget=self.kv.sequence_tokens,
            )
        if not self.waiting and self._free_slots and self.kv.can_allocate(need):
            self._admit(seq, now)
            self._started.append(seq)
            return
        if len(self.waiting) < self.limits.max_queue:
            self.waiting.append(seq)
            return
        if self._free_slots:
            raise KvBudgetExceeded(
                f"KV budget in use: {need} tokens needed, {self.kv.num_free} free, "
                "and the queue is full",
                retry_after_s=2,
            )
        raise QueueFull(
            f"{len(self.running)} sequences running and {len(self.waiting)} waiting",
            retry_after_s=2,
        )

    def _never_fits_limit(self) -> str:
        if self.kv.sequence_tokens < self.kv.capacity_tokens:
            return f"one sequence may hold at most {self.kv.sequence_tokens} (kv_unified = false)"
        return f"the whole budget holds {self.kv.capacity_tokens}"

    def _admit(self, seq: Sequence, now: float) -> None:
        need = self.reservation(seq)
        self.kv.allocate(need)
        seq.kv_reserved_tokens = need
        seq.slot = heapq.heappop(self._free_slots)
        seq.state = SequenceState.PREFILL
        seq.admitted_at = now
        self.running.append(seq)

    def _admit_waiting(self, now: float) -> list[Sequence]:
        started = []
        while self.waiting and self._free_slots:
            seq = self.waiting[0]
            if not self.kv.can_allocate(self.reservation(seq)):
                break  # FIFO: a large request is not starved by smaller ones behind it
            self.waiting.popleft()
            self._admit(seq, now)
            started.append(seq)
        return started

    # -- the step -----------------------------------------------------------------

    def schedule(self, now: float) -> StepPlan:
        started, self._started = self._started, []
        plan = StepPlan(started=[*started, *self._admit_waiting(now)])
        plan.chunks.extend(
            ScheduledChunk(seq, [seq.last_token], seq.kv_tokens, sample=True)
            for seq in self.running
            if seq.runnable and seq.state is SequenceState.DECODING and seq.last_token is not None
        )
        plan.chunks.extend(self._prefill_chunks())
        return plan

    def _prefill_chunks(self) -> list[ScheduledChunk]:
        budget = self.limits.prefill_chunk_tokens
        prefilling = [s for s in self.running if s.runnable and s.state is SequenceState.PREFILL]
        chunks = []
        for seq in sorted(prefilling, key=lambda s: s.prefill_remaining):
            if budget <= 0:
                break
            n = min(seq.prefill_remaining, budget)
            start = seq.n_prefilled
            tokens = seq.request.prompt_tokens[start : start + n]
            chunks.append(ScheduledChunk(seq, tokens, start, sample=n == seq.prefill_remaining))
            budget -= n
        return chunks

    @staticmethod
    def complete(chunk: ScheduledChunk) -> None:
        """Record that a chunk was decoded (before its sampled token is recorded)."""
        seq = chunk.seq
        if seq.state is SequenceState.PREFILL:
            seq.n_prefilled += len(chunk.tokens)
            if chunk.sample:
                seq.state = SequenceState.DECODING

    @staticmethod
    def record_token(seq: Sequence, token: int, now: float) -> None:
        seq.n_generated += 1
        seq.last_token = token
        if seq.first_token_at is None:
            seq.first_token_at = now

    # -- the end --------------------------------------------------------------------

    def finish(self, seq: Sequence, state: SequenceState, now: float) -> None:
        """End a sequence: give back its slot and KV reservation."""
        if seq.state.finished:
            return
        seq.state = state
        seq.finished_at = now
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
        if seq.slot is not None:
            self._released.append(seq.slot)
            heapq.heappush(self._free_slots, seq.slot)
        if seq.kv_reserved_tokens:
            self.kv.free(seq.kv_reserved_tokens)
            seq.kv_reserved_tokens = 0

    def take_released(self) -> list[int]:
        """Slots whose KV cells must be freed before the next decode."""
        released, self._released = self._released, []
        return released
