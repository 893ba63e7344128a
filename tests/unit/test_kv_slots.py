"""The per-slot KV book, checked against the fake backend's cells: what may be reused
(every cached cell that starts the prompt, a previous answer's included), which slot a
request runs in, the host tier, and that the books always equal the cells that exist."""

from __future__ import annotations

import dataclasses
import random

import pytest

from edge_llm.engine.kv.book import (
    NO_ATTACHMENT,
    CopyPrefix,
    KvOp,
    LoadCache,
    LoadState,
    SaveCache,
    SaveState,
    Truncate,
)
from edge_llm.engine.kv.host_cache import HostCache
from edge_llm.engine.kv.slots import SWITCH_SLOT_TOKENS, KvSlots, usable_prefix
from edge_llm.engine.kv.tier import SavedKv
from edge_llm.engine.runtime.backend import BatchItem
from edge_llm.protocol.sampling import SamplingParams

from fakes import FakeBackend

SYSTEM = list(range(500, 540))  # a 40-token "system prompt"
LONG = list(range(1000, 1100))  # a longer prompt


class Driver:
    """Runs sequences through KvSlots and a per-slot FakeBackend as the engine does."""

    def __init__(self, slots: int = 4, per_slot: int = 400, host_bytes: int = 0) -> None:
        self.host = HostCache(host_bytes, 1)
        self.kv = KvSlots(slots * per_slot, 1, slots, per_slot, host=self.host)
        self.backend = FakeBackend(
            kv_capacity_tokens=slots * per_slot, max_sequences=slots, per_slot=True
        )
        self.tokens: dict[int, list[int]] = {}
        self.n_prompt: dict[int, int] = {}
        self.states: dict[str, bytes] = {}

    def apply(self, ops: list[KvOp]) -> None:
        for op in ops:
            if isinstance(op, CopyPrefix):
                self.backend.copy_prefix(op.src, op.dst, op.n_tokens)
            elif isinstance(op, Truncate):
                self.backend.truncate(op.seq_id, op.start)
            elif isinstance(op, SaveState):
                self.states[op.key] = self.backend.save_state(op.seq_id)
            elif isinstance(op, LoadState):
                self.backend.load_state(op.seq_id, self.states.pop(op.key))
            elif isinstance(op, SaveCache):
                self.host.store(op.key, SavedKv(self.backend.save_state(op.seq_id)))
            elif isinstance(op, LoadCache):
                state = self.host.state(op.key)
                assert state is not None
                self.backend.load_state(op.seq_id, state)
        stats = self.kv.stats()
        assert self.backend.num_used_cells == stats.used_tokens + stats.cached_tokens

    def admit(self, prompt: list[int], max_tokens: int = 10, reuse: bool = True) -> tuple[int, int]:
        assert self.kv.can_admit(prompt, len(prompt) + max_tokens, reuse)
        admission = self.kv.admit(prompt, len(prompt) + max_tokens, reuse)
        self.apply(admission.ops)
        self.tokens[admission.seq_id] = list(prompt)
        self.n_prompt[admission.seq_id] = len(prompt)
        self.backend.start_sequence(str(admission.seq_id), SamplingParams())
        return admission.seq_id, admission.n_cached

    def prefill(self, seq_id: int, n_rows: int, chunk: int = 64) -> None:
        """Compute prompt rows up to ``n_rows`` (the cached ones are in KV already) in
        chunks of about ``chunk``, as the scheduler does."""
        done = len(self.backend.kv.get(seq_id, []))
        while done < n_rows:
            tokens = self.tokens[seq_id][done : min(n_rows, done + chunk)]
            self.backend.decode([BatchItem(seq_id, tokens, done, False, str(seq_id))])
            done += len(tokens)
            self.kv.computed(seq_id, self.tokens[seq_id], done, publish=True)

    def generate(self, seq_id: int, n: int) -> None:
        """Decode the prompt's last token and ``n - 1`` more (token ids 900+)."""
        for i in range(n):
            pos = len(self.backend.kv[seq_id])
            token = self.tokens[seq_id][pos]
            self.tokens[seq_id].append(900 + i)
            self.backend.decode([BatchItem(seq_id, [token, token], pos, False, str(seq_id))])
            self.backend.truncate(seq_id, pos + 1)  # the pad row
            self.kv.computed(seq_id, self.tokens[seq_id], pos + 1, publish=False)

    def run(self, prompt: list[int], n_generated: int = 5, keep: bool = True) -> int:
        seq, _ = self.admit(prompt)
        self.prefill(seq, len(prompt) - 1)
        self.generate(seq, n_generated)
        self.release(seq, keep)
        return seq

    def release(self, seq_id: int, keep: bool = True) -> None:
        ops = self.kv.release(seq_id, self.tokens[seq_id], keep, self.n_prompt[seq_id])
        self.apply(ops)


def test_usable_prefix_is_every_matching_cell_but_the_prompts_last() -> None:
    short = [*SYSTEM, 1, 2]
    assert usable_prefix(short, len(short), short) == len(short) - 1
    assert usable_prefix([*short, 900], len(short), [*short, 900, 3]) == len(short) + 1
    long = [*SYSTEM, *LONG]
    assert usable_prefix(short, len(short), long) == len(SYSTEM)  # the shared start
    assert usable_prefix(long, len(long), long) == len(long) - 1
    # The next turn: the earlier prompt and its answer.
    turn = [*long, 900, 901, *range(2000, 2100)]
    assert usable_prefix([*long, 900, 901], len(long), turn) == len(long) + 2
    close = [*long, 900, 901, 7]
    assert usable_prefix([*long, 900, 901], len(long), close) == len(close) - 1
    # Kept logits: a regenerate needs no decode at all.
    assert usable_prefix(long, len(long), long, whole=True) == len(long)
    assert usable_prefix([*long, 900], len(long), long[:-1], whole=True) == len(long) - 2


def test_a_regenerate_continues_the_finished_slot() -> None:
    d = Driver()
    for prompt in ([*SYSTEM, *range(10, 30)], [*SYSTEM, *LONG]):
        seq = d.run(prompt)
        assert d.kv.stats().cached_tokens == len(prompt) + 4
        assert d.admit(prompt) == (seq, len(prompt) - 1)
        assert len(d.backend.kv[seq]) == len(prompt) - 1  # the answer's cells were dropped
        d.release(seq, keep=False)


def test_a_regenerate_saves_nothing_and_keeps_the_prompts_logits_for_the_next() -> None:
    """The cells a regenerate drops in its slot are the answer's, which no request
    may reuse: no save to the host tier delays it. The prompt's kept logits stay with
    the slot, so the next regenerate needs no decode either."""
    d = Driver(host_bytes=64 << 20)
    prompt = [*SYSTEM, *LONG]  # over MIN_SAVED_CELLS
    seq, _ = d.admit(prompt)
    d.prefill(seq, len(prompt) - 1)
    d.generate(seq, 5)
    d.kv.keep_logits(prompt, "logits")  # as Output does with the first token's
    d.release(seq)
    for _ in range(2):
        admission = d.kv.admit(prompt, len(prompt) + 10)
        assert admission.seq_id == seq and admission.first_logits == "logits"
        assert not any(isinstance(op, SaveCache) for op in admission.ops)
        d.apply(admission.ops)
        assert len(d.backend.kv[seq]) == len(prompt)
        d.tokens[seq] = [*prompt, 900]
        d.backend.decode([BatchItem(seq, [900], len(prompt), False, str(seq))])
        d.kv.computed(seq, d.tokens[seq], len(prompt) + 1, publish=False)
        d.release(seq)


def test_without_reuse_the_slot_computes_its_prompt_again_and_keeps_it() -> None:
    """llama-server's ``cache_prompt: false``: no cached cell and no kept logits are
    used; the slot that held the prompt computes it again (nothing is saved to the
    host tier for that: it will hold the same prompt), and keeps it for the next."""
    d = Driver(host_bytes=64 << 20)
    prompt = [*SYSTEM, *LONG]  # over MIN_SAVED_CELLS
    seq, _ = d.admit(prompt)
    d.prefill(seq, len(prompt) - 1)
    d.generate(seq, 5)
    d.kv.keep_logits(prompt, "logits")
    d.release(seq)
    assert d.kv.cached_length(prompt, reuse=False) == 0
    assert d.admit(prompt, reuse=False) == (seq, 0)
    assert not d.backend.kv[seq] and len(d.host) == 0
    d.prefill(seq, len(prompt) - 1)
    d.generate(seq, 5)
    d.release(seq)
    assert d.admit(prompt) == (seq, len(prompt) - 1)


def test_without_reuse_no_other_slot_or_host_entry_is_copied() -> None:
    d = Driver(slots=2, host_bytes=10_000)
    first = [*SYSTEM, *LONG]
    seq = d.run(first)
    busy, _ = d.admit(list(range(5000, 5020)))  # first's cells go to the host tier
    assert busy == seq and len(d.host) == 1
    assert d.admit(first, reuse=False) == (1 - seq, 0)
    assert not d.backend.kv.get(1 - seq) and d.host.hits == 0


def test_a_cancelled_stream_keeps_its_prompt_for_the_regenerate() -> None:
    d = Driver()
    prompt = [*SYSTEM, *range(10, 30)]
    seq = d.run(prompt, keep=False)
    assert len(d.backend.kv[seq]) == len(prompt)  # the answer's cells were freed at once
    assert d.admit(prompt) == (seq, len(prompt) - 1)


def test_the_next_turn_reuses_the_previous_prompt_and_its_answer() -> None:
    d = Driver()
    first = [*SYSTEM, *LONG]
    seq = d.run(first, n_generated=6)  # cells: the prompt and the answer's first five
    turn = [*first, *range(900, 905), *range(3000, 3080)]
    assert d.admit(turn) == (seq, len(first) + 5)
    assert len(d.backend.kv[seq]) == len(first) + 5
    d.prefill(seq, len(turn) - 1, chunk=256)
    assert len(d.backend.kv[seq]) == len(turn) - 1


def test_the_lowest_slot_unless_another_shares_much_more() -> None:
    """llama.cpp decodes each run of consecutive slots apart in this layout: leaving
    the lowest one may leave a gap that costs every step, so only a long match does."""
    d = Driver()
    tail = list(range(2000, 2000 + 2 * SWITCH_SLOT_TOKENS))
    prompts = [[*SYSTEM, 0], [*SYSTEM, 1], [*SYSTEM, 2], [*SYSTEM, *tail, 3]]
    seqs = [d.admit(p)[0] for p in prompts]
    assert seqs == [0, 1, 2, 3]
    for seq, prompt in zip(seqs, prompts, strict=True):
        d.prefill(seq, len(prompt) - 1)
    for seq in (2, 3):
        d.release(seq)
    assert d.admit([*SYSTEM, 2, 9]) == (2, len(SYSTEM))
    d.release(2)
    assert d.admit([*SYSTEM, 5, 9]) == (2, len(SYSTEM))  # slot 3 shares no more
    d.release(2)
    assert d.admit([*SYSTEM, *tail, 9])[0] == 3


def test_a_reused_slot_goes_to_the_host_tier_and_comes_back_elsewhere() -> None:
    d = Driver(slots=2, host_bytes=10_000)
    first = [*SYSTEM, *LONG]
    seq = d.run(first)
    busy, _ = d.admit(list(range(5000, 5020)))  # the lowest slot: first's cells saved
    assert busy == seq and len(d.host) == 1
    again, cached = d.admit(first)  # the other slot, loaded from the host tier
    assert (again, cached) == (1 - seq, len(first) - 1)
    assert len(d.backend.kv[again]) == len(first) - 1
    assert d.host.hits == 1


def test_the_host_tier_evicts_the_least_recently_used_entry() -> None:
    cache = HostCache(3 * HostCache(0, 1).estimate(10), bytes_per_token=1)
    keys = []
    for k in range(3):
        entry = cache.reserve_prompt(list(range(k * 10, k * 10 + 10)), 10, None)
        assert entry is not None
        cache.store(entry.key, SavedKv(b"x" * entry.num_bytes))
        keys.append(entry.key)
    cache.touch(keys[0])  # a hit: the first is now the most recently used
    fourth = cache.reserve_prompt(list(range(100, 110)), 10, None, keep=None)
    assert fourth is not None
    assert keys[1] not in cache and keys[0] in cache and keys[2] in cache
    assert cache.evictions == 1 and cache.num_bytes <= cache.capacity_bytes
    # An entry about to be loaded is never the one evicted to make room.
    cache.store(fourth.key, SavedKv(b"x" * fourth.num_bytes))
    assert cache.reserve_prompt(list(range(200, 210)), 10, None, keep=keys[2]) is not None
    assert keys[2] in cache and keys[0] not in cache
    assert cache.reserve_prompt(list(range(1000)), 1000, None) is None  # larger than the tier


def test_a_prefix_in_flight_is_copied_once_computed() -> None:
    d = Driver()
    first = [*SYSTEM, *LONG, 1]
    second = [*SYSTEM, *LONG, 2, 3]
    a, _ = d.admit(first)
    b, cached = d.admit(second)
    assert cached == 0  # nothing computed yet
    d.prefill(a, len(first) - 1)
    attachment = d.kv.attach_published(b, second)
    gained = attachment.gained
    d.apply(attachment.ops)
    assert gained == len(first) - 1  # all that a computed
    assert len(d.backend.kv[b]) == gained


@pytest.mark.parametrize("seed", range(6))
def test_random_traffic_keeps_the_books_equal_to_the_cells(seed: int) -> None:
    rng = random.Random(seed)
    d = Driver(slots=4, per_slot=300, host_bytes=20_000)
    live: list[int] = []
    prefixes = [list(range(100 * k, 100 * k + rng.choice((30, 80)))) for k in range(3)]
    for _ in range(80):
        if live and (len(live) >= 3 or rng.random() < 0.4):
            d.release(live.pop(rng.randrange(len(live))), keep=rng.random() < 0.5)
            continue
        prompt = [*rng.choice(prefixes), *[rng.randrange(5) for _ in range(rng.randrange(1, 90))]]
        if not d.kv.can_admit(prompt, len(prompt) + 10):
            continue
        seq, _ = d.admit(prompt, max_tokens=10)
        d.prefill(seq, len(prompt) - 1, chunk=rng.choice((64, 128)))
        d.generate(seq, rng.randrange(1, 10))
        live.append(seq)


def test_a_whole_prompt_attached_from_a_prefill_in_flight_carries_its_logits() -> None:
    """Issue 59: two identical prompts together; the second waited for the first's
    prefill, then attached every cell of it, the last token's included. Without the
    logits of that token no step would sample its first token."""
    d = Driver()
    prompt = [*SYSTEM, *LONG]
    a, _ = d.admit(prompt)
    b, _ = d.admit(prompt)
    d.prefill(a, len(prompt))
    d.kv.keep_logits(prompt, "logits")  # the chunk that ended the prompt sampled
    attachment = d.kv.attach_published(b, prompt)
    d.apply(attachment.ops)
    assert attachment.gained == len(prompt)
    assert attachment.first_logits == "logits"


def test_without_kept_logits_an_attachment_stops_one_token_short() -> None:
    d = Driver()
    prompt = [*SYSTEM, *LONG]
    a, _ = d.admit(prompt)
    b, _ = d.admit(prompt)
    d.prefill(a, len(prompt))
    attachment = d.kv.attach_published(b, prompt)
    assert attachment.gained == len(prompt) - 1 and attachment.first_logits is None


def test_no_attachment_is_one_instance_nobody_can_change() -> None:
    """Both layouts return the one NO_ATTACHMENT to every caller: a caller extending
    its ops would have changed every later "no attachment"."""
    assert NO_ATTACHMENT.ops == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        NO_ATTACHMENT.gained = 1  # type: ignore[misc]
