"""Sampling logic without llama.cpp: logprobs, bias, penalties, schema bounds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edge_llm.engine.runtime.logits import (
    LogitBias,
    Penalties,
    check_schema_bounds,
    token_logprob,
)


def test_logprobs_are_a_log_softmax_with_the_top_tokens_in_order() -> None:
    raw = np.array([1.0, 3.0, 2.0, 0.5], dtype=np.float32)
    record = token_logprob(raw, token=2, k=2)
    log_total = math.log(sum(math.exp(x) for x in raw))
    assert record.logprob == pytest.approx(2.0 - log_total, abs=1e-6)
    assert [t for t, _ in record.top] == [1, 2]
    assert record.top[0][1] == pytest.approx(3.0 - log_total, abs=1e-6)
    assert sum(math.exp(float(x) - log_total) for x in raw) == pytest.approx(1.0)


def test_zero_top_logprobs_gives_only_the_chosen_token() -> None:
    record = token_logprob(np.zeros(8, dtype=np.float32), token=3, k=0)
    assert record.top == ()
    assert record.logprob == pytest.approx(-math.log(8))


def test_top_logprobs_never_exceed_the_vocabulary() -> None:
    assert len(token_logprob(np.zeros(3, dtype=np.float32), token=0, k=20).top) == 3


def test_a_bias_of_minus_100_removes_the_token_and_others_add() -> None:
    logits = np.array([5.0, 1.0, 0.0], dtype=np.float32)
    LogitBias([(0, -100.0), (2, 2.5)]).apply(logits)
    assert logits[0] == -np.inf
    assert logits[1] == 1.0
    assert logits[2] == 2.5
    assert int(logits.argmax()) == 2


def test_penalties_follow_openais_formula_over_generated_tokens() -> None:
    penalties = Penalties(presence=0.5, frequency=0.25)
    logits = np.zeros(4, dtype=np.float32)
    penalties.apply(logits)
    assert not logits.any()  # nothing generated yet: nothing changes
    for token in (1, 1, 3):
        penalties.accept(token)
    penalties.apply(logits)
    assert logits.tolist() == [0.0, -(2 * 0.25 + 0.5), 0.0, -(0.25 + 0.5)]


def test_negative_penalties_favour_repeats() -> None:
    penalties = Penalties(presence=-1.0, frequency=0.0)
    penalties.accept(2)
    logits = np.zeros(3, dtype=np.float32)
    penalties.apply(logits)
    assert int(logits.argmax()) == 2


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "maxLength": 1001},
        {"type": "object", "properties": {"a": {"type": "array", "minItems": 5000}}},
        {"anyOf": [{"type": "string", "pattern": "^a{2,100000}$"}]},
    ],
)
def test_schema_bounds_the_converter_cannot_spell_are_refused(schema: dict) -> None:
    with pytest.raises(ValueError, match="above 1000"):
        check_schema_bounds(schema, 1000)


def test_schema_bounds_within_the_limit_pass() -> None:
    check_schema_bounds(
        {"type": "array", "maxItems": 1000, "items": {"type": "string", "pattern": "^a{3}$"}}, 1000
    )
