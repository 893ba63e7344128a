"""Token backpressure with the real model: PAUSE/RESUME over WebSocket and a
slow SSE reader that really fills its socket."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from support import STORY, RawSseClient, chat_body, wait_until

pytestmark = pytest.mark.e2e


async def next_frame(ws: aiohttp.ClientWebSocketResponse, kind: str) -> dict[str, Any]:
    while True:
        frame = await asyncio.wait_for(ws.receive_json(), 120)
        if frame["type"] == kind:
            return frame
        assert frame["type"] != "error", frame


async def collect_text(ws: aiohttp.ClientWebSocketResponse) -> tuple[str, dict[str, Any]]:
    parts = []
    while True:
        frame = await asyncio.wait_for(ws.receive_json(), 120)
        if frame["type"] == "delta":
            parts.append(frame["text"])
        elif frame["type"] == "done":
            return "".join(parts), frame
        assert frame["type"] != "error", frame


def metric(text: str, name: str) -> float:
    line = next(x for x in text.splitlines() if x.startswith("edge_llm_" + name + " "))
    return float(line.split()[-1])


async def test_ws_pause_stops_generation_within_one_token(engine_server) -> None:
    metrics_before = engine_server.metrics_text()
    url = engine_server.base_url.replace("http", "ws") + "/stream"
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        await ws.send_json({"type": "start", "request": chat_body(STORY, max_tokens=120)})
        stream_id = (await next_frame(ws, "started"))["id"]
        await next_frame(ws, "delta")
        await ws.send_json({"type": "pause"})
        assert (await next_frame(ws, "paused"))["cause"] == "client"
        # Keep the engine busy with another stream while this one is paused.
        async with session.post(
            engine_server.base_url + "/chat/completions", json=chat_body(STORY, max_tokens=40)
        ) as other:
            assert other.status == 200
            await other.read()
        stream = engine_server.stream(stream_id)
        assert stream["state"] == "paused"
        assert stream["pause_cause"] == "client"
        received = await wait_until(
            lambda: [
                e
                for e in engine_server.events()
                if e["event"] == "pause_received" and e["request_id"] == stream_id
            ],
            what="pause_received in the engine log",
        )
        assert stream["n_generated"] <= received[0]["n_generated"] + 1
        assert stream["tokens_while_paused"] <= 1
        await ws.send_json({"type": "resume"})
        await next_frame(ws, "resumed")
        _, done = await collect_text(ws)
    assert done["stats"]["pauses"] == 1
    assert done["stats"]["paused_ms"] > 0
    assert done["usage"]["completion_tokens"] > stream["n_generated"]
    metrics = engine_server.metrics_text()
    pauses = 'backpressure_pauses_total{cause="client"}'
    paused_s = 'stream_paused_seconds_total{cause="client"}'
    assert metric(metrics, pauses) == metric(metrics_before, pauses) + 1
    assert metric(metrics, paused_s) > metric(metrics_before, paused_s)
    assert metric(metrics, "backpressure_peak") >= 1
    end = await wait_until(
        lambda: [
            e
            for e in engine_server.events()
            if e["event"] == "end" and e["request_id"] == stream_id
        ],
        what="the end event with the stream's counters",
    )
    assert end[0]["backpressure_peak"] == 1
    assert end[0]["pauses"] == 1


async def test_paused_and_resumed_text_equals_uninterrupted(engine_server) -> None:
    body = chat_body(STORY, max_tokens=500)  # past 512 cells: llama.cpp's split rows apply
    async with aiohttp.ClientSession() as session:
        async with session.post(
            engine_server.base_url + "/chat/completions", json={**body, "stream": False}
        ) as response:
            reference = (await response.json())["choices"][0]["message"]["content"]
        url = engine_server.base_url.replace("http", "ws") + "/stream"
        async with session.ws_connect(url) as ws:
            await ws.send_json({"type": "start", "request": body})
            first = await next_frame(ws, "delta")
            await ws.send_json({"type": "pause"})
            before_pause = [first["text"]]
            while True:  # the in-flight token may still arrive before "paused"
                frame = await asyncio.wait_for(ws.receive_json(), 120)
                if frame["type"] == "paused":
                    break
                if frame["type"] == "delta":
                    before_pause.append(frame["text"])
            await ws.send_json({"type": "resume"})
            rest, _ = await collect_text(ws)
    assert "".join(before_pause) + rest == reference


async def test_slow_sse_reader_is_paused_alone_and_gets_everything(engine_server) -> None:
    slow = RawSseClient(engine_server.url, chat_body(STORY, max_tokens=300))
    try:
        stream_id = slow.request_id()
        stalled = await wait_until(
            lambda: (s := engine_server.stream(stream_id))["state"] == "paused" and s,
            what="the unread stream to pause",
        )
        assert stalled["pause_cause"] == "socket_full"
        async with aiohttp.ClientSession() as session:
            async with session.post(
                engine_server.base_url + "/chat/completions",
                json=chat_body(STORY, max_tokens=48, stream=False),
            ) as other:
                assert (await other.json())["usage"]["completion_tokens"] == 48
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
    text = "".join(slow.contents())
    assert len(text.split()) > 100
    assert (
        final["ring_read"]
        == final["ring_write"]
        == final["n_generated"] - (final["finish_reason"] == "stop")
    )


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
        await collect_text(ws)
    assert heartbeat["state"] in ("queued", "prefill")
    assert heartbeat["prefill_total"] > 900
    assert heartbeat["prefill_done"] < heartbeat["prefill_total"]
