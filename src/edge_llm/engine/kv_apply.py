"""Applying the KV cache's operations through the backend (engine thread only)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from edge_llm.engine.backend import Backend, BackendError
from edge_llm.engine.kv_cache import CopyPrefix, KvOp, LoadState, SaveState, Truncate
from edge_llm.engine.offload import HostStore
from edge_llm.observability.events import EventSink
from edge_llm.observability.metrics import EngineMetrics


class KvApplier:
    """Runs :data:`KvOp` lists in order and reports them (events, metrics)."""

    def __init__(
        self,
        backend: Backend,
        store: HostStore,
        metrics: EngineMetrics,
        events: EventSink,
        used_bytes: Callable[[], int],
    ) -> None:
        self.backend = backend
        self.store = store
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
                if not isinstance(op, LoadState):
                    raise
                failed.append((op.key, exc))
        return failed

    def _apply(self, op: KvOp) -> None:
        if isinstance(op, CopyPrefix):
            self.backend.copy_prefix(op.src, op.dst, op.n_tokens)
        elif isinstance(op, Truncate):
            self.backend.truncate(op.seq_id, op.start)
            self._report_truncate(op)
        elif isinstance(op, SaveState):
            self.store.put(op.key, self.backend.save_state(op.seq_id))
        else:
            state = self.store.pop(op.key)
            if state is None:
                raise BackendError(f"no saved state for {op.key}")
            self.backend.load_state(op.seq_id, state)
            self.metrics.kv_restores.inc()
            self.events("restored", op.key, slot=op.seq_id, state_bytes=len(state))

    def _report_truncate(self, op: Truncate) -> None:
        if op.reason in ("release", "offload"):
            self.events(
                "kv_freed", None, slot=op.seq_id, kv_tokens=op.n_tokens,
                kv_used_bytes=self.used_bytes(),
            )  # fmt: skip
        elif op.reason == "evict":
            self.metrics.kv_cache_evictions.inc()
            self.events("cache_evicted", None, slot=op.seq_id, kv_tokens=op.n_tokens)
