"""The llama.cpp backend alone, with the real model: sampling and KV layouts."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence

import jsonschema
import llama_cpp as llama
import numpy as np
import pytest

from edge_llm.engine.runtime.backend import BatchItem, Sampled
from edge_llm.engine.runtime.llama_backend import LlamaBackend
from edge_llm.errors import BackendError, InvalidRequest
from edge_llm.protocol.sampling import SamplingParams

from support import COPY, STORY, gemma_path

pytestmark = pytest.mark.e2e

PROMPTS = ("Write a story about a lighthouse.", "List three colors.")
# These decodes run without the engine's thread governor (engine/runtime/threads.py): on one
# thread, busy cores cannot hold them at llama.cpp's barriers for seconds per step.
THREADS = 1


@pytest.fixture(scope="module")
def backend() -> Iterator[LlamaBackend]:
    be = LlamaBackend(
        None, kv_budget_bytes=32 << 20, max_sequences=2, max_batch_tokens=256, n_threads=THREADS
    )
    yield be
    be.close()


def release(backend: LlamaBackend, slot: int) -> None:
    """Free a slot's cells and the sampler these tests start under its number."""
    backend.truncate(slot, 0)
    backend.end_sequence(str(slot))


def test_greedy_fast_path_picks_what_llama_cpps_greedy_sampler_picks(
    backend: LlamaBackend,
) -> None:
    reference = llama.llama_sampler_init_greedy()
    try:
        prompts = [backend.tokenize(text, add_special=True) for text in PROMPTS]
        for slot in range(2):
            backend.start_sequence(str(slot), SamplingParams(temperature=0.0))
        first = backend.decode([BatchItem(s, p, 0, True, str(s)) for s, p in enumerate(prompts)])
        tokens = [sampled.token for sampled in first]
        positions = [len(p) for p in prompts]
        for _ in range(12):
            for slot in range(2):  # the last decode's outputs, counted from the end
                expected = llama.llama_sampler_sample(reference, backend._ctx, slot - 2)
                assert tokens[slot] == expected
            items = [BatchItem(s, [tokens[s]], positions[s], True, str(s)) for s in range(2)]
            tokens = [sampled.token for sampled in backend.decode(items)]
            positions = [p + 1 for p in positions]
    finally:
        llama.llama_sampler_free(reference)
        for slot in range(2):
            release(backend, slot)


def test_per_slot_kv_shares_are_whole_and_too_small_ones_are_refused() -> None:
    split = LlamaBackend(
        None, kv_budget_bytes=32 << 20, max_sequences=4, max_batch_tokens=64, n_threads=THREADS,
        kv_unified=False,
    )  # fmt: skip
    try:
        assert split.kv_sequence_tokens * 4 == split.kv_capacity_tokens
        assert split.kv_capacity_tokens * split.info.kv_bytes_per_token <= 32 << 20
    finally:
        split.close()
    with pytest.raises(BackendError, match="lower max_sequences"):
        LlamaBackend(
            None, kv_budget_bytes=8 << 20, max_sequences=32, max_batch_tokens=64, n_threads=THREADS,
            kv_unified=False,
        )  # fmt: skip


def test_results_follow_the_callers_order_whatever_the_slot_order(backend: LlamaBackend) -> None:
    prompts = [backend.tokenize(text, add_special=True) for text in PROMPTS]

    def first_tokens(slots: list[int]) -> dict[int, int]:
        for slot in slots:
            backend.start_sequence(str(slot), SamplingParams())
        items = [BatchItem(slot, prompts[slot], 0, True, str(slot)) for slot in slots]
        tokens = {slot: s.token for slot, s in zip(slots, backend.decode(items), strict=True)}
        for slot in slots:
            release(backend, slot)
        return tokens

    assert first_tokens([0, 1]) == first_tokens([1, 0])
    assert first_tokens([0, 1])[0] != first_tokens([0, 1])[1]  # different prompts, answers


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
ASK_JSON = "Describe a person called Tom who is 31 years old as JSON."


def generate(
    backend: LlamaBackend, params: Sequence[SamplingParams], prompt: str, n: int
) -> list[list[Sampled]]:
    """Decode one prompt in every slot together (one batch per step), each slot with
    its own sampling, until end of generation or ``n`` tokens; the tokens per slot."""
    tokens = backend.tokenize(
        backend.render_chat([{"role": "user", "content": prompt}]), add_special=True
    )
    slots = range(len(params))
    for slot in slots:
        backend.start_sequence(str(slot), params[slot])
    try:
        out: list[list[Sampled]] = [
            [s]
            for s in backend.decode([BatchItem(slot, tokens, 0, True, str(slot)) for slot in slots])
        ]
        live = [slot for slot in slots if not backend.is_end_of_generation(out[slot][-1].token)]
        for step in range(n - 1):
            if not live:
                break
            items = [
                BatchItem(slot, [out[slot][-1].token], len(tokens) + step, True, str(slot))
                for slot in live
            ]
            for slot, sampled in zip(live, backend.decode(items), strict=True):
                out[slot].append(sampled)
            live = [slot for slot in live if not backend.is_end_of_generation(out[slot][-1].token)]
    finally:
        for slot in slots:
            release(backend, slot)
    return out


def text_of(backend: LlamaBackend, sampled: list[Sampled]) -> str:
    pieces = [
        backend.token_bytes(s.token) for s in sampled if not backend.is_end_of_generation(s.token)
    ]
    return b"".join(pieces).decode()


def test_a_json_schema_grammar_keeps_greedy_and_sampled_output_valid(backend: LlamaBackend) -> None:
    grammar = backend.json_schema_grammar(PERSON)
    greedy = SamplingParams(grammar=grammar)
    sampled = SamplingParams(temperature=1.0, seed=7, grammar=grammar)
    for out in generate(backend, [greedy, sampled], ASK_JSON, 80):
        assert backend.is_end_of_generation(out[-1].token)  # the grammar completed, then EOG
        jsonschema.validate(json.loads(text_of(backend, out)), PERSON)


def test_a_grammar_checks_every_draft_position_and_keeps_only_accepted_tokens(
    backend: LlamaBackend,
) -> None:
    """Speculation under a JSON-schema grammar, without the engine's cost model (which
    may decide drafts do not pay): a draft of the grammar's own greedy tokens is
    accepted whole; a draft with a token the grammar forbids stops there with the
    grammar's token, and the rest of the output is the one decoded without drafts."""
    params = SamplingParams(grammar=backend.json_schema_grammar(PERSON))
    plain = [s.token for s in generate(backend, [params], ASK_JSON, 80)[0]]
    assert backend.is_end_of_generation(plain[-1]) and len(plain) > 12
    prompt = backend.tokenize(
        backend.render_chat([{"role": "user", "content": ASK_JSON}]), add_special=True
    )
    eog = plain[-1]  # the grammar forbids it before the object is complete
    backend.start_sequence("0", params)
    try:
        (first,) = backend.decode([BatchItem(0, prompt, 0, True, "0")])
        pos = len(prompt)
        whole = plain[1:6]
        (run,) = backend.decode_runs([BatchItem(0, [first.token, *whole], pos, True, "0", 5)])
        assert [s.token for s in run] == plain[1:7]  # five drafts accepted, one more sampled
        pos += 6
        forbidden = [*plain[7:9], eog, *plain[10:12]]
        (run,) = backend.decode_runs(
            [BatchItem(0, [plain[6], *forbidden], pos, True, "0", len(forbidden))]
        )
        assert [s.token for s in run] == plain[7:10]  # two accepted, then the grammar's own
        pos += 3
        backend.truncate(0, pos)  # the rejected draft's cells
        out = [s.token for s in run]
        while not backend.is_end_of_generation(out[-1]):
            (next_,) = backend.decode([BatchItem(0, [out[-1]], pos, True, "0")])
            out.append(next_.token)
            pos += 1
        assert plain[:7] + out == plain
    finally:
        release(backend, 0)


def test_one_slots_grammar_does_not_change_the_other_slots_tokens(backend: LlamaBackend) -> None:
    grammar = backend.json_schema_grammar(PERSON)
    plain = SamplingParams()
    beside_plain = generate(backend, [plain, plain], ASK_JSON, 24)[0]
    beside_grammar = generate(backend, [plain, SamplingParams(grammar=grammar)], ASK_JSON, 24)[0]
    assert [s.token for s in beside_grammar] == [s.token for s in beside_plain]
    assert not text_of(backend, beside_plain).startswith("{")  # the grammar made a difference


def test_logit_bias_bans_and_forces_tokens(backend: LlamaBackend) -> None:
    (first,) = generate(backend, [SamplingParams()], ASK_JSON, 1)[0]
    (banned,) = generate(
        backend, [SamplingParams(logit_bias=((first.token, -100.0),))], ASK_JSON, 1
    )[0]
    assert banned.token != first.token
    forced = 1000
    out = generate(
        backend,
        [SamplingParams(temperature=0.8, seed=1, logit_bias=((forced, 100.0),))],
        ASK_JSON,
        3,
    )[0]
    assert [s.token for s in out] == [forced] * 3


def test_frequency_penalty_breaks_repetition(backend: LlamaBackend) -> None:
    # Counting repeats its separators at every number, on every CPU (a prose prompt's
    # greedy text, and whether it repeats at all, depends on the CPU's kernels).
    prompt = "Count from 1 to 30 with commas."
    plain = generate(backend, [SamplingParams()], prompt, 24)[0]
    penalized = generate(backend, [SamplingParams(frequency_penalty=2.0)], prompt, 24)[0]

    def most_repeated(out: list[Sampled]) -> int:
        tokens = [s.token for s in out]
        return max(tokens.count(t) for t in tokens)

    assert most_repeated(penalized) < most_repeated(plain)


def test_logprobs_of_greedy_tokens_are_the_top_ones(backend: LlamaBackend) -> None:
    out = generate(backend, [SamplingParams(n_logprobs=3)], ASK_JSON, 6)[0]
    for sampled in out:
        record = sampled.logprob
        assert record is not None and record.token == sampled.token
        assert len(record.top) == 3
        assert record.top[0] == (sampled.token, record.logprob)  # greedy picks the top token
        assert [lp for _, lp in record.top] == sorted((lp for _, lp in record.top), reverse=True)
        assert sum(2.718281828**lp for _, lp in record.top) <= 1.0 + 1e-6


def test_a_grammar_llama_cpp_cannot_parse_fails_that_slot_before_any_decode(
    backend: LlamaBackend,
) -> None:
    tokens = backend.tokenize("Hello", add_special=True)
    backend.start_sequence(str(0), SamplingParams())
    backend.start_sequence(str(1), SamplingParams(grammar="root ::= undefined-rule"))
    try:
        with pytest.raises(BackendError, match="grammar"):
            backend.decode(
                [BatchItem(0, tokens, 0, True, str(0)), BatchItem(1, tokens, 0, True, str(1))]
            )
        assert backend.kv_tokens(0) == 0  # nothing was decoded: the batch can be retried
        assert len(backend.decode([BatchItem(0, tokens, 0, True, str(0))])) == 1
    finally:
        release(backend, 0)
        release(backend, 1)


def test_unconvertible_schemas_are_invalid_requests(backend: LlamaBackend) -> None:
    for schema in (
        {"type": "strnig"},
        {"type": {}},  # found by the fuzzer over the fake backend
        {"type": "string", "maxLength": 10**9},
        {"$ref": "http://x"},
    ):
        with pytest.raises(InvalidRequest):
            backend.json_schema_grammar(schema)
    assert "root ::=" in backend.json_schema_grammar(None)


def greedy_run(
    backend: LlamaBackend, slot: int, tokens: list[int], start: int, n: int
) -> list[int]:
    """Feed ``tokens`` at ``start`` into ``slot``, then generate ``n`` tokens greedily."""
    out = []
    token = backend.decode([BatchItem(slot, tokens, start, True, "greedy")])[0].token
    pos = start + len(tokens)
    for _ in range(n):
        out.append(token)
        token = backend.decode([BatchItem(slot, [token], pos, True, "greedy")])[0].token
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


def test_log_likelihood_scores_a_text_above_its_words_shuffled(backend: LlamaBackend) -> None:
    text = "The river carries water from the mountains down to the sea."
    words = text.rstrip(".").split()
    shuffled = " ".join(words[::2] + words[1::2]) + "."
    scores = [
        backend.log_likelihood(backend.tokenize(t, add_special=True)) for t in (text, shuffled)
    ]
    assert len(scores[0]) == len(backend.tokenize(text, add_special=True)) - 1
    assert all(s < 0 for s in scores[0])
    assert sum(scores[0]) / len(scores[0]) > sum(scores[1]) / len(scores[1])


@pytest.mark.parametrize("kv_type", ["q8_0", "q4_0"])
def test_quantized_kv_stores_more_tokens_and_still_generates(kv_type: str) -> None:
    sizes = {"kv_budget_bytes": 32 << 20, "max_sequences": 2, "max_batch_tokens": 256}
    f16 = LlamaBackend(None, **sizes, n_threads=THREADS, kv_unified=False)
    quantized = LlamaBackend(
        None, **sizes, n_threads=THREADS, kv_unified=False, kv_cache_type=kv_type
    )
    try:
        assert quantized.info.kv_bytes_per_token < f16.info.kv_bytes_per_token * 0.6
        assert quantized.kv_capacity_tokens > f16.kv_capacity_tokens * 1.7
        prompt = quantized.tokenize(quantized.render_chat([{"role": "user", "content": "Hi"}]),
                                    add_special=True)  # fmt: skip
        quantized.start_sequence("q", SamplingParams())
        quantized.decode_runs([BatchItem(0, prompt[:-1], 0, False, "q")])
        run = quantized.decode_runs([BatchItem(0, prompt[-1:], len(prompt) - 1, True, "q")])
        assert run[0][0].token >= 0
        saved = quantized.save_state(0)  # offload and restore within one type
        quantized.truncate(0, 0)
        quantized.load_state(1, saved)
        assert quantized.kv_tokens(1) == len(prompt)
    finally:
        f16.close()
        quantized.close()


@pytest.fixture(scope="module")
def per_slot() -> Iterator[LlamaBackend]:
    """The default KV layout: a share of the budget per slot."""
    be = LlamaBackend(
        None, kv_budget_bytes=32 << 20, max_sequences=2, max_batch_tokens=256, n_threads=THREADS,
        kv_unified=False,
    )  # fmt: skip
    yield be
    be.close()


STORY_TOKENS = 300  # enough for a near-tie in the story to go another way
SAVED_AT = 40  # tokens generated before the state is saved
Corruption = Callable[[int], int]  # damages a slot; returns how far positions moved


def story_run(per_slot: LlamaBackend, corrupt: Corruption | None = None) -> list[int]:
    """The story's greedy tokens, generated in slot 0, one decode per token; with
    ``corrupt``, slot 0's state is saved after ``SAVED_AT`` tokens, loaded into slot
    1, handed to ``corrupt(1)`` and the rest is generated there."""
    prompt = per_slot.tokenize(
        per_slot.render_chat([{"role": "user", "content": STORY}]), add_special=True
    )
    per_slot.start_sequence("greedy", SamplingParams())
    try:
        slot, shift, out = 0, 0, []
        token = per_slot.decode([BatchItem(slot, prompt, 0, True, "greedy")])[0].token
        while len(out) < STORY_TOKENS and not per_slot.is_end_of_generation(token):
            out.append(token)
            if corrupt is not None and len(out) == SAVED_AT:  # before it is fed back
                state = per_slot.save_state(slot)
                per_slot.truncate(slot, 0)
                slot = 1
                per_slot.load_state(slot, state)
                shift = corrupt(slot)
            position = len(prompt) + len(out) - 1 + shift
            token = per_slot.decode([BatchItem(slot, [token], position, True, "greedy")])[0].token
        return out
    finally:
        for used in range(2):
            per_slot.truncate(used, 0)
        per_slot.end_sequence("greedy")


@pytest.fixture(scope="module")
def story(per_slot: LlamaBackend) -> list[int]:
    """The story told in one slot without interruption."""
    tokens = story_run(per_slot)
    assert len(tokens) == STORY_TOKENS
    return tokens


def test_a_story_restored_into_another_slot_continues_token_exact(
    per_slot: LlamaBackend, story: list[int]
) -> None:
    assert story_run(per_slot, corrupt=lambda slot: 0) == story


def test_a_corrupted_restore_changes_the_story(per_slot: LlamaBackend, story: list[int]) -> None:
    """The comparison the restore, offload and cache tests make can fail: with one
    cell of the restored prompt dropped (the model no longer sees one word of the
    request), or a few dropped and the later cells shifted down to close the gap (as
    a context shift does), the greedy story goes another way."""
    memory = llama.llama_get_memory(per_slot._ctx)
    gap = range(20, 28)  # a few words of the request (one alone, shifted, may not show)

    def drop_one_cell(slot: int) -> int:
        llama.llama_memory_seq_rm(memory, slot, gap.start, gap.start + 1)
        return 0

    def drop_and_shift(slot: int) -> int:
        llama.llama_memory_seq_rm(memory, slot, gap.start, gap.stop)
        llama.llama_memory_seq_add(memory, slot, gap.stop, -1, -len(gap))
        return -len(gap)

    for corrupt in (drop_one_cell, drop_and_shift):
        corrupted = story_run(per_slot, corrupt)
        assert corrupted[:SAVED_AT] == story[:SAVED_AT]
        assert corrupted != story, corrupt.__name__


def test_the_thread_count_changes_no_logit(backend: LlamaBackend) -> None:
    """The engine decodes on fewer threads while other processes hold the cores
    (engine/runtime/threads.py); llama.cpp computes each output row on one thread, so the
    logits of a prefill and of each decode step are the same bits on 1 or 2 threads."""

    def logits(threads_at: Callable[[int], int]) -> list[np.ndarray]:
        prompt = backend.tokenize(COPY, add_special=True)
        backend.start_sequence("0", SamplingParams(temperature=0.0))
        try:
            backend.set_threads(threads_at(0))
            [first] = backend.decode([BatchItem(0, prompt, 0, True, "0", keep_logits=True)])
            rows, token = [first.logits], first.token
            for step in range(1, 16):
                backend.set_threads(threads_at(step))
                item = BatchItem(0, [token], len(prompt) + step - 1, True, "0", keep_logits=True)
                [sampled] = backend.decode([item])
                rows.append(sampled.logits)
                token = sampled.token
            return rows
        finally:
            release(backend, 0)
            backend.set_threads(THREADS)

    two = logits(lambda step: 2)
    switching = logits(lambda step: 2 - step % 2)
    assert len(backend.tokenize(COPY, add_special=True)) > 64  # a batched prefill
    assert all(np.array_equal(a, b) for a, b in zip(two, switching, strict=True))


def last_row_logits(
    backend: LlamaBackend, prompt: Sequence[int], chunks: Sequence[int], threads: int = 1
) -> np.ndarray:
    """The logits of ``prompt``'s last token, its rows decoded in ``chunks`` (sizes, in
    order; the last chunk samples), on ``threads`` threads; slot 0 freed after."""
    backend.set_threads(threads)
    backend.start_sequence("0", SamplingParams(temperature=0.0))
    try:
        start = 0
        for n in chunks[:-1]:
            backend.decode([BatchItem(0, prompt[start : start + n], start, False, "0")])
            start += n
        item = BatchItem(0, prompt[start:], start, True, "0", keep_logits=True)
        [sampled] = backend.decode([item])
        return np.asarray(sampled.logits)
    finally:
        release(backend, 0)
        backend.set_threads(THREADS)


@pytest.mark.timeout(900)  # 600-token prefills on a loaded 2-core machine
@pytest.mark.parametrize("model", ["smollm2-q4_1", "gemma3-q4_k_m"])
@pytest.mark.parametrize("invariant", [True, False], ids=["invariant", "fast"])
def test_invariant_kernels_give_a_row_the_same_bits_in_any_batch_and_on_any_thread_count(
    invariant: bool, model: str
) -> None:
    """deterministic = true (scripts/patches/): the last row of a 600-token prompt (its
    KV view past 512 cells, where a lone row's attention is split across the threads by
    default) computed in one batch (two ubatches: 512 and 88 rows, the last in tiles),
    alone after the rest, in a 7-row batch after the rest, in 100-row chunks, on 1 or 2
    threads: the same logits, bit for bit, with the embedded model's Q4_1 weights and
    with Gemma's K-quants (repacked; the mode computes their rows as lone rows). The
    fast kernels (the default) round the lone row differently from the tiled one: the
    comparison can fail."""
    backend = LlamaBackend(
        None if model.startswith("smollm2") else gemma_path(), kv_budget_bytes=64 << 20,
        max_sequences=2, max_batch_tokens=768, n_threads=THREADS, kv_unified=False,
        invariant_kernels=invariant,
    )  # fmt: skip
    try:
        prompt = (backend.tokenize(" ".join([STORY, COPY] * 12), add_special=True) * 2)[:600]
        n = len(prompt)
        whole = last_row_logits(backend, prompt, [n])
        shapes = {
            "alone after the rest": [n - 1, 1],
            "7 rows after the rest": [n - 7, 7],
            "100-row chunks": [100] * 6,
            "alone, two threads": ([n - 1, 1], 2),
        }
        differs = {}
        for name, shape in shapes.items():
            chunks, threads = shape if isinstance(shape, tuple) else (shape, 1)
            row = last_row_logits(backend, prompt, chunks, threads)
            differs[name] = float(np.max(np.abs(row - whole)))
        if invariant:
            assert differs == dict.fromkeys(shapes, 0.0)
        else:
            assert differs["alone after the rest"] > 0.0  # the split lone row
    finally:
        backend.close()


@pytest.mark.timeout(900)  # 600-token prefills of three slots on a loaded 2-core machine
@pytest.mark.parametrize("invariant", [True, False], ids=["invariant", "fast"])
def test_invariant_kernels_give_a_decode_row_the_same_bits_beside_other_streams(
    invariant: bool,
) -> None:
    """deterministic = true: a decode row of slot 0, at 200 cells (one 256-cell KV chunk)
    and at 600 (three, folded), gives the same logits, bit for bit, alone, with 1, 7, 12
    or 16 draft rows after it, beside two other slots' rows and so on two threads. Beside
    others (or with a draft), the query heads that share a K/V head are one tile; alone at
    200 cells on two threads each head is a task of its own. The weights' products
    change kernels from 17 rows (the row kernels' second pass, the output matrix's
    tiles; from 9 without AVX-512): scripts/patches/. The fast kernels split a lone row
    past 512 cells across the threads: the comparison can fail."""
    backend = LlamaBackend(
        None, kv_budget_bytes=96 << 20, max_sequences=3, max_batch_tokens=768,
        n_threads=THREADS, kv_unified=False, invariant_kernels=invariant,
    )  # fmt: skip
    texts = (" ".join([STORY, COPY] * 12), " ".join([COPY, STORY] * 12), " ".join([COPY] * 24))
    prompts = [backend.tokenize(text, add_special=True)[:617] for text in texts]
    keys = [str(slot) for slot in range(3)]  # release() ends the samplers by these names
    for key in keys:
        backend.start_sequence(key, SamplingParams(temperature=0.0))

    def item(slot: int, depth: int, n_draft: int) -> BatchItem:
        tokens = prompts[slot][depth : depth + 1 + n_draft]
        return BatchItem(slot, tokens, depth, True, keys[slot], n_draft, keep_logits=True)

    def row(depth: int, slots: int, threads: int = THREADS, draft: int = 0) -> np.ndarray:
        backend.set_threads(threads)
        try:
            items = [item(slot, depth, draft if slot == 0 else 0) for slot in range(slots)]
            return np.asarray(backend.decode(items)[0].logits)
        finally:
            for slot in range(3):
                backend.truncate(slot, depth)
            backend.set_threads(THREADS)

    try:
        differs = {}
        for depth in (200, 600):
            for slot in range(3):
                backend.truncate(slot, 0)
                backend.decode([BatchItem(slot, prompts[slot][:depth], 0, False, keys[slot])])
            alone = row(depth, 1)
            shapes = {
                "with a draft row": row(depth, 1, draft=1),
                "with 7 draft rows": row(depth, 1, draft=7),
                "with 12 draft rows": row(depth, 1, draft=12),
                "with 16 draft rows": row(depth, 1, draft=16),
                "beside two others": row(depth, 3),
                "beside two others, two threads": row(depth, 3, threads=2),
                "alone, two threads": row(depth, 1, threads=2),
            }
            for name, logits in shapes.items():
                differs[f"{name} at {depth}"] = float(np.max(np.abs(logits - alone)))
        if invariant:
            assert differs == dict.fromkeys(differs, 0.0)
        else:
            assert differs["alone, two threads at 600"] > 0.0  # the split lone row
    finally:
        for slot in range(3):
            release(backend, slot)
        backend.close()


def test_an_item_whose_draft_leaves_no_token_to_sample_is_refused(backend: LlamaBackend) -> None:
    """A draft as long as its item would flag logits before the item's first token,
    outside the batch (it corrupted the heap): refused before llama.cpp sees it."""
    backend.start_sequence("0", SamplingParams(temperature=0.0))
    try:
        with pytest.raises(BackendError, match="no token to sample"):
            backend.decode([BatchItem(0, [1, 2], 0, True, "0", n_draft=2)])
        [sampled] = backend.decode([BatchItem(0, [1, 2], 0, True, "0", n_draft=1)])
        assert sampled.token >= 0  # the batch is whole after the refusal
    finally:
        release(backend, 0)
