"""The ``/debug/streams`` document: live and recent streams, KV and backpressure totals."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol, Self

from edge_llm.engine.kv.book import KvBook
from edge_llm.engine.kv.ledger import MemoryLedger
from edge_llm.engine.kv.tier import KvTier, SummaryPart
from edge_llm.engine.pressure.memory import MemoryPolicy
from edge_llm.engine.runtime.backend import Backend
from edge_llm.engine.scheduling.admission import predict_ttft_s
from edge_llm.engine.scheduling.scheduler import Scheduler
from edge_llm.engine.streams.handle import StreamHandle
from edge_llm.engine.streams.live import Streams
from edge_llm.observability.metrics import EngineMetrics


class EngineView(Protocol):
    """What these readings take of the engine (``engine.Engine``, which calls them
    with itself), read-only, so that this module does not import the engine's."""

    # fmt: off
    @property
    def backend(self) -> Backend: ...
    @property
    def metrics(self) -> EngineMetrics: ...
    @property
    def ledger(self) -> MemoryLedger: ...
    @property
    def kv(self) -> KvBook: ...
    @property
    def tiers(self) -> tuple[KvTier, ...]: ...
    @property
    def scheduler(self) -> Scheduler: ...
    @property
    def streams(self) -> Streams: ...
    @property
    def memory(self) -> MemoryPolicy: ...
    @property
    def machine_bytes(self) -> int | None: ...
    @property
    def steps(self) -> int: ...
    @property
    def alive(self) -> bool: ...
    def locked(self, read: Callable[[Self], float]) -> Callable[[], float]: ...
    def tier_bytes(self) -> dict[str, int]: ...
    def ledger_lines(self) -> dict[str, int | None]: ...
    # fmt: on


def snapshot(engine: EngineView, now: float) -> dict[str, Any]:
    """Engine lock held."""
    streams = engine.streams
    handles = [*streams.live.values(), *streams.recent(now)]
    kv = engine.kv
    return {
        "streams": [describe(handle, now) for handle in handles],
        **{name: value for tier in engine.tiers for name, value in tier.read().debug.items()},
        "kv_layout": "per_slot" if kv.per_slot else "pool",
        **memory_fields(engine),
        "memory_ledger": ledger_fields(engine),
        "decode_threads": engine.backend.n_threads,
        "kv_budget_bytes": kv.capacity_bytes,
        "kv_reserved_bytes": kv.reserved_bytes,
        "kv_bytes_per_token": kv.bytes_per_token,
        "kv_sequence_tokens": kv.sequence_tokens,
        "requests_running": engine.scheduler.num_running,
        "requests_waiting": engine.scheduler.num_waiting,
        "backpressure": streams.backpressure,
        "backpressure_peak": streams.backpressure_peak,
        "engine_alive": engine.alive,
        "steps": engine.steps,
    }


def describe(handle: StreamHandle, now: float) -> dict[str, Any]:
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
        "pauses": seq.pauses.count,
        "paused_ms": round(seq.paused_ms(now), 3),
        "backpressure": seq.backpressure,
        "backpressure_peak": seq.backpressure_peak,
        "tokens_while_paused": seq.tokens_while_paused,
        "ttft_ms": handle.stats(now)["ttft_ms"],
        "finish_reason": seq.finish_reason,
        "cancel_reason": seq.cancel_reason,
        "age_ms": round((now - seq.created_at) * 1000.0, 3),
        "priority": seq.priority,
        "preemptions": seq.preemptions,
    }


def memory_fields(engine: EngineView) -> dict[str, Any]:
    guard = engine.memory.guard
    last = guard.last
    return {
        "memory_min_available_bytes": guard.floor_bytes,
        "memory_available_bytes": last.available_bytes if last else None,
        "memory_pressure": guard.under_pressure,
        "memory_source": last.source if last else None,
        "memory_pressure_avg10": last.pressure_avg10 if last else None,
    }


def ledger_fields(engine: EngineView) -> dict[str, Any]:
    """Engine lock held: the memory ledger's lines (``ledger.py``), in bytes: each KV
    tier's (the KV context: live, cached and free cells; each host tier with its cap),
    the embeddings context, saves in flight, every other loaded model's lines, the
    total against the cap, the weights beside it (outside the cap), and each tier in
    memory's part of the summary line, in the list's order."""
    ledger, readings = engine.ledger, [tier.read() for tier in engine.tiers]
    return {
        "cap_bytes": ledger.cap_bytes,
        "total_bytes": ledger.used_bytes,
        "free_bytes": ledger.free_bytes if ledger.shared else None,
        "weights_bytes": engine.backend.info.size_bytes,
        **{f"{line}_bytes": n for r in readings for line, n in r.lines.items()},
        **{name: value for r in readings for name, value in r.ledger.items()},
        "embeddings_bytes": ledger.by_kind().get("embeddings", 0),
        "reserve_bytes": sum(r.reserved_bytes for r in readings),
        "other_models_bytes": ledger.used_bytes - ledger.own_bytes,  # their every line
        "machine_bytes": engine.machine_bytes,
        "tiers": [_summary_part(r.summary) for r in readings if r.summary is not None],
    }


def _summary_part(part: SummaryPart) -> dict[str, Any]:
    """A tier's part of the serve banner's line (``ledger.ledger_summary``)."""
    return {"label": part.label, "bytes": part.num_bytes, "detail": part.detail}


def ledger_lines(engine: EngineView) -> dict[str, int | None]:
    """Engine lock held: the ledger as ``memory_ledger_bytes{line}`` exports it: the
    tiers' lines, then the ledger's own."""
    fields = ledger_fields(engine)
    tiers = {line: n for tier in engine.tiers for line, n in tier.read().lines.items()}
    own = {line: fields[f"{line}_bytes"] for line in ("embeddings", "reserve", "other_models")}
    return {**tiers, **own, "total": fields["total_bytes"], "cap": fields["cap_bytes"]}


def tier_bytes(engine: EngineView) -> dict[str, int]:
    """Engine lock held: bytes of KV per tier (``kv_cache_tier_bytes{tier}``): running
    streams' and cached cells on the device, each host tier, the disk."""
    return {name: n for tier in engine.tiers for name, n in tier.read().held.items()}


def bind_gauges(engine: EngineView) -> None:
    """The engine's gauges read its state, under its lock, when scraped."""
    metrics = engine.metrics
    metrics.bind_gauges(
        running=engine.locked(lambda e: e.scheduler.num_running),
        waiting=engine.locked(lambda e: e.scheduler.num_waiting),
        paused=engine.locked(lambda e: e.streams.count_paused()),
        kv_used=engine.locked(lambda e: tier_bytes(e)["device_live"]),
        backpressure_peak=engine.locked(lambda e: e.streams.backpressure_peak),
        kv_usage=engine.locked(lambda e: e.kv.stats().used_tokens / e.kv.capacity_tokens),
    )
    metrics.streams_detached.set_function(engine.locked(lambda e: e.streams.count_detached()))
    metrics.bind_tiers(engine.tier_bytes)
    metrics.bind_ledger(engine.ledger_lines)
    metrics.memory_available.set_function(engine.locked(_memory_available))
    metrics.decode_threads.set_function(lambda: engine.backend.n_threads)


def _memory_available(engine: EngineView) -> float:
    last = engine.memory.guard.last
    return float(last.available_bytes) if last else float("nan")


def progress(engine: EngineView, handle: StreamHandle) -> dict[str, Any]:
    """Engine lock held: what a client waiting for a first token can show: its state
    (queued, prefill, preempted, decoding, ...), its place in the queue, the prompt
    prefilled so far and the predicted wait for its first token."""
    seq = handle.seq
    scheduler = engine.scheduler
    waiting = seq.first_token_at is None and not seq.state.finished
    predicted = None
    if waiting:
        view = scheduler.queue_view(seq)
        predicted = round(predict_ttft_s(view, scheduler.prefill_budget.costs) * 1000.0)
    return {
        "state": seq.public_state(),
        "queue_position": scheduler.queue_position(seq),
        "prefill_done": seq.n_prefilled,
        "prefill_total": seq.n_prompt,
        "predicted_wait_ms": predicted,
    }


def count_waiting(engine: EngineView) -> None:
    """Engine lock held: the waiting requests by priority, for the labelled gauge."""
    counts = Counter(str(seq.priority) for seq in engine.scheduler.waiting)
    engine.metrics.set_waiting_by_priority(counts)
