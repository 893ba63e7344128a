"""The device tier: the KV context llama.cpp allocates whole at start (its ledger line
is the whole context); which of its cells are live or cached is the KV book's.

A tier of the list, not a state tier (``tier.py`` says why): its reserve is
:func:`reserve_context`, once, before the engine is built."""

from __future__ import annotations

from dataclasses import dataclass

from edge_llm.engine.kv.book import KvBook
from edge_llm.engine.kv.ledger import Account, MemoryLedger
from edge_llm.engine.kv.tier import SummaryPart, TierReading
from edge_llm.errors import BackendError


@dataclass
class DeviceTier:
    account: Account
    kv: KvBook
    name = "device"

    def read(self) -> TierReading:
        stats, per_token = self.kv.stats(), self.kv.bytes_per_token
        live, cached = stats.used_tokens * per_token, stats.cached_tokens * per_token
        context = self.account.num_bytes
        free = max(0, context - live - cached)
        return TierReading(
            held={"device_live": live, "device_cached": cached},
            lines={"device_live": live, "device_cached": cached, "device_free": free},
            ledger={"device_bytes": context},
            debug={"kv_used_bytes": live, "kv_cached_bytes": cached},
            summary=SummaryPart("KV context", context, {"live": live, "cached": cached}),
        )

    def close(self) -> None:
        self.account.close()


def reserve_context(ledger: MemoryLedger, kv: KvBook) -> DeviceTier:
    """The KV context's line, allocated whole (as the KV book sizes it); a model the
    pool loads reserved it before loading. Raises ``BackendError`` when it does not fit
    the ledger's cap (and leaves no line of the model behind)."""
    device = ledger.line("device") or ledger.account("device", "device")
    if not device.resize(kv.capacity_bytes):
        ledger.close_model()  # no line of a model that does not start stays
        raise BackendError(
            f"the KV context ({kv.capacity_bytes >> 20} MiB: whole blocks of 256 "
            f"cells) does not fit max_kv_cache_mb ({(ledger.cap_bytes or 0) >> 20})"
        )
    return DeviceTier(device, kv)
