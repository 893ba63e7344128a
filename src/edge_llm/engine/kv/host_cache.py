"""The prefix cache's host-memory tier: saved KV states of finished prompts, LRU,
bounded in bytes (``[engine.cache] host_cache_mb``).

In the per-slot layout a finished sequence keeps its cells in its slot until the slot
is needed by a request that cannot use them; then the cells are saved here (a copy of
the slot's state, what offload uses) and the slot is reused. A later request whose
prompt starts the same way gets them back into whichever slot it runs in: as
llama-server's ``--cache-ram`` does, and without any decode scanning them meanwhile.

Its bytes are a line in the memory ledger (``ledger.py``): ``host_cache_mb`` is its
cap inside the ledger's, and it takes only what the ledger has free. It is the tier
that gives back first: when an offload, an embeddings context or a model load needs
room, its least recently used entries go (never one a pending load will read).

Pure bookkeeping plus the saved bytes: :class:`KvSlots` decides what is saved and
loaded, the engine thread copies the bytes (``kv/apply.py``).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from edge_llm.engine.kv.ledger import Giver, LedgerTier, MemoryLedger
from edge_llm.engine.kv.tier import TierReading

# A saved state holds, beside the K and V rows, each cell's position and sequence ids
# and a small header: an upper bound used to reserve room before the save runs.
STATE_BYTES_PER_CELL = 16
STATE_HEADER_BYTES = 4096


@dataclass
class HostEntry:
    key: str
    tokens: tuple[int, ...]  # what its cells hold, in order
    n_prompt: int  # the prompt of the sequence they came from (its first n_prompt tokens)
    num_bytes: int  # reserved, then the saved state's size
    first_logits: Any = None
    state: bytes | None = field(default=None, repr=False)  # None until the save ran
    hits: int = 0
    origin: str = "host"  # "disk": read back from the disk tier at start
    pending_loads: int = 0  # loads decided, not applied yet: the entry must stay


class HostCache(LedgerTier):
    def __init__(
        self,
        capacity_bytes: int,
        bytes_per_token: int,
        ledger: MemoryLedger | None = None,
        wrap_giver: Callable[[Giver], Giver] | None = None,
    ) -> None:
        """``ledger``: the memory ledger it is a line of (None: one of its own, no
        common cap); ``wrap_giver``: how another thread reaches :meth:`give_back`
        (under the engine's lock)."""
        self.bytes_per_token = bytes_per_token
        self.hits = 0
        self.evictions = 0
        self._entries: OrderedDict[str, HostEntry] = OrderedDict()  # least recently used first
        self._keys = itertools.count()
        giver = wrap_giver(self.give_back) if wrap_giver else self.give_back
        ledger = ledger or MemoryLedger(None)
        self.account = ledger.account("host_cache", "host_cache", capacity_bytes, giver)

    @property
    def enabled(self) -> bool:
        return self.capacity_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def entries(self) -> list[HostEntry]:
        return list(self._entries.values())

    def estimate(self, n_cells: int) -> int:
        """Room to reserve for a saved state of ``n_cells`` cells."""
        return n_cells * (self.bytes_per_token + STATE_BYTES_PER_CELL) + STATE_HEADER_BYTES

    def holds(self, tokens: Sequence[int]) -> bool:
        """Whether an entry already holds these tokens or more of the same run."""
        n = len(tokens)
        return any(e.tokens[:n] == tuple(tokens) for e in self._entries.values())

    def reserve(
        self, tokens: Sequence[int], n_prompt: int, first_logits: Any, keep: str | None = None
    ) -> HostEntry | None:
        """Room for a state about to be saved, evicting the least recently used entries
        (never ``keep``: one about to be loaded). None when it can never fit."""
        size = self.estimate(len(tokens))
        if size > self.capacity_bytes:
            return None
        while size > self.account.room():  # its own cap, or what the ledger has free
            if not self._evict_one(keep):
                return None
        key = f"prefix-{next(self._keys)}"
        entry = HostEntry(key, tuple(tokens), n_prompt, size, first_logits)
        self._entries[key] = entry
        self.account.charge(size)
        return entry

    @property
    def reserved_bytes(self) -> int:
        """Room held for saves that have not run yet."""
        return sum(e.num_bytes for e in self._entries.values() if e.state is None)

    def read(self) -> TierReading:
        """Its bytes as a KV tier (``tier.KvTier``)."""
        held, cap = self.num_bytes, self.capacity_bytes
        return TierReading(
            held={"host": held},
            lines={"host_cache": held},
            ledger={"host_cache_cap_bytes": cap},
            debug={"kv_host_cache_bytes": held, "kv_host_cache_budget_bytes": cap,
                   "kv_host_cache_entries": len(self), "kv_host_cache_hits": self.hits},
            reserved_bytes=self.reserved_bytes,
        )  # fmt: skip

    def give_back(self) -> int:
        """Another tier needs the room: the least recently used entry goes; the bytes
        freed (0: nothing could go)."""
        before = self.num_bytes
        self._evict_one(None)
        return before - self.num_bytes

    def _evict_one(self, keep: str | None) -> bool:
        victim = next(
            (k for k, e in self._entries.items() if k != keep and not e.pending_loads), None
        )
        if victim is None:
            return False
        self.pop(victim)
        self.evictions += 1
        return True

    def put(self, key: str, state: bytes) -> None:
        """The saved bytes of a reserved entry (a state larger than reserved is dropped)."""
        entry = self._entries.get(key)
        if entry is None:
            return
        if len(state) > entry.num_bytes:
            self.pop(key)
            return
        self.account.release(entry.num_bytes - len(state))
        entry.num_bytes, entry.state = len(state), state

    def add_saved(
        self, tokens: Sequence[int], n_prompt: int, first_logits: Any, state: bytes, origin: str
    ) -> bool:
        """An entry whose state was saved elsewhere (the disk tier); False when full."""
        if len(state) > self.account.room() or self.holds(tokens):
            return False
        key = f"prefix-{next(self._keys)}"
        entry = HostEntry(key, tuple(tokens), n_prompt, len(state), first_logits, state,
                          origin=origin)  # fmt: skip
        self._entries[key] = entry
        self._entries.move_to_end(key, last=False)  # older than anything saved since
        self.account.charge(len(state))
        return True

    def touch(self, key: str, loading: bool = False) -> HostEntry:
        """A hit: the entry becomes the most recently used; ``loading``: a load of it
        is decided, and it stays until that load ran (:meth:`loaded`)."""
        entry = self._entries[key]
        self._entries.move_to_end(key)
        entry.hits += 1
        entry.pending_loads += int(loading)
        self.hits += 1
        return entry

    def loaded(self, key: str) -> bytes | None:
        """The state of an entry whose load runs now (see :meth:`touch`)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        entry.pending_loads = max(0, entry.pending_loads - 1)
        return entry.state

    def entry(self, key: str) -> HostEntry | None:
        return self._entries.get(key)

    def state(self, key: str) -> bytes | None:
        entry = self._entries.get(key)
        return entry.state if entry is not None else None

    def pop(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.account.release(entry.num_bytes)

    def clear(self) -> None:
        for key in list(self._entries):
            self.pop(key)
