"""The one owner of KV cells: who holds which tokens, what is shared, what the budget allows.

llama.cpp tags every KV cell with the sequence ids that see it. In the unified pool
``llama_memory_seq_cp`` adds a tag without copying, so a prompt prefix computed once
can serve any number of sequences. This module keeps the book of those tags:

- a radix tree of token runs (``prefix_tree.py``). Each node stands for cells that
  exist once in KV, and every sequence id (``holder``) tagging a node also tags all
  its ancestors, so any holder of a node can be the source of a copy of the whole path;
- running sequences hold the path they attached to at admission (shared) and the
  cells they computed since (published into the tree after each prefill chunk unless
  another sequence computed the same tokens first; then they stay private);
- a finished sequence's path stays as cache under its own id: cells nobody running
  references, evicted least recently used when an admission needs room or an id.

This is the unified pool (``kv_unified = true``); the per-slot layout's book is
``kv/slots.py``.

Budget: every running sequence reserves the cells it may still compute (prompt +
max_tokens - cached), and cells owned by no running sequence are counted as cache.
Their sum never exceeds the capacity, so a running stream never runs out of KV.

Pure bookkeeping: methods return the operations (:data:`KvOp`) the engine applies
through the backend, in order; nothing here calls llama.cpp.
"""

from __future__ import annotations

import heapq
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
    LoadState,
    SaveState,
    Truncate,
)
from edge_llm.engine.kv.first_logits import FirstTokenLogits
from edge_llm.engine.kv.prefix_tree import PrefixNode, PrefixTree


@dataclass
class _Holder:
    seq_id: int
    node: PrefixNode  # end of the attached (shared, published) path; the root when none
    n_cells: int  # cells tagged: the attached path plus private cells after it
    reserved: int = 0
    running: bool = True
    diverged: bool = False  # its cells stopped matching the tree: the rest stays private
    last_used: int = 0

    @property
    def attached(self) -> int:
        return self.node.end

    @property
    def private(self) -> int:
        return self.n_cells - self.attached


@dataclass
class KvCache:
    """The unified pool's book over its prefix tree (``prefix_tree.py``): which ids
    hold which cells, their reservations, the budget and the eviction order. One
    class for one invariant: every method moves cells between live, cached and free
    and keeps reserved + cached <= capacity, which two classes would both have to
    keep. It returns KV operations and never calls llama.cpp."""

    capacity_tokens: int
    bytes_per_token: int
    num_seq_ids: int
    share: bool = True  # False: no prefix shared between ids (prefix_cache off)
    _tree: PrefixTree = field(init=False, default_factory=PrefixTree)
    _holders: dict[int, _Holder] = field(init=False, default_factory=dict)
    _free_ids: list[int] = field(init=False)
    _tick: int = field(init=False, default=0)
    _first_logits: FirstTokenLogits = field(init=False, default_factory=FirstTokenLogits)
    num_reserved: int = field(init=False, default=0)
    num_cache: int = field(init=False, default=0)  # cells owned by no running sequence

    def __post_init__(self) -> None:
        # A prefix is shared by copying its cells into the new sequence's id: with one
        # id (one slot holding the whole budget) there is no second id to copy into, and
        # a kept prefix would pin the only id (every second request failed to admit).
        self.share = self.share and self.num_seq_ids > 1
        # The lowest free id first: with per-slot KV llama.cpp decodes each run of
        # consecutive seq ids apart, so busy ids are kept together.
        self._free_ids = list(range(self.num_seq_ids))

    per_slot = False

    @property
    def sequence_tokens(self) -> int:
        """Most cells one sequence may hold: all of them."""
        return self.capacity_tokens

    # -- budget -----------------------------------------------------------------

    @property
    def capacity_bytes(self) -> int:
        return self.capacity_tokens * self.bytes_per_token

    @property
    def reserved_bytes(self) -> int:
        return self.num_reserved * self.bytes_per_token

    @property
    def num_free(self) -> int:
        """Cells neither reserved nor cached."""
        return self.capacity_tokens - self.num_reserved - self.num_cache

    def could_ever_fit(self, num_tokens: int) -> bool:
        return num_tokens <= self.sequence_tokens

    @property
    def reuses_prefixes(self) -> bool:
        return self.share

    def stats(self) -> KvCacheStats:
        used = sum(len(n.tokens) for n in self._tree.nodes() if n.running_refs)
        cached = sum(len(n.tokens) for n in self._tree.nodes() if not n.running_refs)
        for holder in self._holders.values():
            if holder.running:
                used += holder.private
            else:
                cached += holder.private
        return KvCacheStats(used, cached, self.num_reserved)

    # -- admission ---------------------------------------------------------------

    def cached_length(self, tokens: Sequence[int], whole: bool = False, reuse: bool = True) -> int:
        """Tokens of ``tokens`` an admission now would find in KV. The last one is
        computed again (its logits give the first token) unless ``whole``: the
        caller kept those logits (:meth:`keep_logits`). None without ``reuse``."""
        prefix = tokens if whole else tokens[:-1]
        if len(prefix) < 1:
            return 0
        if not (self.share and reuse):
            return 0
        node, offset = self._tree.lookup(prefix)
        return node.start + offset if node is not self._tree.root else 0

    def can_admit(self, tokens: Sequence[int], total_tokens: int, reuse: bool = True) -> bool:
        """Whether ``admit`` would succeed now, evicting cache if it must."""
        matched = self.cached_length(tokens, reuse=reuse)
        pinned = self._evictable_in_prefix(tokens[:matched]) if matched else 0
        return self._can_make_room(total_tokens - matched, pinned)

    def can_restore(self, total_tokens: int) -> bool:
        return self._can_make_room(total_tokens, 0)

    def _can_make_room(self, need: int, pinned: int) -> bool:
        """``pinned``: evictable cells the new sequence itself would hold."""
        reclaimable = sum(len(n.tokens) for n in self._tree.evictable()) - pinned
        reclaimable += sum(h.private for h in self._holders.values() if not h.running)
        has_id = bool(self._free_ids) or any(not h.running for h in self._holders.values())
        return has_id and need <= self.num_free + reclaimable

    def _evictable_in_prefix(self, prefix: Sequence[int]) -> int:
        node, offset = self._tree.lookup(prefix)
        nodes = list(node.path())
        lengths = [offset, *(len(n.tokens) for n in nodes[1:])]
        return sum(n for n, node in zip(lengths, nodes, strict=True) if node.evictable)

    def keep_logits(self, prompt: Sequence[int], logits: Any) -> None:
        """The logits of ``prompt``'s last token, kept with its cells: a request for the
        same prompt while they are cached samples its first token without a decode."""
        self._first_logits.put(prompt, logits)

    def admit(self, tokens: Sequence[int], total_tokens: int, reuse: bool = True) -> Admission:
        """Attach the longest cached prefix of ``tokens`` to a new sequence id that
        reserves the rest of ``total_tokens``; all of ``tokens`` when the logits of
        its last one were kept (the admission carries them); nothing without
        ``reuse`` (its cells are published as they are computed, as any sequence's).
        Call :meth:`can_admit` first."""
        logits = self._first_logits.get(tokens) if self.reuses_prefixes and reuse else None
        admission = self._admit(tokens, total_tokens, logits is not None, reuse)
        if admission.n_cached == len(tokens):
            admission.first_logits = logits
        return admission

    def _admit(
        self, tokens: Sequence[int], total_tokens: int, whole: bool, reuse: bool
    ) -> Admission:
        matched = self.cached_length(tokens, whole, reuse)
        end = self._tree.attach_point(tokens, matched)
        for node in end.path():
            node.running_refs += 1  # pinned: the evictions below must not take it
        need = total_tokens - matched
        ops = self._make_room(need, need_id=True)
        seq_id = heapq.heappop(self._free_ids)
        if matched:
            ops.append(CopyPrefix(min(end.holders), seq_id, matched))
        holder = _Holder(seq_id, end, matched, reserved=need)
        self._holders[seq_id] = holder
        self.num_reserved += need
        for node in end.path():
            node.holders.add(seq_id)
        self._touch(holder)
        ops.extend(self._drop_redundant(end, keep=seq_id))
        return Admission(seq_id, matched, ops)

    def attach_published(self, seq_id: int, tokens: Sequence[int]) -> Attachment:
        """Attach to a running sequence that has computed nothing of its own yet the
        longer prefix of ``tokens`` published since its admission (another sequence
        was prefilling it then); its reservation shrinks by the cells it gained. The
        whole prompt only when the logits of its last token were kept (the attachment
        carries them), else all but that token, computed again."""
        holder = self._holders[seq_id]
        logits = self._first_logits.get(tokens) if self.share else None
        matched = self.cached_length(tokens, whole=logits is not None)
        if not self.share or holder.private or matched <= holder.attached:
            return NO_ATTACHMENT
        had = set(map(id, holder.node.path()))
        end = self._tree.attach_point(tokens, matched)
        for node in end.path():
            if id(node) not in had:
                node.running_refs += 1
                node.holders.add(seq_id)
        gained = matched - holder.attached
        holder.node, holder.n_cells = end, matched
        holder.reserved -= gained
        self.num_reserved -= gained
        self._touch(holder)
        ops: list[KvOp] = [CopyPrefix(min(end.holders - {seq_id}), seq_id, matched)]
        ops.extend(self._drop_redundant(end, keep=seq_id))
        return Attachment(gained, tuple(ops), logits if matched == len(tokens) else None)

    def restore(
        self,
        key: str,
        n_cells: int,
        total_tokens: int,
        tokens: Sequence[int] = (),
        n_prompt: int = 0,
    ) -> Admission:
        """A new id for an offloaded sequence, its ``n_cells`` loaded from host
        memory (private: a saved state is restored whole; ``tokens`` and ``n_prompt``
        matter only to the per-slot book)."""
        ops = self._make_room(total_tokens, need_id=True)
        seq_id = heapq.heappop(self._free_ids)
        holder = _Holder(seq_id, self._tree.root, n_cells, reserved=total_tokens, diverged=True)
        self._holders[seq_id] = holder
        self.num_reserved += total_tokens
        self._touch(holder)
        ops.append(LoadState(seq_id, key))
        return Admission(seq_id, 0, ops)

    # -- growth ----------------------------------------------------------------------

    def computed(self, seq_id: int, tokens: Sequence[int], n_cells: int, publish: bool) -> None:
        """A running sequence now has ``n_cells`` cells, for ``tokens[:n_cells]``;
        ``publish`` offers the new ones to other sequences."""
        holder = self._holders[seq_id]
        if publish and self.share:
            self._publish(holder, tokens, n_cells)
        holder.n_cells = n_cells

    def _publish(self, holder: _Holder, tokens: Sequence[int], n_cells: int) -> None:
        if holder.diverged or n_cells <= holder.attached:
            return
        new = list(tokens[holder.attached : n_cells])
        end = holder.node
        if new[0] in end.children:
            holder.diverged = True  # another sequence computed these tokens first
            return
        own_leaf = end.owner == holder.seq_id and end.holders == {holder.seq_id}
        if end.parent is not None and own_leaf and not end.children:
            end.tokens.extend(new)
        else:
            child = PrefixNode(new, end.end, end)
            child.owner = holder.seq_id
            child.holders.add(holder.seq_id)
            child.running_refs = 1
            end.children[new[0]] = child
            holder.node = child
        self._touch(holder)

    # -- the end -----------------------------------------------------------------------

    def release(
        self, seq_id: int, tokens: Sequence[int], keep: bool, n_prompt: int = 0
    ) -> list[KvOp]:
        """A running sequence ended. Its attached path stays as cache; with ``keep``
        its other cells too (published when they can be, else kept whole without
        sharing); without, they are freed at once. (``n_prompt`` matters only to the
        per-slot book.)"""
        holder = self._holders[seq_id]
        if keep and self.share:
            self._publish(holder, tokens, holder.n_cells)
        kept = holder.n_cells if keep else 0
        start = holder.attached if self.share else kept
        ops: list[KvOp] = [Truncate(seq_id, start, holder.n_cells - start, "release")]
        holder.n_cells = start
        self._stop_running(holder)
        if start and not self.share:
            self.num_cache += holder.private
        if holder.n_cells == 0:
            self._forget(holder)
        else:
            ops.extend(self._drop_redundant(holder.node, keep=None))
        return ops

    def kept(self) -> list[tuple[int, tuple[int, ...], int, Any]]:
        """Nothing: the pool's cached prefixes are not written to the disk tier (only the
        per-slot layout's kept slots are, each one sequence's whole state)."""
        return []

    def offload(self, seq_id: int, key: str) -> list[KvOp]:
        """Save a running sequence to host memory and free its cells; its attached
        path stays as cache."""
        return [SaveState(seq_id, key), *self._retag_offload(self.release(seq_id, (), False))]

    @staticmethod
    def _retag_offload(ops: list[KvOp]) -> list[KvOp]:
        return [
            Truncate(op.seq_id, op.start, op.n_tokens, "offload")
            if isinstance(op, Truncate) and op.reason == "release"
            else op
            for op in ops
        ]

    def _stop_running(self, holder: _Holder) -> None:
        self.num_reserved -= holder.reserved
        holder.reserved = 0
        holder.running = False
        for node in holder.node.path():
            node.running_refs -= 1
            if node.owner == holder.seq_id:
                node.owner = None
                self.num_cache += len(node.tokens)

    # -- eviction --------------------------------------------------------------------

    def _make_room(self, need: int, *, need_id: bool) -> list[KvOp]:
        ops: list[KvOp] = []
        while need > self.num_free or (need_id and not self._free_ids):
            if not self._evict_one(ops):
                raise RuntimeError(f"KV cache cannot make room for {need} tokens")
        return ops

    def _evict_one(self, ops: list[KvOp]) -> bool:
        """Free the least recently used cache entry: a leaf node, or the private
        cells of a sequence kept without sharing. False when nothing is evictable."""
        leaves = [n for n in self._tree.evictable() if not n.children]
        lingering = [h for h in self._holders.values() if not h.running and h.private]
        leaf = min(leaves, key=lambda n: n.last_used, default=None)
        linger = min(lingering, key=lambda h: h.last_used, default=None)
        if linger is not None and (leaf is None or linger.last_used <= leaf.last_used):
            self.num_cache -= linger.private
            ops.append(Truncate(linger.seq_id, linger.attached, linger.private, "evict"))
            linger.n_cells = linger.attached
            if linger.n_cells == 0:
                self._forget(linger)
            return True
        if leaf is None:
            return False
        self._evict_leaf(leaf, ops)
        return True

    def _evict_leaf(self, leaf: PrefixNode, ops: list[KvOp]) -> None:
        parent = leaf.parent
        assert parent is not None  # the root is never evictable
        del parent.children[leaf.tokens[0]]
        self.num_cache -= len(leaf.tokens)
        for seq_id in sorted(leaf.holders):
            holder = self._holders[seq_id]
            ops.append(Truncate(seq_id, leaf.start, len(leaf.tokens), "evict"))
            holder.node = parent
            holder.n_cells = leaf.start
            if holder.n_cells == 0:
                self._forget(holder)
        leaf.holders.clear()
        ops.extend(self._drop_redundant(parent, keep=None))

    def _drop_redundant(self, node: PrefixNode, keep: int | None) -> list[KvOp]:
        """Cache ids ending at ``node`` whose cells another id also tags are let go,
        so that ids stay free for new sequences."""
        ops: list[KvOp] = []
        if node.parent is None:
            return ops
        for seq_id in sorted(node.holders):
            holder = self._holders[seq_id]
            others = len(node.holders) > 1
            if seq_id != keep and not holder.running and holder.node is node and others:
                ops.append(Truncate(seq_id, 0, holder.n_cells, "drop"))
                self._forget(holder)
        return ops

    def _forget(self, holder: _Holder) -> None:
        for node in holder.node.path():
            node.holders.discard(holder.seq_id)
        del self._holders[holder.seq_id]
        heapq.heappush(self._free_ids, holder.seq_id)

    def _touch(self, holder: _Holder) -> None:
        self._tick += 1
        holder.last_used = self._tick
        for node in holder.node.path():
            node.last_used = self._tick
