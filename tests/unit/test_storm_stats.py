"""A storm's figures against hand-recorded requests, and the table and report built on them."""

from __future__ import annotations

import numpy as np
import pytest

from edge_llm.bench.record import RequestRecord
from edge_llm.bench.storm.load import StormSettings
from edge_llm.bench.storm.report import render_html, storm_table, summary_row
from edge_llm.bench.storm.run import (
    LiveState,
    StormConfig,
    StormResult,
    TargetRunResult,
    round_order,
)
from edge_llm.bench.storm.stats import TargetRunData, is_server_error, summarize_storm
from edge_llm.bench.storm.user import StormRecord
from edge_llm.bench.storm.watch import CounterReading, ServerSample
from edge_llm.bench.targets import Target
from edge_llm.cli.storm import report_server_errors


def record(
    outcome: str,
    *,
    user: int = 0,
    turn: int = 0,
    attempt: int = 0,
    started: float = 1.0,
    turn_started: float | None = None,
    chunks: tuple[float, ...] = (),
    tokens_read: int = 0,
    error: str | None = None,
    stream_id: str | None = None,
    round_index: int = 0,
) -> StormRecord:
    request = RequestRecord("edge", 4, 0, "p", started_at=started, stream_id=stream_id)
    request.chunk_times = list(chunks)
    request.ended_at = (chunks[-1] if chunks else 0.5) + 0.1
    if error:
        request.fail(error, "boom")
    return StormRecord(
        target="edge", round=round_index, user=user, turn=turn, attempt=attempt, slow=False,
        prompt_tokens_requested=300, request=request,
        turn_started_at=started if turn_started is None else turn_started,
        outcome=outcome, tokens_read=tokens_read,
    )  # fmt: skip


def recorded() -> list[StormRecord]:
    return [
        # user 0: two regenerates, then an answer after 1.2 s (wait from the turn: 9.2 s)
        record("superseded", attempt=0, started=0.0, stream_id="s0"),
        record("superseded", attempt=1, started=4.0, turn_started=0.0, stream_id="s1"),
        record("completed", attempt=2, started=8.0, turn_started=0.0, chunks=(1.2, 1.3, 1.4),
               tokens_read=3, stream_id="s2"),
        # user 1: fast answer, then an abandoned stream, then a failure
        record("completed", user=1, started=0.5, chunks=(0.4, 0.5), tokens_read=2, stream_id="s3"),
        record("abandoned", user=1, turn=1, started=3.0, chunks=(5.0, 5.1, 5.2, 5.3),
               tokens_read=4, stream_id="s4"),
        record("failed", user=1, turn=2, started=9.0, error="504 ttft_timeout", stream_id="s5"),
        record("failed", user=2, started=9.5, error="503 queue_full"),
    ]  # fmt: skip


def run_data() -> TargetRunData:
    samples = [
        ServerSample(0.0, kv_used_bytes=0.0, running=0, waiting=0, paused=0, rss_bytes=100),
        ServerSample(0.5, kv_used_bytes=4e6, running=3, waiting=2, paused=1, rss_bytes=300),
        ServerSample(1.0, kv_used_bytes=2e6, running=4, waiting=0, paused=0, rss_bytes=200),
        ServerSample(1.5, alive=False),
    ]
    streams = {
        sid: {"id": sid, "prefill_done": n}
        for sid, n in (("s0", 100), ("s1", 60), ("s2", 300), ("s3", 50), ("s4", 80), ("s5", 40))
    }
    return TargetRunData(
        duration_s=30.0,
        samples=samples,
        before=CounterReading(generated_tokens=1000.0, prompt_tokens=5000.0),
        after=CounterReading(generated_tokens=1050.0, prompt_tokens=5630.0),
        streams=streams,
    )


def test_every_figure_follows_from_the_records_and_samples() -> None:
    records = recorded()
    summary = summarize_storm("edge", records, [run_data()], ttft_slo_ms=1000.0)
    assert summary.n_requests == 7
    assert summary.outcomes == {"completed": 2, "abandoned": 1, "superseded": 2, "failed": 2}
    assert sum(summary.outcomes.values()) == summary.n_requests
    assert summary.n_turns == 5
    assert summary.regenerated_turns == 1
    ttfts = [1.2, 0.4, 5.0]  # completed and abandoned, each from its own start
    assert summary.ttft is not None
    assert summary.ttft.p50 == pytest.approx(np.percentile(ttfts, 50))
    assert summary.ttft.p99 == pytest.approx(np.percentile(ttfts, 99))
    assert summary.wait is not None
    assert summary.wait.max == pytest.approx(9.2)  # user 0 waited from the first click
    assert summary.goodput == 1  # only user 1's 0.4 s answer is completed within 1 s
    assert summary.goodput_per_min == pytest.approx(2.0)
    assert summary.tokens_read == 9
    assert summary.tokens_generated == 50.0
    assert summary.tokens_unread == 41.0
    assert summary.prompt_tokens_processed == 630.0
    assert summary.wasted_prefill_tokens == 100 + 60 + 40  # superseded and failed streams
    assert summary.errors == {"503 queue_full": 1, "504 ttft_timeout": 1}
    assert summary.server_errors == {"504 ttft_timeout": 1}  # a 503 is a refusal
    assert summary.peak_kv_bytes == 4e6
    assert (summary.peak_running, summary.peak_waiting, summary.peak_paused) == (4, 2, 1)
    assert summary.peak_rss_bytes == 300
    assert summary.server_unreachable_samples == 1


def test_figures_a_server_does_not_expose_stay_unknown() -> None:
    data = TargetRunData(duration_s=10.0, samples=[ServerSample(0.0, running=2)])
    summary = summarize_storm("llama", recorded(), [data], ttft_slo_ms=3000.0)
    assert summary.tokens_generated is None
    assert summary.tokens_unread is None
    assert summary.wasted_prefill_tokens is None
    assert summary.peak_kv_bytes is None
    assert summary.peak_rss_bytes is None
    row = summary_row(summary)
    assert row[0] == "llama"
    assert row[9:12] == ("-", "-", "-")


def test_rounds_add_up() -> None:
    one, two = run_data(), run_data()
    summary = summarize_storm("edge", recorded(), [one, two], ttft_slo_ms=1000.0)
    assert summary.duration_s == 60.0
    assert summary.tokens_generated == 100.0
    assert summary.prompt_tokens_processed == 1260.0


def test_targets_rotate_between_rounds() -> None:
    targets = (Target("a", "http://x"), Target("b", "http://y"), Target("c", "http://z"))
    assert [t.name for t in round_order(targets, 0)] == ["a", "b", "c"]
    assert [t.name for t in round_order(targets, 1)] == ["b", "c", "a"]
    assert [t.name for t in round_order(targets, 3)] == ["a", "b", "c"]


def test_table_and_report_show_the_summary() -> None:
    config = StormConfig((Target("edge", "http://127.0.0.1:1"),), StormSettings(ttft_slo_ms=1000))
    result = StormResult(config, "2026-12-02T18:00:00+00:00", {"cpu_count": 2}, "abc123")
    result.records = recorded()
    result.runs = [TargetRunResult("edge", 0, run_data())]
    result.summaries = [summarize_storm("edge", result.records, [run_data()], 1000.0)]
    row = summary_row(result.summaries[0])
    assert row[1:6] == ("7", "2", "1", "2", "2")
    assert row[6] == "1200 / 4240 / 4924"
    assert row[7] == "1 (14%)"
    assert storm_table(result).row_count == 1
    html = render_html(result)
    assert html.startswith("<!DOCTYPE html>")
    assert "<script" not in html and " src=" not in html and "<link" not in html
    for heading in (
        "KV cache in use",
        "Running sequences",
        "TTFT vs request start",
        "edge, round 1",
    ):
        assert heading in html
    assert html.count("<circle") == 3  # one dot per request a user read
    assert "504 ttft_timeout" in html
    data = result.to_json()
    assert data["summaries"][0]["outcomes"]["superseded"] == 2
    assert data["records"][0]["outcome"] == "superseded"
    assert data["runs"][0]["counters_after"]["generated_tokens"] == 1050.0
    assert LiveState().counters == {}


@pytest.mark.parametrize(
    ("kind", "fault"),
    [
        ("500 internal_error", True),
        ("500", True),
        ("502 upstream_error", True),
        ("504 ttft_timeout", True),
        ("stream_error backend_error", True),
        ("stream_error internal_error", True),
        ("stream_error server_error", True),  # llama-server's type in a 200 stream
        ("503 queue_full", False),  # a refusal, retried after Retry-After
        ("503 kv_budget_exceeded", False),
        ("stream_error memory_pressure", False),
        ("409 cancelled", False),
        ("400 prompt_too_long", False),
        ("timeout", False),  # the user's own time-out
        ("incomplete_stream", False),
    ],
)
def test_server_errors_are_5xx_other_than_503(kind: str, fault: bool) -> None:
    assert is_server_error(kind) is fault


def test_the_storm_command_fails_when_a_request_met_a_server_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = StormConfig((Target("edge", "http://127.0.0.1:1"),), StormSettings())
    result = StormResult(config, "2026-12-02T18:00:00+00:00", {"cpu_count": 2}, "abc123")
    refused = [r for r in recorded() if r.request.error_kind != "504 ttft_timeout"]
    result.summaries = [summarize_storm("edge", refused, [run_data()], 1000.0)]
    assert report_server_errors(result) == 0
    result.summaries = [summarize_storm("edge", recorded(), [run_data()], 1000.0)]
    assert report_server_errors(result) == 1
    assert "edge: server errors: 504 ttft_timeout x1" in capsys.readouterr().err
