"""Which sequences run in the next decode step: pure policy, no model, no I/O.

Each step holds one token of every decoding sequence that is not paused (plus its
prompt-lookup draft, when speculation is on: ``speculation/prompt_lookup.py``), and then prompt
chunks of prefilling sequences, shortest remaining prompt first, up to the step's
prefill budget (``prefill_budget.py``): all of ``prefill_chunk_tokens`` for a lone
prompt, else what keeps the others' inter-token latency near its target, except
for a prompt that has waited ``urgent_after_s`` (half its TTFT time-out) for its
first token: it goes first and gets whole batches.
A long prompt is therefore prefilled over many steps while the others keep
decoding, and a short request that arrives during it gets its first token after
one chunk, not after the whole prompt.

Admission needs a free slot plus KV for prompt + max_tokens minus what the
prefix cache already holds (:class:`KvCache`, which evicts cache to make room);
it happens on arrival when both are free, else the request waits in a bounded
FIFO. Offloaded sequences that were resumed come back before the queue. The KV
operations admission, finishing and offload imply are handed to the engine
(``take_kv_ops``), which applies them before the next decode.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edge_llm.engine.kv.book import KvBook, KvOp, Truncate, common_prefix
from edge_llm.engine.scheduling.admission import QueueView, queue_view
from edge_llm.engine.scheduling.prefill_budget import PrefillBudget
from edge_llm.engine.scheduling.priorities import (
    next_in_line,
    prefill_order,
    queue_key,
    queue_position,
)
from edge_llm.engine.sequence import Sequence
from edge_llm.engine.speculation.prompt_lookup import PROBE_EVERY, PromptLookup
from edge_llm.errors import KvBudgetExceeded, KvBudgetNeverFits, QueueFull
from edge_llm.protocol.stream_rules import StreamState

# An admitted sequence waits for a prompt start another sequence is prefilling right
# now when it would otherwise compute at least this many of those tokens again itself,
# or at least half of all it would compute (identical prompts after a cached system
# prompt: each computing its own 27 tokens beside the others' decodes took 2-5 s on a
# loaded machine; waiting, each samples its first token from the kept logits).
HOLD_FOR_PREFIX_TOKENS = 32


@dataclass(frozen=True)
class _DraftPrice:
    threshold: float  # a draft token pays above this chance of acceptance
    probe_every: int  # proposals between one-token probes when none pays


@dataclass(frozen=True)
class _AwaitedPrefix:
    seq: Sequence  # admitted, prefilling nothing yet
    source: Sequence  # prefilling the start of seq's prompt
    n_tokens: int  # how much of it they share


def _prefilling(seq: Sequence, n_tokens: int) -> bool:
    """Whether ``seq`` is computing its first ``n_tokens`` prompt tokens right now."""
    return seq.runnable and seq.state is StreamState.PREFILL and seq.num_computed < n_tokens


@dataclass(frozen=True)
class SchedulerLimits:
    max_sequences: int
    max_queue: int
    prefill_chunk_tokens: int
    itl_target_s: float | None = None  # None: a fixed chunk of prefill_chunk_tokens
    max_draft_tokens: int = 0  # 0: no speculation
    # A prompt still waiting for its first token this long after it arrived gets the
    # whole batch: past it, holding others' ITL steady would cost it its TTFT time-out.
    urgent_after_s: float | None = None
    max_preemptions: int = 3  # times one stream may be preempted (priorities.py)

    @property
    def max_batch_tokens(self) -> int:
        return self.max_sequences * (1 + self.max_draft_tokens) + self.prefill_chunk_tokens


@dataclass
class ScheduledChunk:
    seq: Sequence
    tokens: list[int]
    start_pos: int
    sample: bool = False  # a prompt chunk samples when it ends the prompt
    prompt: bool = False  # a chunk of the prompt (else a decode chunk, or kept logits)
    n_draft: int = 0  # the ``n_draft`` tokens before the pad are a draft to verify
    n_pad: int = 0  # the last ``n_pad`` tokens are computed, never sampled (``_pad``)
    logits: Any = None  # no tokens: the first token comes from these kept logits
    keep_logits: bool = False  # keep the logits its token is sampled from (a prompt's end)


@dataclass
class StepPlan:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    started: list[Sequence] = field(default_factory=list)
    # The started sequences that get a sampler: those not finished when the plan was
    # made (under the lock). One cancelled after it still gets one, for its chunk may
    # sample in this step; its end frees the sampler after the decode.
    sampling: list[Sequence] = field(default_factory=list)
    attached: list[tuple[Sequence, int]] = field(default_factory=list)  # (seq, cells gained)
    kv_ops: list[KvOp] = field(default_factory=list)  # applied, in order, before the decode
    ended_samplers: list[str] = field(default_factory=list)  # freed before the decode

    @property
    def num_prefill_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.chunks if c.prompt)

    @property
    def num_decode_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.chunks) - self.num_prefill_tokens

    def __bool__(self) -> bool:
        return bool(self.chunks)


class Scheduler:
    """Admission, the queue, returns from offload and each step's plan: one state
    (running, waiting, offloaded) that all of them change, hence one class; the
    policies it applies are pure modules of their own (priorities, prefill_budget,
    speculative, admission)."""

    def __init__(self, limits: SchedulerLimits, kv: KvBook) -> None:
        self.limits = limits
        self.kv = kv
        self.prefill_budget = PrefillBudget(
            limits.prefill_chunk_tokens, limits.itl_target_s, apart=kv.per_slot
        )
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.offloaded: list[Sequence] = []  # oldest first
        self._kv_ops: list[KvOp] = []
        self._started: list[Sequence] = []  # admitted since the last step
        self._awaiting: dict[str, _AwaitedPrefix] = {}  # by the waiting sequence's id
        self._now = 0.0  # of the last schedule: the queue's order ages with it

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    # -- admission ------------------------------------------------------------

    @staticmethod
    def reservation(seq: Sequence) -> int:
        """Cells the sequence may hold at most (its cached prefix included)."""
        return seq.n_prompt + seq.request.max_tokens

    @property
    def _has_slot(self) -> bool:
        return len(self.running) < self.limits.max_sequences

    def fits(self, seq: Sequence) -> bool:
        """A slot aside, whether KV for ``seq`` can be had now (evicting cache)."""
        request = seq.request
        return self.kv.can_admit(request.prompt_tokens, self.reservation(seq), request.reuse_cache)

    def can_restore(self, seq: Sequence) -> bool:
        """Whether the offloaded ``seq`` could come back now: a slot and its KV are free."""
        return self._has_slot and self.kv.can_restore(self.reservation(seq))

    def _may_start(self, seq: Sequence) -> bool:
        """Whether ``seq`` may start now: no offloaded stream comes back before it (a
        resumed one, or a preempted one of its class or a more urgent one: it holds its
        place while it waits for room), and a slot and its KV are free."""
        returns_first = self._resumed_offloaded() or any(
            s.preempted and s.priority <= seq.priority for s in self.offloaded
        )
        return not returns_first and self._has_slot and self.fits(seq)

    def add(self, seq: Sequence, now: float) -> None:
        """Admit a new sequence at once if a slot and its KV are free, else queue
        it; or raise the admission error the client gets."""
        need = self.reservation(seq)
        if not self.kv.could_ever_fit(need):
            raise KvBudgetNeverFits(
                f"prompt + max_tokens needs {need} KV tokens but {self._never_fits_limit()}; "
                "lower max_tokens or raise max_kv_cache_mb",
                param="max_tokens",
                kv_tokens_needed=need,
                kv_tokens_budget=self.kv.sequence_tokens,
            )
        if not self.waiting and self._may_start(seq):
            self._admit(seq, now)
            self._started.append(seq)
            return
        if len(self.waiting) < self.limits.max_queue:
            self.waiting.append(seq)
            return
        if self._has_slot:
            raise KvBudgetExceeded(
                f"KV budget in use: {need} tokens needed, {self.kv.num_free} free, "
                "and the queue is full",
                retry_after_s=2,
            )
        raise QueueFull(
            f"{len(self.running)} sequences running and {len(self.waiting)} waiting",
            retry_after_s=2,
        )

    def queue_view(self, seq: Sequence) -> QueueView:
        """What is ahead of ``seq``, waiting or about to be added (``admission.py``)."""
        running = [
            (s.prefill_remaining, s.request.max_tokens - s.n_generated if s.runnable else 0)
            for s in self.running if s is not seq
        ]  # fmt: skip
        if seq in self.running:
            return queue_view(seq.prefill_remaining, True, running, [])
        waiting = [w for w in self.waiting if w is not seq]
        admitted_now = not waiting and self._has_slot and self.fits(seq)
        key = queue_key(self.running, self._now)
        ahead_prompts = [w.n_prompt for w in waiting if key(w) < key(seq)]
        request = seq.request
        to_prefill = seq.n_prompt - self.kv.cached_length(
            request.prompt_tokens, reuse=request.reuse_cache
        )
        return queue_view(to_prefill, admitted_now, running, ahead_prompts)

    def queue_position(self, seq: Sequence) -> int | None:
        """Where a waiting sequence stands (1: next), None when not waiting."""
        if seq not in self.waiting:
            return None
        return queue_position(seq, self.waiting, self.running, self._now)

    def _never_fits_limit(self) -> str:
        if self.kv.sequence_tokens < self.kv.capacity_tokens:
            return f"one sequence may hold at most {self.kv.sequence_tokens} (kv_unified = false)"
        return f"the whole budget holds {self.kv.capacity_tokens}"

    def _admit(self, seq: Sequence, now: float) -> None:
        request = seq.request
        admission = self.kv.admit(request.prompt_tokens, self.reservation(seq), request.reuse_cache)
        seq.first_logits = admission.first_logits  # the whole prompt is in KV: no decode
        seq.cache_tier = admission.tier
        self._kv_ops.extend(admission.ops)
        seq.kv_reserved_tokens = self.reservation(seq) - admission.n_cached
        seq.slot = admission.seq_id
        seq.num_cached = seq.num_computed = admission.n_cached
        seq.state = StreamState.PREFILL
        seq.admitted_at = now
        self._await_prefix_in_flight(seq)
        self.running.append(seq)

    def next_in_line(self, now: float) -> Sequence | None:
        """The waiting sequence admitted next (``priorities.py``)."""
        return next_in_line(self.waiting, self.running, now) if self.waiting else None

    def _admit_waiting(self, now: float) -> list[Sequence]:
        started = []
        while self.waiting:
            seq = next_in_line(self.waiting, self.running, now)
            if not self._may_start(seq):
                break  # in order: a large request is not starved by smaller ones behind it
            self.waiting.remove(seq)
            self._admit(seq, now)
            started.append(seq)
        return started

    def _await_prefix_in_flight(self, seq: Sequence) -> None:
        """When another sequence is prefilling a start of the just admitted ``seq``'s
        prompt that the cache did not hold yet (requests arriving together with one
        system prompt), ``seq`` prefills nothing until those cells are published and
        then attaches them, instead of computing its own copy beside them. It holds
        its slot meanwhile, as it would have anyway; the wait ends with that prefill."""
        reuses = self.kv.reuses_prefixes and seq.request.reuse_cache
        if not reuses or seq.state is not StreamState.PREFILL:
            return
        prompt = seq.request.prompt_tokens[:-1]
        own_work = len(prompt) - seq.num_cached  # what it would compute before its last
        for other in self.running:
            shared = common_prefix(other.request.prompt_tokens, prompt)
            gain = shared - seq.num_cached
            worth = gain >= HOLD_FOR_PREFIX_TOKENS or (gain > 0 and 2 * gain >= own_work)
            if worth and _prefilling(other, shared):
                self._awaiting[seq.id] = _AwaitedPrefix(seq, other, shared)
                return

    def _attach_published(self) -> list[tuple[Sequence, int]]:
        """Waiting sequences whose prefix is published (or whose source stopped
        prefilling) attach what the cache holds now and prefill the rest; returns
        (sequence, cells gained) of those that gained some."""
        attached = []
        for wait in list(self._awaiting.values()):
            if _prefilling(wait.source, wait.n_tokens):
                continue
            seq = self._awaiting.pop(wait.seq.id).seq
            attachment = self.kv.attach_published(seq.require_slot(), seq.request.prompt_tokens)
            gained = attachment.gained
            self._kv_ops.extend(attachment.ops)
            if attachment.first_logits is not None:  # the whole prompt: no decode before it
                seq.first_logits = attachment.first_logits
            seq.kv_reserved_tokens -= gained
            seq.num_cached += gained
            seq.num_computed += gained
            if gained:
                attached.append((seq, gained))
        return attached

    @property
    def head_blocked(self) -> bool:
        """The next in line (a resumed offloaded stream, or a preempted one due back,
        else the queue's head) waits for KV or a slot."""
        returning = self._resumed_offloaded() or self.preempted_due()
        if returning:
            return not self.can_restore(returning[0])
        head = self.next_in_line(self._now)
        return head is not None and not (self._has_slot and self.fits(head))

    # -- offload ---------------------------------------------------------------------

    def offload(self, seq: Sequence) -> None:
        """Save a running sequence's KV to host memory and give back its slot and cells."""
        self._kv_ops.extend(self.kv.offload(seq.require_slot(), seq.id))
        self._awaiting.pop(seq.id, None)  # restored whole, it attaches nothing more
        seq.slot, seq.kv_reserved_tokens, seq.offloaded = None, 0, True
        self.running.remove(seq)
        self.offloaded.append(seq)

    def _resumed_offloaded(self) -> list[Sequence]:
        return [s for s in self.offloaded if not s.paused]

    def preempted_due(self) -> list[Sequence]:
        """Preempted streams no waiting request outranks: each comes back as soon as
        there is room for it (``PreemptionPolicy``), oldest first."""
        waiting = [w.priority for w in self.waiting]
        return [
            s for s in self.offloaded
            if s.preempted and not any(p < s.priority for p in waiting)
        ]  # fmt: skip

    @property
    def restoring(self) -> bool:
        """An offloaded stream was resumed: it comes back before anyone is admitted."""
        return bool(self._resumed_offloaded())

    def _restore_resumed(self) -> None:
        """Offloaded sequences that were resumed come back first (they are older)."""
        for seq in self._resumed_offloaded():
            if not self.can_restore(seq):
                break
            need = self.reservation(seq)
            admission = self.kv.restore(seq.id, seq.num_computed, need, seq.token_ids, seq.n_prompt)
            self._kv_ops.extend(admission.ops)
            seq.slot, seq.kv_reserved_tokens, seq.offloaded = admission.seq_id, need, False
            self.offloaded.remove(seq)
            self.running.append(seq)

    # -- the step -----------------------------------------------------------------

    def schedule(self, now: float, draft_room: Callable[[Sequence], int] | None = None) -> StepPlan:
        """The next step. ``draft_room(seq)``: most tokens the sequence may emit in
        one step (room in its outbound ring); drafts stay below it."""
        self._now = now
        started, self._started = self._started, []
        self._restore_resumed()
        plan = StepPlan(started=[*started, *self._admit_waiting(now)])
        started_ids = {seq.id for seq in plan.started}  # they report the whole cached prefix
        plan.attached = [(s, n) for s, n in self._attach_published() if s.id not in started_ids]
        plan.chunks.extend(self._decode_chunks(draft_room))
        n_decode_tokens = sum(len(chunk.tokens) for chunk in plan.chunks)
        prefilling = [
            s
            for s in self.running
            if s.runnable and s.state is StreamState.PREFILL and s.id not in self._awaiting
        ]
        urgent = self._urgent(prefilling, now)
        if urgent:
            budget = self.limits.prefill_chunk_tokens
        else:
            budget = self.prefill_budget.tokens(n_decode_tokens, len(prefilling))
            if not n_decode_tokens:  # no one's ITL to keep: the shortest prompt finishes
                budget = max(
                    budget, min(self._shortest(prefilling), self.limits.prefill_chunk_tokens)
                )
        plan.chunks.extend(self._prefill_chunks(prefilling, budget, urgent))
        return plan

    @staticmethod
    def _shortest(prefilling: list[Sequence]) -> int:
        """The fewest prompt tokens a prefilling sequence has left (0: none left)."""
        return min((s.prefill_remaining for s in prefilling if s.prefill_remaining), default=0)

    def observe_step(self, plan: StepPlan, seconds: float) -> None:
        """A step's measured time, for the prefill budget, the drafts' worth and
        admission's predictions."""
        n_chunks = sum(1 for chunk in plan.chunks if chunk.prompt)
        self.prefill_budget.observe(
            plan.num_prefill_tokens, n_chunks, plan.num_decode_tokens, seconds
        )

    def _decode_chunks(self, draft_room: Callable[[Sequence], int] | None) -> list[ScheduledChunk]:
        """One chunk per decoding sequence: its last token, its draft, and the pad rows
        that give every sequence as many rows (``_pad``)."""
        decoding = [s for s in self.running if s.runnable and s.state is StreamState.DECODING]
        price = _DraftPrice(
            self.prefill_budget.costs.draft_price(len(decoding), self.kv.per_slot),
            PROBE_EVERY * (len(decoding) if self.kv.per_slot else 1),
        )
        chunks = [self._decode_chunk(seq, draft_room, price) for seq in decoding]
        if self.kv.per_slot:
            _pad(chunks)
        return chunks

    def _decode_chunk(
        self,
        seq: Sequence,
        draft_room: Callable[[Sequence], int] | None,
        price: _DraftPrice,
    ) -> ScheduledChunk:
        assert seq.last_token is not None
        room = draft_room(seq) if draft_room else self.limits.max_draft_tokens + 1
        draft = self._draft(seq, room, price)
        tokens = [seq.last_token, *draft]
        return ScheduledChunk(seq, tokens, seq.num_computed, sample=True, n_draft=len(draft))

    def _draft(self, seq: Sequence, room: int, price: _DraftPrice) -> list[int]:
        """Prompt-lookup draft: at most one token fewer than may still be emitted
        (max_tokens, ring room), so an accepted run never overruns either."""
        max_draft = self.limits.max_draft_tokens
        if max_draft <= 0:
            return []
        if seq.lookup is None:
            seq.lookup = PromptLookup(max_draft)
        limit = min(room, seq.request.max_tokens - seq.n_generated) - 1
        return seq.lookup.propose(seq.token_ids, limit, price.threshold, price.probe_every)

    def _urgent(self, prefilling: list[Sequence], now: float) -> list[Sequence]:
        """Prompts past ``urgent_after_s`` without a first token, oldest first; one with
        a TTFT time-out of its own (a background response's) waits its turn instead."""
        after = self.limits.urgent_after_s
        if after is None:
            return []
        engines = [seq for seq in prefilling if seq.request.ttft_timeout_s is None]
        late = [seq for seq in engines if now - seq.created_at >= after]
        return sorted(late, key=lambda seq: seq.created_at)

    def _prefill_chunks(
        self, prefilling: list[Sequence], budget: int, urgent: list[Sequence]
    ) -> list[ScheduledChunk]:
        """Prompts whose first token comes from kept logits, then the urgent ones,
        then the shortest remaining prompt first."""
        chunks = []
        for seq in prefilling:
            if seq.first_logits is not None:
                logits, seq.first_logits = seq.first_logits, None
                chunks.append(ScheduledChunk(seq, [], seq.num_computed, True, logits=logits))
        urgent = [seq for seq in urgent if seq.prefill_remaining]
        late = {seq.id for seq in urgent}
        rest = prefill_order([s for s in prefilling if s.id not in late and s.prefill_remaining])
        for seq in [*urgent, *rest]:
            if budget <= 0:
                break
            chunks.append(self._prompt_chunk(seq, budget))
            budget -= len(chunks[-1].tokens)
        return chunks

    def _prompt_chunk(self, seq: Sequence, budget: int) -> ScheduledChunk:
        """The next ``budget`` prompt tokens of ``seq``; the chunk that ends the prompt
        samples the first token, and keeps its logits for a regenerate of the prompt."""
        start = seq.num_computed
        tokens = seq.request.prompt_tokens[start : start + min(seq.prefill_remaining, budget)]
        last = start + len(tokens) == seq.n_prompt
        keep = last and self.kv.reuses_prefixes
        return ScheduledChunk(seq, tokens, start, sample=last, prompt=True, keep_logits=keep)

    def complete(self, chunk: ScheduledChunk) -> None:
        """Record that a prompt chunk was decoded; its cells become visible to the
        prefix cache at once. The chunk that ends the prompt sampled the first token
        (recorded next, by the output): the sequence decodes from then on."""
        seq = chunk.seq
        seq.num_computed += len(chunk.tokens)
        self.kv.computed(seq.require_slot(), seq.token_ids, seq.num_computed, publish=True)
        if chunk.sample:
            seq.state = StreamState.DECODING

    def complete_run(self, chunk: ScheduledChunk, n_kept: int, n_accepted: int) -> None:
        """A decode chunk was verified and its output recorded: the cells of its first
        ``n_kept`` tokens (the fed-back token and the drafts before the last token
        recorded) are the sequence's; the others' (rejected drafts, or tokens after
        the end of the stream) are dropped before the next decode. ``n_accepted``:
        the run the model accepted, for the draft's acceptance rate."""
        seq = chunk.seq
        seq.state = StreamState.DECODING  # a first token from kept logits ends the prompt
        slot = seq.require_slot()
        n_cells = min(n_kept, len(chunk.tokens))  # none for kept logits
        seq.num_computed += n_cells
        self.kv.computed(slot, seq.token_ids, seq.num_computed, publish=False)
        unused = len(chunk.tokens) - n_cells
        if unused > 0:
            self._kv_ops.append(Truncate(slot, seq.num_computed, unused, "reject"))
        if seq.lookup is not None:
            seq.lookup.feedback(chunk.n_draft, n_accepted - 1)

    @staticmethod
    def record_token(seq: Sequence, token: int, now: float) -> None:
        seq.append(token)
        if seq.first_token_at is None:
            seq.first_token_at = now

    # -- the end --------------------------------------------------------------------

    def finish(self, seq: Sequence, state: StreamState, now: float, *, keep: bool) -> None:
        """End a sequence: give back its slot and KV reservation. Its cached prefix
        stays as cache; ``keep`` keeps its other cells too, else they are freed."""
        if seq.state.finished:
            return
        seq.state = state
        seq.finished_at = now
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.offloaded:
            self.offloaded.remove(seq)
        self._awaiting.pop(seq.id, None)
        seq.first_logits = None
        if seq in self.running:
            self.running.remove(seq)
            ops = self.kv.release(seq.require_slot(), seq.token_ids, keep, seq.n_prompt)
            self._kv_ops.extend(ops)
            seq.kv_reserved_tokens = 0  # the slot stays as a record of where it ran

    def take_kv_ops(self) -> list[KvOp]:
        """KV operations to apply, in order, before the next decode."""
        ops, self._kv_ops = self._kv_ops, []
        return ops


def _pad(chunks: list[ScheduledChunk]) -> None:
    """Per-slot layout: give every decode chunk as many rows as the longest (its
    draft), with rows that are computed, never sampled, and dropped: llama.cpp splits
    a batch into ubatches holding as many rows of each sequence, and one ubatch is the
    cheapest. Pad rows follow the rows they pad, so causal attention keeps them out of
    every sampled row."""
    length = max((len(c.tokens) for c in chunks), default=0)
    for chunk in chunks:
        n_pad = length - len(chunk.tokens)
        chunk.tokens = [*chunk.tokens, *[chunk.tokens[-1]] * n_pad]
        chunk.n_pad = n_pad
