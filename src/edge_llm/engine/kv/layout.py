"""Which KV book a backend's layout asks for (``book.py``)."""

from __future__ import annotations

from edge_llm.engine.kv.book import KvBook
from edge_llm.engine.kv.host_cache import HostCache
from edge_llm.engine.kv.slots import KvSlots
from edge_llm.engine.kv.unified import KvCache
from edge_llm.engine.runtime.backend import Backend


def kv_book(backend: Backend, prefix_cache: bool, host_cache: HostCache) -> KvBook:
    """The unified pool shares prefix cells between sequences (``kv/unified.py``); the
    per-slot layout keeps them in slots and the host tier (``kv/slots.py``)."""
    capacity, per_token = backend.kv_capacity_tokens, backend.info.kv_bytes_per_token
    if backend.kv_sequence_tokens >= capacity:
        return KvCache(capacity, per_token, backend.num_seq_ids, share=prefix_cache)
    return KvSlots(
        capacity, per_token, backend.num_seq_ids, backend.kv_sequence_tokens,
        prefix_cache=prefix_cache, host=host_cache,
    )  # fmt: skip
