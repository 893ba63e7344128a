"""bench against in-process fake OpenAI servers: requests, error kinds, interleaving,
the slow-consumer probe against a server that keeps generating, and the CLI."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from edge_llm.bench.chat_stream import RequestOptions, run_request
from edge_llm.bench.prompts import Prompt
from edge_llm.bench.record import RequestRecord
from edge_llm.bench.runner import BenchConfig, run_bench
from edge_llm.bench.slow_consumer import SlowConsumerSettings, probe
from edge_llm.bench.stats import percentile
from edge_llm.bench.targets import Target, parse_target
from edge_llm.cli import bench as bench_cli

from helpers import free_port

CHUNK_PAD = "x" * 100  # makes each SSE event about 200 bytes, like real servers
PACED_CHUNKS = 4  # the slow-consumer test reads this many, then stalls
PACE_S = 0.1


@dataclass
class Log:
    """What the fake servers saw: (server, event, loop time) and the request bodies."""

    events: list[tuple[str, str, float]] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)

    def mark(self, name: str, event: str) -> None:
        self.events.append((name, event, asyncio.get_running_loop().time()))


def sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chunk(content: str | None, finish: str | None = None, role: str | None = None) -> bytes:
    delta: dict[str, str] = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return sse({"id": "c", "object": "chat.completion.chunk", "choices": [choice]})


class FakeServer:
    """An OpenAI-style streaming endpoint; the prompt text selects the behaviour."""

    def __init__(self, name: str, log: Log) -> None:
        self.name = name
        self.log = log
        self.count = 0

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": f"{self.name}-model"}]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.log.bodies.append(body)
        self.log.mark(self.name, "start")
        self.count += 1
        try:
            return await self._reply(request, body, body["messages"][-1]["content"])
        finally:
            self.log.mark(self.name, "end")

    async def _reply(
        self, request: web.Request, body: dict[str, Any], text: str
    ) -> web.StreamResponse:
        if "TOO LONG" in text:
            error = {"message": "too long", "type": "invalid_request_error",
                     "code": "prompt_too_long", "param": "messages"}  # fmt: skip
            return web.json_response({"error": error}, status=400)
        if "PLAIN" in text:
            return web.json_response({"choices": []})
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "X-Request-Id": f"{self.name}-{self.count}",
            }
        )
        await response.prepare(request)
        await response.write(chunk("", role="assistant"))
        if "FAIL MID" in text:
            await response.write(chunk("a"))
            await response.write(sse({"error": {"message": "boom", "code": "engine_error"}}))
            return response
        if "KEEP GENERATING" in text:
            await _generate_unbounded(response, body["max_tokens"])
        else:
            for i in range(body["max_tokens"]):
                await response.write(chunk(f"w{i} "))
                await asyncio.sleep(0)
        await _finish(response, body, done="NO DONE" not in text)
        return response


async def _generate_unbounded(response: web.StreamResponse, n: int) -> None:
    """Like llama-server: tokens pile up in a queue whatever the reader does. The
    first ``PACED_CHUNKS`` come ``PACE_S`` apart (the pace the probe measures before
    its reader stalls), then the rest at once: all of it is generated while the
    reader is stalled, however loaded the machine, and arrives in one burst whose
    gaps are far below a quarter of the pace (the probe's burst threshold)."""
    queue: asyncio.Queue[bytes] = asyncio.Queue()

    async def produce() -> None:
        for i in range(n):
            queue.put_nowait(chunk(f"w{i} {CHUNK_PAD}"))
            if i < PACED_CHUNKS:
                await asyncio.sleep(PACE_S)  # the fake model's pace, not an ordering

    producer = asyncio.create_task(produce())
    for _ in range(n):
        await response.write(await queue.get())
    await producer


async def _finish(response: web.StreamResponse, body: dict[str, Any], *, done: bool) -> None:
    await response.write(chunk(None, finish="length"))
    if body.get("stream_options", {}).get("include_usage"):
        usage = {"prompt_tokens": 5, "completion_tokens": body["max_tokens"], "total_tokens": 0}
        await response.write(sse({"id": "c", "choices": [], "usage": usage}))
    if done:
        await response.write(b"data: [DONE]\n\n")


Serve = Callable[[str], Awaitable[Target]]


@pytest.fixture
def log() -> Log:
    return Log()


@pytest.fixture
async def serve(log: Log) -> AsyncIterator[Serve]:
    runners: list[web.AppRunner] = []

    async def start(name: str) -> Target:
        fake = FakeServer(name, log)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", fake.chat)
        app.router.add_get("/v1/models", fake.models)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        return parse_target(f"{name}=http://127.0.0.1:{runner.addresses[0][1]}")

    yield start
    for runner in runners:
        await runner.cleanup()


async def one(target: Target, text: str, options: RequestOptions | None = None) -> RequestRecord:
    record = RequestRecord(target.name, 1, 0, "p")
    options = options or RequestOptions(max_tokens=5)
    await run_request(target, Prompt.user("p", text), options, record, epoch=0.0)
    return record


async def test_a_stream_is_timed_chunk_by_chunk(serve: Serve, log: Log) -> None:
    target = await serve("a")
    record = await one(target, "hello")
    assert record.ok, record.error_message
    assert record.status == 200
    assert record.stream_id == "a-1"
    assert record.n_chunks == 5  # the role-only and finish chunks are not content
    assert record.completion_tokens == 5
    assert record.ttfr is not None and record.ttft is not None and record.ttfr <= record.ttft
    assert record.chunk_times == sorted(record.chunk_times)
    assert record.finish_reason == "length"
    assert log.bodies[0]["stream_options"] == {"include_usage": True}
    assert log.bodies[0]["temperature"] == 0.0


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("TOO LONG", "400 prompt_too_long"),
        ("FAIL MID", "stream_error engine_error"),
        ("NO DONE", "incomplete_stream"),
        ("PLAIN", "not_streaming"),
    ],
)
async def test_failures_become_error_kinds(serve: Serve, text: str, kind: str) -> None:
    record = await one(await serve("a"), text)
    assert record.error_kind == kind
    assert not record.ok


async def test_refused_connection_and_timeout_are_error_kinds(serve: Serve) -> None:
    port = free_port()
    record = await one(Target("dead", f"http://127.0.0.1:{port}"), "hi")
    assert record.error_kind == "connect_error"

    accepted: list[asyncio.StreamWriter] = []
    silent = await asyncio.start_server(lambda _, w: accepted.append(w), "127.0.0.1", 0)
    async with silent:
        port = silent.sockets[0].getsockname()[1]
        options = RequestOptions(max_tokens=5, timeout_s=0.2)
        record = await one(Target("silent", f"http://127.0.0.1:{port}"), "hi", options)
        for writer in accepted:
            writer.close()
    assert record.error_kind == "timeout"


def config(*targets: Target, **fields: Any) -> BenchConfig:
    prompts = (Prompt.user("p0", "zero"), Prompt.user("p1", "one"), Prompt.user("p2", "TOO LONG"))
    fields.setdefault("options", RequestOptions(max_tokens=4))
    return BenchConfig(targets=targets, prompts=prompts, prompt_source="test", **fields)


async def test_targets_take_turns_and_never_overlap(serve: Serve, log: Log) -> None:
    a, b = await serve("a"), await serve("b")
    result = await run_bench(config(a, b, requests=3, concurrency=(1, 2), warmup=1))
    starts = [name for name, event, _ in log.events if event == "start"]
    # warm-up a, b; then concurrency 1: a, b, a, b, a, b; then batches of 2 and 1.
    assert starts[:8] == ["a", "b"] * 4
    assert sorted(starts[8:10]) == ["a", "a"] and starts[10:12] == ["b", "b"]
    _assert_no_overlap(log)
    assert [r.target for r in result.records if r.concurrency == 1] == ["a"] * 3 + ["b"] * 3
    assert {r.model for r in result.config.targets} == {"a-model", "b-model"}
    assert all(body["model"] in ("a-model", "b-model") for body in log.bodies)


def _assert_no_overlap(log: Log) -> None:
    """While one target has requests in flight, the other has none."""
    active: dict[str, int] = {"a": 0, "b": 0}
    for name, event, _ in log.events:
        active[name] += 1 if event == "start" else -1
        assert min(active.values()) == 0 or max(active.values()) == 0


async def test_summaries_agree_with_the_records(serve: Serve) -> None:
    a = await serve("a")
    result = await run_bench(config(a, requests=6, concurrency=(2,), warmup=0))
    data = json.loads(json.dumps(result.to_json()))
    (summary,) = data["summaries"]
    ok = [r for r in data["records"] if r["ok"]]
    assert summary["n_requests"] == 6
    assert summary["errors"] == {"400 prompt_too_long": 2}
    assert summary["n_ok"] == len(ok) == 4
    assert summary["ttft"]["p50"] == percentile([r["ttft"] for r in ok], 50)
    gaps = [b - a for r in ok for a, b in zip(r["chunk_times"], r["chunk_times"][1:], strict=False)]
    assert summary["itl"]["p99"] == pytest.approx(percentile(gaps, 99))
    assert summary["output_tokens"] == sum(r["n_output_tokens"] for r in ok) == 16


async def test_slow_consumer_against_a_server_that_keeps_generating(serve: Serve) -> None:
    target = await serve("llama-like")
    settings = SlowConsumerSettings(
        rcvbuf=2048, stall_after_chunks=PACED_CHUNKS, stall_s=1.0, max_tokens=80
    )
    prompt = Prompt.user("slow", "KEEP GENERATING")
    found = await probe(target, settings, RequestOptions(), epoch=0.0, prompt=prompt)
    assert found.record.ok, found.record.error_message
    assert found.introspection is False
    assert found.chunks_before_stall == 4
    assert found.queue_peak_bytes is not None and found.queue_peak_bytes > 0
    assert found.arrival_stopped_at is not None
    assert found.finished_in_burst
    assert found.server_paused is False
    assert "kept generating" in found.verdict
    assert found.memory_note.startswith("not measurable")


async def test_cli_writes_json_and_report(
    serve: Serve, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = await serve("a"), await serve("b")
    parser = argparse.ArgumentParser()
    bench_cli.register(parser.add_subparsers())
    out_json, out_html = tmp_path / "out.json", tmp_path / "out.html"
    args = parser.parse_args(
        ["bench", "--target", f"a={a.base_url}", "--target", f"b={b.root}/",
         "--requests", "2", "--concurrency", "1,2", "--max-tokens", "3", "--warmup", "0",
         "--json", str(out_json), "--report", str(out_html)]
    )  # fmt: skip
    assert await asyncio.to_thread(args.func, args) == 0
    data = json.loads(out_json.read_text())
    assert [s["target"] for s in data["summaries"]] == ["a", "b", "a", "b"]
    assert len(data["records"]) == 8
    assert data["config"]["concurrency"] == [1, 2]
    html = out_html.read_text()
    assert html.count("<svg") >= 6
    out = capsys.readouterr().out
    assert "concurrency 1" in out and "concurrency 2" in out


def test_cli_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    bench_cli.register(parser.add_subparsers())
    args = parser.parse_args(["bench", "--target", "nourl"])
    assert args.func(args) == 2
    assert "NAME=URL" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--target", "a=http://h", "--concurrency", "0"])


async def test_prompts_are_tagged_alike_for_every_target(serve: Serve, log: Log) -> None:
    a, b = await serve("a"), await serve("b")
    await run_bench(config(a, b, requests=2, concurrency=(1, 2), warmup=0))
    texts = [body["messages"][0]["content"] for body in log.bodies]
    # c=1: a0, b0, a1, b1; c=2: a0 a1, b0 b1 (the batch's order may vary).
    assert texts[0] == texts[1] and texts[2] == texts[3]
    assert sorted(texts[4:6]) == sorted(texts[6:8])
    assert len(set(texts)) == 4  # no prompt repeated across levels or indices
    assert all(text.startswith("[") and text.endswith(("zero", "one")) for text in texts)


async def test_verbatim_prompts(serve: Serve, log: Log) -> None:
    a = await serve("a")
    await run_bench(config(a, requests=2, warmup=0, unique_prompts=False))
    assert [body["messages"][0]["content"] for body in log.bodies] == ["zero", "one"]
