"""Host memory for the KV state of offloaded sequences, bounded in bytes: the store
the offload and preemption policies (``engine/pressure/offload.py``) send streams to.

The store is a line in the memory ledger (``ledger.py``): ``host_offload_mb`` is its
cap inside the ledger's, and a state is saved only where the ledger has room for it,
the prefix cache's host tier giving back its entries first."""

from __future__ import annotations

from collections import OrderedDict

from edge_llm.engine.kv.ledger import LedgerTier, MemoryLedger
from edge_llm.engine.kv.tier import SavedKv, SummaryPart, TierReading


class HostOffload(LedgerTier):
    """Saved sequence states by key (a stream's id), oldest first: a state tier
    (``tier.StateTier``). The engine decides what to drop when a new state would not
    fit (:meth:`oldest`); :meth:`store` never goes over its cap nor the ledger's."""

    name = "offload"

    def __init__(self, capacity_bytes: int, ledger: MemoryLedger | None = None) -> None:
        self.account = (ledger or MemoryLedger(None)).account("offload", "offload", capacity_bytes)
        self._states: OrderedDict[str, bytes] = OrderedDict()
        self._sizes: dict[str, int] = {}

    @property
    def enabled(self) -> bool:
        return self.capacity_bytes > 0

    def __contains__(self, key: str) -> bool:
        return key in self._states

    def __len__(self) -> int:
        return len(self._states)

    @property
    def reserved_bytes(self) -> int:
        """Room held for saves that have not run yet."""
        return sum(self._sizes[key] for key, state in self._states.items() if not state)

    def read(self) -> TierReading:
        """Its bytes as a KV tier (``tier.KvTier``)."""
        return TierReading(
            held={"offload": self.num_bytes},
            lines={"offload": self.num_bytes},
            ledger={"offload_cap_bytes": self.capacity_bytes},
            debug={"kv_offloaded_bytes": self.num_bytes},
            reserved_bytes=self.reserved_bytes,
            summary=SummaryPart("offload", self.num_bytes, {"cap": self.capacity_bytes}),
        )

    def fits(self, num_bytes: int) -> bool:
        """Whether a state of ``num_bytes`` can be saved now (the host prefix tier
        giving back its entries if it must)."""
        return self.account.could_hold(num_bytes)

    def could_ever_hold(self, num_bytes: int) -> bool:
        """Whether it would fit once every offloaded state were dropped too."""
        ledger = self.account.ledger
        room = self.num_bytes + ledger.free_bytes + ledger.givable(besides=self.account)
        return num_bytes <= min(self.capacity_bytes, room)

    def oldest(self, skip: set[str] | frozenset[str] = frozenset()) -> str | None:
        return next((key for key in self._states if key not in skip), None)

    def reserve(self, key: str, num_bytes: int) -> bool:
        """Hold room for a state about to be saved (the save runs a little later);
        False, nothing held, when the room could not be made (an entry the host tier
        counted on giving back is about to be loaded, or its engine is busy)."""
        if not self.account.reserve(num_bytes):
            return False
        self._states[key] = b""
        self._sizes[key] = num_bytes
        return True

    def store(self, key: str, saved: SavedKv) -> bool:
        """Keep a state, in the room reserved for it if there was one (kept, not
        given back and asked again: another thread could take it meanwhile)."""
        state = saved.state
        reserved = self._sizes.get(key)
        if reserved is not None and len(state) <= reserved:
            self.account.release(reserved - len(state))
            self._states[key], self._sizes[key] = state, len(state)
            return True
        self.evict(key)
        if not self.account.reserve(len(state)):
            raise ValueError(f"{len(state)} bytes do not fit: {self.num_bytes} used")
        self._states[key] = state
        self._sizes[key] = len(state)
        return True

    def load(self, key: str) -> SavedKv | None:
        """A stream's state as it comes back: it leaves host memory (its cells are
        back on the device)."""
        state = self._states.get(key)
        self.evict(key)
        return SavedKv(state) if state is not None else None

    def evict(self, key: str) -> int:
        self._states.pop(key, None)
        size = self._sizes.pop(key, 0)
        self.account.release(size)
        return size
