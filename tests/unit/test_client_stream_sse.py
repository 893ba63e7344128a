"""The streaming client over SSE, against small aiohttp servers that emit each case."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from edge_llm.client import (
    ClientConfig,
    ConnectError,
    DeadConnectionError,
    HTTPStatusError,
    NotStreamingError,
    ServerStreamError,
    StreamClient,
    TtftTimeoutError,
)
from edge_llm.client.connection import socket_factory

from helpers import Recorder, free_port

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Serve = Callable[[Handler], Awaitable[str]]
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start an app whose POST /v1/chat/completions is ``handler``; yields base URL."""
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}/v1"

    yield start
    for runner in runners:
        await runner.cleanup()


def config(base_url: str, **fields: Any) -> ClientConfig:
    fields.setdefault("ttft_warn_ms", 0)
    return ClientConfig(base_url=base_url, api_key="sk-test", model_id="m", **fields)


def chunk(
    content: str | None = None,
    *,
    role: str | None = None,
    finish: str | None = None,
    cid: str = "chatcmpl-1",
) -> bytes:
    delta: dict[str, Any] = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    obj = {
        "id": cid,
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


USAGE_CHUNK = (
    b'data: {"id":"chatcmpl-1","choices":[],'
    b'"usage":{"prompt_tokens":3,"completion_tokens":7,"total_tokens":10}}\n\n'
)


def sse_handler(
    parts: list[bytes],
    *,
    headers: dict[str, str] | None = None,
    content_type: str = "text/event-stream",
    seen: list[web.Request] | None = None,
) -> Handler:
    """A handler that writes ``parts`` as separate writes."""

    async def handle(request: web.Request) -> web.StreamResponse:
        if seen is not None:
            seen.append(request)
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": content_type, **(headers or {})})
        await response.prepare(request)
        for part in parts:
            await response.write(part)
        await response.write_eof()
        return response

    return handle


async def collect(client: StreamClient, **options: Any) -> tuple[list[str], Any]:
    async with client.stream(MESSAGES, **options) as stream:
        texts = [text async for text in stream]
    return texts, stream.result


async def test_streams_deltas_and_reports_result(serve: Serve) -> None:
    seen: list[web.Request] = []
    parts = [
        chunk("", role="assistant"),
        chunk("Hel"),
        chunk("lo"),
        chunk(None, finish="stop"),
        USAGE_CHUNK,
        b"data: [DONE]\n\n",
    ]
    url = await serve(sse_handler(parts, headers={"X-Request-Id": "req-42"}, seen=seen))
    events = Recorder()
    async with StreamClient(config(url), event_log=events) as client:
        texts, result = await collect(client)
    assert texts == ["Hel", "lo"]  # the role-only first chunk is not a token
    assert result.text == "Hello"
    assert result.finish_reason == "stop"
    assert result.usage["completion_tokens"] == 7
    assert (result.n_chunks, result.n_tokens) == (2, 7)
    assert result.request_id == "req-42"
    assert result.ttfr_ms is not None and result.ttft_ms is not None
    assert result.ttft_ms >= result.ttfr_ms
    assert len(result.itl_ms) == 1
    assert seen[0].headers["Authorization"] == "Bearer sk-test"
    assert events.names() == ["request_sent", "first_byte", "first_token", "end"]
    assert all(line["client_request_id"] == result.client_request_id for line in events.lines)
    assert events.of("request_sent")[0]["request_id"] is None
    assert events.of("request_sent")[0]["transport"] == "sse"
    assert events.of("end")[0]["request_id"] == "req-42"
    assert events.of("end")[0]["n_tokens"] == 7


async def test_request_body_is_openai_streaming_shape(serve: Serve) -> None:
    bodies: list[dict[str, Any]] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        bodies.append(await request.json())
        return await sse_handler([chunk("x", finish="stop"), b"data: [DONE]\n\n"])(request)

    url = await serve(handle)
    async with StreamClient(config(url, max_tokens=9, temperature=0.5)) as client:
        await client.complete(MESSAGES)
    assert bodies == [
        {
            "model": "m",
            "messages": MESSAGES,
            "stream": True,
            "stream_options": {"include_usage": True, "resumable": True},
            "max_tokens": 9,
            "temperature": 0.5,
        }
    ]


async def test_crlf_split_utf8_comments_and_no_final_blank_line(serve: Serve) -> None:
    text = "你好🙂"
    payload = json.dumps(
        {"id": "c9", "choices": [{"delta": {"content": text}}]}, ensure_ascii=False
    ).encode()
    cut = payload.index("好".encode()) + 1
    parts = [
        b": ping\r\n\r\n",
        b"data:" + payload[:cut],  # data without space, UTF-8 split across writes
        payload[cut:] + b"\r",  # a CR at the end of one write ...
        b"\n\r\n",  # ... and its LF at the start of the next
        b"data: " + json.dumps({"choices": [{"delta": {}, "finish_reason": "stop"}]}).encode(),
        b"\r\n\r\ndata: [DONE]",  # no final blank line
    ]
    url = await serve(sse_handler(parts))
    async with StreamClient(config(url)) as client:
        texts, result = await collect(client)
    assert texts == [text]
    assert result.finish_reason == "stop"
    assert result.request_id == "c9"  # no X-Request-Id header: the chunk id


async def test_error_inside_200_stream_raises_after_earlier_chunks(serve: Serve) -> None:
    error = {
        "error": {"message": "engine fell over", "type": "server_error", "code": "backend_error"}
    }
    parts = [chunk("partial"), b"data: " + json.dumps(error).encode() + b"\n\n"]
    url = await serve(sse_handler(parts))
    events = Recorder()
    texts: list[str] = []
    async with StreamClient(config(url), event_log=events) as client:
        with pytest.raises(ServerStreamError) as info:
            async with client.stream(MESSAGES) as stream:
                async for text in stream:
                    texts.append(text)
    assert texts == ["partial"]
    assert info.value.code == "server_error"
    assert info.value.server_code == "backend_error"
    assert events.of("error")[0]["server_code"] == "backend_error"


async def test_retry_never_repeats_delivered_content(serve: Serve) -> None:
    seen: list[web.Request] = []
    error = b'data: {"error": {"message": "x", "code": "backend_error"}}\n\n'
    url = await serve(sse_handler([chunk("a"), error], seen=seen))
    retry = {"max_attempts": 3, "backoff_ms": 0, "retry_on": ["server_error"]}
    async with StreamClient(config(url, retry=retry)) as client:
        with pytest.raises(ServerStreamError):
            await client.complete(MESSAGES)
    assert len(seen) == 1


async def test_wrong_content_type_says_the_server_did_not_stream(serve: Serve) -> None:
    body = json.dumps({"choices": [{"message": {"content": "whole answer"}}]}).encode()
    url = await serve(sse_handler([body], content_type="application/json"))
    async with StreamClient(config(url)) as client:
        with pytest.raises(NotStreamingError, match="did not stream") as info:
            await client.complete(MESSAGES)
    assert info.value.code == "not_streaming"
    assert "application/json" in str(info.value)


async def test_stream_ending_without_done_is_a_read_error(serve: Serve) -> None:
    url = await serve(sse_handler([chunk("a")]))
    async with StreamClient(config(url)) as client:
        with pytest.raises(Exception, match=r"before \[DONE\]") as info:
            await client.complete(MESSAGES)
    assert getattr(info.value, "code", None) == "read_error"


def error_handler(
    status: int, code: str, seen: list[web.Request], headers: dict[str, str] | None = None
) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        seen.append(request)
        body = {"error": {"message": f"{code} happened", "type": "x", "code": code, "param": None}}
        return web.json_response(body, status=status, headers=headers)

    return handle


async def test_4xx_is_never_retried(serve: Serve) -> None:
    seen: list[web.Request] = []
    url = await serve(error_handler(401, "invalid_api_key", seen))
    retry = {"max_attempts": 3, "backoff_ms": 0, "retry_on": ["http_status", "overloaded"]}
    async with StreamClient(config(url, retry=retry)) as client:
        with pytest.raises(HTTPStatusError) as info:
            await client.complete(MESSAGES)
    assert len(seen) == 1
    assert (info.value.code, info.value.status) == ("http_status", 401)
    assert info.value.server_code == "invalid_api_key"
    assert "invalid_api_key happened" in str(info.value)


async def test_503_with_retry_after_is_retried_when_listed(serve: Serve) -> None:
    seen: list[web.Request] = []
    busy = error_handler(503, "queue_full", [], headers={"Retry-After": "0"})
    ok = sse_handler([chunk("fine", finish="stop"), b"data: [DONE]\n\n"])

    async def handle(request: web.Request) -> web.StreamResponse:
        seen.append(request)
        return await (busy if len(seen) == 1 else ok)(request)

    url = await serve(handle)
    events = Recorder()
    retry = {"max_attempts": 2, "backoff_ms": 1, "retry_on": ["overloaded"]}
    async with StreamClient(config(url, retry=retry), event_log=events) as client:
        result = await client.complete(MESSAGES)
    assert result.text == "fine"
    assert result.attempts == 2
    assert len(seen) == 2
    assert [r["cause"] for r in events.of("retry")] == ["overloaded"]
    assert [r["attempt"] for r in events.of("request_sent")] == [1, 2]


async def test_ttft_timeout_cancels_retries_once_then_fails(serve: Serve) -> None:
    seen: list[web.Request] = []
    disconnects: list[int] = []
    both_gone = asyncio.Event()

    async def slow_prefill(request: web.Request) -> web.StreamResponse:
        # Heartbeats but never a token: a prefill slower than the client's hard limit.
        seen.append(request)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            while True:
                await response.write(b": ping\n\n")
                await asyncio.sleep(0.02)
        except (ConnectionError, RuntimeError):
            disconnects.append(1)
            if len(disconnects) == 2:
                both_gone.set()
        return response

    url = await serve(slow_prefill)
    events = Recorder()
    cfg = config(
        url,
        ttft_warn_ms=100,
        ttft_hard_timeout_ms=300,
        retry={"max_attempts": 2, "backoff_ms": 20, "retry_on": ["ttft_timeout"]},
    )
    async with StreamClient(cfg, event_log=events) as client:
        with pytest.raises(TtftTimeoutError) as info:
            await client.complete(MESSAGES)
    assert info.value.code == "ttft_timeout"
    assert len(seen) == 2
    assert [line["cause"] for line in events.of("retry")] == ["ttft_timeout"]
    assert events.of("retry")[0]["backoff_ms"] > 0
    assert [line["reason"] for line in events.of("cancel_sent")] == ["ttft_timeout"] * 2
    assert len(events.of("ttft_warn")) == 2
    assert events.of("error")[0]["code"] == "ttft_timeout"
    await asyncio.wait_for(both_gone.wait(), timeout=10)  # the server saw each close


async def test_connection_refused_is_connect_error_and_retried() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    events = Recorder()
    retry = {"max_attempts": 2, "backoff_ms": 1, "retry_on": ["connect_error"]}
    async with StreamClient(config(url, retry=retry), event_log=events) as client:
        with pytest.raises(ConnectError) as info:
            await client.complete(MESSAGES)
    assert info.value.code == "connect_error"
    assert len(events.of("request_sent")) == 2
    assert [line["cause"] for line in events.of("retry")] == ["connect_error"]


async def test_silence_after_heartbeats_is_a_dead_connection(serve: Serve) -> None:
    gate = asyncio.Event()

    async def goes_silent(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b": ping\n\n")
        await gate.wait()  # never set: the engine hangs
        return response

    url = await serve(goes_silent)
    cfg = config(url, ttft_hard_timeout_ms=0, heartbeat_interval_ms=50, dead_after_heartbeats=3)
    try:
        async with StreamClient(cfg) as client:
            with pytest.raises(DeadConnectionError) as info:
                await asyncio.wait_for(client.complete(MESSAGES), 30)
    finally:
        gate.set()
    assert info.value.code == "dead_connection"


async def test_require_heartbeat_arms_the_deadline_from_the_start(serve: Serve) -> None:
    gate = asyncio.Event()

    async def never_pings(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await gate.wait()  # never set: headers, then nothing
        return response

    url = await serve(never_pings)
    cfg = config(url, ttft_hard_timeout_ms=0, heartbeat_interval_ms=50, require_heartbeat=True)
    try:
        async with StreamClient(cfg) as client:
            with pytest.raises(DeadConnectionError):
                await asyncio.wait_for(client.complete(MESSAGES), 30)
    finally:
        gate.set()


async def test_slow_prefill_with_heartbeats_is_not_dead(serve: Serve) -> None:
    async def slow_but_alive(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(40):  # ~0.4 s of prefill, a ping every 10 ms
            await response.write(b": ping\n\n")
            await asyncio.sleep(0.01)
        await response.write(chunk("done", finish="stop") + b"data: [DONE]\n\n")
        return response

    url = await serve(slow_but_alive)
    beats: list[Any] = []
    cfg = config(url, ttft_hard_timeout_ms=0, heartbeat_interval_ms=200)
    async with (
        StreamClient(cfg) as client,
        client.stream(MESSAGES, on_heartbeat=beats.append) as stream,
    ):
        texts = [t async for t in stream]
    assert texts == ["done"]
    assert len(beats) >= 1


async def test_plain_server_without_heartbeats_may_be_silent(serve: Serve) -> None:
    async def silent_prefill(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(0.3)  # six heartbeat intervals without a byte
        await response.write(chunk("ok", finish="stop") + b"data: [DONE]\n\n")
        return response

    url = await serve(silent_prefill)
    cfg = config(url, ttft_hard_timeout_ms=0, heartbeat_interval_ms=50)
    async with StreamClient(cfg) as client:
        result = await client.complete(MESSAGES)
    assert result.text == "ok"


async def test_closing_early_cancels_by_closing_the_connection(serve: Serve) -> None:
    gone = asyncio.Event()

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            while True:
                await response.write(chunk("tok"))
                await asyncio.sleep(0.005)
        except (ConnectionError, RuntimeError):
            gone.set()
        return response

    url = await serve(endless)
    events = Recorder()
    async with (
        StreamClient(config(url), event_log=events) as client,
        client.stream(MESSAGES) as stream,
    ):
        async for _ in stream:
            break
    await asyncio.wait_for(gone.wait(), timeout=10)
    assert events.of("cancel_sent")[0]["reason"] == "client"
    assert events.of("end")[0]["finish_reason"] == "cancelled"


def test_socket_factory_sets_small_buffers_before_connect() -> None:
    make = socket_factory(4096)
    sock = make((socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0)))
    default = socket.socket()
    try:
        rcvbuf = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        assert rcvbuf <= 2 * 4096  # Linux doubles the value it is given
        assert rcvbuf < default.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) <= 2 * 4096
    finally:
        sock.close()
        default.close()


async def test_slow_renderer_stops_reading_and_the_server_blocks(serve: Serve) -> None:
    n_events = 400
    server_blocked = asyncio.Event()
    written: list[int] = []

    async def fast_producer(request: web.Request) -> web.StreamResponse:
        sock = request.transport.get_extra_info("socket") if request.transport else None
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(n_events):
            await response.write(chunk(f"{i:04d}" + "x" * 400))
            written.append(i)
            transport = request.transport
            if transport is not None and transport.get_write_buffer_size() > 0:
                server_blocked.set()  # the kernel refused bytes: TCP backpressure
        await response.write(b"data: [DONE]\n\n")
        return response

    url = await serve(fast_producer)
    events = Recorder()
    cfg = config(url, render_queue_capacity=8, socket_send_buffer_bytes=4096)
    async with (
        StreamClient(cfg, event_log=events) as client,
        client.stream(MESSAGES) as stream,
    ):
        # The renderer is stuck until the server's writes block.
        await asyncio.wait_for(server_blocked.wait(), timeout=30)
        blocked_at = len(written)
        texts = [t async for t in stream]
    assert blocked_at < n_events
    assert [int(t[:4]) for t in texts] == list(range(n_events))
    assert events.of("watermark_high")[0]["pause_enabled"] is True
    assert events.of("watermark_high")[0]["queue_capacity"] == 8
    assert "read_paused" in events.names()
    assert "read_resumed" in events.names()
    assert stream.result.pauses == len(events.of("read_paused")) >= 1


async def test_no_pause_flag_keeps_reading_until_the_queue_is_full(serve: Serve) -> None:
    parts = [chunk(str(i)) for i in range(20)] + [chunk(None, finish="stop"), b"data: [DONE]\n\n"]
    url = await serve(sse_handler(parts))
    events = Recorder()
    cfg = config(url, render_queue_capacity=8)
    async with (
        StreamClient(cfg, event_log=events, send_pause=False) as client,
        client.stream(MESSAGES) as stream,
    ):
        await events.wait_for("watermark_high")  # the renderer has not started yet
        texts = [t async for t in stream]
    assert texts == [str(i) for i in range(20)]
    assert events.of("watermark_high")[0]["pause_enabled"] is False
    assert "read_paused" not in events.names()
    assert stream.result.pauses == 0
