"""Token backpressure with the real model, in the default configuration (speculation
on): PAUSE/RESUME over WebSocket lets through at most one token, and a slow SSE reader
that really fills its socket is paused alone."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from conftest import EngineProcess
from helpers import delta_text, metric, next_frame
from support import COPY, STORY, RawSseClient, chat_body, complete, pause_stream, wait_until

pytestmark = pytest.mark.e2e


def busy(engine: EngineProcess) -> Any:
    """Another request run to its end while a stream is paused: the engine steps on."""
    return lambda: complete(engine.url, chat_body(STORY, max_tokens=40))


@contextlib.contextmanager
def busy_loops(n: int = 2) -> Iterator[None]:
    """Processes that take CPU from the engine and the test: the load of a shared
    2-core CI machine, under which the writer runs behind the engine."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


async def test_ws_pause_stops_generation_within_one_token(engine_server) -> None:
    """A copy task, so that the step in flight at PAUSE may carry a draft run."""
    metrics_before = engine_server.metrics_text()
    url = engine_server.base_url.replace("http", "ws") + "/stream"
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        await ws.send_json({"type": "start", "request": chat_body(COPY, max_tokens=120)})
        stream_id = (await next_frame(ws, "started"))["id"]
        for _ in range(8):  # into the copied passage, where drafts are accepted
            await next_frame(ws, "delta")
        pause = await pause_stream(engine_server, ws, stream_id, busy(engine_server))
        seen: list[dict[str, Any]] = []
        done = await next_frame(ws, "done", seen=seen)
    pause.assert_within_one_token()
    assert done["stats"]["pauses"] == 1
    assert done["stats"]["paused_ms"] > 0
    metrics = engine_server.metrics_text()
    assert metric(metrics, "edge_llm_backpressure_pauses_total", cause="client") == (
        metric(metrics_before, "edge_llm_backpressure_pauses_total", cause="client") + 1
    )
    paused_s = "edge_llm_stream_paused_seconds_total"
    assert metric(metrics, paused_s, cause="client") > metric(
        metrics_before, paused_s, cause="client"
    )
    assert metric(metrics, "edge_llm_backpressure_peak") >= 1
    end = await wait_until(
        lambda: engine_server.events_of("end", stream_id), what="the stream's end event"
    )
    assert end[0]["backpressure_peak"] == 1
    assert end[0]["pauses"] == 1


async def test_paused_and_resumed_text_equals_uninterrupted(engine_factory) -> None:
    """With ``deterministic`` (docs/architecture.md: the exactness table), also while
    other requests run beside it during the pause."""
    engine = engine_factory("--deterministic", "--max-pause-ms", "600000")
    body = chat_body(STORY, max_tokens=500)  # past 512 cells: llama.cpp's split rows apply
    reference = (await complete(engine.url, body))["choices"][0]["message"]["content"]
    url = engine.base_url.replace("http", "ws") + "/stream"
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        await ws.send_json({"type": "start", "request": body})
        stream_id = (await next_frame(ws, "started"))["id"]
        first = await next_frame(ws, "delta")
        pause = await pause_stream(engine, ws, stream_id, busy(engine))
        rest: list[dict[str, Any]] = []
        await next_frame(ws, "done", seen=rest)
    pause.assert_within_one_token()
    text = first["text"] + pause.text_before + pause.text_after + delta_text(rest)
    assert text == reference


async def test_slow_sse_reader_is_paused_alone_and_gets_everything(engine_server) -> None:
    slow = RawSseClient(engine_server.url, chat_body(STORY, max_tokens=300))
    try:
        stream_id = slow.request_id()
        stalled = await wait_until(
            lambda: (s := engine_server.stream(stream_id))["state"] == "paused" and s,
            what="the unread stream to pause",
        )
        assert stalled["pause_cause"] == "socket_full"
        other = await complete(engine_server.url, chat_body(STORY, max_tokens=48))
        assert other["usage"]["completion_tokens"] == 48
        still = engine_server.stream(stream_id)
        assert still["state"] == "paused"
        assert still["n_generated"] == stalled["n_generated"]  # no compute while paused
        assert still["tokens_while_paused"] == 0
        await asyncio.to_thread(slow.read_until, b"data: [DONE]")
    finally:
        slow.close()
    final = engine_server.stream(stream_id)
    assert final["state"] == "done"
    assert final["pauses"] >= 1
    assert final["tokens_while_paused"] <= 1
    text = "".join(slow.contents())
    assert len(text.split()) > 100
    assert (
        final["ring_read"]
        == final["ring_write"]
        == final["n_generated"] - (final["finish_reason"] == "stop")
    )
    # Every pause of the stream, from the engine's log: at most one token between the
    # paused event and the resumed one.
    await wait_until(lambda: engine_server.events_of("end", stream_id), what="the end event")
    paused = engine_server.events_of("paused", stream_id)
    resumed = engine_server.events_of("resumed", stream_id)
    assert len(paused) == len(resumed) == final["pauses"]
    for pause, resume in zip(paused, resumed, strict=True):
        assert resume["n_generated"] - pause["n_generated"] <= 1


async def test_heartbeats_report_prefill_progress(engine_factory) -> None:
    engine = engine_factory(
        "--max-prompt-tokens", "2048", "--prefill-chunk-tokens", "32",
        "--heartbeat-interval-ms", "50", "--ttft-timeout-ms", "0",
    )  # fmt: skip
    body = chat_body("Tell me about the sea. " * 150, max_tokens=2)
    url = engine.base_url.replace("http", "ws") + "/stream"
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        await ws.send_json({"type": "start", "request": body})
        heartbeat = await next_frame(ws, "heartbeat")
        await next_frame(ws, "done")
    assert heartbeat["state"] in ("queued", "prefill")
    assert heartbeat["prefill_total"] > 900
    assert heartbeat["prefill_done"] < heartbeat["prefill_total"]


async def test_pause_bound_holds_on_the_client_with_the_writer_batching(engine_factory) -> None:
    """SPEC section 25: after the ``paused`` frame the client receives at most the token
    of the step in flight, however the writer batches (chunks of 4 tokens held up to
    300 ms) and beside two busy loops. Tokens generated before the pause and not sent
    yet go out before the frame (they used to follow it: 2 tokens after ``paused``)."""
    engine = engine_factory(
        "--chunk-size-tokens", "4", "--flush-interval-ms", "300", "--max-pause-ms", "600000"
    )
    body = {**chat_body(STORY, max_tokens=400), "ignore_eos": True}
    url = engine.base_url.replace("http", "ws") + "/stream"
    with busy_loops(2):
        async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
            await ws.send_json({"type": "start", "request": body})
            stream_id = (await next_frame(ws, "started"))["id"]
            pauses = []
            steps = lambda: complete(engine.url, chat_body(STORY, max_tokens=8))  # noqa: E731
            for _ in range(3):
                await next_frame(ws, "delta")  # decoding (again)
                pauses.append(await pause_stream(engine, ws, stream_id, steps))
            await ws.send_json({"type": "cancel"})
            await next_frame(ws, "error")
    for pause in pauses:
        pause.assert_within_one_token()


def progress_and_tokens(received: bytes) -> list[str | None]:
    """An SSE body in order: each progress chunk's state, and None for each token's
    chunk (one token a chunk: chunk_size_tokens 1)."""
    order: list[str | None] = []
    for line in received.split(b"\n"):
        if line.startswith(b"data: {"):
            chunk = json.loads(line[6:])
            if "progress" in chunk:
                order.append(chunk["progress"]["state"])
            elif any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                order.append(None)
    return order


async def test_pause_bound_holds_for_a_slow_sse_reader(engine_server) -> None:
    """A reader whose socket fills (socket_full), with progress events: after one that
    says ``paused``, at most one token's chunk comes before the next progress event."""
    body = {**chat_body(STORY, max_tokens=200), "return_progress": True}
    slow = RawSseClient(engine_server.url, body)
    try:
        stream_id = slow.request_id()
        await wait_until(
            lambda: engine_server.stream(stream_id)["pauses"] > 0, what="a socket-full pause"
        )
        while b"data: [DONE]" not in slow.received:  # a slow reader: 256 bytes at a time
            await asyncio.to_thread(slow.read_some, 256)
            await asyncio.sleep(0.01)
    finally:
        slow.close()
    order = progress_and_tokens(slow.received)
    assert order.count(None) > 100
    for i, state in enumerate(order):
        if state == "paused":
            following = order[i + 1 :]
            end = next((j for j, s in enumerate(following) if s is not None), len(following))
            assert end <= 1, f"{end} tokens after a paused progress event"
