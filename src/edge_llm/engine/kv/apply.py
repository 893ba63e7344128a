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
from edge_llm.engine.kv.disk_cache import DiskCache, DiskEntry
from edge_llm.engine.kv.host_cache import HostCache
from edge_llm.engine.kv.host_offload import HostOffload
from edge_llm.engine.runtime.backend import Backend
from edge_llm.errors import BackendError
from edge_llm.observability.events import Event, EventSink
from edge_llm.observability.metrics import EngineMetrics


class KvApplier:
    """Runs :data:`KvOp` lists in order and reports them (events, metrics)."""

    def __init__(
        self,
        backend: Backend,
        store: HostOffload,
        cache: HostCache,
        *,
        disk: DiskCache | None = None,
        metrics: EngineMetrics,
        events: EventSink,
        used_bytes: Callable[[], int],
    ) -> None:
        self.backend = backend
        self.store = store
        self.cache = cache
        self.disk = disk
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
        elif isinstance(op, SaveState):
            self.store.put(op.key, self.backend.save_state(op.seq_id))
        elif isinstance(op, LoadState):
            state = self._load(op.seq_id, op.key, self.store.pop(op.key))
            self.metrics.kv_restores.inc()
            self.events(Event.RESTORED, op.key, slot=op.seq_id, state_bytes=len(state))
        elif isinstance(op, SaveCache):
            self._save_cache(op)
        else:
            self._load(op.seq_id, op.key, self.cache.loaded(op.key))

    def _save_cache(self, op: SaveCache) -> None:
        """Into the host tier, and through to the disk tier when there is one."""
        state = self.backend.save_state(op.seq_id)
        self.cache.put(op.key, state)
        entry = self.cache.entry(op.key)
        if self.disk is not None and entry is not None and entry.state is not None:
            self.disk.write(DiskEntry(entry.tokens, entry.n_prompt, state, entry.first_logits))

    def _load(self, seq_id: int, key: str, state: bytes | None) -> bytes:
        if state is None:
            raise BackendError(f"no saved state for {key}")
        self.backend.load_state(seq_id, state)
        return state

    def _report_truncate(self, op: Truncate) -> None:
        if op.reason in ("release", "offload"):
            self.events(Event.KV_FREED, None, slot=op.seq_id, kv_tokens=op.n_tokens,
                kv_used_bytes=self.used_bytes(),
            )  # fmt: skip
        elif op.reason == "evict":
            self.metrics.kv_cache_evictions.inc()
            self.events(Event.CACHE_EVICTED, None, slot=op.seq_id, kv_tokens=op.n_tokens)
