"""``edge-llm chat`` against in-test servers running on their own thread and loop."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import WSMsgType, web

from edge_llm.cli import chat
from edge_llm.observability.events import read_events

Start = Callable[[web.Application], str]


@pytest.fixture
def serve_in_thread() -> Iterator[Start]:
    """Run aiohttp apps on a background loop; yields start(app) -> base URL."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runners: list[web.AppRunner] = []

    def start(app: web.Application) -> str:
        async def setup() -> str:
            runner = web.AppRunner(app, shutdown_timeout=0.1)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            runners.append(runner)
            return f"http://127.0.0.1:{runner.addresses[0][1]}/v1"

        return asyncio.run_coroutine_threadsafe(setup(), loop).result(timeout=30)

    yield start

    async def cleanup() -> None:
        for runner in runners:
            await runner.cleanup()

    asyncio.run_coroutine_threadsafe(cleanup(), loop).result(timeout=30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=30)
    loop.close()


def run_chat(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    chat.register(parser.add_subparsers())
    args = parser.parse_args(["chat", *argv])
    code: int = args.func(args)
    return code


def sse_chunk(content: str, finish: str | None = None) -> bytes:
    obj = {"id": "r-1", "choices": [{"delta": {"content": content}, "finish_reason": finish}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def sse_app(answer: Callable[[dict[str, Any]], list[str]], bodies: list[dict[str, Any]]) -> Any:
    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        bodies.append(body)
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "X-Request-Id": "r-1"}
        )
        await response.prepare(request)
        await response.write(b": ping\n\n")
        for piece in answer(body):
            await response.write(sse_chunk(piece))
        await response.write(sse_chunk("", "stop") + b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    return app


def write_config(tmp_path: Path, base_url: str, **extra: Any) -> str:
    section = {"base_url": base_url, "api_key": "sk-t", "model_id": "m", "ttft_warn_ms": 0}
    path = tmp_path / "client.json"
    path.write_text(json.dumps({"edge_llm_client": {**section, **extra}}))
    return str(path)


def test_one_shot_streams_to_stdout_and_logs_events(
    serve_in_thread: Start, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bodies: list[dict[str, Any]] = []
    url = serve_in_thread(sse_app(lambda _: ["Hello", ", ", "world"], bodies))
    log = tmp_path / "client.jsonl"
    code = run_chat("--config", write_config(tmp_path, url), "--event-log", str(log), "hi")
    out = capsys.readouterr().out
    assert code == 0
    assert out == "Hello, world\n"
    assert bodies[0]["messages"] == [{"role": "user", "content": "hi"}]
    events = read_events(log)
    names = [e["event"] for e in events]
    assert names[:4] == ["request_sent", "first_byte", "first_token", "end"]
    assert all(e["source"] == "client" for e in events)
    assert events[3]["request_id"] == "r-1"


def test_flags_override_the_config(
    serve_in_thread: Start, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bodies: list[dict[str, Any]] = []
    url = serve_in_thread(sse_app(lambda _: ["ok"], bodies))
    config = write_config(tmp_path, "http://127.0.0.1:1/v1")
    code = run_chat("--config", config, "--base-url", url + "/", "--model", "other", "x")
    assert code == 0
    assert bodies[0]["model"] == "other"
    assert capsys.readouterr().out == "ok\n"


def test_priority_is_sent_and_progress_asked_only_for_a_terminal(
    serve_in_thread: Start, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bodies: list[dict[str, Any]] = []
    url = serve_in_thread(sse_app(lambda _: ["ok"], bodies))
    assert run_chat("--config", write_config(tmp_path, url), "--priority", "4", "x") == 0
    assert bodies[0]["priority"] == 4
    assert "return_progress" not in bodies[0]  # stderr is no terminal: no spinner to feed
    assert capsys.readouterr().out == "ok\n"


def test_failure_exits_1_with_one_line_cause(
    serve_in_thread: Start, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def unauthorized(request: web.Request) -> web.Response:
        body = {
            "error": {
                "message": "bad key",
                "type": "authentication_error",
                "code": "invalid_api_key",
                "param": None,
            }
        }
        return web.json_response(body, status=401)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", unauthorized)
    url = serve_in_thread(app)
    code = run_chat("--config", write_config(tmp_path, url), "hi")
    err = capsys.readouterr().err
    assert code == 1
    lines = [line for line in err.splitlines() if line.startswith("edge-llm chat:")]
    assert len(lines) == 1
    assert "http_status" in lines[0]
    assert "bad key" in lines[0]


def test_bad_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "client.json"
    path.write_text(json.dumps({"edge_llm_client": {"base_url": "http://h/v1"}}))
    assert run_chat("--config", str(path), "hi") == 2
    assert "model_id" in capsys.readouterr().err


def test_interactive_keeps_the_conversation(
    serve_in_thread: Start,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    bodies: list[dict[str, Any]] = []
    url = serve_in_thread(sse_app(lambda body: [f"turn{len(body['messages'])}"], bodies))
    monkeypatch.setattr("sys.stdin", io.StringIO("first\n\nsecond\n"))
    code = run_chat("--config", write_config(tmp_path, url), "--system", "be brief")
    assert code == 0
    assert capsys.readouterr().out == "turn2\nturn4\n"
    assert bodies[1]["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "turn2"},
        {"role": "user", "content": "second"},
    ]


def test_conversation_drops_oldest_turns_over_budget() -> None:
    conversation = chat.Conversation(budget_tokens=30, system="s")
    for i in range(10):
        conversation.add("user", f"{i}" * 40)  # ~14 tokens each
    messages = conversation.messages()
    assert messages[0] == {"role": "system", "content": "s"}
    assert [m["content"][0] for m in messages[1:]] == ["9"]
    conversation.add("user", "x" * 1000)  # alone over budget: still sent
    assert conversation.messages()[-1]["content"] == "x" * 1000


def ws_app(
    handler: Callable[
        [web.WebSocketResponse, list[str], dict[str, asyncio.Event]], Awaitable[None]
    ],
    frames: list[str],
) -> web.Application:
    async def endpoint(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        seen: dict[str, asyncio.Event] = {k: asyncio.Event() for k in ("start", "pause", "resume")}

        async def read() -> None:
            async for message in ws:
                if message.type is WSMsgType.TEXT:
                    kind = json.loads(message.data)["type"]
                    frames.append(kind)
                    if kind in seen:
                        seen[kind].set()

        reader = asyncio.create_task(read())
        await seen["start"].wait()
        await handler(ws, frames, seen)
        await ws.close()
        await reader
        return ws

    app = web.Application()
    app.router.add_get("/v1/stream", endpoint)
    return app


def delta(i: int) -> dict[str, Any]:
    return {"type": "delta", "id": "w-1", "seq": i, "text": f"<{i}>", "n_tokens": 1}


DONE = {"type": "done", "id": "w-1", "finish_reason": "stop", "usage": None, "stats": {}}


def test_ws_slow_renderer_sends_pause_and_resume(
    serve_in_thread: Start, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    frames: list[str] = []
    sent: list[int] = []

    async def engine(
        ws: web.WebSocketResponse, _: list[str], seen: dict[str, asyncio.Event]
    ) -> None:
        await ws.send_json({"type": "started", "id": "w-1"})
        for i in range(200):
            if seen["pause"].is_set():
                break
            await ws.send_json(delta(i))
            sent.append(i)
            await asyncio.sleep(0.001)
        await seen["resume"].wait()
        await ws.send_json(DONE)

    url = serve_in_thread(ws_app(engine, frames))
    log = tmp_path / "c.jsonl"
    config = write_config(tmp_path, url, render_queue_capacity=8)
    code = run_chat(
        "--config", config, "--ws", "--render-delay-ms", "10", "--event-log", str(log), "hi"
    )
    assert code == 0
    assert capsys.readouterr().out == "".join(f"<{i}>" for i in sent) + "\n"
    assert frames[:3] == ["start", "pause", "resume"]
    names = [e["event"] for e in read_events(log)]
    for name in ("watermark_high", "pause_sent", "watermark_low", "resume_sent"):
        assert name in names
    assert len(sent) < 200


def test_ws_no_pause_logs_high_watermark_without_pause(
    serve_in_thread: Start, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    frames: list[str] = []

    async def engine(ws: web.WebSocketResponse, _: list[str], __: dict[str, asyncio.Event]) -> None:
        await ws.send_json({"type": "started", "id": "w-1"})
        for i in range(30):
            await ws.send_json(delta(i))
        await ws.send_json(DONE)

    url = serve_in_thread(ws_app(engine, frames))
    log = tmp_path / "c.jsonl"
    config = write_config(tmp_path, url, render_queue_capacity=8)
    code = run_chat(
        "--config",
        config,
        "--ws",
        "--render-delay-ms",
        "10",
        "--no-pause",
        "--event-log",
        str(log),
        "hi",
    )
    assert code == 0
    assert capsys.readouterr().out.count("<") == 30
    assert frames == ["start"]
    events = read_events(log)
    high = [e for e in events if e["event"] == "watermark_high"]
    assert high and high[0]["pause_enabled"] is False
    assert not [e for e in events if e["event"] == "pause_sent"]
