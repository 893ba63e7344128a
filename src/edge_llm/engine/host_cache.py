"""The prefix cache's host-memory tier: saved KV states of finished prompts, LRU,
bounded in bytes (``[engine.cache] host_cache_mb``).

In the per-slot layout a finished sequence keeps its cells in its slot until the slot
is needed by a request that cannot use them; then the cells are saved here (a copy of
the slot's state, what offload uses) and the slot is reused. A later request whose
prompt starts the same way gets them back into whichever slot it runs in: as
llama-server's ``--cache-ram`` does, and without any decode scanning them meanwhile.

Pure bookkeeping plus the saved bytes: :class:`KvSlots` decides what is saved and
loaded, the engine thread copies the bytes (``kv_apply.py``).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

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


class HostCache:
    def __init__(self, capacity_bytes: int, bytes_per_token: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.bytes_per_token = bytes_per_token
        self.num_bytes = 0
        self.hits = 0
        self.evictions = 0
        self._entries: OrderedDict[str, HostEntry] = OrderedDict()  # least recently used first
        self._keys = itertools.count()

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
        while self.num_bytes + size > self.capacity_bytes:
            victim = next((key for key in self._entries if key != keep), None)
            if victim is None:
                return None
            self.pop(victim)
            self.evictions += 1
        key = f"prefix-{next(self._keys)}"
        entry = HostEntry(key, tuple(tokens), n_prompt, size, first_logits)
        self._entries[key] = entry
        self.num_bytes += size
        return entry

    def put(self, key: str, state: bytes) -> None:
        """The saved bytes of a reserved entry (a state larger than reserved is dropped)."""
        entry = self._entries.get(key)
        if entry is None:
            return
        if len(state) > entry.num_bytes:
            self.pop(key)
            return
        self.num_bytes += len(state) - entry.num_bytes
        entry.num_bytes, entry.state = len(state), state

    def add_saved(
        self, tokens: Sequence[int], n_prompt: int, first_logits: Any, state: bytes, origin: str
    ) -> bool:
        """An entry whose state was saved elsewhere (the disk tier); False when full."""
        if self.num_bytes + len(state) > self.capacity_bytes or self.holds(tokens):
            return False
        key = f"prefix-{next(self._keys)}"
        entry = HostEntry(key, tuple(tokens), n_prompt, len(state), first_logits, state,
                          origin=origin)  # fmt: skip
        self._entries[key] = entry
        self._entries.move_to_end(key, last=False)  # older than anything saved since
        self.num_bytes += len(state)
        return True

    def touch(self, key: str) -> HostEntry:
        """A hit: the entry becomes the most recently used."""
        entry = self._entries[key]
        self._entries.move_to_end(key)
        entry.hits += 1
        self.hits += 1
        return entry

    def entry(self, key: str) -> HostEntry | None:
        return self._entries.get(key)

    def state(self, key: str) -> bytes | None:
        entry = self._entries.get(key)
        return entry.state if entry is not None else None

    def pop(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.num_bytes -= entry.num_bytes

    def clear(self) -> None:
        for key in list(self._entries):
            self.pop(key)
