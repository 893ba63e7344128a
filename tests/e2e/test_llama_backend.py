"""The llama.cpp backend alone, with the real model: sampling and KV layouts."""

from __future__ import annotations

from collections.abc import Iterator

import llama_cpp as llama
import pytest

from edge_llm.engine.backend import BackendError, BatchItem, SamplingParams
from edge_llm.engine.llama_backend import LlamaBackend

pytestmark = pytest.mark.e2e

PROMPTS = ("Write a story about a lighthouse.", "List three colors.")


@pytest.fixture(scope="module")
def backend() -> Iterator[LlamaBackend]:
    be = LlamaBackend(
        None, kv_budget_bytes=32 << 20, max_sequences=2, max_batch_tokens=64, n_threads=2
    )
    yield be
    be.close()


def test_greedy_fast_path_picks_what_llama_cpps_greedy_sampler_picks(
    backend: LlamaBackend,
) -> None:
    reference = llama.llama_sampler_init_greedy()
    try:
        prompts = [backend.tokenize(text, add_special=True) for text in PROMPTS]
        for slot in range(2):
            backend.start_sequence(str(slot), SamplingParams(temperature=0.0))
        tokens = backend.decode([BatchItem(s, p, 0, True, str(s)) for s, p in enumerate(prompts)])
        positions = [len(p) for p in prompts]
        for _ in range(12):
            for slot in range(2):  # the last decode's outputs, counted from the end
                expected = llama.llama_sampler_sample(reference, backend._ctx, slot - 2)
                assert tokens[slot] == expected
            items = [BatchItem(s, [tokens[s]], positions[s], True, str(s)) for s in range(2)]
            tokens = backend.decode(items)
            positions = [p + 1 for p in positions]
    finally:
        llama.llama_sampler_free(reference)
        for slot in range(2):
            backend.truncate(slot, 0)
            backend.end_sequence(str(slot))


def test_per_slot_kv_shares_are_whole_and_too_small_ones_are_refused() -> None:
    split = LlamaBackend(
        None, kv_budget_bytes=32 << 20, max_sequences=4, max_batch_tokens=64, n_threads=2,
        kv_unified=False,
    )  # fmt: skip
    try:
        assert split.kv_sequence_tokens * 4 == split.kv_capacity_tokens
        assert split.kv_capacity_tokens * split.info.kv_bytes_per_token <= 32 << 20
    finally:
        split.close()
    with pytest.raises(BackendError, match="lower max_sequences"):
        LlamaBackend(
            None, kv_budget_bytes=8 << 20, max_sequences=32, max_batch_tokens=64, n_threads=2,
            kv_unified=False,
        )  # fmt: skip


def test_results_follow_the_callers_order_whatever_the_slot_order(backend: LlamaBackend) -> None:
    prompts = [backend.tokenize(text, add_special=True) for text in PROMPTS]

    def first_tokens(slots: list[int]) -> dict[int, int]:
        for slot in slots:
            backend.start_sequence(str(slot), SamplingParams())
        items = [BatchItem(slot, prompts[slot], 0, True, str(slot)) for slot in slots]
        tokens = dict(zip(slots, backend.decode(items), strict=True))
        for slot in slots:
            backend.truncate(slot, 0)
            backend.end_sequence(str(slot))
        return tokens

    assert first_tokens([0, 1]) == first_tokens([1, 0])
    assert first_tokens([0, 1])[0] != first_tokens([0, 1])[1]  # different prompts, answers


def greedy_run(
    backend: LlamaBackend, slot: int, tokens: list[int], start: int, n: int
) -> list[int]:
    """Feed ``tokens`` at ``start`` into ``slot``, then generate ``n`` tokens greedily."""
    out = []
    token = backend.decode([BatchItem(slot, tokens, start, True, "greedy")])[0]
    pos = start + len(tokens)
    for _ in range(n):
        out.append(token)
        token = backend.decode([BatchItem(slot, [token], pos, True, "greedy")])[0]
        pos += 1
    return out


def test_a_shared_prefix_and_a_restored_state_continue_token_exact(
    backend: LlamaBackend,
) -> None:
    """The two KV facts the prefix cache and offload stand on (unified pool)."""
    prompt = backend.tokenize(PROMPTS[0], add_special=True)
    backend.start_sequence("greedy", SamplingParams())
    try:
        reference = greedy_run(backend, 0, prompt, 0, 12)
        backend.copy_prefix(0, 1, len(prompt) - 1)  # shared cells, then the last token
        assert greedy_run(backend, 1, prompt[-1:], len(prompt) - 1, 12) == reference
        state = backend.save_state(1)
        assert len(state) == backend.state_size(1)
        backend.truncate(1, 0)
        backend.load_state(2, state)  # into another slot
        n_cells = len(prompt) + 12  # the prompt and the 12 tokens fed back
        assert backend.kv_tokens(2) == n_cells
        restored = greedy_run(backend, 2, reference[:1], n_cells, 6)
        assert restored == greedy_run(backend, 0, reference[:1], n_cells, 6)
    finally:
        for slot in range(3):
            backend.truncate(slot, 0)
        backend.end_sequence("greedy")
