"""Floods, shutdown and hostile clients against the real engine."""

from __future__ import annotations

import asyncio
import json
import signal
import socket

import aiohttp
import psutil
import pytest

from edge_llm.engine.llama_backend import default_model_path

from support import RawSseClient, chat_body, wait_until

pytestmark = pytest.mark.e2e

STORY = "Write a very long story about a dragon and a knight."
MARGIN_BYTES = 150 * 1024 * 1024  # docs/design.md §9: model + KV budget + 150 MB


async def read_sse(session: aiohttp.ClientSession, url: str, body: dict) -> str:
    """Read a whole answer: "done", "refused" (which must be a 503 with its code and
    Retry-After) or "ttft_timeout" (waited in the queue past its TTFT time-out: the
    documented error event, never silence, never a 5xx)."""
    async with session.post(url, json=body) as response:
        if response.status == 503:
            assert response.headers["Retry-After"]
            code = (await response.json())["error"]["code"]
            assert code in ("queue_full", "kv_budget_exceeded")
            return "refused"
        assert response.status == 200
        text = await response.text()
        if text.endswith("data: [DONE]\n\n"):
            return "done"
        last = text.rstrip().rsplit("\n\n", 1)[-1]
        return json.loads(last.removeprefix("data: "))["error"]["code"]


async def stalled_ws(session: aiohttp.ClientSession, url: str) -> aiohttp.ClientWebSocketResponse:
    ws = await session.ws_connect(url)
    await ws.send_json({"type": "start", "request": chat_body(STORY, max_tokens=400)})
    return ws  # never read again


async def test_flood_of_200_connections_leaves_the_engine_serving(engine_factory) -> None:
    """With the default configuration: 100 connections that start a stream and
    never read it (SSE and WebSocket), then 100 normal readers. Every reader gets
    a complete answer, a 503 with Retry-After or, when the silent ones ahead of it
    in the queue held the KV past its TTFT time-out, the ttft_timeout error event
    (no hang, no 5xx: which of the three depends on the machine's speed), memory stays
    under model + KV budget + 150 MB, and once the silent ones go, the engine
    has freed all KV and serves normally."""
    engine = engine_factory()
    process = psutil.Process(engine.proc.pid)
    chat_url = engine.base_url + "/chat/completions"
    ws_url = engine.base_url.replace("http", "ws") + "/stream"
    silent: list[RawSseClient] = []
    sockets: list[aiohttp.ClientWebSocketResponse] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        try:
            for _ in range(50):
                silent.append(RawSseClient(engine.url, chat_body(STORY, max_tokens=400)))
                sockets.append(await stalled_ws(session, ws_url))
            outcomes = await asyncio.gather(
                *(
                    read_sse(session, chat_url, chat_body(f"Hi {i}", max_tokens=8))
                    for i in range(100)
                )
            )
            peak_rss = process.memory_info().rss
        finally:
            for client in silent:
                client.close()
            for ws in sockets:
                await ws.close()
    assert set(outcomes) <= {"done", "refused", "ttft_timeout"}
    await wait_until(
        lambda: engine.debug_streams()["kv_used_bytes"] == 0, what="KV idle after the flood"
    )
    peak_rss = max(peak_rss, process.memory_info().rss)
    snapshot = engine.debug_streams()
    model_bytes = default_model_path().stat().st_size
    limit = model_bytes + snapshot["kv_budget_bytes"] + MARGIN_BYTES
    assert peak_rss < limit, f"RSS {peak_rss / 1e6:.0f} MB over {limit / 1e6:.0f} MB"
    async with aiohttp.ClientSession() as session:
        assert await read_sse(session, chat_url, chat_body("Still there?", max_tokens=4)) == "done"


async def test_sigterm_drains_then_cancels_and_exits_zero(engine_factory) -> None:
    engine = engine_factory("--drain-grace-ms", "200")
    ws_url = engine.base_url.replace("http", "ws") + "/stream"
    async with aiohttp.ClientSession() as session, session.ws_connect(ws_url) as ws:
        await ws.send_json({"type": "start", "request": chat_body(STORY, max_tokens=2000)})
        while (await ws.receive_json())["type"] != "delta":
            pass
        engine.proc.send_signal(signal.SIGTERM)
        frames = []
        async for message in ws:
            if message.type is not aiohttp.WSMsgType.TEXT:
                break
            frames.append(json.loads(message.data))
            if frames[-1]["type"] in ("done", "error"):
                break
    assert frames[-1]["type"] == "error"
    assert frames[-1]["code"] == "cancelled"
    assert frames[-1]["reason"] == "shutdown"
    assert await asyncio.to_thread(engine.proc.wait, 60) == 0


async def test_slowloris_body_cannot_hold_the_server(engine_factory) -> None:
    engine = engine_factory("--body-timeout-ms", "300")
    host, port = engine.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    try:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"
        )
        sock.settimeout(30)
        reply = sock.recv(4096).decode()  # answered without the rest of the body
    finally:
        sock.close()
    assert reply.startswith("HTTP/1.1 400")
    assert "not received in time" in reply
    for silent in (b"", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"):
        await asyncio.to_thread(assert_closed_without_answer, host, int(port), silent)
    async with aiohttp.ClientSession() as session:
        chat_url = engine.base_url + "/chat/completions"
        assert await read_sse(session, chat_url, chat_body("Still there?", max_tokens=2)) == "done"


def assert_closed_without_answer(host: str, port: int, sent: bytes) -> None:
    """A client that sends nothing, or half a request head, is disconnected
    after the body timeout instead of holding a connection forever."""
    with socket.create_connection((host, port)) as sock:
        sock.sendall(sent)
        sock.settimeout(30)
        assert sock.recv(4096) == b""  # closed by the server, nothing answered


async def test_a_full_disk_under_the_event_log_costs_lines_not_service(engine_factory) -> None:
    """Mid-run the event log's file stops growing (RLIMIT_FSIZE set on the running
    engine: every write fails with EFBIG, as on a full disk). The engine keeps
    serving, counts the lost lines, and logs again once the file may grow."""
    engine = engine_factory()
    process = psutil.Process(engine.proc.pid)
    chat_url = engine.base_url + "/chat/completions"

    def ends() -> int:
        return sum(1 for event in engine.events() if event["event"] == "end")

    async with aiohttp.ClientSession() as session:
        assert await read_sse(session, chat_url, chat_body("One", max_tokens=2)) == "done"
        await wait_until(lambda: ends() == 1, what="the first request logged")
        size = engine.event_log.stat().st_size
        soft, hard = process.rlimit(psutil.RLIMIT_FSIZE)
        process.rlimit(psutil.RLIMIT_FSIZE, (size, hard))
        try:
            assert await read_sse(session, chat_url, chat_body("Two", max_tokens=2)) == "done"
            await wait_until(
                lambda: (
                    engine.metric("edge_llm_event_log_dropped_total", reason="write_failed") > 0
                ),
                what="lost lines counted",
            )
            assert engine.event_log.stat().st_size == size
        finally:
            process.rlimit(psutil.RLIMIT_FSIZE, (soft, hard))
        assert await read_sse(session, chat_url, chat_body("Three", max_tokens=2)) == "done"
        await wait_until(lambda: ends() >= 2, what="logging resumed")
    assert engine.event_log.stat().st_size > size
    assert engine.proc.poll() is None
