"""The KV tiers' interface: one list names every tier (``EngineParts.tiers``, built in
``engine/build.py``), and every reader (the ledger, ``/debug/streams``, the
``kv_cache_tier_bytes`` gauge, the serve banner) and mover (``kv/apply.py``, the
offload and preemption policies of ``engine/pressure/offload.py``, the end of a
stream) goes through the protocols below.

Every tier is a :class:`KvTier`: its name, what it holds (``read``: the account) and
its close. The tiers that hold sequences' KV states as bytes (the prefix cache's host
tier ``host_cache.py``, offloaded streams ``host_offload.py``, the disk
``disk_cache.py``) are state tiers as well (:class:`StateTier`): ``reserve`` room for
a state about to be saved, ``store`` it, ``load`` it back, ``evict`` it. A KV operation names
the tier it saves to or loads from (``kv/book.py``) and the applier finds it by name.

The device's KV context (``device.py``) is a tier of the list but not a state tier.
Its reserve is the context's ledger line, allocated whole at start and sized by the
KV book. It has no ``store`` or ``load``: it is where every state is saved from and
loaded into, by llama.cpp on the engine thread (``Backend.save_state``/``load_state``),
and its cells are written by the decode. It has no ``evict``: which cached cells go is
decided by the KV book while it admits a prompt (a ``Truncate`` it plans, run between
decodes), since it depends on the prompt; and on a CPU freeing cells returns no
memory (the context is allocated whole).

A new tier is its own module and one entry in ``build.py``'s list."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class TierReading:
    """What a tier holds now (read under its engine's lock)."""

    held: dict[str, int]  # kv_cache_tier_bytes{tier}: bytes per label
    lines: dict[str, int] = field(default_factory=dict)  # memory_ledger_bytes{line}
    ledger: dict[str, Any] = field(default_factory=dict)  # more of the ledger's document
    debug: dict[str, Any] = field(default_factory=dict)  # its fields in /debug/streams
    reserved_bytes: int = 0  # held for saves that have not run (the ledger's reserve)
    summary: SummaryPart | None = None  # its part of the serve banner (None: not in RAM)


@dataclass(frozen=True)
class SummaryPart:
    """A tier's part of the ledger's one-line summary: ``{label} {MiB} ({name} {MiB},
    ...)``, e.g. ``host cache 8.0 (cap 256.0)``."""

    label: str
    num_bytes: int
    detail: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class SavedKv:
    """A sequence's KV state as bytes (``Backend.save_state``) and what its cells hold:
    the tiers that find a state by its prompt (the host cache, the disk) keep that; an
    offloaded stream's needs none (its sequence knows)."""

    state: bytes
    tokens: tuple[int, ...] = ()
    n_prompt: int = 0  # its first n_prompt tokens were the prompt
    first_logits: Any = None  # the prompt's last token's, kept (a regenerate skips a decode)


def prompt_key(tokens: Sequence[int]) -> str:
    """The key of a state found by the tokens its cells hold: the same in every tier
    and every run (the disk's file names)."""
    return hashlib.sha256(json.dumps(list(tokens)).encode()).hexdigest()[:32]


class KvTier(Protocol):
    """Every tier, the device's too."""

    @property
    def name(self) -> str:
        """What a KV operation names it by (``device``, ``host_cache``, ``offload``,
        ``disk``)."""
        ...

    def read(self) -> TierReading:
        """What it holds: its account, read by every reader of the tiers."""
        ...

    def close(self) -> None:
        """Its model is gone: what it holds leaves the ledger (after the last step)."""
        ...


@runtime_checkable
class StateTier(KvTier, Protocol):
    """A tier holding sequences' KV states as bytes, by key. ``store`` and ``load`` run
    on the engine thread, between decodes; ``reserve`` and ``evict`` under the engine's
    lock."""

    def reserve(self, key: str, num_bytes: int) -> bool:
        """Hold room for a state about to be saved under ``key`` (the save runs a little
        later, on the engine thread); False, nothing held, when there is none."""
        ...

    def store(self, key: str, saved: SavedKv) -> bool:
        """Keep ``saved`` under ``key``, in the room reserved for it; False when it was
        not kept (larger than reserved, or its room is gone)."""
        ...

    def load(self, key: str) -> SavedKv | None:
        """The state to write back into a sequence (None: it is gone). A tier whose
        states serve one sequence gives it up (offload); a prompt's stays."""
        ...

    def evict(self, key: str) -> int:
        """Drop the state under ``key``; the bytes that frees (0: none was there)."""
        ...
