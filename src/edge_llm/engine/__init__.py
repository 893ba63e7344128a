"""The engine's face: what other rooms use of it; its rooms stay inside
(``tests/unit/test_layers.py`` holds the other rooms to these names)."""

from edge_llm.engine.build import build_engine
from edge_llm.engine.engine import Engine
from edge_llm.engine.kv.book import KvBook
from edge_llm.engine.kv.ledger import (
    Account,
    MemoryLedger,
    context_cells,
    device_share_bytes,
    kv_bytes_per_token,
    ledger_summary,
)
from edge_llm.engine.runtime.backend import Backend, BatchItem, context_tokens
from edge_llm.engine.runtime.heap import unmap_large_blocks_when_freed
from edge_llm.engine.runtime.threads import in_passing_thread
from edge_llm.engine.sequence import GenerationRequest
from edge_llm.engine.settings import EngineSettings, scheduler_limits
from edge_llm.engine.streams.handle import StreamHandle

__all__ = [
    "Account",
    "Backend",
    "BatchItem",
    "Engine",
    "EngineSettings",
    "GenerationRequest",
    "KvBook",
    "MemoryLedger",
    "StreamHandle",
    "build_engine",
    "context_cells",
    "context_tokens",
    "device_share_bytes",
    "in_passing_thread",
    "kv_bytes_per_token",
    "ledger_summary",
    "scheduler_limits",
    "unmap_large_blocks_when_freed",
]
