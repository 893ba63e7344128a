"""The streaming client over the WebSocket protocol, against small in-test servers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import WSMsgType, web

from edge_llm.client import (
    ClientConfig,
    DeadConnectionError,
    Heartbeat,
    HTTPStatusError,
    ServerStreamError,
    StreamClient,
    TtftTimeoutError,
)

from helpers import Recorder

MESSAGES = [{"role": "user", "content": "hi"}]
WsHandler = Callable[[web.WebSocketResponse, "Frames"], Awaitable[None]]
Serve = Callable[[WsHandler], Awaitable[str]]


class Frames:
    """Client frames the server received, with an event per frame type."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.connections = 0
        self._events: dict[str, asyncio.Event] = {}

    def event(self, kind: str) -> asyncio.Event:
        return self._events.setdefault(kind, asyncio.Event())

    def add(self, frame: dict[str, Any]) -> None:
        self.received.append(frame)
        self.event(str(frame.get("type"))).set()

    def types(self) -> list[str]:
        return [str(frame.get("type")) for frame in self.received]

    async def reader(self, ws: web.WebSocketResponse) -> None:
        """Record every client frame until the socket closes."""
        async for message in ws:
            if message.type is WSMsgType.TEXT:
                self.add(json.loads(message.data))
        self.event("closed").set()


@pytest.fixture
async def serve() -> AsyncIterator[tuple[Serve, Frames]]:
    """Start a WebSocket app at /v1/stream running a handler; yields (start, frames)."""
    frames = Frames()
    runners: list[web.AppRunner] = []
    tasks: list[asyncio.Task[None]] = []

    async def start(handler: WsHandler) -> str:
        async def endpoint(request: web.Request) -> web.WebSocketResponse:
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            frames.connections += 1
            reader = asyncio.create_task(frames.reader(ws))
            tasks.append(reader)
            await frames.event("start").wait()
            frames.event("start").clear()
            try:
                await handler(ws, frames)
                await ws.close()
            except ConnectionError:
                pass
            await reader
            return ws

        app = web.Application()
        app.router.add_get("/v1/stream", endpoint)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}/v1"

    yield start, frames
    for task in tasks:
        task.cancel()
    for runner in runners:
        await runner.cleanup()


def config(base_url: str, **fields: Any) -> ClientConfig:
    fields.setdefault("ttft_warn_ms", 0)
    return ClientConfig(base_url=base_url, api_key="sk-test", model_id="m", **fields)


def delta(i: int, text: str) -> dict[str, Any]:
    return {"type": "delta", "id": "ws-1", "seq": i, "text": text, "n_tokens": 1}


DONE = {
    "type": "done",
    "id": "ws-1",
    "finish_reason": "stop",
    "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4},
    "stats": {"ttft_ms": 5.0, "pauses": 0, "paused_ms": 0.0},
}


async def test_ws_stream_with_prefill_progress(serve: tuple[Serve, Frames]) -> None:
    start, frames = serve

    async def handler(ws: web.WebSocketResponse, _: Frames) -> None:
        await ws.send_json({"type": "started", "id": "ws-1"})
        await ws.send_json(
            {"type": "heartbeat", "state": "prefill", "prefill_done": 5, "prefill_total": 10}
        )
        await ws.send_json(delta(0, "Hi"))
        await ws.send_json(delta(1, " there"))
        await ws.send_json(DONE)

    url = await start(handler)
    events = Recorder()
    beats: list[Heartbeat] = []
    async with (
        StreamClient(config(url), event_log=events) as client,
        client.stream(MESSAGES, transport="ws", on_heartbeat=beats.append) as stream,
    ):
        texts = [t async for t in stream]
    result = stream.result
    assert texts == ["Hi", " there"]
    assert (result.request_id, result.finish_reason, result.n_tokens) == ("ws-1", "stop", 2)
    assert result.server_stats == DONE["stats"]
    assert result.transport == "ws"
    assert beats == [Heartbeat(state="prefill", prefill_done=5, prefill_total=10)]
    start_frame = frames.received[0]
    assert start_frame["type"] == "start"
    assert start_frame["request"]["messages"] == MESSAGES
    assert start_frame["request"]["stream"] is True
    assert events.of("request_sent")[0]["transport"] == "ws"
    assert events.of("first_token")[0]["request_id"] == "ws-1"


async def test_slow_renderer_sends_pause_then_resume(serve: tuple[Serve, Frames]) -> None:
    start, frames = serve
    sent: list[int] = []

    async def handler(ws: web.WebSocketResponse, frames: Frames) -> None:
        await ws.send_json({"type": "started", "id": "ws-1"})
        paused = frames.event("pause")
        for i in range(100):  # a fast engine; stops when PAUSE arrives
            if paused.is_set():
                break
            await ws.send_json(delta(i, f"<{i}>"))
            sent.append(i)
            await asyncio.sleep(0)
        await ws.send_json({"type": "paused", "cause": "client"})
        await frames.event("resume").wait()
        await ws.send_json({"type": "resumed"})
        for i in range(len(sent), len(sent) + 5):
            await ws.send_json(delta(i, f"<{i}>"))
        await ws.send_json(DONE)

    url = await start(handler)
    events = Recorder()
    cfg = config(url, render_queue_capacity=8)  # high mark 7, low mark 2
    async with (
        StreamClient(cfg, event_log=events) as client,
        client.stream(MESSAGES, transport="ws") as stream,
    ):
        # The renderer does nothing until the engine has been told to pause.
        await asyncio.wait_for(frames.event("pause").wait(), 30)
        texts = [t async for t in stream]
    n_total = len(sent) + 5
    assert texts == [f"<{i}>" for i in range(n_total)]
    assert frames.types()[:3] == ["start", "pause", "resume"]
    assert len(sent) >= cfg.high_mark
    assert events.names().index("watermark_high") < events.names().index("pause_sent")
    assert events.names().index("watermark_low") < events.names().index("resume_sent")
    high = events.of("watermark_high")[0]
    assert (high["queue_len"], high["queue_capacity"], high["pause_enabled"]) == (7, 8, True)
    assert stream.result.pauses == 1
    assert stream.result.server_pauses == ("client",)


async def test_no_pause_flag_never_sends_pause(serve: tuple[Serve, Frames]) -> None:
    start, frames = serve

    async def handler(ws: web.WebSocketResponse, _: Frames) -> None:
        await ws.send_json({"type": "started", "id": "ws-1"})
        for i in range(20):
            await ws.send_json(delta(i, str(i)))
        await ws.send_json(DONE)

    url = await start(handler)
    events = Recorder()
    async with (
        StreamClient(
            config(url, render_queue_capacity=8), event_log=events, send_pause=False
        ) as client,
        client.stream(MESSAGES, transport="ws") as stream,
    ):
        await events.wait_for("watermark_high")  # the renderer is slow to start
        texts = [t async for t in stream]
    assert texts == [str(i) for i in range(20)]
    assert frames.types() == ["start"]
    assert events.of("watermark_high")[0]["pause_enabled"] is False
    assert "pause_sent" not in events.names()
    assert "watermark_low" in events.names()
    assert "resume_sent" not in events.names()


async def test_ttft_timeout_sends_cancel_and_retries(serve: tuple[Serve, Frames]) -> None:
    start, frames = serve
    both_cancelled = asyncio.Event()

    async def slow_prefill(ws: web.WebSocketResponse, frames: Frames) -> None:
        await ws.send_json({"type": "started", "id": f"ws-{frames.connections}"})
        cancels_before = frames.types().count("cancel")
        # Heartbeats every 20 ms until this connection's CANCEL arrives.
        while frames.types().count("cancel") == cancels_before:
            await ws.send_json(
                {"type": "heartbeat", "state": "prefill", "prefill_done": 1, "prefill_total": 1000}
            )
            await asyncio.sleep(0.02)
        if frames.types().count("cancel") == 2:
            both_cancelled.set()

    url = await start(slow_prefill)
    events = Recorder()
    cfg = config(
        url,
        ttft_hard_timeout_ms=300,
        retry={"max_attempts": 2, "backoff_ms": 10, "retry_on": ["ttft_timeout"]},
    )
    async with StreamClient(cfg, event_log=events) as client:
        with pytest.raises(TtftTimeoutError):
            await client.complete(MESSAGES, transport="ws")
    await asyncio.wait_for(both_cancelled.wait(), 30)  # the engine got each CANCEL
    assert frames.connections == 2
    assert frames.types() == ["start", "cancel", "start", "cancel"]
    cancels = events.of("cancel_sent")
    assert [(c["reason"], c["method"]) for c in cancels] == [("ttft_timeout", "frame")] * 2
    assert [c["request_id"] for c in cancels] == ["ws-1", "ws-2"]
    assert events.of("retry")[0]["cause"] == "ttft_timeout"


async def test_error_frame_raises_server_stream_error(serve: tuple[Serve, Frames]) -> None:
    start, _ = serve

    async def handler(ws: web.WebSocketResponse, _: Frames) -> None:
        await ws.send_json({"type": "started", "id": "ws-1"})
        await ws.send_json({"type": "error", "code": "kv_budget_exceeded", "message": "full"})

    url = await start(handler)
    async with StreamClient(config(url)) as client:
        with pytest.raises(ServerStreamError) as info:
            await client.complete(MESSAGES, transport="ws")
    assert info.value.server_code == "kv_budget_exceeded"
    assert "full" in str(info.value)


async def test_silent_ws_is_a_dead_connection(serve: tuple[Serve, Frames]) -> None:
    start, _ = serve

    async def hangs(ws: web.WebSocketResponse, frames: Frames) -> None:
        await ws.send_json({"type": "started", "id": "ws-1"})
        await frames.event("closed").wait()

    url = await start(hangs)
    cfg = config(url, ttft_hard_timeout_ms=0, heartbeat_interval_ms=50)
    async with StreamClient(cfg) as client:
        with pytest.raises(DeadConnectionError):
            await client.complete(MESSAGES, transport="ws")


async def test_server_without_ws_endpoint_is_http_404(serve: tuple[Serve, Frames]) -> None:
    start, _ = serve

    async def unused(ws: web.WebSocketResponse, _: Frames) -> None:
        raise AssertionError("not reached")

    url = await start(unused)
    async with StreamClient(config(url.replace("/v1", "/nope"))) as client:
        with pytest.raises(HTTPStatusError, match="no WebSocket") as info:
            await client.complete(MESSAGES, transport="ws")
    assert info.value.status == 404
