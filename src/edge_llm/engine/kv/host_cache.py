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

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from edge_llm.engine.kv.ledger import Giver, LedgerTier, MemoryLedger
from edge_llm.engine.kv.tier import SavedKv, StateTier, SummaryPart, TierReading, prompt_key

# A saved state holds, beside the K and V rows, each cell's position and sequence ids
# and a small header: an upper bound used to reserve room before the save runs.
STATE_BYTES_PER_CELL = 16
STATE_HEADER_BYTES = 4096


@dataclass
class HostEntry:
    key: str  # tier.prompt_key of its tokens (a bare reserve: the caller's)
    tokens: tuple[int, ...]  # what its cells hold, in order
    n_prompt: int  # the prompt of the sequence they came from (its first n_prompt tokens)
    num_bytes: int  # reserved, then the saved state's size
    first_logits: Any = None
    state: bytes | None = field(default=None, repr=False)  # None until the save ran
    hits: int = 0
    origin: str = "host"  # "disk": read back from the disk tier at start
    pending_loads: int = 0  # loads decided, not applied yet: the entry must stay


class HostCache(LedgerTier):
    """A state tier (``tier.StateTier``) whose states are found by their prompt."""

    name = "host_cache"

    def __init__(
        self,
        capacity_bytes: int,
        bytes_per_token: int,
        ledger: MemoryLedger | None = None,
        wrap_giver: Callable[[Giver], Giver] | None = None,
        below: StateTier | None = None,
    ) -> None:
        """``ledger``: the memory ledger it is a line of (None: one of its own, no
        common cap); ``wrap_giver``: how another thread reaches :meth:`give_back`
        (under the engine's lock); ``below``: the tier each saved state is written
        through to (the disk's)."""
        self.bytes_per_token = bytes_per_token
        self.below = below
        self.hits = 0
        self.evictions = 0
        self._entries: OrderedDict[str, HostEntry] = OrderedDict()  # least recently used first
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

    def reserve_prompt(
        self, tokens: Sequence[int], n_prompt: int, first_logits: Any, keep: str | None = None
    ) -> HostEntry | None:
        """:meth:`reserve` for the state of cells holding ``tokens`` (the first
        ``n_prompt`` a prompt), under their key, never evicting ``keep`` (an entry about
        to be loaded). None when it can never fit. Call :meth:`holds` first."""
        entry = HostEntry(prompt_key(tokens), tuple(tokens), n_prompt,
                          self.estimate(len(tokens)), first_logits)  # fmt: skip
        return entry if self._reserve(entry, keep) else None

    def reserve(self, key: str, num_bytes: int) -> bool:
        """Room for a state whose prompt is not known (never found by a prompt)."""
        return self._reserve(HostEntry(key, (), 0, num_bytes), None)

    def _reserve(self, entry: HostEntry, keep: str | None) -> bool:
        """Room for ``entry``, evicting the least recently used entries."""
        if entry.num_bytes > self.capacity_bytes or entry.key in self._entries:
            return False
        while entry.num_bytes > self.account.room():  # its own cap, or the ledger's free
            if not self._evict_one(keep):
                return False
        self._entries[entry.key] = entry
        self.account.charge(entry.num_bytes)
        return True

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
            summary=SummaryPart("host cache", held, {"cap": cap}),
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
        self.evict(victim)
        self.evictions += 1
        return True

    def store(self, key: str, saved: SavedKv) -> bool:
        """The saved bytes of a reserved entry (a state larger than reserved is
        dropped), written through to the tier below. What its cells hold is the one
        :meth:`reserve_prompt` gave unless ``saved`` says (the applier does not know)."""
        entry = self._entries.get(key)
        state = saved.state
        if entry is None:
            return False
        if len(state) > entry.num_bytes:
            self.evict(key)
            return False
        self.account.release(entry.num_bytes - len(state))
        entry.num_bytes, entry.state = len(state), state
        if saved.tokens:
            entry.tokens, entry.n_prompt = saved.tokens, saved.n_prompt
            entry.first_logits = saved.first_logits
        below = self.below
        if below is not None and below.reserve(key, len(state)):
            below.store(key, SavedKv(state, entry.tokens, entry.n_prompt, entry.first_logits))
        return True

    def adopt(self, saved: SavedKv, origin: str) -> bool:
        """A state saved elsewhere (read back from the disk tier), only into free room:
        it evicts nothing. False when full or held already."""
        state = saved.state
        if len(state) > self.account.room() or self.holds(saved.tokens):
            return False
        entry = HostEntry(prompt_key(saved.tokens), saved.tokens, saved.n_prompt, len(state),
                          saved.first_logits, state, origin=origin)  # fmt: skip
        self._entries[entry.key] = entry
        self._entries.move_to_end(entry.key, last=False)  # older than anything saved since
        self.account.charge(len(state))
        return True

    def touch(self, key: str, loading: bool = False) -> HostEntry:
        """A hit: the entry becomes the most recently used; ``loading``: a load of it
        is decided, and it stays until that load ran (:meth:`load`)."""
        entry = self._entries[key]
        self._entries.move_to_end(key)
        entry.hits += 1
        entry.pending_loads += int(loading)
        self.hits += 1
        return entry

    def load(self, key: str) -> SavedKv | None:
        """The state of an entry whose load runs now (see :meth:`touch`); it stays."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        entry.pending_loads = max(0, entry.pending_loads - 1)
        if entry.state is None:
            return None
        return SavedKv(entry.state, entry.tokens, entry.n_prompt, entry.first_logits)

    def entry(self, key: str) -> HostEntry | None:
        return self._entries.get(key)

    def state(self, key: str) -> bytes | None:
        entry = self._entries.get(key)
        return entry.state if entry is not None else None

    def evict(self, key: str) -> int:
        entry = self._entries.pop(key, None)
        if entry is None:
            return 0
        self.account.release(entry.num_bytes)
        return entry.num_bytes

    def clear(self) -> None:
        for key in list(self._entries):
            self.evict(key)
