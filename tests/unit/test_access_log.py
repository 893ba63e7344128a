"""The access log: one line per request on ``edge_llm.access`` when it ends (fake backend)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestServer

from edge_llm.server.access_log import LOGGER_NAME

from conftest import app_engine
from fakes import FakeBackend

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
LINE = re.compile(
    r"^(?P<id>\S+) (?P<method>\S+) (?P<path>\S+) (?P<status>\S+) ttft_ms=(?P<ttft>\S+) "
    r"tokens=(?P<tokens>\S+) end=(?P<end>\S+) backend=(?P<backend>\S+)$"
)

ClientFactory = Callable[..., Any]


def lines(caplog: pytest.LogCaptureFixture, level: int = logging.INFO) -> list[dict[str, str]]:
    found = []
    for record in caplog.records:
        if record.name == LOGGER_NAME and record.levelno == level:
            match = LINE.match(record.getMessage())
            assert match, record.getMessage()
            found.append(match.groupdict())
    return found


@pytest.fixture
def access(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger=LOGGER_NAME)
    return caplog


async def test_a_completion_is_one_line_with_its_facts(client_of, access) -> None:
    client = await client_of()
    response = await client.post("/v1/chat/completions", json=CHAT)
    body = await response.json()
    [line] = lines(access)
    assert line["id"] == body["id"] == response.headers["X-Request-Id"]
    assert (line["method"], line["path"], line["status"]) == ("POST", "/v1/chat/completions", "200")
    usage = body["usage"]
    assert line["tokens"] == f"{usage['prompt_tokens']}/{usage['completion_tokens']}"
    assert line["end"] == body["choices"][0]["finish_reason"]
    assert line["backend"] == "local"
    assert float(line["ttft"]) >= 0


async def test_a_stream_is_logged_when_it_ends(client_of, access) -> None:
    client = await client_of()
    response = await client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 2,
                                                          "stream": True})  # fmt: skip
    text = await response.text()
    assert text.rstrip().endswith("data: [DONE]")
    [line] = lines(access)
    assert (line["path"], line["status"], line["end"]) == ("/v1/completions", "200", "length")
    assert line["tokens"].endswith("/2")


class _Notify(logging.Handler):
    """Sets ``event`` when a line is logged (the server runs on the test's loop)."""

    def __init__(self, event: asyncio.Event) -> None:
        super().__init__()
        self.event = event

    def emit(self, record: logging.LogRecord) -> None:
        self.event.set()


async def test_a_client_that_leaves_mid_stream_is_499(client_of, access) -> None:
    backend = FakeBackend()
    backend.gate = threading.Semaphore(2)  # two decode steps, then the stream waits
    client = await client_of(backend, heartbeat_interval_ms=20)
    logged = asyncio.Event()
    notify = _Notify(logged)
    logging.getLogger(LOGGER_NAME).addHandler(notify)
    try:
        body = {**CHAT, "max_tokens": 50, "stream": True}
        response = await client.post("/v1/chat/completions", json=body)
        assert (await response.content.readline()).startswith(b"data: ")
        response.close()  # the next heartbeat finds the connection gone
        await asyncio.wait_for(logged.wait(), timeout=60)
    finally:
        logging.getLogger(LOGGER_NAME).removeHandler(notify)
        backend.gate.release(10_000)
    [line] = lines(access)
    assert (line["status"], line["end"], line["backend"]) == (
        "499",
        "cancelled:disconnect",
        "local",
    )


async def test_a_refusal_names_its_code(client_of, access) -> None:
    client = await client_of(max_prompt_tokens=4)
    response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status == 400
    [line] = lines(access)
    assert line == {
        "id": response.headers["X-Request-Id"],
        "method": "POST",
        "path": "/v1/chat/completions",
        "status": "400",
        "ttft": "-",
        "tokens": "-",
        "end": "prompt_too_long",
        "backend": "-",
    }


async def test_every_refusal_has_an_id_in_its_header_and_its_line(client_of, access) -> None:
    """Support and ``blame`` name a refused request by the id its client saw."""
    client = await client_of(api_key=["k"], max_body_bytes=1024)
    key = {"Authorization": "Bearer k"}
    refusals = [
        await client.post("/v1/chat/completions", json={**CHAT, "bogus": 1}, headers=key),
        await client.post("/v1/chat/completions", json=CHAT),
        await client.post("/v1/completions", data=b"x" * 4096, headers=key),
        await client.get("/nope", headers=key),
    ]
    app_engine(client.app).begin_drain()  # 503 engine_unavailable from now on
    refusals.append(await client.post("/v1/chat/completions", json=CHAT, headers=key))
    assert [r.status for r in refusals] == [400, 401, 413, 404, 503]
    ids = [r.headers["X-Request-Id"] for r in refusals]
    assert all(i.startswith("chatcmpl-") for i in ids) and len(set(ids)) == len(ids)
    assert [line["id"] for line in lines(access)] == ids


async def test_auth_failures_and_unknown_routes(client_of, access) -> None:
    client = await client_of(api_key=["k"])
    assert (await client.post("/v1/messages", json={})).status == 401
    assert (await client.get("/nope/%0A")).status == 401
    open_client = await client_of()
    assert (await open_client.get("/nope")).status == 404
    assert [(x["path"], x["status"], x["end"]) for x in lines(access)] == [
        ("/v1/messages", "401", "invalid_api_key"),
        ("/nope/%0A", "401", "invalid_api_key"),  # as sent: a newline cannot forge a line
        ("/nope", "404", "not_found"),
    ]


async def test_polled_endpoints_are_logged_at_debug(client_of, access) -> None:
    client = await client_of()
    for path in ("/health", "/metrics", "/debug/streams"):
        assert (await client.get(path)).status == 200
    assert lines(access) == []
    assert [x["path"] for x in lines(access, logging.DEBUG)] == [
        "/health",
        "/metrics",
        "/debug/streams",
    ]


async def test_no_access_log_writes_nothing(client_of, access) -> None:
    client = await client_of(access_log=False)
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200
    assert (await client.get("/v1/models")).status == 200
    assert [r for r in access.records if r.name == LOGGER_NAME] == []


async def test_each_websocket_stream_has_its_line(client_of, access) -> None:
    backend = FakeBackend()
    backend.gate = threading.Semaphore(0)  # the first stream waits until it is cancelled
    client = await client_of(backend)
    try:
        async with client.ws_connect("/v1/stream") as ws:
            cancelled = await _cancelled_stream(ws, backend)
            await ws.send_json({"type": "start", "request": {**CHAT, "max_tokens": 2}})
            assert (await _last_frame(ws))["type"] == "done"
    finally:
        backend.gate.release(10_000)
    found = lines(access)
    assert [(x["method"], x["path"], x["status"]) for x in found] == [
        ("WS", "/v1/stream", "101")
    ] * 2
    assert (found[0]["id"], found[0]["end"]) == (cancelled, "cancelled:client")
    assert found[1]["end"] == "length"


async def _cancelled_stream(ws: Any, backend: FakeBackend) -> str:
    """Start a stream, cancel it while its first step waits at the gate, and return
    its id once the engine has ended it."""
    await ws.send_json({"type": "start", "request": {**CHAT, "max_tokens": 400}})
    started = await ws.receive_json()
    assert await asyncio.to_thread(backend.at_gate.wait, 60)
    await ws.send_json({"type": "cancel"})
    await ws.send_json({"type": "bogus"})  # its error frame: the cancel was handled
    assert (await ws.receive_json())["type"] == "error"
    assert backend.gate is not None
    backend.gate.release(10_000)
    assert (await _last_frame(ws))["code"] == "cancelled"
    return str(started["id"])


async def _last_frame(ws: Any) -> dict[str, Any]:
    """Frames until the stream's ``done`` or ``error``."""
    while True:
        message = await ws.receive()
        assert message.type is WSMsgType.TEXT
        frame: dict[str, Any] = json.loads(message.data)
        if frame["type"] in ("done", "error"):
            return frame


async def test_a_relayed_answer_names_its_upstream(client_of, access) -> None:
    upstream = TestServer(_upstream_app())
    await upstream.start_server()
    try:
        url = str(upstream.make_url("")).rstrip("/")
        client = await client_of(upstream=[f"lan={url}"])
        body = {**CHAT, "model": "remote-model"}
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status == 200
        [line] = lines(access)
        assert (line["backend"], line["end"], line["tokens"]) == ("lan", "stop", "7/2")
        assert line["id"] == response.headers["X-Request-Id"]
    finally:
        await upstream.close()


def _upstream_app() -> web.Application:
    """An OpenAI-compatible server with one model that streams two chunks and usage."""

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "remote-model"}]})

    async def chat(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunks = [
            {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]},
            {"choices": [{"index": 0, "delta": {"content": "!"}, "finish_reason": "stop"}]},
            {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}},
        ]
        for chunk in chunks:
            await response.write(b"data: " + json.dumps({"id": "u", **chunk}).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    return app
