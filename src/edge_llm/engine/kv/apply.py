"""Applying the KV books' operations through the backend (engine thread only)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from edge_llm.engine.kv.book import (
    CopyPrefix,
    KvOp,
    LoadCache,
    LoadState,
    SaveCache,
    SaveState,
    Truncate,
)
from edge_llm.engine.kv.tier import KvTier, SavedKv, StateTier
from edge_llm.engine.runtime.backend import Backend
from edge_llm.errors import BackendError
from edge_llm.observability.events import Event, EventSink
from edge_llm.observability.metrics import EngineMetrics


class KvApplier:
    """Runs :data:`KvOp` lists in order and reports them (events, metrics). A save or
    load goes to the state tier the operation names (``tier.StateTier``)."""

    def __init__(
        self,
        backend: Backend,
        tiers: Iterable[KvTier],
        *,
        metrics: EngineMetrics,
        events: EventSink,
        used_bytes: Callable[[], int],
    ) -> None:
        """``tiers``: the engine's list (``EngineParts.tiers``); those holding states
        are found by name."""
        self.backend = backend
        self.tiers = {t.name: t for t in tiers if isinstance(t, StateTier)}
        self.metrics = metrics
        self.events = events
        self.used_bytes = used_bytes

    def apply(self, ops: Iterable[KvOp]) -> list[tuple[str, BackendError]]:
        """Apply ``ops``; returns (sequence key, error) for states that could not
        be restored (those sequences must end)."""
        failed = []
        for op in ops:
            try:
                self._apply(op)
            except BackendError as exc:
                if not isinstance(op, LoadState | LoadCache):
                    raise  # a cache entry that fails to load fails its sequence's decode
                failed.append((op.key, exc))
        return failed

    def _apply(self, op: KvOp) -> None:
        if isinstance(op, CopyPrefix):
            self.backend.copy_prefix(op.src, op.dst, op.n_tokens)
        elif isinstance(op, Truncate):
            self.backend.truncate(op.seq_id, op.start)
            self._report_truncate(op)
        elif isinstance(op, SaveState | SaveCache):
            self.tiers[op.tier].store(op.key, SavedKv(self.backend.save_state(op.seq_id)))
        else:
            state = self._load(op)
            if isinstance(op, LoadState):
                self.metrics.kv_restores.inc()
                self.events(Event.RESTORED, op.key, slot=op.seq_id, state_bytes=len(state))

    def _load(self, op: LoadState | LoadCache) -> bytes:
        saved = self.tiers[op.tier].load(op.key)
        if saved is None:
            raise BackendError(f"no saved state for {op.key}")
        self.backend.load_state(op.seq_id, saved.state)
        return saved.state

    def _report_truncate(self, op: Truncate) -> None:
        if op.reason in ("release", "offload"):
            self.events(Event.KV_FREED, None, slot=op.seq_id, kv_tokens=op.n_tokens,
                kv_used_bytes=self.used_bytes(),
            )  # fmt: skip
        elif op.reason == "evict":
            self.metrics.kv_cache_evictions.inc()
            self.events(Event.CACHE_EVICTED, None, slot=op.seq_id, kv_tokens=op.n_tokens)
