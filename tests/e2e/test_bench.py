"""``edge-llm bench`` against live engines: figures consistent with the per-request
records, error kinds, and the slow-consumer probe seeing the engine pause and resume."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_llm.cli import bench as bench_cli

pytestmark = pytest.mark.e2e


def run_bench_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    bench_cli.register(parser.add_subparsers())
    args = parser.parse_args(["bench", *argv])
    code: int = args.func(args)
    return code


def records_of(data: dict[str, Any], target: str, level: int) -> list[dict[str, Any]]:
    return [r for r in data["records"] if r["target"] == target and r["concurrency"] == level]


def assert_summary_matches_records(summary: dict[str, Any], records: list[dict[str, Any]]) -> None:
    ok = [r for r in records if r["ok"]]
    assert summary["n_requests"] == len(records)
    assert summary["n_ok"] == len(ok)
    ttfts = [r["ttft"] for r in ok]
    for q in (50, 90, 99):
        assert summary["ttft"][f"p{q}"] == pytest.approx(np.percentile(ttfts, q))
    assert summary["ttft"]["mean"] == pytest.approx(np.mean(ttfts))
    gaps = [gap for r in ok for gap in np.diff(r["chunk_times"])]
    assert summary["itl"]["n"] == len(gaps)
    assert summary["itl"]["p50"] == pytest.approx(np.percentile(gaps, 50))
    assert summary["e2el"]["p99"] == pytest.approx(np.percentile([r["e2el"] for r in ok], 99))
    rates = [r["decode_rate"] for r in ok if r["decode_rate"] is not None]
    assert summary["decode_rate"]["p50"] == pytest.approx(np.percentile(rates, 50))
    assert summary["output_tokens"] == sum(r["n_output_tokens"] for r in ok)
    assert summary["output_tokens_from_usage"]


def test_two_engines_side_by_side(engine_server: Any, engine_factory: Any, tmp_path: Path) -> None:
    # A second configuration: two tokens per chunk, so chunk counts and token counts differ.
    other = engine_factory("--chunk-size-tokens", "2")
    out_json, out_html = tmp_path / "bench.json", tmp_path / "bench.html"
    code = run_bench_cli(
        "--target", f"one={engine_server.base_url}", "--target", f"two={other.url}/",
        "--requests", "3", "--concurrency", "1,2", "--max-tokens", "16", "--warmup", "1",
        "--json", str(out_json), "--report", str(out_html),
    )  # fmt: skip
    assert code == 0
    data = json.loads(out_json.read_text())
    assert len(data["records"]) == 12
    assert all(r["ok"] for r in data["records"]), [r["error_kind"] for r in data["records"]]
    for summary in data["summaries"]:
        records = records_of(data, summary["target"], summary["concurrency"])
        assert_summary_matches_records(summary, records)
    two = records_of(data, "two", 1) + records_of(data, "two", 2)
    assert sum(r["n_chunks"] for r in two) < sum(r["n_output_tokens"] for r in two)
    single = sorted(records_of(data, "one", 1) + records_of(data, "two", 1),
                    key=lambda r: r["started_at"])  # fmt: skip
    assert [r["target"] for r in single] == ["one", "two"] * 3  # interleaved
    html = out_html.read_text()
    assert "TTFT distribution, concurrency 2" in html and "two #2" in html


def test_long_prompts_over_the_limit_are_an_error_kind(engine_server: Any, tmp_path: Path) -> None:
    out_json = tmp_path / "long.json"
    code = run_bench_cli(
        "--target", f"edge={engine_server.url}", "--prompt-set", "long",
        "--requests", "2", "--warmup", "0", "--max-tokens", "4", "--json", str(out_json),
    )  # fmt: skip
    assert code == 0
    (summary,) = json.loads(out_json.read_text())["summaries"]
    assert summary["errors"] == {"400 prompt_too_long": 2}
    assert summary["n_ok"] == 0
    assert summary["ttft"] is None


def test_slow_consumer_sees_the_engine_pause_and_resume(
    engine_factory: Any, tmp_path: Path
) -> None:
    # Small server-side buffers so that the stalled socket stops this stream after some
    # dozens of tokens. The probe needs more than 32 tokens: the buffers must fill first.
    engine = engine_factory(
        "--outbound-buffer-tokens", "4", "--write-buffer-bytes", "512",
        "--socket-send-buffer-bytes", "4096",
    )  # fmt: skip
    out_json, out_html = tmp_path / "slow.json", tmp_path / "slow.html"
    code = run_bench_cli(
        "--target", f"edge={engine.url}", "--requests", "0", "--warmup", "0",
        "--slow-consumer", "--rcvbuf", "2048", "--stall-after", "4", "--stall-seconds", "1",
        "--stall-until-paused", "--slow-max-tokens", "160",
        "--json", str(out_json), "--report", str(out_html),
    )  # fmt: skip
    assert code == 0
    (found,) = json.loads(out_json.read_text())["slow_consumer"]
    assert found["record"]["ok"], found["record"]["error_message"]
    assert found["verdict_source"] == "debug_streams"
    assert found["server_paused"] is True
    assert found["pause_cause"] == "socket_full"
    assert found["stall_start"] <= found["paused_at"] <= found["stall_end"]
    assert found["resumed_at"] >= found["stall_end"]
    assert found["queue_peak_bytes"] > 0
    assert found["kv_growth_bytes"] > 0
    server = engine.stream(found["record"]["stream_id"])
    assert found["server_pauses"] == server["pauses"] >= 1
    assert found["server_paused_ms"] == server["paused_ms"] > 0
    html = out_html.read_text()
    assert "<title>client stalled</title>" in html
    assert "<title>server paused (socket_full)</title>" in html
    assert "Tokens generated by the server" in html
