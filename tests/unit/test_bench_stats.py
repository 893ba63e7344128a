"""bench metrics: percentiles, per-request derived metrics and per-level summaries."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_llm.bench.record import RequestRecord
from edge_llm.bench.stats import Distribution, percentile, summarize

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@given(st.lists(finite, min_size=1, max_size=50), st.floats(min_value=0, max_value=100))
def test_percentile_matches_numpy_linear_interpolation(values: list[float], q: float) -> None:
    expected = float(np.percentile(values, q, method="linear"))
    assert math.isclose(percentile(values, q), expected, rel_tol=1e-9, abs_tol=1e-6)


def test_percentile_examples() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([10.0], 99) == 10.0
    assert percentile([0.0, 10.0], 90) == pytest.approx(9.0)


@pytest.mark.parametrize("q", [-1.0, 100.5, math.nan])
def test_percentile_rejects_bad_q(q: float) -> None:
    with pytest.raises(ValueError, match="within"):
        percentile([1.0], q)


def test_percentile_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


def test_distribution_of_nothing_is_none() -> None:
    assert Distribution.of([]) is None
    dist = Distribution.of([3.0, 1.0, 2.0])
    assert dist is not None
    assert (dist.n, dist.mean, dist.p50, dist.min, dist.max) == (3, 2.0, 2.0, 1.0, 3.0)


def record(
    times: list[float], *, usage: int | None = None, ttfr: float | None = None
) -> RequestRecord:
    rec = RequestRecord("a", 1, 0, "p", chunk_times=times, completion_tokens=usage)
    rec.ttfr = ttfr if ttfr is not None else (times[0] if times else None)
    rec.done = True
    return rec


def test_record_metrics_follow_the_definitions() -> None:
    rec = record([0.5, 0.6, 0.8, 1.1], usage=4, ttfr=0.4)
    assert rec.ttft == 0.5
    assert rec.e2el == 1.1
    assert rec.itls() == pytest.approx([0.1, 0.2, 0.3])
    assert rec.tpot == pytest.approx((1.1 - 0.5) / 3)
    assert rec.decode_rate == pytest.approx(3 / 0.6)


def test_usage_wins_over_chunk_count_for_output_tokens() -> None:
    rec = record([0.5, 0.6], usage=6)
    assert rec.n_output_tokens == 6
    assert rec.tokens_from_usage
    assert rec.tpot == pytest.approx(0.1 / 5)
    assert record([0.5, 0.6]).n_output_tokens == 2


def test_single_chunk_has_no_tpot_or_decode_rate() -> None:
    rec = record([0.5])
    assert rec.tpot is None
    assert rec.decode_rate is None
    assert rec.itls() == []


def test_failed_requests_are_counted_never_used_for_latency() -> None:
    good = [record([0.2, 0.3, 0.5], usage=3), record([0.4, 0.5, 0.6], usage=3)]
    failed = RequestRecord("a", 1, 2, "p", chunk_times=[0.01, 0.02])
    failed.fail("400 prompt_too_long", "too long")
    timeout = RequestRecord("a", 1, 3, "p")
    timeout.fail("timeout", "slow")
    summary = summarize("a", 1, [*good, failed, timeout], duration_s=2.0)
    assert (summary.n_requests, summary.n_ok, summary.n_failed) == (4, 2, 2)
    assert summary.errors == {"400 prompt_too_long": 1, "timeout": 1}
    assert summary.ttft is not None and summary.ttft.n == 2
    assert summary.ttft.min == 0.2  # the failed request's 0.01 is not in it
    assert summary.itl is not None and summary.itl.n == 4  # pooled gaps of the ok ones
    assert summary.output_tokens == 6
    assert summary.output_tok_s == pytest.approx(3.0)
    assert summary.request_s == pytest.approx(1.0)
    assert summary.output_tokens_from_usage


def test_first_failure_wins() -> None:
    rec = RequestRecord("a", 1, 0, "p")
    rec.fail("read_error", "dropped")
    rec.fail("incomplete_stream", "no DONE")
    assert rec.error_kind == "read_error"
    assert not rec.ok


def test_to_json_has_raw_and_derived_fields() -> None:
    data = record([0.5, 0.7], usage=2).to_json()
    assert data["chunk_times"] == [0.5, 0.7]
    assert data["ttft"] == 0.5
    assert data["n_output_tokens"] == 2
    assert data["output_tokens_from"] == "usage"
    assert data["ok"] is True
