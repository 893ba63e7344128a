"""The device tier: the KV context llama.cpp allocates whole at start (its ledger line
is the whole context); which of its cells are live or cached is the KV book's."""

from __future__ import annotations

from dataclasses import dataclass

from edge_llm.engine.kv.book import KvBook
from edge_llm.engine.kv.ledger import Account
from edge_llm.engine.kv.tier import TierReading


@dataclass
class DeviceTier:
    account: Account
    kv: KvBook

    def read(self) -> TierReading:
        stats, per_token = self.kv.stats(), self.kv.bytes_per_token
        live, cached = stats.used_tokens * per_token, stats.cached_tokens * per_token
        free = max(0, self.account.num_bytes - live - cached)
        return TierReading(
            held={"device_live": live, "device_cached": cached},
            lines={"device_live": live, "device_cached": cached, "device_free": free},
            ledger={"device_bytes": self.account.num_bytes},
            debug={"kv_used_bytes": live, "kv_cached_bytes": cached},
        )

    def close(self) -> None:
        self.account.close()
