"""The client SDK and ``edge-llm chat`` against the real engine (SSE and WebSocket)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from edge_llm.client import ClientConfig, StreamClient, TtftTimeoutError
from edge_llm.observability.events import read_events

from helpers import Recorder, next_frame
from support import chat_body, logged_through, served_model, wait_until

pytestmark = pytest.mark.e2e

QUESTION = [{"role": "user", "content": "Name the capital of France."}]
STORY = [{"role": "user", "content": "Write a long story about a dragon who learns to bake."}]


def config(engine: Any, **fields: Any) -> ClientConfig:
    """The client against ``engine``; one attempt per call unless ``retry`` says more
    (the seed's two attempts would hide a failed first one from a test that counts)."""
    fields.setdefault("retry", {"max_attempts": 1})
    model_id = served_model(engine)
    return ClientConfig(base_url=engine.base_url, api_key="", model_id=model_id, **fields)


def engine_events(engine: Any, request_id: str) -> list[str]:
    return [e["event"] for e in engine.events() if e.get("request_id") == request_id]


async def test_sse_and_ws_give_the_same_answer_with_server_ids(engine_server: Any) -> None:
    events = Recorder()
    n_admitted = len(engine_server.events_of("admitted"))
    async with StreamClient(config(engine_server), event_log=events) as client:
        sse = await client.complete(QUESTION, max_tokens=24, temperature=0)
        ws = await client.complete(QUESTION, max_tokens=24, temperature=0, transport="ws")
    assert "Paris" in sse.text
    assert ws.text == sse.text  # greedy: the same answer either way
    for result in (sse, ws):
        assert result.finish_reason in ("stop", "length")
        assert result.n_tokens > 0
        assert result.ttft_ms is not None
        assert result.ttfr_ms is not None
        assert result.request_id
        assert result.attempts == 1
    assert ws.request_id != sse.request_id
    assert sse.usage is not None and sse.usage["completion_tokens"] == sse.n_tokens
    assert ws.server_stats is not None and "ttft_ms" in ws.server_stats
    ends = events.of("end")
    assert [e["request_id"] for e in ends] == [sse.request_id, ws.request_id]
    # The ids the client logs are the engine's: `edge-llm blame` can join the two logs.
    for result in (sse, ws):
        assert result.request_id is not None
        rid = result.request_id
        await wait_until(lambda rid=rid: "end" in engine_events(engine_server, rid), what="end")
    # one request per call reached the engine (lines are written in order: both ends
    # are in the log, so every admission before them is too)
    admitted = [e["request_id"] for e in engine_server.events_of("admitted")[n_admitted:]]
    assert admitted == [sse.request_id, ws.request_id]


async def test_ttft_timeout_cancels_on_the_engine(engine_factory: Any) -> None:
    """The engine's only slot is held by a paused stream (offload off), so the
    client's request waits in the queue: no first token can come, however fast the
    machine, and both attempts end in the client's TTFT time-out and a cancel."""
    engine = engine_factory(
        "--max-sequences", "1", "--host-offload-mb", "0", "--max-pause-ms", "600000"
    )
    url = engine.base_url.replace("http", "ws") + "/stream"
    events = Recorder()
    cfg = config(
        engine,
        ttft_warn_ms=0,
        ttft_hard_timeout_ms=300,
        retry={"max_attempts": 2, "backoff_ms": 50, "retry_on": ["ttft_timeout"]},
    )
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as holder:
        await holder.send_json({"type": "start", "request": chat_body("Hi", max_tokens=64)})
        await next_frame(holder, "delta")
        await holder.send_json({"type": "pause"})
        await next_frame(holder, "paused")
        async with StreamClient(cfg, event_log=events) as client:
            with pytest.raises(TtftTimeoutError):
                await client.complete(QUESTION, max_tokens=8, transport="ws")
    cancels = events.of("cancel_sent")
    assert [c["reason"] for c in cancels] == ["ttft_timeout", "ttft_timeout"]
    ids = [c["request_id"] for c in cancels]
    assert all(ids) and ids[0] != ids[1]
    for rid in ids:
        cancel = await wait_until(lambda rid=rid: engine.events_of("cancel", rid), what="cancel")
        assert cancel[0]["reason"] == "client"
    assert not engine.events_of("first_token", ids[0]) and not engine.events_of(
        "first_token", ids[1]
    )


async def test_sse_slow_renderer_stops_reading(engine_server: Any) -> None:
    events = Recorder()
    cfg = config(engine_server, render_queue_capacity=8)
    async with (
        StreamClient(cfg, event_log=events) as client,
        client.stream(STORY, max_tokens=48, temperature=0) as stream,
    ):
        await wait_until(lambda: events.of("read_paused"), what="read_paused")
        texts = [text async for text in stream]
    assert "".join(texts) == stream.result.text
    assert stream.result.n_tokens > 8
    assert stream.result.attempts == 1
    assert events.of("read_resumed")


def run_cli(*argv: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edge_llm", "chat", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_chat_ws_render_delay_sends_pause_and_resume(engine_server: Any, tmp_path: Path) -> None:
    """A render queue of two chunks and a renderer of one chunk a second: two tokens
    arriving while one is rendered reach the high watermark, on any machine that
    runs these tests (the engine makes dozens a second), and the queue drains to the
    low watermark (empty) before the end."""
    log = tmp_path / "client.jsonl"
    model_id = served_model(engine_server)
    config_path = tmp_path / "client.json"
    section = {"base_url": engine_server.base_url, "api_key": "", "model_id": model_id,
               "render_queue_capacity": 2, "retry": {"max_attempts": 1}}  # fmt: skip
    config_path.write_text(json.dumps({"edge_llm_client": section}), encoding="utf-8")
    proc = run_cli(
        "--config", str(config_path), "--ws", "--render-delay-ms", "1000",
        "--max-tokens", "8", "--event-log", str(log), STORY[0]["content"],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    events = read_events(log)
    names = [e["event"] for e in events]
    assert names.count("request_sent") == 1, names
    for name in ("watermark_high", "pause_sent", "watermark_low", "resume_sent", "end"):
        assert name in names, names
    assert names.index("pause_sent") < names.index("resume_sent")
    rid = next(e["request_id"] for e in events if e["event"] == "pause_sent")
    assert rid
    logged = asyncio.run(logged_through(engine_server, rid))
    engine_names = [e["event"] for e in logged if e.get("request_id") == rid]
    assert "pause_received" in engine_names
    assert "resume_received" in engine_names


def test_chat_sse_one_shot_and_failure_exit_code(engine_server: Any, tmp_path: Path) -> None:
    model_id = served_model(engine_server)
    question = "Name the capital of France."
    ok = run_cli("--base-url", engine_server.base_url + "/", "--model", model_id,
                 "--max-tokens", "16", "--temperature", "0", question)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "Paris" in ok.stdout
    bad = run_cli("--base-url", engine_server.base_url, "--model", "no-such-model", "hi")
    assert bad.returncode == 1
    assert "model_not_found" in bad.stderr
    assert len([ln for ln in bad.stderr.splitlines() if ln.startswith("edge-llm chat:")]) == 1


def test_chat_reads_the_seed_config_shape(engine_server: Any, tmp_path: Path) -> None:
    model_id = served_model(engine_server)
    path = tmp_path / "client.json"
    section = {"base_url": engine_server.url, "api_key": " sk-local ", "model_id": model_id}
    path.write_text(json.dumps({"edge_llm_client": section}))
    proc = run_cli("--config", str(path), "--max-tokens", "8", "Say hi.")
    assert proc.returncode == 0, proc.stderr
    assert "api_key had leading/trailing whitespace" in proc.stderr
    assert "no path" not in proc.stderr  # the documented form without /v1 is no repair
