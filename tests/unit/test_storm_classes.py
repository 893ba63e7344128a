"""The storm's mixed workload: interactive users beside a background batch, prompts that
fit the target, and the figures per class."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from edge_llm.bench.record import RequestRecord
from edge_llm.bench.storm.load import (
    StormSettings,
    fitted,
    profiles,
    user_profile,
    user_turn,
)
from edge_llm.bench.storm.report import class_rows, render_html
from edge_llm.bench.storm.run import StormConfig, StormResult, TargetRunResult, run_storm
from edge_llm.bench.storm.stats import TargetRunData, summarize_storm
from edge_llm.bench.storm.user import StormRecord
from edge_llm.bench.targets import Target

# -- the load -------------------------------------------------------------------------------


def test_the_batch_runs_beside_the_same_interactive_users() -> None:
    alone = StormSettings(users=3, seed=4)
    mixed = StormSettings(users=3, seed=4, batch_users=2)
    assert profiles(mixed)[:3] == profiles(alone) == [user_profile(alone, u) for u in range(3)]
    batch = profiles(mixed)[3:]
    assert [(p.user, p.batch, p.slow, p.kind) for p in batch] == [
        (3, True, False, "batch"),
        (4, True, False, "batch"),
    ]
    assert all(p.patience_s == mixed.timeout_s for p in batch)  # it waits, never regenerates
    turns = [user_turn(mixed, 3, i, batch=True) for i in range(50)]
    assert all(t.abandon_after_tokens is None and t.think_s == 0.0 for t in turns)
    assert {t.prompt_tokens for t in turns} <= set(range(128, 1025))


def test_the_batch_sends_its_priority_unless_classes_are_off() -> None:
    mixed = StormSettings(users=1, batch_users=1, batch_priority=7)
    user, job = profiles(mixed)
    assert (mixed.priority_of(user), mixed.priority_of(job)) == (None, 7)
    flat = StormSettings(users=1, batch_users=1, batch_priority=7, priorities=False)
    assert [flat.priority_of(p) for p in profiles(flat)] == [None, None]


def test_bad_batch_settings_are_named() -> None:
    with pytest.raises(ValueError, match=r"batch_priority must be within -10\.\.10"):
        StormSettings(batch_priority=11).check()
    with pytest.raises(ValueError, match="batch_users must be >= 0"):
        StormSettings(batch_users=-1).check()


def test_prompts_are_fitted_to_the_smallest_limit_only_when_asked() -> None:
    default = StormSettings(fit_prompts=True)
    assert fitted(default, 511).prompt_tokens == (128, 372)  # the seed's 512 less one
    assert fitted(default, 200).prompt_tokens == (113, 113)
    assert fitted(default, 4000).prompt_tokens == (128, 1024)  # never raised
    assert fitted(default, None) == default  # no target says
    given = StormSettings(prompt_tokens=(600, 900))
    assert fitted(given, 511) == given  # a range asked for is sent as it is


# -- against a scripted server --------------------------------------------------------------

BODIES = web.AppKey("bodies", list)


def chunk(content: str, finish: str | None = None) -> bytes:
    body = {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def chat(request: web.Request) -> web.StreamResponse:
    request.app[BODIES].append(await request.json())
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(chunk("a ") + chunk("b", "stop") + b"data: [DONE]\n\n")
    return response


async def debug_streams(_: web.Request) -> web.Response:
    document = {"streams": [], "requests_running": 0, "requests_waiting": 0}
    return web.json_response({**document, "max_prompt_tokens": 200})


@pytest.fixture
async def edge_like() -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
    """A server that answers every chat request at once and reports max_prompt_tokens."""
    app = web.Application()
    app[BODIES] = []
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/debug/streams", debug_streams)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield app[BODIES], str(server.make_url("")).rstrip("/")
    await server.close()


def mixed_load(**change: Any) -> StormSettings:
    return StormSettings(
        users=1, batch_users=1, duration_s=0.3, think_s=(0.2, 0.2), timeout_s=5.0,
        abandon_share=0.0, slow_share=0.0, max_tokens=4, fit_prompts=True, **change,
    )  # fmt: skip


async def test_batch_requests_carry_the_priority_and_prompts_fit_the_target(edge_like) -> None:
    bodies, url = edge_like
    config = StormConfig((Target("edge", url, model="m"),), mixed_load(), sample_interval_s=0.1)
    result = await run_storm(config)
    assert result.config.settings.prompt_tokens == (113, 113)  # what ran, for the report
    assert all(r.prompt_tokens_requested == 113 for r in result.records)
    kinds = {r.kind for r in result.records}
    assert kinds == {"interactive", "batch"}
    batch = [r for r in result.records if r.kind == "batch"]
    assert len(batch) > len([r for r in result.records if r.kind == "interactive"])  # no think
    assert {b.get("priority") for b in bodies} == {None, 5}
    assert all(r.priority == (5 if r.kind == "batch" else None) for r in result.records)
    assert [c.kind for c in result.summaries[0].classes] == ["interactive", "batch"]
    bodies.clear()
    flat = StormConfig(config.targets, mixed_load(priorities=False), sample_interval_s=0.1)
    await run_storm(flat)
    assert all("priority" not in b for b in bodies)


# -- figures per class ----------------------------------------------------------------------


def record(kind: str, outcome: str, stream_id: str, ttft: float | None, read: int) -> StormRecord:
    request = RequestRecord("edge", 2, 0, "p", started_at=0.0, stream_id=stream_id)
    request.chunk_times = [ttft] if ttft is not None else []
    return StormRecord(
        target="edge", round=0, user=0, turn=0, attempt=0, slow=False,
        prompt_tokens_requested=100, turn_started_at=0.0, request=request, outcome=outcome,
        tokens_read=read, kind=kind, priority=5 if kind == "batch" else None,
    )  # fmt: skip


def test_each_class_has_its_ttft_goodput_tokens_lost_and_preemptions() -> None:
    records = [
        record("interactive", "completed", "i1", 0.2, 10),
        record("interactive", "superseded", "i2", None, 0),
        record("interactive", "abandoned", "i3", 3.0, 4),
        record("batch", "completed", "b1", 5.0, 30),
        record("batch", "completed", "b2", 0.5, 30),
    ]
    streams = {
        "i1": {"n_generated": 10, "preemptions": 0},
        "i2": {"n_generated": 7, "preemptions": 0},
        "i3": {"n_generated": 9, "preemptions": 0},
        "b1": {"n_generated": 30, "preemptions": 2},
        "b2": {"n_generated": 30, "preemptions": 1},
    }
    run = TargetRunData(duration_s=10.0, streams=streams)
    summary = summarize_storm("edge", records, [run], ttft_slo_ms=1000.0)
    interactive, batch = summary.classes
    assert (interactive.kind, interactive.priority, interactive.n_requests) == (
        "interactive",
        None,
        3,
    )
    assert interactive.outcomes == {"completed": 1, "abandoned": 1, "superseded": 1, "failed": 0}
    assert interactive.ttft is not None and interactive.ttft.p50 == pytest.approx(1.6)
    assert (interactive.goodput, interactive.tokens_lost, interactive.preemptions) == (1, 12, 0)
    assert (batch.kind, batch.priority, batch.goodput, batch.tokens_lost) == ("batch", 5, 1, 0)
    assert batch.preemptions == 3
    assert batch.ttft is not None and batch.ttft.p99 == pytest.approx(4.955)
    rows = class_rows(summary)
    assert rows[0] == (
        "edge",
        "interactive",
        "-",
        "3",
        "1",
        "0",
        "1600 / 2972",
        "1 (33%)",
        "12",
        "0",
    )
    assert rows[1][1:3] == ("batch", "5")
    unknown = summarize_storm("llama", records, [TargetRunData(duration_s=10.0)], 1000.0)
    assert [(c.tokens_lost, c.preemptions) for c in unknown.classes] == [(None, None)] * 2
    config = StormConfig((Target("edge", "http://127.0.0.1:1"),))
    result = StormResult(config, "2026-12-03T18:00:00+00:00", {}, "abc", records=records)
    result.runs, result.summaries = [TargetRunResult("edge", 0, run)], [summary]
    html = render_html(result)
    assert "<h2>Per class</h2>" in html and "<td>interactive</td>" in html


async def test_the_server_reports_the_longest_prompt_it_admits(client_of) -> None:
    client = await client_of(max_prompt_tokens=300)
    assert (await (await client.get("/debug/streams")).json())["max_prompt_tokens"] == 300
    client = await client_of(max_prompt_tokens=4000)  # the fake model's context is 2048
    assert (await (await client.get("/debug/streams")).json())["max_prompt_tokens"] == 2047
