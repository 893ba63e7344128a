"""Floods, shutdown and hostile clients against the real engine."""

from __future__ import annotations

import asyncio
import collections
import json
import signal
import socket

import aiohttp
import psutil
import pytest

from edge_llm.config.tree import EngineConfig
from edge_llm.engine.runtime.llama_backend import default_model_path

from support import STORY, RawSseClient, RssSampler, chat_body, wait_until

pytestmark = pytest.mark.e2e

MARGIN_BYTES = 150 * 1024 * 1024  # docs/design.md §9: model + KV budget + 150 MB


async def read_sse(session: aiohttp.ClientSession, url: str, body: dict) -> str:
    """Read a whole answer: "done", "refused" (which must be a 503 with its code and
    Retry-After) or the code of the error event that ended the stream."""
    response = await admitted(session, url, body)
    if response is None:
        return "refused"
    return await outcome(response)


async def admitted(
    session: aiohttp.ClientSession, url: str, body: dict
) -> aiohttp.ClientResponse | None:
    """Send a streamed request and read its head: the response when it was admitted
    (running or queued), None when it was refused with a 503, its code and Retry-After."""
    response = await session.post(url, json=body)
    if response.status == 503:
        async with response:
            assert response.headers["Retry-After"]
            code = (await response.json())["error"]["code"]
        assert code in ("queue_full", "kv_budget_exceeded")
        return None
    assert response.status == 200, await response.text()
    return response


async def outcome(response: aiohttp.ClientResponse) -> str:
    """The outcome of an admitted stream: "done" when it ends with [DONE], else the
    code of its error event."""
    async with response:
        text = await response.text()
    if text.endswith("data: [DONE]\n\n"):
        return "done"
    last = text.rstrip().rsplit("\n\n", 1)[-1]
    return str(json.loads(last.removeprefix("data: "))["error"]["code"])


async def stalled_ws(session: aiohttp.ClientSession, url: str) -> aiohttp.ClientWebSocketResponse:
    ws = await session.ws_connect(url)
    await ws.send_json({"type": "start", "request": chat_body(STORY, max_tokens=400)})
    return ws  # never read again


@pytest.mark.timeout(600)  # 5 s alone; minutes beside two busy loops (flake-check)
async def test_flood_of_200_connections_leaves_the_engine_serving(engine_factory) -> None:
    """With the default configuration but for the TTFT time-out: 100 normal readers
    at once, then, while they are served, 100 connections that start a stream and
    never read it (SSE and WebSocket). The engine is idle when the readers come and
    admits at once while a slot or a place in the queue is free, so at least
    max_sequences + max_queue of them are admitted; the rest get a 503 with
    Retry-After, never a hang or a 5xx. Every admitted reader completes: with no TTFT
    time-out (ttft_timeout_ms 0: on a loaded machine a queued reader may wait longer
    than the default 10 s, and what is served must follow from admission alone, not
    from the machine's speed) an admitted request is served, and the admitted readers
    are ahead of every silent stream in the queue (first come, first served in one
    class). The engine's RSS, sampled every 50 ms from before the flood until the KV
    is idle again, stays under model + KV budget + 150 MB, and once the silent ones
    go, the engine has freed all KV and serves."""
    engine = engine_factory("--ttft-timeout-ms", "0")
    snapshot = engine.debug_streams()
    defaults = EngineConfig()  # what the engine runs with: no other flag, no file
    slots, max_queue = defaults.scheduler.max_sequences, defaults.scheduler.max_queue
    n_readers = 100
    chat_url = engine.base_url + "/chat/completions"
    ws_url = engine.base_url.replace("http", "ws") + "/stream"
    silent: list[RawSseClient] = []
    sockets: list[aiohttp.ClientWebSocketResponse] = []
    with RssSampler(engine.proc.pid) as rss:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            try:
                heads = await asyncio.gather(
                    *(
                        admitted(session, chat_url, chat_body(f"Hi {i}", max_tokens=8))
                        for i in range(n_readers)
                    )
                )
                for _ in range(50):  # every reader was admitted or refused before these
                    silent.append(RawSseClient(engine.url, chat_body(STORY, max_tokens=400)))
                    sockets.append(await stalled_ws(session, ws_url))
                outcomes = await asyncio.gather(*(outcome(h) for h in heads if h is not None))
            finally:
                for head in heads:
                    if head is not None:
                        head.release()
                for client in silent:
                    client.close()
                for ws in sockets:
                    await ws.close()
        await wait_until(
            lambda: engine.debug_streams()["kv_used_bytes"] == 0, what="KV idle after the flood"
        )
    n_refused = heads.count(None)
    assert n_readers - n_refused >= min(n_readers, slots + max_queue), f"{n_refused} refused"
    assert outcomes == ["done"] * len(outcomes), collections.Counter(outcomes)
    assert len(rss.samples) >= 10  # sampled during the flood, not only after it
    model_bytes = default_model_path().stat().st_size
    limit = model_bytes + snapshot["memory_ledger"]["cap_bytes"] + MARGIN_BYTES  # every KV tier
    assert rss.peak < limit, f"RSS {rss.peak / 1e6:.0f} MB over {limit / 1e6:.0f} MB"
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
