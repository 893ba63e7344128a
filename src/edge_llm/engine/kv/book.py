"""The KV book: what the engine asks of the one owner of KV cells, whichever layout.

Two books implement it: the per-slot layout's (``slots.py``, ``kv_unified = false``,
the default) and the unified pool's (``unified.py``); ``layout.py`` picks the one a
backend's layout asks for. Callers hold a :class:`KvBook` and never ask which it is.
A book is pure bookkeeping: its methods return the operations (:data:`KvOp`) the
engine applies through the backend, in order (``apply.py``); none calls llama.cpp.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class CopyPrefix:
    """Tag the first ``n_tokens`` cells of ``src`` with ``dst`` too (no copy in the pool)."""

    src: int
    dst: int
    n_tokens: int


@dataclass(frozen=True)
class Truncate:
    """Untag ``seq_id`` from position ``start`` on (0: everything).

    ``reason``: ``release`` (a sequence ended), ``evict`` (cache made room),
    ``drop`` (a cache id whose cells another id also holds), ``offload``."""

    seq_id: int
    start: int
    n_tokens: int
    reason: str


@dataclass(frozen=True)
class SaveState:
    """Copy the cells of ``seq_id`` to host memory under ``key`` (before they are freed):
    a stream offloaded."""

    seq_id: int
    key: str
    tier: str = "offload"  # the state tier it saves to or loads from (tier.StateTier)


@dataclass(frozen=True)
class LoadState:
    """Write the copy saved under ``key`` into ``seq_id``: an offloaded stream restored."""

    seq_id: int
    key: str
    tier: str = "offload"  # the state tier it saves to or loads from (tier.StateTier)


@dataclass(frozen=True)
class SaveCache:
    """Copy the cells of ``seq_id`` into the prefix cache's entry ``key`` (reserved)."""

    seq_id: int
    key: str
    tier: str = "host_cache"  # the state tier it saves to or loads from (tier.StateTier)


@dataclass(frozen=True)
class LoadCache:
    """Write the prefix cache's entry ``key`` into the empty ``seq_id``."""

    seq_id: int
    key: str
    tier: str = "host_cache"  # the state tier it saves to or loads from (tier.StateTier)


KvOp = CopyPrefix | Truncate | SaveState | LoadState | SaveCache | LoadCache


@dataclass
class Admission:
    seq_id: int
    n_cached: int
    ops: list[KvOp]
    first_logits: Any = None  # the whole prompt was cached: its first token's logits
    tier: str = "device"  # where the cached cells came from: device or host


@dataclass(frozen=True)
class Attachment:
    """What a waiting sequence gained from a prefill that ran since its admission
    (immutable: :data:`NO_ATTACHMENT` is one instance every caller gets)."""

    gained: int  # cells
    ops: tuple[KvOp, ...]
    first_logits: Any = None  # it now holds the whole prompt: its first token's logits


NO_ATTACHMENT = Attachment(0, ())


@dataclass
class KvCacheStats:
    used_tokens: int  # cells live streams hold (shared ones once)
    cached_tokens: int  # cells only the cache holds (evictable)
    reserved_tokens: int


def common_prefix(run: Sequence[int], tokens: Sequence[int], pos: int = 0) -> int:
    """How many tokens of ``run`` equal ``tokens`` from ``pos`` on."""
    n = min(len(run), len(tokens) - pos)
    for i in range(n):
        if run[i] != tokens[pos + i]:
            return i
    return n


class KvBook(Protocol):
    """Who holds which KV cells, what a new request may reuse, what the budget allows.

    A sequence is never given the cell of its prompt's last token without the logits
    of that token (``Admission.first_logits``, ``Attachment.first_logits``): they give
    its first token, and without them no step would ever sample it (issue 59: identical
    prompts arriving together waited for their TTFT time-out). Without kept logits a
    hit stops one token short and that token is computed again, as llama-server and
    vLLM do.

    ``per_slot`` is the layout's one fact the step needs besides: each sequence id
    has a slot of its own (llama.cpp's ``kv_unified = false``), so llama.cpp splits a
    batch into ubatches holding as many rows of each sequence; the scheduler then
    pads decode rows and prices drafts per row, the runner prefills apart, and only
    such a book keeps prompts in the host and disk tiers."""

    # fmt: off
    @property
    def per_slot(self) -> bool: ...
    @property
    def capacity_tokens(self) -> int: ...
    @property
    def bytes_per_token(self) -> int: ...
    @property
    def sequence_tokens(self) -> int: ...
    @property
    def capacity_bytes(self) -> int: ...
    @property
    def reserved_bytes(self) -> int: ...
    @property
    def num_free(self) -> int: ...
    @property
    def reuses_prefixes(self) -> bool: ...
    # fmt: on

    def could_ever_fit(self, num_tokens: int) -> bool:
        """Whether one sequence of ``num_tokens`` fits the book when it is empty."""
        ...

    def stats(self) -> KvCacheStats: ...

    def cached_length(self, tokens: Sequence[int], *, reuse: bool = True) -> int:
        """Tokens of ``tokens`` an admission now would find in KV (none without
        ``reuse``: the request's ``cache_prompt`` is false)."""
        ...

    def can_admit(self, tokens: Sequence[int], total_tokens: int, reuse: bool = True) -> bool: ...

    def can_restore(self, total_tokens: int) -> bool: ...

    def keep_logits(self, prompt: Sequence[int], logits: Any) -> None:
        """Keep the logits of ``prompt``'s last token with its cells."""
        ...

    def admit(self, tokens: Sequence[int], total_tokens: int, reuse: bool = True) -> Admission:
        """A sequence id for a new request, its longest reusable prefix attached
        (none without ``reuse``)."""
        ...

    def attach_published(self, seq_id: int, tokens: Sequence[int]) -> Attachment:
        """Attach what running sequences have computed of ``tokens`` since admission."""
        ...

    def restore(
        self,
        key: str,
        n_cells: int,
        total_tokens: int,
        tokens: Sequence[int] = (),
        n_prompt: int = 0,
    ) -> Admission:
        """A sequence id for an offloaded sequence, its cells loaded from ``key``."""
        ...

    def computed(self, seq_id: int, tokens: Sequence[int], n_cells: int, publish: bool) -> None:
        """A running sequence now has ``n_cells`` cells, for ``tokens[:n_cells]``."""
        ...

    def release(
        self, seq_id: int, tokens: Sequence[int], keep: bool, n_prompt: int = 0
    ) -> list[KvOp]:
        """A running sequence ended; ``keep``: its cells may serve a later request."""
        ...

    def offload(self, seq_id: int, key: str) -> list[KvOp]:
        """Save a running sequence's cells to host memory under ``key`` and free them."""
        ...

    def kept(self) -> list[tuple[int, tuple[int, ...], int, Any]]:
        """(sequence id, tokens, prompt length, kept logits) of the cells worth writing
        to the disk tier when the engine stops."""
        ...
