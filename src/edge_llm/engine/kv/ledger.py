"""One memory ledger for every KV tier of a CPU device.

On a CPU the device's KV context, the prefix cache's host tier, the states of
offloaded streams and the embeddings context all live in one RAM.
``max_kv_cache_mb`` is the cap on all of them together: every tier is an
:class:`Account` in one :class:`MemoryLedger` and asks it before it allocates.

- *Fixed* accounts are allocated whole when made: the model's KV context (llama.cpp
  allocates it at start and clears it, so all of it is resident however few cells
  are in use) and its embeddings context. They are charged at their full size.
- *Elastic* accounts hold saved states: the host prefix tier (``host_cache_mb``)
  and offloaded streams (``host_offload_mb``). Their own setting is a cap inside the
  ledger, never an addition to it.

Policy: the KV context is sized at start to the cap minus the other tiers' share
(:func:`device_share_bytes`); the host tiers and the embeddings context live in what
is left. The prefix host tier takes whatever is free and gives it back first: an
offload or an embeddings context that needs room evicts its entries, least recently
used first (:meth:`MemoryLedger.make_room`); if that is not enough nothing is
allocated (no offload; 503 ``kv_budget_exceeded`` with ``Retry-After`` for an
embeddings request). Nothing is charged past the cap.

Every loaded model's lines are in the same ledger (one cap for all their KV): each
model sees it through :meth:`MemoryLedger.for_model`, whose lines are tagged with its
name, and a model's KV context is reserved before the model loads (the pool asks the
ledger first, ``models/pool.py``). A backend whose KV lives in its own memory (an
accelerator) would keep the tiers apart: its ledger has no cap (``cap_bytes=None``)
and each tier is bound only by its own setting. Every backend this project builds
today is a CPU one.

Pure bookkeeping: no llama.cpp, no clock. Several threads use one ledger (its
engine's thread, the embeddings thread, the event loop): its own lock makes each
check-and-charge one step, and a host tier gives back under its engine's lock,
waited for briefly (``try_giver``): a thread making room never waits on a decode.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edge_llm.engine.runtime.backend import KV_CELL_BLOCK
from edge_llm.observability.units import mib

# The host tiers' share of the cap at most: the rest is the device's KV context, so
# that live streams keep three quarters of the configured budget.
HOST_TIERS_SHARE = 4

# How long a thread making room waits for a host tier's engine lock.
GIVE_WAIT_S = 0.1

# Evicts the least recently used entry of a host tier; returns the bytes it freed
# (0: nothing left to give).
Giver = Callable[[], int]


# (elements per block, bytes per block) of each KV cell type, as llama.cpp stores them.
_KV_TYPE_BLOCKS = {"f16": (1, 2), "q8_0": (32, 34), "q4_0": (32, 18)}


def device_share_bytes(
    cap_bytes: int, host_cache_bytes: int, host_offload_bytes: int, embeddings_bytes: int = 0
) -> int:
    """The KV context's budget on a CPU: the cap minus the room of the other tiers:
    what the host caps ask for, up to a quarter of the cap, and at least room for the
    embeddings context (within that quarter), so that embeddings work without host
    tiers too."""
    quarter = cap_bytes // HOST_TIERS_SHARE
    tiers = max(min(host_cache_bytes + host_offload_bytes, quarter), min(embeddings_bytes, quarter))
    return cap_bytes - tiers


def context_cells(max_tokens: int) -> int:
    """Cells llama.cpp allocates for a context of ``max_tokens``."""
    return -(-max_tokens // KV_CELL_BLOCK) * KV_CELL_BLOCK


def kv_bytes_per_token(metadata: dict[str, Any], kv_cache_type: str) -> int | None:
    """A token's K and V in every layer, from a GGUF's metadata (before the model is
    loaded; as ``LlamaBackend`` computes it once loaded). None when a key is missing."""
    arch = metadata.get("general.architecture")

    def number(key: str) -> int | None:
        value = metadata.get(f"{arch}.{key}")
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
            return None
        return int(value)

    n_layer, n_embd = number("block_count"), number("embedding_length")
    n_head = number("attention.head_count")
    if not (n_layer and n_embd and n_head) or kv_cache_type not in _KV_TYPE_BLOCKS:
        return None
    n_head_kv = number("attention.head_count_kv") or n_head
    key_len = number("attention.key_length") or n_embd // n_head
    value_len = number("attention.value_length") or n_embd // n_head
    per_block, block_bytes = _KV_TYPE_BLOCKS[kv_cache_type]
    blocks = -(-n_head_kv * key_len // per_block) + -(-n_head_kv * value_len // per_block)
    return n_layer * blocks * block_bytes


@dataclass
class Account:
    """One tier's line: ``num_bytes`` held, at most ``cap_bytes`` (its own setting)."""

    ledger: MemoryLedger
    name: str
    kind: str  # "device", "host_cache", "offload", "embeddings"
    cap_bytes: int | None = None  # None: only the ledger's cap
    num_bytes: int = 0
    model: str = ""  # the model whose line it is

    @property
    def own_room(self) -> int:
        """Room under this account's own cap."""
        if self.cap_bytes is None:
            return self.ledger.unbounded
        return max(0, self.cap_bytes - self.num_bytes)

    def room(self) -> int:
        """Bytes it may add now without evicting anything."""
        return min(self.own_room, self.ledger.free_bytes)

    def could_hold(self, num_bytes: int) -> bool:
        """Whether ``num_bytes`` more would fit once the host tiers gave all they hold
        (the giver's own entries do not count: it cannot evict for itself here)."""
        if num_bytes > self.own_room:
            return False
        return num_bytes <= self.ledger.free_bytes + self.ledger.givable(besides=self)

    def reserve(self, num_bytes: int) -> bool:
        """Charge ``num_bytes``, evicting host-tier entries (not this account's) for
        them first if needed; False, with nothing charged, when they cannot fit."""
        with self.ledger.lock:
            if num_bytes > self.own_room or not self.ledger.make_room(num_bytes, self):
                return False
            self.num_bytes += num_bytes
            return True

    def charge(self, num_bytes: int) -> None:
        """Add ``num_bytes`` that fit now (:meth:`room`), evicting nothing."""
        with self.ledger.lock:
            if num_bytes > self.room():
                raise ValueError(
                    f"{self.name}: {num_bytes} bytes do not fit the memory ledger "
                    f"({self.ledger.free_bytes} free, {self.own_room} under its own cap)"
                )
            self.num_bytes += num_bytes

    def resize(self, num_bytes: int) -> bool:
        """Hold exactly ``num_bytes``: less gives the rest back, more is reserved as
        :meth:`reserve` does (False, nothing changed, when it cannot fit)."""
        with self.ledger.lock:
            if num_bytes <= self.num_bytes:
                self.num_bytes = num_bytes
                return True
            return self.reserve(num_bytes - self.num_bytes)

    def release(self, num_bytes: int) -> None:
        with self.ledger.lock:
            self.num_bytes = max(0, self.num_bytes - num_bytes)

    def close(self) -> None:
        """The tier is gone (a model unloaded): its line leaves the ledger."""
        self.num_bytes = 0
        self.ledger.remove(self)


class LedgerTier:
    """A tier whose bytes are its :class:`Account`'s (the host cache, the offload
    store): what it holds, and its own cap inside the ledger's."""

    account: Account

    @property
    def num_bytes(self) -> int:
        return self.account.num_bytes

    @property
    def capacity_bytes(self) -> int:
        """Its own cap (``host_cache_mb``, ``host_offload_mb``), inside the ledger's."""
        return self.account.cap_bytes or 0

    @capacity_bytes.setter
    def capacity_bytes(self, value: int) -> None:
        self.account.cap_bytes = value

    def close(self) -> None:
        """Its model is gone: its line leaves the ledger (``tier.KvTier``)."""
        self.account.close()


@dataclass
class _Lines:
    """What every view of one ledger shares: its lines and the host tiers' givers."""

    accounts: list[Account] = field(default_factory=list)
    givers: list[tuple[Account, Giver]] = field(default_factory=list)


@dataclass
class MemoryLedger:
    """Every KV tier's bytes against one cap (None: no common cap, tiers apart).

    ``model``: whose view this is (:meth:`for_model`): the lines it makes are that
    model's and :meth:`by_kind` counts only them; the cap, the total and the room
    are the whole ledger's."""

    cap_bytes: int | None
    model: str = ""
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    _lines: _Lines = field(default_factory=_Lines, repr=False)

    unbounded = 1 << 62

    @property
    def shared(self) -> bool:
        """Whether the tiers share one cap (a CPU device)."""
        return self.cap_bytes is not None

    def for_model(self, model: str) -> MemoryLedger:
        """The same ledger (lines, lock, cap) as model ``model`` uses it."""
        return MemoryLedger(self.cap_bytes, model, self.lock, self._lines)

    def account(
        self,
        name: str,
        kind: str,
        cap_bytes: int | None = None,
        giver: Giver | None = None,
    ) -> Account:
        """A new line of this view's model; ``giver`` evicts its least recently used
        entry when another tier needs the room (the host prefix tier)."""
        account = Account(self, name, kind, cap_bytes, model=self.model)
        with self.lock:
            self._lines.accounts.append(account)
            if giver is not None:
                self._lines.givers.append((account, giver))
        return account

    def line(self, kind: str) -> Account | None:
        """This model's line of ``kind``, if it has one (its KV context, reserved
        before the model loaded)."""
        with self.lock:
            return next((a for a in self._own() if a.kind == kind), None)

    def remove(self, account: Account) -> None:
        with self.lock:
            lines = self._lines
            lines.accounts[:] = [a for a in lines.accounts if a is not account]
            lines.givers[:] = [(a, g) for a, g in lines.givers if a is not account]

    def close_model(self) -> None:
        """This view's model is gone (unloaded, or its load failed): its lines leave."""
        with self.lock:
            for account in self._own():
                account.close()

    def _own(self) -> list[Account]:
        return [a for a in self._lines.accounts if a.model == self.model]

    @property
    def used_bytes(self) -> int:
        """Every model's lines together."""
        return sum(a.num_bytes for a in self._lines.accounts)

    @property
    def own_bytes(self) -> int:
        """This view's model's lines."""
        return sum(a.num_bytes for a in self._own())

    @property
    def free_bytes(self) -> int:
        if self.cap_bytes is None:
            return self.unbounded
        return max(0, self.cap_bytes - self.used_bytes)

    def givable(self, besides: Account | None = None) -> int:
        """Bytes the host tiers (every model's) would give back (all their entries)."""
        return sum(a.num_bytes for a, _ in self._lines.givers if a is not besides)

    def make_room(self, num_bytes: int, besides: Account | None = None) -> bool:
        """Evict host-tier entries (not ``besides``'s) until ``num_bytes`` are free;
        whether they are. Nothing is evicted when even all of them would not do."""
        with self.lock:
            if num_bytes <= self.free_bytes:
                return True
            if num_bytes > self.free_bytes + self.givable(besides):
                return False
            for account, give in list(self._lines.givers):
                while account is not besides and num_bytes > self.free_bytes:
                    if give() <= 0:
                        break
            return num_bytes <= self.free_bytes

    def by_kind(self) -> dict[str, int]:
        """Bytes per kind of this model's lines (device, host_cache, offload,
        embeddings)."""
        totals: dict[str, int] = {}
        for account in self._own():
            totals[account.kind] = totals.get(account.kind, 0) + account.num_bytes
        return totals

    def by_model(self) -> dict[str, int]:
        """Bytes per model."""
        totals: dict[str, int] = {}
        for account in self._lines.accounts:
            totals[account.model] = totals.get(account.model, 0) + account.num_bytes
        return totals

    def lines(self) -> list[Account]:
        return list(self._lines.accounts)


def try_giver(lock: threading.RLock, give: Giver) -> Giver:
    """``give`` under ``lock`` (its engine's), or nothing when another thread holds it
    longer than ``GIVE_WAIT_S`` (the engine holds it for a step's planning, never for
    a decode; a bounded wait, so two threads making room never wait on each other)."""

    def locked() -> int:
        if not lock.acquire(timeout=GIVE_WAIT_S):
            return 0
        try:
            return give()
        finally:
            lock.release()

    return locked


def ledger_summary(fields: dict[str, Any]) -> str:
    """One line of the ledger (``/debug/streams``' ``memory_ledger``), in MiB: what the
    serve banner prints. Its tiers are the document's ``tiers``: each tier in memory
    names its own part (``tier.SummaryPart``)."""
    f = fields
    cap = f"{mib(f['cap_bytes'])} MiB cap" if f["cap_bytes"] is not None else "no common cap"
    other = f.get("other_models_bytes") or 0
    others = f" + other models {mib(other)}" if other else ""
    tiers = "".join(f"{_part(part)} + " for part in f.get("tiers", ()))
    return (
        f"memory ledger: {tiers}embeddings {mib(f['embeddings_bytes'])} + reserve "
        f"{mib(f['reserve_bytes'])}{others} = {mib(f['total_bytes'])} MiB of {cap}; "
        f"weights {mib(f['weights_bytes'])} MiB beside it"
    )


def _part(part: dict[str, Any]) -> str:
    """``host cache 8.0 (cap 256.0)``."""
    detail = ", ".join(f"{name} {mib(n)}" for name, n in part["detail"].items())
    return f"{part['label']} {mib(part['bytes'])}" + (f" ({detail})" if detail else "")
