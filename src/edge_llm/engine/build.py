"""How an engine is wired: which part each part is given (``parts.py`` names them).

The order matters where the ledger does: the host cache is accounted before the KV
context is sized against the cap, and a model whose context does not fit leaves no
line behind."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from edge_llm.engine.engine import Engine
from edge_llm.engine.kv.apply import KvApplier
from edge_llm.engine.kv.book import KvBook
from edge_llm.engine.kv.device import reserve_context
from edge_llm.engine.kv.disk_cache import DiskTier, disk_cache
from edge_llm.engine.kv.host_cache import HostCache
from edge_llm.engine.kv.host_offload import HostOffload
from edge_llm.engine.kv.layout import kv_book
from edge_llm.engine.kv.ledger import MemoryLedger, try_giver
from edge_llm.engine.parts import EngineParts
from edge_llm.engine.pressure.memory import (
    MemoryGuard,
    MemoryPolicy,
    MemorySource,
    ProcMemory,
    machine_memory_bytes,
)
from edge_llm.engine.pressure.offload import OffloadPolicy, PreemptionPolicy
from edge_llm.engine.runtime.backend import Backend
from edge_llm.engine.runtime.threads import CoreReadings, thread_governor
from edge_llm.engine.scheduling.scheduler import Scheduler
from edge_llm.engine.settings import EngineSettings, scheduler_limits
from edge_llm.engine.step.output import Output
from edge_llm.engine.step.runner import ModelRunner
from edge_llm.engine.streams.deadlines import Deadlines
from edge_llm.engine.streams.live import Streams
from edge_llm.observability.events import EventSink, null_sink
from edge_llm.observability.metrics import EngineMetrics


def build_engine(
    backend: Backend,
    settings: EngineSettings,
    *,
    metrics: EngineMetrics | None = None,
    events: EventSink = null_sink,
    clock: Callable[[], float] = time.monotonic,
    memory: MemorySource | None = None,
    cores: CoreReadings | None = None,
    ledger: MemoryLedger | None = None,
) -> Engine:
    """An engine over ``backend``, not started. ``memory``: where available device
    memory is read (default: /proc); ``cores``: what the thread governor reads of the
    cores (default: /proc); ``ledger``: the process's memory ledger, which every loaded
    model's KV shares (default: one of its own, capped at ``memory_cap_bytes``).
    Raises ``BackendError`` when the KV context does not fit the ledger's cap."""
    parts = build_parts(backend, settings, metrics=metrics, events=events, clock=clock,
                        memory=memory, cores=cores, ledger=ledger)  # fmt: skip
    return Engine(parts)


def build_parts(
    backend: Backend,
    settings: EngineSettings,
    *,
    metrics: EngineMetrics | None = None,
    events: EventSink = null_sink,
    clock: Callable[[], float] = time.monotonic,
    memory: MemorySource | None = None,
    cores: CoreReadings | None = None,
    ledger: MemoryLedger | None = None,
) -> EngineParts:
    """The parts ``build_engine`` gives an engine (a test's engine class takes them too)."""
    metrics = metrics or EngineMetrics()
    lock = threading.RLock()
    # Every KV tier's bytes; this model's lines are tagged with its name.
    own = (ledger or MemoryLedger(settings.memory_cap_bytes)).for_model(backend.info.model_id)
    disk = DiskTier(disk_cache(settings.cache_dir, settings.cache_dir_bytes, backend))
    host_cache = HostCache(
        settings.host_cache_bytes, backend.info.kv_bytes_per_token, own,
        lambda give: try_giver(lock, give), below=disk,
    )  # fmt: skip
    kv = kv_book(backend, settings.prefix_cache, host_cache)
    device = reserve_context(own, kv)
    host_offload = HostOffload(settings.host_offload_bytes, own)
    tiers = (device, host_cache, host_offload, disk)  # every KV tier: the one list
    scheduler = Scheduler(scheduler_limits(backend.max_sequences, settings), kv)
    streams = Streams(
        scheduler, host_offload, settings, metrics=metrics, events=events, clock=clock
    )
    offload = OffloadPolicy(
        host_offload, settings.offload_paused_after_s, streams, backend.state_size
    )
    applier = KvApplier(
        backend, tiers, metrics=metrics, events=events, used_bytes=_live_bytes(lock, kv)
    )
    guard = MemoryGuard(settings.min_available_bytes, memory or ProcMemory(), clock)
    return EngineParts(
        backend=backend, settings=settings, metrics=metrics, events=events, clock=clock,
        _lock=lock, ledger=own, device=device, host_cache=host_cache,
        host_offload=host_offload, disk=disk, kv=kv, scheduler=scheduler, streams=streams,
        tiers=tiers, deadlines=Deadlines(settings, streams), offload=offload,
        preemption=PreemptionPolicy(offload, settings.max_preemptions),
        runner=ModelRunner(backend, applier, prefill_apart=kv.per_slot),
        output=Output(streams, backend, settings, clock),
        memory=MemoryPolicy(guard, host_cache, streams),
        threads=thread_governor(backend, settings.adaptive_threads, clock, cores, events),
        machine_bytes=machine_memory_bytes(),
    )  # fmt: skip


def _live_bytes(lock: threading.RLock, kv: KvBook) -> Callable[[], int]:
    """Bytes of KV cells live streams hold, read under the engine lock (the applier
    reads it from the engine thread, between steps)."""

    def read() -> int:
        with lock:
            return kv.stats().used_tokens * kv.bytes_per_token

    return read
