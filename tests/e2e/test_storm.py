"""``edge-llm storm`` against the real engine: a short storm whose counts add up."""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from edge_llm.cli import storm as storm_cli

pytestmark = pytest.mark.e2e

OUTCOMES = ("completed", "abandoned", "superseded", "failed")


def run_storm_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    storm_cli.register(parser.add_subparsers())
    args = parser.parse_args(["storm", *argv])
    code: int = args.func(args)
    return code


def test_a_short_storm_accounts_for_every_request_exactly_once(
    engine_server: Any, tmp_path: Path
) -> None:
    out_json, out_html = tmp_path / "storm.json", tmp_path / "storm.html"
    code = run_storm_cli(
        "--target", f"edge={engine_server.url}", "--pid", f"edge={engine_server.proc.pid}",
        "--users", "4", "--duration", "4", "--seed", "5", "--prompt-tokens", "40-200",
        "--max-tokens", "12", "--patience", "0.5-2", "--max-regenerates", "2",
        "--abandon-share", "0.3", "--abandon-after", "2-4", "--slow-share", "0.5",
        "--slow-rate", "40", "--think", "0.2-0.5", "--timeout", "60",
        "--sample-interval", "0.2", "--json", str(out_json), "--report", str(out_html),
    )  # fmt: skip
    assert code == 0
    data = json.loads(out_json.read_text())
    records, summary = data["records"], data["summaries"][0]
    assert records, "the storm sent no request"
    # every request has exactly one outcome, and the summary counts each once
    assert all(r["outcome"] in OUTCOMES for r in records)
    assert summary["n_requests"] == len(records)
    for outcome in OUTCOMES:
        assert summary["outcomes"][outcome] == sum(r["outcome"] == outcome for r in records)
    assert sum(summary["outcomes"].values()) == len(records)
    # a turn's attempts are numbered 0, 1, ... and only the last may be other than superseded
    turns: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in records:
        turns.setdefault((r["user"], r["turn"]), []).append(r)
    for attempts in turns.values():
        assert [a["attempt"] for a in attempts] == list(range(len(attempts)))
        assert all(a["outcome"] in ("superseded", "failed") for a in attempts[:-1])
    # what the engine says about the same requests (joined by X-Request-Id)
    streams = {s["id"]: s for s in engine_server.debug_streams()["streams"]}
    for r in records:
        stream = streams.get(r["stream_id"])
        if stream is None:
            continue
        if r["outcome"] == "completed":
            assert stream["state"] == "done"
            assert stream["n_generated"] == r["completion_tokens"] == r["tokens_read"]
        elif r["outcome"] == "superseded" and stream["state"] == "cancelled":
            assert stream["cancel_reason"] in ("superseded", "disconnect", "ttft_timeout")
    assert summary["tokens_generated"] >= summary["tokens_read"]
    assert summary["peak_rss_bytes"] > 50 * 1024 * 1024
    assert summary["peak_running"] >= 1
    html = out_html.read_text()
    assert "KV cache in use" in html and "edge, round 1" in html


def test_deadline_admission_refuses_at_once_what_would_miss_the_ttft_timeout(
    engine_factory: Any,
) -> None:
    engine = engine_factory(
        "--deadline-admission", "--ttft-timeout-ms", "2000", "--max-prompt-tokens", "1500"
    )
    long_prompt = " ".join(["The harbour town woke slowly, its boats rocking."] * 100)
    body = {"messages": [{"role": "user", "content": long_prompt}], "max_tokens": 4}
    request = urllib.request.Request(
        engine.base_url + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    error = json.loads(refused.value.read())["error"]
    assert refused.value.code == 503
    assert error["code"] == "queue_full" and "predicted time to first token" in error["message"]
    assert int(refused.value.headers["Retry-After"]) >= 1
    assert error["predicted_ttft_ms"] > 2000
    # refused before admission: no stream, no prefill (not a 504 after the time-out)
    assert engine.debug_streams()["streams"] == []
    assert engine.metric("edge_llm_admission_rejections_total", reason="queue_full") == 1
    short = {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 4}
    request = urllib.request.Request(
        engine.base_url + "/chat/completions",
        data=json.dumps(short).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200
