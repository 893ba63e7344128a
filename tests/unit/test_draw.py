"""The numpy draw that replaces llama.cpp's chain without top-k or min-p: the
distribution llama.cpp's rules give (top-p at temperature 1, then the temperature),
seeds that repeat, and no banned token ever drawn."""

from __future__ import annotations

import numpy as np
import pytest

from edge_llm.engine.runtime.draw import BLOCK, TemperatureDraw, _index_at

N_DRAWS = 20_000


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    finite = np.isfinite(logits)
    weights = np.where(finite, np.exp((logits - logits[finite].max()) / temperature), 0.0)
    return weights / weights.sum()


def counts_of(draw: TemperatureDraw, logits: np.ndarray) -> np.ndarray:
    return np.bincount([draw(logits) for _ in range(N_DRAWS)], minlength=len(logits))


def assert_frequencies(counts: np.ndarray, expected: np.ndarray) -> None:
    # About four standard deviations of a binomial count: the draws are seeded.
    tolerance = 4 * np.sqrt(N_DRAWS * expected * (1 - expected)) + 1
    assert np.all(np.abs(counts - N_DRAWS * expected) <= tolerance)


def test_the_whole_vocabulary_follows_the_softmax_at_the_temperature() -> None:
    logits = np.array([2.0, 0.0, -np.inf, 1.0, -1.0], dtype=np.float32)
    counts = counts_of(TemperatureDraw(0.5, 1.0, seed=3), logits)
    assert counts[2] == 0
    assert_frequencies(counts, softmax(logits.astype(np.float64), 0.5))


def test_top_p_keeps_the_likeliest_tokens_at_temperature_one_then_applies_the_temperature() -> None:
    logits = np.array([-1.0, 3.0, 0.0, 2.0, 1.0, -5.0], dtype=np.float32)
    probs = softmax(logits.astype(np.float64))
    # Tokens 1, 3 and 4 hold about 0.91 at temperature 1, tokens 1 and 3 about 0.88.
    top_p = (probs[1] + probs[3] + probs[4] + probs[1] + probs[3]) / 2
    counts = counts_of(TemperatureDraw(2.0, float(top_p), seed=5), logits)
    kept = np.array([1, 3, 4])
    assert counts[[0, 2, 5]].sum() == 0
    expected = np.zeros(len(logits))
    expected[kept] = softmax(logits[kept].astype(np.float64), 2.0)
    assert_frequencies(counts, expected)


@pytest.mark.parametrize("n_tokens", [3_000, 20_000])  # past the first try, past both
def test_a_wide_nucleus_is_found_past_the_first_tries(n_tokens: int) -> None:
    logits = (-np.arange(n_tokens) * 1e-4).astype(np.float32)  # nearly flat, no ties
    top_p = 0.6
    reached = np.cumsum(softmax(logits.astype(np.float64)))
    size = int(np.searchsorted(reached, top_p)) + 1
    draw = TemperatureDraw(1.0, top_p, seed=11)
    drawn = np.array([draw(logits) for _ in range(1_000)])  # the full sort is slow
    assert drawn.max() < size
    assert drawn.max() >= 0.95 * size  # the whole nucleus, not a part of it


def test_a_seed_repeats_the_draws_and_another_seed_does_not() -> None:
    logits = np.linspace(-2.0, 2.0, 64, dtype=np.float32)
    for top_p in (1.0, 0.8):
        same, again, other = (TemperatureDraw(1.0, top_p, seed=s) for s in (7, 7, 8))
        first = [same(logits) for _ in range(50)]
        assert first == [again(logits) for _ in range(50)]
        assert first != [other(logits) for _ in range(50)]


def test_with_every_token_banned_a_draw_still_names_a_token() -> None:
    logits = np.full(4, -np.inf, dtype=np.float32)
    assert 0 <= TemperatureDraw(1.0, 0.9, seed=None)(logits) < 4


@pytest.mark.parametrize("uniform", [0.0, 0.3, 0.999_999_999_999])
def test_the_index_never_lands_on_a_zero_weight(uniform: float) -> None:
    weights = np.zeros(3 * BLOCK, dtype=np.float32)
    weights[[5, BLOCK + 7, BLOCK + 9]] = [1.0, 2.0, 1e-30]  # the last block holds nothing
    assert weights[_index_at(weights, uniform)] > 0.0
