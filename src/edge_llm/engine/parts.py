"""What an engine is made of: one field per noun the step calls (``build.py`` wires
them; ``engine.py`` runs them)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from edge_llm.engine.kv.book import KvBook
from edge_llm.engine.kv.device import DeviceTier
from edge_llm.engine.kv.disk_cache import DiskTier
from edge_llm.engine.kv.host_cache import HostCache
from edge_llm.engine.kv.host_offload import HostOffload
from edge_llm.engine.kv.ledger import MemoryLedger
from edge_llm.engine.kv.tier import KvTier
from edge_llm.engine.pressure.memory import MemoryPolicy
from edge_llm.engine.pressure.offload import OffloadPolicy, PreemptionPolicy
from edge_llm.engine.runtime.backend import Backend
from edge_llm.engine.runtime.threads import ThreadGovernor
from edge_llm.engine.scheduling.scheduler import Scheduler
from edge_llm.engine.settings import EngineSettings
from edge_llm.engine.step.output import Output
from edge_llm.engine.step.runner import ModelRunner
from edge_llm.engine.streams.deadlines import Deadlines
from edge_llm.engine.streams.live import Streams
from edge_llm.observability.events import EventSink
from edge_llm.observability.metrics import EngineMetrics


@dataclass(eq=False)
class EngineParts:
    """Every part is built once, by ``build.build_parts``; the engine holds them as its
    own attributes (``Engine(parts)``), which is what /debug/streams and tests read."""

    backend: Backend
    settings: EngineSettings
    metrics: EngineMetrics
    events: EventSink
    clock: Callable[[], float]
    # Held briefly by every public method and by a step's planning, never by a decode.
    _lock: threading.RLock
    ledger: MemoryLedger  # this model's view of the process's ledger
    device: DeviceTier  # the KV context, allocated whole
    host_cache: HostCache
    host_offload: HostOffload
    disk: DiskTier  # holds nothing without cache_dir
    tiers: tuple[KvTier, ...]  # every KV tier, the device's first: the one list of them
    kv: KvBook
    scheduler: Scheduler
    streams: Streams
    deadlines: Deadlines
    offload: OffloadPolicy
    preemption: PreemptionPolicy
    runner: ModelRunner
    output: Output
    memory: MemoryPolicy
    threads: ThreadGovernor | None  # None: nothing to govern
    machine_bytes: int | None  # what doctor holds the ledger against
