"""The one interface every KV tier implements: what it holds, read for the ledger,
``/debug/streams`` and the ``kv_cache_tier_bytes`` gauge, and its close.

The tiers are the device's KV context (``device.py``), the prefix cache's host tier
(``host_cache.py``), offloaded streams (``host_offload.py``) and the disk tier
(``disk_cache.py``); one list names them (``EngineParts.tiers``, built in
``engine/build.py``). How KV moves between them is not shared: cells on the device are
the KV book's, host states are bytes the applier copies, the disk is written through
(``apply.py``). What every reader asks of all of them alike is this accounting, so a
new tier is its own module and one entry in that list."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class TierReading:
    """What a tier holds now (read under its engine's lock)."""

    held: dict[str, int]  # kv_cache_tier_bytes{tier}: bytes per label
    lines: dict[str, int] = field(default_factory=dict)  # memory_ledger_bytes{line}
    ledger: dict[str, Any] = field(default_factory=dict)  # more of the ledger's document
    debug: dict[str, Any] = field(default_factory=dict)  # its fields in /debug/streams
    reserved_bytes: int = 0  # held for saves that have not run (the ledger's reserve)


class KvTier(Protocol):
    def read(self) -> TierReading: ...

    def close(self) -> None:
        """Its model is gone: what it holds leaves the ledger (after the last step)."""
        ...
