"""``edge-llm top``: the frame as a pure function of fixed documents, and ``--once``."""

from __future__ import annotations

import argparse
import asyncio
import io
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from rich.console import Console, RenderableType

from edge_llm.cli import top
from edge_llm.client.address import ServerAddress
from edge_llm.observability.metrics import EngineMetrics
from edge_llm.observability.top_view import (
    Rates,
    Sample,
    bar,
    histogram_quantile,
    parse_metrics,
    rates_between,
    render_frame,
    ring_fill,
    sample_of,
)

STREAM = {
    "id": "chatcmpl-0a0000000000000000000001",
    "session": "tab-1",
    "state": "paused",
    "pause_cause": "socket_full",
    "ring_write": 45,
    "ring_read": 13,
    "ring_capacity": 32,
    "kv_tokens": 75,
    "n_prompt_tokens": 31,
    "prefill_done": 31,
    "n_generated": 45,
    "max_tokens": 96,
    "pauses": 2,
    "paused_ms": 2410.0,
    "backpressure": 1,
    "backpressure_peak": 1,
    "tokens_while_paused": 0,
    "finish_reason": None,
    "cancel_reason": None,
    "age_ms": 3120.5,
    "priority": 0,
    "preemptions": 0,
}
PREEMPTED = {
    **STREAM,
    "id": "chatcmpl-0c0000000000000000000003",
    "state": "preempted",
    "pause_cause": "preempted",
    "priority": 5,
    "preemptions": 2,
}
DONE = {
    **STREAM,
    "id": "chatcmpl-0b0000000000000000000002",
    "session": None,
    "state": "cancelled",
    "pause_cause": None,
    "ring_write": 8,
    "ring_read": 8,
    "kv_tokens": 0,
    "n_generated": 8,
    "pauses": 0,
    "paused_ms": 0.0,
    "cancel_reason": "disconnect",
}
DOC = {
    "streams": [STREAM, DONE],
    "kv_used_bytes": 75 * 23040,
    "kv_budget_bytes": 256 * 1024 * 1024,
    "kv_reserved_bytes": 127 * 23040,
    "kv_bytes_per_token": 23040,
    "requests_running": 1,
    "requests_waiting": 0,
    "backpressure": 1,
    "backpressure_peak": 2,
    "engine_alive": True,
    "steps": 1234,
}


def metrics_text() -> str:
    metrics = EngineMetrics()
    metrics.bind_gauges(lambda: 1, lambda: 0, lambda: 1, lambda: 75 * 23040, lambda: 2)
    metrics.pauses.labels("client").inc(3)
    metrics.pauses.labels("socket_full").inc()
    metrics.cancellations.labels("disconnect").inc()
    metrics.preemptions.labels("5").inc(2)
    metrics.generated_tokens.inc(53)
    metrics.prompt_tokens.inc(62)
    for seconds in (0.02, 0.04, 0.2, 3.0):
        metrics.ttft.observe(seconds)
    return metrics.render().decode()


def text_of(renderable: RenderableType) -> str:
    out = io.StringIO()
    Console(file=out, width=220, force_terminal=False).print(renderable)
    return out.getvalue()


# -- metrics and rates ----------------------------------------------------------------------


def test_parse_metrics_keeps_engine_samples_by_label() -> None:
    metrics = parse_metrics(metrics_text())
    assert metrics["backpressure_pauses_total"] == {
        "client": 3.0,
        "socket_full": 1.0,
        "preempted": 0.0,
        "disconnected": 0.0,
    }
    assert metrics["generated_tokens_total"] == {"": 53.0}
    assert metrics["streams_paused"] == {"": 1.0}
    assert metrics["time_to_first_token_seconds_count"] == {"": 4.0}


def test_parse_metrics_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        parse_metrics("edge_llm_x{ 1\n")


def test_histogram_quantile_is_the_bucket_upper_bound() -> None:
    metrics = parse_metrics(metrics_text())
    name = "time_to_first_token_seconds"
    assert histogram_quantile(metrics, name, 0.5) == 0.05
    assert histogram_quantile(metrics, name, 0.9) == 5.0
    assert histogram_quantile(metrics, "inter_token_latency_seconds", 0.5) is None


def test_a_quantile_in_the_inf_bucket_shows_the_largest_bound() -> None:
    metrics = {"x_bucket": {"0.1": 0.0, "1.0": 1.0, "+Inf": 4.0}}
    assert histogram_quantile(metrics, "x", 0.9) == 1.0


def test_rates_between_refreshes() -> None:
    before = Sample(10.0, 100.0, {"a": 5, "gone": 3})
    now = Sample(12.0, 150.0, {"a": 25, "new": 4})
    rates = rates_between(before, now)
    assert rates.total == 25.0
    assert rates.per_stream == {"a": 10.0}
    assert rates_between(None, now) == Rates()
    assert rates_between(Sample(10.0, 500.0), Sample(11.0, 0.0)).total == 0.0  # restart


def test_sample_of_reads_both_documents() -> None:
    sample = sample_of(7.0, DOC, parse_metrics(metrics_text()))
    assert sample == Sample(7.0, 53.0, {STREAM["id"]: 45, DONE["id"]: 8})


def test_ring_fill_and_bar() -> None:
    assert ring_fill(STREAM) == 1.0
    assert ring_fill({**STREAM, "ring_capacity": 0}) == 0.0
    assert bar(0.3).plain == "███░░░░░░░"
    assert bar(1.7).plain == "█" * 10
    assert bar(0.95).spans[0].style == "red"


# -- the frame --------------------------------------------------------------------------------


def test_frame_shows_streams_with_ring_kv_and_pauses() -> None:
    rates = Rates(26.5, {STREAM["id"]: 12.0})
    text = text_of(render_frame(DOC, parse_metrics(metrics_text()), rates, title="T"))
    row = next(line for line in text.splitlines() if line.startswith("chatcmpl-0a000000"))
    assert row.split()[:6] == ["chatcmpl-0a000000", "tab-1", "0", "paused", "socket_full", "45/96"]
    assert "██████████ 45/13/32" in row
    assert row.split()[-8:] == ["75", "2", "2410", "ms", "0", "12.0", "3120", "ms"]
    done = next(line for line in text.splitlines() if line.startswith("chatcmpl-0b000000"))
    assert "cancelled  disconnect" in done


def test_a_preempted_stream_shows_its_class_and_preemptions() -> None:
    doc = {**DOC, "streams": [STREAM, PREEMPTED, {**STREAM, "id": "relayed", "priority": None}]}
    lines = text_of(render_frame(doc, {}, Rates(), title="T")).splitlines()
    preempted = next(line for line in lines if line.startswith("chatcmpl-0c000000"))
    assert preempted.split()[2:6] == ["5", "x2", "preempted", "preempted"]
    relayed = next(line for line in lines if line.startswith("relayed"))
    assert relayed.split()[2] == "-"


@pytest.mark.parametrize("width", range(48, 200, 7))
def test_a_narrow_terminal_wraps_the_header_between_fields(width: int) -> None:
    out = io.StringIO()
    frame = render_frame(DOC, parse_metrics(metrics_text()), Rates(26.5), title="T")
    Console(file=out, width=width, force_terminal=False).print(frame)
    lines = out.getvalue().splitlines()
    assert any(line.endswith("26.5 tok/s") or "26.5 tok/s  " in line for line in lines)
    assert any("1.6/256.0 MiB used/capacity" in line for line in lines)


def test_frame_shows_engine_line_and_totals() -> None:
    text = text_of(render_frame(DOC, parse_metrics(metrics_text()), Rates(26.5), title="T"))
    assert (
        "engine alive  steps 1234  running 1  waiting 0  paused 1  detached 0  26.5 tok/s" in text
    )
    assert "backpressure 1 (peak 2)  KV ░░░░░░░░░░ 1.6/256.0 MiB used/capacity" in text
    assert "MiB used/capacity  (reserved 2.8, cached 0.0, offloaded 0.0)" in text
    assert "pauses client 3 socket_full 1  |  cancels disconnect 1  |  rejected none" in text
    assert "rejected none  |  preempted prio 5 x2  |  tokens" in text
    assert "tokens 53 generated, 62 prompt  |  TTFT p50 <= 0.05 s p90 <= 5 s" in text


def test_frame_without_streams_or_metrics_says_so() -> None:
    doc = {**DOC, "streams": [], "engine_alive": False}
    text = text_of(render_frame(doc, {}, Rates(), title="T"))
    assert "engine DEAD" in text
    assert "no live or recent streams" in text
    assert "metrics unavailable" in text
    assert "- tok/s" in text


# -- the command ------------------------------------------------------------------------------


Handler = Callable[[web.Request], web.Response]


@pytest.fixture
async def fake_engine() -> AsyncIterator[Callable[[Handler], Any]]:
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> str:
        async def endpoint(request: web.Request) -> web.Response:
            return handler(request)

        app = web.Application()
        app.router.add_get("/{path:.*}", endpoint)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield start
    for runner in runners:
        await runner.cleanup()


def args_for(url: str, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    top.register(parser.add_subparsers())
    return parser.parse_args(["top", "--base-url", url, "--once", *extra])


def serve_docs(seen: list[web.Request]) -> Handler:
    def handler(request: web.Request) -> web.Response:
        seen.append(request)
        if request.path == "/debug/streams":
            return web.json_response(DOC)
        if request.path == "/metrics":
            return web.Response(text=metrics_text())
        return web.Response(status=404)

    return handler


async def test_once_prints_one_frame_and_sends_the_key(
    fake_engine: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[web.Request] = []
    url = await fake_engine(serve_docs(seen))
    code = await asyncio.to_thread(top.run, args_for(url + "/v1/", "--api-key", "sk-1"))
    out = capsys.readouterr().out
    assert code == 0
    assert "chatcmpl-0a000000" in out
    assert "pauses client 3 socket_full 1" in out
    assert [r.path for r in seen] == ["/debug/streams", "/metrics"]
    assert {r.headers.get("Authorization") for r in seen} == {"Bearer sk-1"}


async def test_once_explains_a_401(fake_engine: Any, capsys: pytest.CaptureFixture[str]) -> None:
    url = await fake_engine(lambda request: web.Response(status=401))
    assert await asyncio.to_thread(top.run, args_for(url)) == 1
    assert "HTTP 401 (wrong or missing --api-key?)" in capsys.readouterr().err


async def test_once_rejects_a_server_that_is_not_an_engine(
    fake_engine: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    url = await fake_engine(lambda request: web.json_response({"hello": "world"}))
    assert await asyncio.to_thread(top.run, args_for(url)) == 1
    assert "not an edge-llm debug document" in capsys.readouterr().err


async def test_the_old_url_flag_still_works(
    fake_engine: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    url = await fake_engine(serve_docs([]))
    parser = argparse.ArgumentParser()
    top.register(parser.add_subparsers())
    args = parser.parse_args(["top", "--url", url, "--once"])
    assert await asyncio.to_thread(top.run, args) == 0
    assert "chatcmpl-0a000000" in capsys.readouterr().out


async def test_next_frame_derives_tok_s_from_the_previous_sample(fake_engine: Any) -> None:
    counts = iter([100, 160])

    def handler(request: web.Request) -> web.Response:
        if request.path == "/debug/streams":
            return web.json_response(DOC)
        return web.Response(text=f"edge_llm_generated_tokens_total {next(counts)}\n")

    endpoint = top.Endpoint(ServerAddress(await fake_engine(handler) + "/v1", ""))
    first, before = await asyncio.to_thread(top.next_frame, endpoint, None)
    assert before is not None and before.generated_total == 100
    earlier = Sample(before.at - 2.0, before.generated_total, before.per_stream)
    frame, after = await asyncio.to_thread(top.next_frame, endpoint, earlier)
    assert after is not None and after.generated_total == 160
    assert "- tok/s" in text_of(first)
    assert " tok/s" in text_of(frame) and "- tok/s" not in text_of(frame)


async def test_next_frame_shows_an_error_and_keeps_going(fake_engine: Any) -> None:
    url = await fake_engine(lambda request: web.Response(status=500))
    endpoint = top.Endpoint(ServerAddress(url + "/v1", ""))
    frame, sample = await asyncio.to_thread(top.next_frame, endpoint, None)
    assert sample is None
    assert "HTTP 500 (retrying)" in text_of(frame)
