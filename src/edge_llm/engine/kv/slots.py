"""The book of the per-slot KV layout (``kv_unified = false``, the default): each
slot (llama.cpp sequence id) has a share of the budget of its own, and a sequence's
attention scans only its slot's cells, however long the server has run.

A finished sequence keeps its cells in its slot; a new request continues the slot
whose cells start as its prompt does (a regenerate, the next turn), else takes the
lowest free one (llama.cpp decodes each run of consecutive ids as its own ubatch, so
low ids keep busy slots together). Cells that another slot, a running sequence or the
host tier (``host_cache.py``) holds are copied into the new request's slot instead of
being computed again; a kept slot that is reused for something else is saved to the
host tier first.

**What may be reused.** Every cached cell that starts the new prompt: a regenerate
reuses the whole prompt (and the logits of its last token), the next turn of a
conversation the previous prompt and its answer (:func:`usable_prefix`). With
``deterministic`` the kernels round a row the same however it was batched, so a hit
gives the text a miss would; by default a hit may turn a near-tie the other way far
into a long answer (docs/architecture.md, what may differ).

Pure bookkeeping: methods return the operations (``kv_cache.KvOp``) the engine applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from edge_llm.engine.kv.book import (
    NO_ATTACHMENT,
    Admission,
    Attachment,
    CopyPrefix,
    KvCacheStats,
    KvOp,
    LoadCache,
    LoadState,
    SaveCache,
    SaveState,
    Truncate,
    common_prefix,
)
from edge_llm.engine.kv.host_cache import HostCache, HostEntry

SWITCH_SLOT_TOKENS = 64  # the match worth leaving the lowest free slot for
MIN_SAVED_CELLS = 128  # fewer are not worth a host-tier entry (prefilled in ~0.4 s)


def usable_prefix(
    cells: Sequence[int], n_prompt: int, prompt: Sequence[int], whole: bool = False
) -> int:
    """How many of ``cells`` (computed for a sequence whose prompt was their first
    ``n_prompt`` tokens) a new sequence with ``prompt`` may use: all that match but
    the prompt's last token, whose logits give the first token; all of them when
    ``whole`` (the logits of that last token were kept with the cells: a regenerate
    skips the decode too)."""
    match = common_prefix(cells, prompt)
    if whole and n_prompt == len(prompt) and match == len(prompt):
        return len(prompt)
    return min(match, len(prompt) - 1)


@dataclass
class _Slot:
    seq_id: int
    tokens: Sequence[int] = ()  # what its cells hold (a running sequence: its tokens so far)
    n_cells: int = 0
    n_prompt: int = 0
    running: bool = False
    reserved: int = 0
    n_attached: int = 0  # running: cells it started with (continued, copied or restored)
    last_used: int = 0
    first_logits: Any = None

    @property
    def cells(self) -> Sequence[int]:
        return self.tokens[: self.n_cells]


@dataclass(frozen=True)
class _Source:
    """Where cells for a new sequence come from: a slot or a host entry."""

    usable: int
    slot: _Slot | None = None
    entry: HostEntry | None = None
    whole: bool = False


@dataclass
class KvSlots:
    capacity_tokens: int
    bytes_per_token: int
    num_seq_ids: int
    sequence_tokens: int
    prefix_cache: bool = True
    host: HostCache = field(default_factory=lambda: HostCache(0, 1))
    _slots: list[_Slot] = field(init=False)
    _tick: int = field(init=False, default=0)

    share = False  # no cell is seen by two slots: prefixes are copied
    per_slot = True

    def __post_init__(self) -> None:
        self._slots = [_Slot(i) for i in range(self.num_seq_ids)]

    # -- budget -----------------------------------------------------------------

    @property
    def reuse_slots(self) -> bool:
        return self.prefix_cache

    @property
    def reuses_prefixes(self) -> bool:
        return self.prefix_cache

    @property
    def capacity_bytes(self) -> int:
        return self.capacity_tokens * self.bytes_per_token

    @property
    def reserved_bytes(self) -> int:
        return sum(s.reserved for s in self._slots) * self.bytes_per_token

    @property
    def num_free(self) -> int:
        """Cells of the slots no sequence runs in."""
        return sum(self.sequence_tokens for s in self._slots if not s.running)

    def could_ever_fit(self, num_tokens: int) -> bool:
        return num_tokens <= self.sequence_tokens

    def stats(self) -> KvCacheStats:
        used = sum(s.n_cells for s in self._slots if s.running)
        cached = sum(s.n_cells for s in self._slots if not s.running)
        return KvCacheStats(used, cached, sum(s.reserved for s in self._slots))

    # -- admission ---------------------------------------------------------------

    def can_admit(self, tokens: Sequence[int], total_tokens: int, reuse: bool = True) -> bool:
        return self.can_restore(total_tokens)

    def can_restore(self, total_tokens: int) -> bool:
        return total_tokens <= self.sequence_tokens and any(not s.running for s in self._slots)

    def cached_length(self, tokens: Sequence[int], reuse: bool = True) -> int:
        """Cells an admission now would start with (without kept logits)."""
        if not (self.prefix_cache and reuse):
            return 0
        if all(s.running for s in self._slots):  # it would wait: whatever is cached now
            return self._best_source(tokens, None).usable
        target = self._target(tokens)
        own = self._own(target, tokens)
        return max(own.usable, self._best_source(tokens, target).usable)

    def keep_logits(self, prompt: Sequence[int], logits: Any) -> None:
        """The logits of ``prompt``'s last token, kept with the cells of the slot that
        computed them: a regenerate samples its first token without a decode."""
        n = len(prompt)
        for slot in self._slots:
            if slot.running and slot.n_prompt == n and list(slot.tokens[:n]) == list(prompt):
                slot.first_logits = logits

    def admit(self, tokens: Sequence[int], total_tokens: int, reuse: bool = True) -> Admission:
        """Run a new sequence in a slot, starting from the cells it may reuse (see
        :func:`usable_prefix`); from none without ``reuse``: it takes the slot it
        would have continued and computes the prompt again there, so that the slot
        keeps that prompt for later requests. Call :meth:`can_admit` first."""
        target = self._target(tokens)
        ops: list[KvOp] = []
        own = self._own(target, tokens)
        source = own if reuse else _Source(0, target)
        if self.prefix_cache and reuse:
            other = self._best_source(tokens, target)
            if other.usable > source.usable:
                source = other
        if source.slot is target:
            if target.n_cells > source.usable:
                # A regenerate keeps the whole prompt here (computed again without
                # reuse): the cells it drops (the answer, no other request may reuse
                # them) are not worth a save.
                if own.usable < target.n_prompt - 1:
                    ops.extend(self._save(target))
                n_dropped = target.n_cells - source.usable
                ops.append(Truncate(target.seq_id, source.usable, n_dropped, "evict"))
        else:
            ops.extend(self._vacate(target, keep=source.entry))
            ops.extend(self._copy(source, target))
        logits = self._logits_of(source)
        self._start(target, tokens, len(tokens), source.usable, total_tokens - source.usable)
        target.first_logits = logits  # still the prompt's: the next regenerate's too
        tier = source.entry.origin if source.entry is not None else "device"
        return Admission(target.seq_id, source.usable, ops, logits, tier)

    def attach_published(self, seq_id: int, tokens: Sequence[int]) -> Attachment:
        """A running sequence that has computed nothing of its own yet takes the
        longer prefix another sequence computed since its admission (it waited for
        that prefill); the whole prompt only with the logits of its last token, which
        the attachment carries (as an admission's)."""
        slot = self._slots[seq_id]
        if not self.prefix_cache or slot.n_cells != slot.n_attached:
            return NO_ATTACHMENT
        source = self._best_source(tokens, slot)
        gained = source.usable - slot.n_cells
        if gained <= 0:
            return NO_ATTACHMENT
        ops: list[KvOp] = []
        if slot.n_cells:
            ops.append(Truncate(seq_id, 0, slot.n_cells, "drop"))
        ops.extend(self._copy(source, slot))
        slot.n_cells = slot.n_attached = source.usable
        slot.reserved -= gained
        slot.first_logits = self._logits_of(source)  # the next regenerate's too
        self._touch(slot)
        return Attachment(gained, tuple(ops), slot.first_logits)

    def restore(
        self,
        key: str,
        n_cells: int,
        total_tokens: int,
        tokens: Sequence[int] = (),
        n_prompt: int = 0,
    ) -> Admission:
        """A slot for an offloaded sequence (``tokens``, the first ``n_prompt`` its
        prompt), its ``n_cells`` loaded from host memory."""
        target = self._target(())
        ops = self._vacate(target)
        ops.append(LoadState(target.seq_id, key))
        self._start(target, tokens, n_prompt, n_cells, total_tokens)
        return Admission(target.seq_id, 0, ops)

    def _start(
        self, slot: _Slot, tokens: Sequence[int], n_prompt: int, n_cells: int, reserved: int
    ) -> None:
        slot.tokens, slot.n_prompt, slot.n_cells, slot.n_attached = (
            tokens,
            n_prompt,
            n_cells,
            n_cells,
        )
        slot.running, slot.reserved, slot.first_logits = True, reserved, None
        self._touch(slot)

    # -- where cells come from ---------------------------------------------------------

    def _target(self, tokens: Sequence[int]) -> _Slot:
        """The lowest slot no sequence runs in, or a kept slot whose cells give
        ``SWITCH_SLOT_TOKENS`` more (a regenerate, the next turn), not merely the
        template's system prompt that every kept slot starts with."""
        idle = [s for s in self._slots if not s.running]
        lowest = idle[0]
        if not self.prefix_cache or not tokens:
            return lowest
        best = max(idle, key=lambda s: (self._own(s, tokens).usable, -s.seq_id))
        gain = self._own(best, tokens).usable - self._own(lowest, tokens).usable
        return best if gain >= SWITCH_SLOT_TOKENS else lowest

    def _own(self, slot: _Slot, tokens: Sequence[int]) -> _Source:
        if not self.prefix_cache or not slot.n_cells or not tokens:
            return _Source(0, slot)
        whole = slot.first_logits is not None
        usable = usable_prefix(slot.cells, slot.n_prompt, tokens, whole)
        return _Source(usable, slot, whole=whole and usable == len(tokens))

    def _best_source(self, tokens: Sequence[int], target: _Slot | None) -> _Source:
        best = _Source(0)
        for slot in self._slots:
            if slot is not target and slot.n_cells:
                best = max(best, self._own(slot, tokens), key=lambda s: s.usable)
        for entry in self.host.entries():
            whole = entry.first_logits is not None
            usable = usable_prefix(entry.tokens, entry.n_prompt, tokens, whole)
            if usable > best.usable and entry.state is not None:
                best = _Source(usable, entry=entry, whole=whole and usable == len(tokens))
        return best

    def _copy(self, source: _Source, target: _Slot) -> list[KvOp]:
        if not source.usable:
            return []
        if source.slot is not None:
            return [CopyPrefix(source.slot.seq_id, target.seq_id, source.usable)]
        assert source.entry is not None
        self.host.touch(source.entry.key, loading=True)  # not given back before it ran
        ops: list[KvOp] = [LoadCache(target.seq_id, source.entry.key)]
        if len(source.entry.tokens) > source.usable:
            n_extra = len(source.entry.tokens) - source.usable
            ops.append(Truncate(target.seq_id, source.usable, n_extra, "drop"))
        return ops

    @staticmethod
    def _logits_of(source: _Source) -> Any:
        if not source.whole:
            return None
        holder = source.slot or source.entry
        return holder.first_logits if holder is not None else None

    def _vacate(self, slot: _Slot, keep: HostEntry | None = None) -> list[KvOp]:
        """Empty a kept slot for another sequence, its cells saved to the host tier
        first (never evicting ``keep``, about to be loaded)."""
        if not slot.n_cells:
            return []
        ops = self._save(slot, keep)
        ops.append(Truncate(slot.seq_id, 0, slot.n_cells, "evict"))
        slot.tokens, slot.n_cells, slot.first_logits = (), 0, None
        return ops

    def _save(self, slot: _Slot, keep: HostEntry | None = None) -> list[KvOp]:
        """Save a kept slot's cells to the host tier unless it holds them already or
        they are too few to be worth the memory (prefilled again in a fraction of a
        second: a flood of short prompts must not fill the host with them)."""
        if not (self.prefix_cache and self.host.enabled) or slot.n_cells < MIN_SAVED_CELLS:
            return []
        if self.host.holds(slot.cells):
            return []
        keep_key = keep.key if keep is not None else None
        entry = self.host.reserve_prompt(slot.cells, slot.n_prompt, slot.first_logits, keep_key)
        return [SaveCache(slot.seq_id, entry.key)] if entry is not None else []

    def kept(self) -> list[tuple[int, tuple[int, ...], int, Any]]:
        """(slot, tokens, prompt length, kept logits) of each kept slot worth saving."""
        return [
            (s.seq_id, tuple(s.cells), s.n_prompt, s.first_logits)
            for s in self._slots
            if not s.running and s.n_cells >= MIN_SAVED_CELLS
        ]

    # -- growth and the end ------------------------------------------------------------

    def computed(self, seq_id: int, tokens: Sequence[int], n_cells: int, publish: bool) -> None:
        """A running sequence now has ``n_cells`` cells, for ``tokens[:n_cells]``."""
        slot = self._slots[seq_id]
        slot.tokens, slot.n_cells = tokens, n_cells

    def release(
        self, seq_id: int, tokens: Sequence[int], keep: bool, n_prompt: int = 0
    ) -> list[KvOp]:
        """A running sequence ended. With ``keep`` its cells stay in its slot for a
        later request; without, only its prompt's (a regenerate after a cancel
        continues them), or none without the prefix cache."""
        slot = self._slots[seq_id]
        if not self.prefix_cache:
            start = 0
        else:
            start = slot.n_cells if keep else min(n_prompt, slot.n_cells)
        # Always one release, if it frees nothing: its stream's KV is no longer in use
        # (kv_freed, as the pool reports a stream whose cells all became cache).
        ops: list[KvOp] = [Truncate(seq_id, start, slot.n_cells - start, "release")]
        slot.tokens, slot.n_cells, slot.n_prompt = list(tokens[:start]), start, n_prompt
        slot.running, slot.reserved = False, 0
        if not start:
            slot.first_logits = None
        self._touch(slot)
        return ops

    def offload(self, seq_id: int, key: str) -> list[KvOp]:
        """Save a running sequence to host memory and free its slot."""
        slot = self._slots[seq_id]
        ops: list[KvOp] = [SaveState(seq_id, key), Truncate(seq_id, 0, slot.n_cells, "offload")]
        slot.tokens, slot.n_cells, slot.n_prompt = (), 0, 0
        slot.running, slot.reserved, slot.first_logits = False, 0, None
        return ops

    def _touch(self, slot: _Slot) -> None:
        self._tick += 1
        slot.last_used = self._tick
