"""Running a step's plan on the backend (engine thread only, no lock): samplers, KV
operations and the decode, with a failure isolated to the sequence that caused it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from edge_llm.engine.kv.apply import KvApplier
from edge_llm.engine.kv.book import KvOp
from edge_llm.engine.runtime.backend import Backend, BatchItem, Sampled
from edge_llm.engine.scheduling.scheduler import ScheduledChunk, StepPlan
from edge_llm.engine.sequence import Sequence
from edge_llm.errors import BackendError


@dataclass
class ChunkResult:
    """A decoded chunk: its accepted run of sampled tokens (when it samples) or the
    error that failed it."""

    chunk: ScheduledChunk
    run: list[Sampled] | None = None
    error: BackendError | None = None


class ModelRunner:
    def __init__(self, backend: Backend, kv_ops: KvApplier, *, prefill_apart: bool) -> None:
        """``prefill_apart``: each prompt chunk gets a ``llama_decode`` of its own, apart
        from the decode rows (per-slot layout: llama.cpp would otherwise split the
        batch so that a chunk's first row shares a ubatch with the decode rows, and
        that row would be computed as they are, not as the rest of its chunk)."""
        self.backend = backend
        self.kv_ops = kv_ops
        self.prefill_apart = prefill_apart

    def apply(self, ops: list[KvOp], ended_samplers: list[str]) -> list[tuple[str, BackendError]]:
        """Free ended sequences' samplers, then apply KV operations in order; returns
        (sequence key, error) for the states that could not be restored."""
        for key in ended_samplers:
            self.backend.end_sequence(key)
        return self.kv_ops.apply(ops)

    def start(self, started: list[Sequence]) -> None:
        for seq in started:
            request = seq.request
            self.backend.start_sequence(seq.id, request.sampling.with_prompt(request.prompt_tokens))

    def decode(self, plan: StepPlan, unpaused: Callable[[str], bool]) -> list[ChunkResult]:
        """Decode the whole plan; on failure, retry each chunk alone so one bad
        sequence fails by itself and the others go on. ``unpaused(key)`` is asked
        between the tokens of an accepted draft run."""
        return [
            result for batch in self._batches(plan) for result in self._isolated(batch, unpaused)
        ]

    def _batches(self, plan: StepPlan) -> list[list[ScheduledChunk]]:
        if not self.prefill_apart:
            return [plan.chunks]
        prompt = [c for c in plan.chunks if c.prompt]
        rest = [c for c in plan.chunks if not c.prompt]
        # The tokens' batch last: sampling it may take the engine lock (RunGuard) until
        # the step is recorded, which a prompt's batch after it would prolong.
        return [*([c] for c in prompt), rest] if rest else [[c] for c in prompt]

    def _isolated(
        self, chunks: list[ScheduledChunk], unpaused: Callable[[str], bool]
    ) -> list[ChunkResult]:
        try:
            return self._decode(chunks, unpaused)
        except BackendError as exc:
            if len(chunks) == 1:
                return [ChunkResult(chunks[0], error=exc)]
        return [result for chunk in chunks for result in self._alone(chunk, unpaused)]

    def _alone(self, chunk: ScheduledChunk, unpaused: Callable[[str], bool]) -> list[ChunkResult]:
        try:
            return self._decode([chunk], unpaused)
        except BackendError as exc:
            return [ChunkResult(chunk, error=exc)]

    def _decode(
        self, chunks: list[ScheduledChunk], unpaused: Callable[[str], bool]
    ) -> list[ChunkResult]:
        items = [_batch_item(c) for c in chunks if c.logits is None]
        runs = iter(self.backend.decode_runs(items, unpaused) if items else ())
        return [ChunkResult(c, self._run_of(c, runs)) for c in chunks]

    def _run_of(self, chunk: ScheduledChunk, runs: Iterator[list[Sampled]]) -> list[Sampled] | None:
        if chunk.logits is not None:
            return [self.backend.sample_from(chunk.seq.id, chunk.logits)]
        return next(runs) if chunk.sample else None


def _batch_item(chunk: ScheduledChunk) -> BatchItem:
    seq = chunk.seq
    return BatchItem(
        seq.require_slot(), chunk.tokens, chunk.start_pos, chunk.sample, seq.id,
        chunk.n_draft, keep_logits=chunk.keep_logits, n_pad=chunk.n_pad,
    )  # fmt: skip
