"""The KV cache's bookkeeping, checked against the fake backend's cell model: every
operation it returns is applied, and the cells it counts must be the cells that exist."""

from __future__ import annotations

import random

import pytest

from edge_llm.engine.kv.book import CopyPrefix, KvOp, LoadState, SaveState, Truncate
from edge_llm.engine.kv.unified import KvCache
from edge_llm.engine.runtime.backend import BatchItem
from edge_llm.protocol.sampling import SamplingParams

from fakes import FakeBackend

SYSTEM = list(range(500, 540))  # a 40-token "system prompt"


class Driver:
    """Runs sequences through a KvCache and a FakeBackend the way the engine does."""

    def __init__(self, capacity: int = 1000, ids: int = 8, share: bool = True) -> None:
        self.kv = KvCache(capacity, 1, num_seq_ids=ids, share=share)
        self.backend = FakeBackend(kv_capacity_tokens=capacity, max_sequences=ids // 2)
        self.tokens: dict[int, list[int]] = {}
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
        self.check()

    def check(self) -> None:
        stats = self.kv.stats()
        assert self.backend.num_used_cells == stats.used_tokens + stats.cached_tokens
        assert self.kv.num_reserved + self.kv.num_cache <= self.kv.capacity_tokens

    def admit(self, prompt: list[int], max_tokens: int = 10, reuse: bool = True) -> tuple[int, int]:
        assert self.kv.can_admit(prompt, len(prompt) + max_tokens, reuse)
        admission = self.kv.admit(prompt, len(prompt) + max_tokens, reuse)
        self.apply(admission.ops)
        self.tokens[admission.seq_id] = list(prompt)
        self.backend.start_sequence(str(admission.seq_id), SamplingParams())
        return admission.seq_id, admission.n_cached

    def prefill(self, seq_id: int, n_prompt: int, chunk: int = 16) -> None:
        """Compute the rest of the prompt (the cached part is already in KV)."""
        done = len(self.backend.kv.get(seq_id, []))
        while done < n_prompt:
            tokens = self.tokens[seq_id][done : done + chunk]
            self.backend.decode([BatchItem(seq_id, tokens, done, False, str(seq_id))])
            done += len(tokens)
            self.kv.computed(seq_id, self.tokens[seq_id], done, publish=True)
            self.check()

    def generate(self, seq_id: int, n: int) -> None:
        """Feed back ``n`` generated tokens (token ids 900+)."""
        for i in range(n):
            pos = len(self.backend.kv[seq_id])
            token = 900 + i
            self.tokens[seq_id].append(token)
            self.backend.decode([BatchItem(seq_id, [token], pos, False, str(seq_id))])
            self.kv.computed(seq_id, self.tokens[seq_id], pos + 1, publish=False)
            self.check()

    def release(self, seq_id: int, keep: bool = True, n_prompt: int = 0) -> list[KvOp]:
        ops = self.kv.release(seq_id, self.tokens[seq_id], keep, n_prompt)
        self.apply(ops)
        return ops


def test_a_regenerate_reuses_all_but_the_last_prompt_token() -> None:
    d = Driver()
    prompt = [*SYSTEM, *range(10, 30)]
    first, cached = d.admit(prompt)
    assert cached == 0
    d.prefill(first, len(prompt))
    d.generate(first, 5)
    d.release(first)
    again, cached = d.admit(prompt)
    assert cached == len(prompt) - 1
    assert again != first  # the first id keeps the cache; the copy shares its cells
    assert d.backend.kv[again] == d.backend.kv[first][: len(prompt) - 1]


def test_a_shared_system_prompt_is_reused_exactly() -> None:
    d = Driver()
    a = [*SYSTEM, 1, 2, 3]
    b = [*SYSTEM, 7, 8]
    seq_a, _ = d.admit(a)
    d.prefill(seq_a, len(a))
    d.release(seq_a)
    _, cached = d.admit(b)
    assert cached == len(SYSTEM)


def test_the_next_turn_reuses_the_previous_prompt_and_answer() -> None:
    d = Driver()
    turn1 = [*SYSTEM, 1, 2]
    seq, _ = d.admit(turn1)
    d.prefill(seq, len(turn1))
    d.generate(seq, 6)  # cells for 900..905
    d.release(seq)
    turn2 = [*turn1, *range(900, 906), 3, 4]
    _, cached = d.admit(turn2)
    assert cached == len(turn1) + 6


def test_without_reuse_nothing_is_attached_and_the_cells_it_computes_are_kept() -> None:
    """llama-server's ``cache_prompt: false``: a prompt the cache holds is computed
    again under a new id; a prompt it does not hold is published as it is computed,
    so the next request reuses it."""
    d = Driver()
    prompt = [*SYSTEM, *range(10, 30)]
    first, cached = d.admit(prompt, reuse=False)
    assert cached == 0
    d.prefill(first, len(prompt))
    d.generate(first, 5)
    d.kv.keep_logits(prompt, "logits")
    d.release(first)
    assert d.kv.cached_length(prompt) == len(prompt) - 1
    assert d.kv.cached_length(prompt, reuse=False) == 0
    again, cached = d.admit(prompt, reuse=False)
    assert cached == 0 and again != first and not d.backend.kv.get(again)
    d.prefill(again, len(prompt))
    d.release(again)
    _, cached = d.admit(prompt)
    assert cached == len(prompt)  # the first's cells and its kept logits


def test_live_streams_hold_a_common_prefix_once() -> None:
    d = Driver()
    a, b = [*SYSTEM, 1, 2], [*SYSTEM, 3, 4]
    seq_a, _ = d.admit(a)
    d.prefill(seq_a, len(a))
    seq_b, cached = d.admit(b)
    d.prefill(seq_b, len(b))
    assert cached == len(SYSTEM)
    assert d.kv.stats().used_tokens == len(SYSTEM) + 2 + 2
    assert d.backend.num_used_cells == len(SYSTEM) + 4


def test_cancel_frees_private_cells_and_keeps_the_prefix_as_cache() -> None:
    d = Driver()
    prompt = [*SYSTEM, 1]
    seq, _ = d.admit(prompt)
    d.prefill(seq, len(prompt))
    d.generate(seq, 4)
    ops = d.release(seq, keep=False)
    assert ops[0] == Truncate(seq, len(prompt), 4, "release")
    stats = d.kv.stats()
    assert (stats.used_tokens, stats.cached_tokens) == (0, len(prompt))


def test_cache_is_evicted_least_recently_used_to_admit_a_request() -> None:
    d = Driver(capacity=200)
    old, recent = [*range(1000, 1080)], [*range(2000, 2080)]
    for prompt in (old, recent):
        seq, _ = d.admit(prompt, max_tokens=10)
        d.prefill(seq, len(prompt))
        d.release(seq)
    assert d.kv.num_free == 40
    new = [*range(3000, 3060)]
    assert d.kv.can_admit(new, 100)  # 40 free + 80 evictable
    admission = d.kv.admit(new, 100)
    d.apply(admission.ops)
    evicted = [op for op in admission.ops if isinstance(op, Truncate) and op.reason == "evict"]
    assert evicted and all(op.n_tokens == 80 for op in evicted)
    assert d.kv.cached_length([*recent, 1]) == 80  # the recent one stayed
    assert d.kv.cached_length([*old, 1]) == 0


def test_cells_a_running_stream_uses_are_never_evicted() -> None:
    d = Driver(capacity=200)
    prompt = list(range(1000, 1100))
    seq, _ = d.admit(prompt, max_tokens=10)
    d.prefill(seq, len(prompt))
    assert not d.kv.can_admit(list(range(3000, 3050)), 100)  # 110 reserved, 90 free


def test_without_sharing_nothing_is_cached() -> None:
    d = Driver(share=False)
    prompt = [*SYSTEM, 1]
    seq, _ = d.admit(prompt)
    d.prefill(seq, len(prompt))
    d.release(seq, keep=False)
    assert d.kv.cached_length(prompt) == 0
    assert d.backend.num_used_cells == 0


def test_without_sharing_kept_cells_stay_until_their_id_is_needed() -> None:
    d = Driver(ids=2, share=False)
    prompt = [*SYSTEM, 1]
    seq, _ = d.admit(prompt)
    d.prefill(seq, len(prompt))
    d.release(seq, keep=True)  # cancel_release_kv = false
    assert d.kv.stats().cached_tokens == len(prompt)
    d.admit([1, 2, 3])
    assert d.kv.stats().cached_tokens == len(prompt)  # a free id was left
    d.admit([4, 5, 6])  # no id left: the kept cells go
    assert d.backend.num_used_cells == 0


def test_offload_saves_then_frees_and_restore_loads_into_a_new_id() -> None:
    d = Driver()
    prompt = [*SYSTEM, 1, 2]
    seq, _ = d.admit(prompt)
    d.prefill(seq, len(prompt))
    d.generate(seq, 3)
    cells = list(d.backend.kv[seq])
    d.apply(d.kv.offload(seq, "req-1"))
    assert d.kv.stats().used_tokens == 0
    assert d.kv.num_reserved == 0
    admission = d.kv.restore("req-1", len(cells), len(prompt) + 10)
    d.apply(admission.ops)
    assert len(d.backend.kv[admission.seq_id]) == len(cells)


@pytest.mark.parametrize("seed", range(6))
def test_random_traffic_keeps_the_books_equal_to_the_cells(seed: int) -> None:
    rng = random.Random(seed)
    d = Driver(capacity=400, ids=8)
    live: list[tuple[int, int]] = []
    prefixes = [list(range(100 * k, 100 * k + 30)) for k in range(3)]
    for _ in range(60):
        if live and (len(live) >= 3 or rng.random() < 0.4):
            seq, _ = live.pop(rng.randrange(len(live)))
            d.release(seq, keep=rng.random() < 0.5)
            continue
        prompt = [*rng.choice(prefixes), *[rng.randrange(5) for _ in range(rng.randrange(1, 20))]]
        if not d.kv.can_admit(prompt, len(prompt) + 10):
            continue
        seq, _ = d.admit(prompt, max_tokens=10)
        d.prefill(seq, len(prompt), chunk=rng.choice((4, 16)))
        d.generate(seq, rng.randrange(10))
        live.append((seq, len(prompt)))


def test_a_request_sharing_part_of_one_cached_run_may_evict_the_rest_of_it() -> None:
    """Regression: the whole run was counted as pinned, not only the shared part."""
    d = Driver(capacity=256)
    first = [*SYSTEM, *range(100, 197)]
    seq, _ = d.admit(first, max_tokens=20)
    d.prefill(seq, len(first), chunk=128)
    d.generate(seq, 19)
    d.release(seq)
    second = [*SYSTEM, *range(300, 398)]
    assert d.kv.can_admit(second, len(second) + 20)
    admission = d.kv.admit(second, len(second) + 20)
    d.apply(admission.ops)
    assert admission.n_cached == len(SYSTEM)


def test_one_id_shares_nothing_so_every_request_is_admitted() -> None:
    """Regression: with one slot holding the whole budget (``--max-sequences 1``) a
    kept prefix pinned the only id, and the next request sharing the chat template's
    system prompt could not be admitted (RuntimeError, a 500)."""
    d = Driver(capacity=400, ids=1)
    for suffix in (range(10, 30), range(60, 70), range(10, 30)):
        prompt = [*SYSTEM, *suffix]
        seq, cached = d.admit(prompt, max_tokens=20)
        assert cached == 0
        d.prefill(seq, len(prompt))
        d.generate(seq, 5)
        d.release(seq)


def test_an_attachment_takes_the_whole_prompt_only_with_its_kept_logits() -> None:
    """Issue 59: a prompt that waited for an identical one's prefill attaches every
    cell only with the logits of the last token (they give its first token); without
    them it stops one token short and computes that token again."""
    d = Driver()
    prompt = [*SYSTEM, *range(10, 30)]
    a, _ = d.admit(prompt)
    b, _ = d.admit(prompt)
    c, _ = d.admit(prompt)
    d.prefill(a, len(prompt))
    short = d.kv.attach_published(b, prompt)
    d.apply(short.ops)
    assert (short.gained, short.first_logits) == (len(prompt) - 1, None)
    d.kv.keep_logits(prompt, "logits")
    whole = d.kv.attach_published(c, prompt)
    d.apply(whole.ops)
    assert (whole.gained, whole.first_logits) == (len(prompt), "logits")
