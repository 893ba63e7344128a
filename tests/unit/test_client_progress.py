"""The SDK's progress events and priority, and how ``edge-llm chat`` shows them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from edge_llm.cli.chat import _ordinal, _progress_text
from edge_llm.client import ClientConfig, Heartbeat, StreamClient

MESSAGES = [{"role": "user", "content": "hi"}]
Serve = Callable[[web.Application], Awaitable[str]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start an aiohttp app on 127.0.0.1; yields its base URL (with /v1)."""
    runners: list[web.AppRunner] = []

    async def start(app: web.Application) -> str:
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}/v1"

    yield start
    for runner in runners:
        await runner.cleanup()


def config(base_url: str) -> ClientConfig:
    return ClientConfig(base_url=base_url, api_key="sk-test", model_id="m", ttft_warn_ms=0)


def data(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def progress(state: str, **fields: Any) -> bytes:
    return data({"id": "c-1", "choices": [], "progress": {"state": state, **fields}})


ANSWER = data({"id": "c-1", "choices": [{"index": 0, "delta": {"content": "ok"}}]}) + data(
    {"id": "c-1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
)


def chat_app(bodies: list[dict[str, Any]], *, refuse_progress: bool = False) -> web.Application:
    """Streams two progress chunks, then "ok"; with ``refuse_progress`` a request
    carrying ``return_progress`` gets OpenAI's 400 for an unknown field."""

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        bodies.append(body)
        if refuse_progress and "return_progress" in body:
            error = {"message": "Unrecognized request argument supplied: return_progress"}
            return web.json_response(
                {"error": {**error, "type": "invalid_request_error"}}, status=400
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        queued = progress("queued", queue_position=2, predicted_wait_ms=1500, prefill_total=40)
        await response.write(queued + progress("prefill", prefill_done=16, prefill_total=40))
        await response.write(ANSWER + b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    return app


async def test_sse_progress_chunks_are_progress_events(serve: Serve) -> None:
    bodies: list[dict[str, Any]] = []
    url = await serve(chat_app(bodies))
    beats: list[Heartbeat] = []
    async with StreamClient(config(url)) as client:
        stream = client.stream(MESSAGES, on_heartbeat=beats.append, priority=3, progress=True)
        async with stream:
            texts = [t async for t in stream]
    assert texts == ["ok"]
    assert beats == [
        Heartbeat(state="queued", prefill_total=40, queue_position=2, predicted_wait_ms=1500),
        Heartbeat(state="prefill", prefill_done=16, prefill_total=40),
    ]
    assert (bodies[0]["priority"], bodies[0]["return_progress"]) == (3, True)


async def test_a_server_refusing_the_progress_field_is_asked_again_without(serve: Serve) -> None:
    bodies: list[dict[str, Any]] = []
    url = await serve(chat_app(bodies, refuse_progress=True))
    async with StreamClient(config(url)) as client:
        result = await client.complete(MESSAGES, progress=True)
    assert result.text == "ok"
    assert ["return_progress" in body for body in bodies] == [True, False]
    assert result.attempts == 1


async def test_without_progress_or_priority_the_body_has_neither(serve: Serve) -> None:
    bodies: list[dict[str, Any]] = []
    url = await serve(chat_app(bodies))
    async with StreamClient(config(url)) as client:
        await client.complete(MESSAGES)
    assert "return_progress" not in bodies[0]
    assert "priority" not in bodies[0]


async def test_websocket_heartbeats_and_preemption_are_progress_events(serve: Serve) -> None:
    starts: list[dict[str, Any]] = []

    async def endpoint(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        starts.append(json.loads((await ws.receive()).data))
        frames = [
            {"type": "started", "id": "ws-1"},
            {"type": "heartbeat", "state": "queued", "prefill_done": 0, "prefill_total": 9,
             "queue_position": 1, "predicted_wait_ms": 300},
            {"type": "delta", "id": "ws-1", "seq": 0, "text": "o", "n_tokens": 1},
            {"type": "paused", "cause": "preempted"},
            {"type": "resumed"},
            {"type": "delta", "id": "ws-1", "seq": 1, "text": "k", "n_tokens": 1},
            {"type": "done", "id": "ws-1", "finish_reason": "stop", "usage": {}, "stats": {}},
        ]  # fmt: skip
        for frame in frames:
            await ws.send_json(frame)
        await ws.close()
        return ws

    app = web.Application()
    app.router.add_get("/v1/stream", endpoint)
    url = await serve(app)
    beats: list[Heartbeat] = []
    async with StreamClient(config(url)) as client:
        result = await client.complete(
            MESSAGES, transport="ws", on_heartbeat=beats.append, priority=-2
        )
    assert result.text == "ok"
    assert result.server_pauses == ("preempted",)
    assert beats == [
        Heartbeat("queued", 0, 9, queue_position=1, predicted_wait_ms=300),
        Heartbeat(state="preempted"),
    ]
    assert starts[0]["request"]["priority"] == -2


@pytest.mark.parametrize(
    ("beat", "text"),
    [
        (Heartbeat("queued", 0, 300, queue_position=3, predicted_wait_ms=2000), "queued 3rd, ~2 s"),
        (
            Heartbeat("queued", 0, 300, queue_position=1, predicted_wait_ms=450),
            "queued 1st, ~0.5 s",
        ),
        (Heartbeat("queued", 0, 300), "queued"),
        (
            Heartbeat("prefill", 150, 300, predicted_wait_ms=12_400),
            "prefill ██████████░░░░░░░░░░ 50% of 300 prompt tokens, ~12 s",
        ),
        (Heartbeat(state="preempted"), "preempted by a more urgent request (it resumes by itself)"),
        (
            Heartbeat("downloading", 0, 0, download_done=256 << 20, download_total=1 << 30),
            "downloading the model █████░░░░░░░░░░░░░░░ 25% of 1024 MiB",
        ),
        (Heartbeat("downloading", 0, 0, download_done=0), "downloading the model, 0 MiB"),
        (Heartbeat("loading", 0, 0), "loading the model"),
        (Heartbeat(), "waiting for the first token (server alive)"),
    ],
)
def test_the_spinner_line_says_where_the_request_stands(beat: Heartbeat, text: str) -> None:
    assert _progress_text(beat) == text


def test_ordinals() -> None:
    assert [_ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th",
    ]  # fmt: skip
