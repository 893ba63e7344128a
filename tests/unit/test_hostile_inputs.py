"""Property: no request body, on any endpoint, and no WebSocket frame gets a 5xx,
an error in another shape, or leaves the server unable to serve the next request.

Runs the real HTTP stack (aiohttp, the routes, the engine) over the fake backend,
so that many examples fit in ``make test``; ``tests/e2e/test_fuzz_api.py`` runs
the same properties, fewer examples, against the real model.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Iterator

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_llm.config.tree import load_config

from conftest import app_over, stop_app_engine
from fakes import FakeBackend
from hostile import (
    BASE_BODIES,
    DIALECT_FIELDS,
    HOSTILE_VALUES,
    NORMAL_CHAT,
    PING,
    PONG,
    HostileRequest,
    RawWebSocket,
    Reply,
    check_reply,
    check_ws_frame,
    finish_ws_stream,
    hostile_frames,
    hostile_requests,
    post_raw,
    served_post_paths,
    ws_frame,
)

EXAMPLES = int(os.environ.get("EDGE_LLM_FUZZ_EXAMPLES", "150"))  # more: a longer hunt
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


class FakeServer:
    """The application over a fake backend, served on 127.0.0.1 from a loop in a
    thread, so that synchronous hypothesis tests can talk to it over real sockets."""

    def __init__(self, **overrides: object) -> None:
        self.overrides = {"max_body_bytes": 1 << 20, **overrides}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.url = self._run(self._start())

    def _run(self, coro):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    async def _start(self) -> str:
        config = load_config(None, env={}, overrides=self.overrides)
        self.app = app_over(FakeBackend(), config)
        self.runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        host, port = self.runner.addresses[0][:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        self._run(self.runner.cleanup())
        self._run(stop_app_engine(self.app))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def server() -> Iterator[FakeServer]:
    running = FakeServer()
    yield running
    running.stop()


def test_every_post_route_is_fuzzed_with_a_valid_base(server: FakeServer) -> None:
    paths = served_post_paths()
    assert {"/v1/chat/completions", "/v1/completions", "/v1/messages"} <= set(paths)
    missing = [path for path in paths if path not in BASE_BODIES]
    assert not missing, f"add a valid body for {missing} to tests/hostile.py BASE_BODIES"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/messages"])
def test_the_reported_hostile_bodies_are_400_naming_the_field(
    server: FakeServer, path: str
) -> None:
    text_field = {"/v1/completions": b'"prompt"'}.get(path, b'"messages"')
    cases = {
        b'{"model": "m", ' + text_field + b': "\\ud800"}': text_field.strip(b'"').decode(),
        b'{"model": "m", "x": ' + b"[" * 50_000 + b"]" * 50_000 + b"}": None,
        b'{"model": "m", "max_tokens": 1e999}': "max_tokens",
        b'{"model": "m", "max_tokens": NaN}': "max_tokens",
        b'{"max_tokens": ' + b"1" * 10_000 + b"}": "max_tokens",
    }
    for body, param in cases.items():
        reply = post_raw(server.url, path, HostileRequest(body, "application/json"))
        assert reply.status == 400, reply
        check_reply(path, reply)
        assert (param or "nested deeper") in reply.body.decode()


DIALECT_PATHS = ("/v1/chat/completions", "/v1/completions")
# Two values of the one penalty disagree: the refusal names the second name.
SAME_PENALTY = {"repetition_penalty": ("repeat_penalty",)}
DIALECT_KEYS = [*DIALECT_FIELDS, "repeat_penalty", "continue_final_message",
                "add_generation_prompt", "stream_options"]  # fmt: skip


@pytest.mark.parametrize("field", DIALECT_KEYS)
def test_no_value_of_a_dialect_field_gets_a_5xx(server: FakeServer, field: str) -> None:
    """Every type and range on each field of vLLM, SGLang and llama-server: a 200 or
    a 400 in the API's shape naming the field, never a 5xx."""
    for path in DIALECT_PATHS:
        for value in HOSTILE_VALUES:
            hostile = {"continuous_usage_stats": value} if field == "stream_options" else value
            body = {**BASE_BODIES[path], field: hostile}
            reply = post_raw(server.url, path, _json(body))
            check_reply(path, reply)
            if reply.status == 400:
                error = json.loads(reply.body)["error"]
                named = (error["param"] or "").split(".")[0]
                assert named in (field, *SAME_PENALTY.get(field, ())), (field, value, error)


UNHASHABLE_TYPE_BODIES = {
    "/v1/chat/completions": {
        "messages": [{"role": "user", "content": [{"type": {}, "text": "Hi"}]}],
        "tools": [{"type": [], "function": {"name": "f"}}],
    },
    "/v1/messages": {
        "messages": [
            {"role": "user", "content": [{"type": {}, "text": "Hi"}]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": {}}]}],
            },
        ],
        "tools": [{"type": {}, "name": "f", "input_schema": {}}],
    },
    "/v1/responses": {"tools": [{"type": {}, "name": "f"}]},
}


@pytest.mark.parametrize(
    ("path", "field"),
    [(path, field) for path, fields in UNHASHABLE_TYPE_BODIES.items() for field in fields],
)
def test_a_type_that_is_an_object_is_a_400(server: FakeServer, path: str, field: str) -> None:
    """Found by the fuzzer: ``"type": {}`` in a content block reached a set lookup
    (TypeError, 500). Every field whose "type" names a kind is checked."""
    value = UNHASHABLE_TYPE_BODIES[path][field]
    for item in value:
        body = {**BASE_BODIES[path], field: [item]}
        reply = post_raw(server.url, path, _json(body))
        assert reply.status == 400, reply
        check_reply(path, reply)


def test_a_json_format_whose_type_is_an_object_is_a_400(server: FakeServer) -> None:
    """Found by the fuzzer: ``"format": {"type": {}}`` reached a set lookup in the
    fake backend (llama.cpp's converter refuses it: test_llama_backend.py)."""
    body = {**BASE_BODIES["/api/chat"], "format": {"type": {}}}
    reply = post_raw(server.url, "/api/chat", _json(body))
    assert reply.status == 400, reply
    check_reply("/api/chat", reply)


@given(data=st.data())
@FUZZ
def test_no_body_on_any_endpoint_gets_a_5xx(server: FakeServer, data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(served_post_paths()), label="path")
    request = data.draw(hostile_requests(BASE_BODIES.get(path, {})), label="request")
    check_reply(path, post_raw(server.url, path, request))
    normal = post_raw(server.url, "/v1/chat/completions", _json(NORMAL_CHAT))
    assert normal.status == 200, normal


@given(frame=hostile_frames())
@FUZZ
def test_no_websocket_frame_breaks_the_socket_or_the_server(
    server: FakeServer, frame: bytes
) -> None:
    check_ws_frame(server.url, RawWebSocket(server.url), frame, then_stream=True)


@pytest.fixture(scope="module")
def impatient_server() -> Iterator[FakeServer]:
    running = FakeServer(body_timeout_ms=300)
    yield running
    running.stop()


def test_half_a_websocket_frame_cannot_hold_the_socket(impatient_server: FakeServer) -> None:
    """The client sends a frame's head and a few bytes of its payload, then waits
    with the socket open. The server's ping cannot be answered (its pong would be
    read as the missing payload), so the socket is closed: 1008, then EOF."""
    ws = RawWebSocket(impatient_server.url, timeout=30)
    try:
        ws.sock.sendall(
            ws_frame(json.dumps({"type": "start", "request": NORMAL_CHAT}).encode())[:12]
        )
        assert ws.receive_json_or_close() == 1008
        with pytest.raises(EOFError):
            ws.receive()
    finally:
        ws.close()


def test_an_idle_websocket_that_answers_pings_stays_open(impatient_server: FakeServer) -> None:
    ws = RawWebSocket(impatient_server.url, timeout=30)
    try:
        for _ in range(2):  # two rounds of the watchdog: each ping answered
            opcode, payload = ws.receive()
            assert opcode == PING
            ws.send(payload, PONG)
        ws.send_json({"type": "start", "request": NORMAL_CHAT})
        assert ws.receive_json()["type"] == "started"
        assert finish_ws_stream(ws)["type"] == "done"
    finally:
        ws.close()


def _json(body: object) -> HostileRequest:
    return HostileRequest(json.dumps(body).encode(), "application/json")


SSE = "text/event-stream"
FAULTY_STREAMS = {
    "/v1/chat/completions": (
        SSE,
        b'data: {"choices": []}\n\ndata: {"error": {"message": "boom", "type": "server_error", '
        b'"code": "internal_error", "param": null}}\n\n',
    ),
    "/v1/messages": (
        SSE,
        b'event: error\ndata: {"type": "error", "error": {"type": "api_error", '
        b'"message": "boom", "code": "backend_error"}}\n\n',
    ),
    "/v1/responses": (
        SSE,
        b'event: error\ndata: {"type": "error", "code": "internal_error", "message": "boom"}\n\n',
    ),
    "/api/chat": ("application/x-ndjson", b'{"message": {"content": "a"}}\n{"error": "boom"}\n'),
}


@pytest.mark.parametrize("path", list(FAULTY_STREAMS))
def test_a_200_stream_that_ends_in_a_server_fault_fails_the_check(path: str) -> None:
    content_type, body = FAULTY_STREAMS[path]
    with pytest.raises(AssertionError, match="200 stream ended"):
        check_reply(path, Reply(200, content_type, body))


def test_a_200_stream_that_ends_in_a_refusal_passes_the_check() -> None:
    body = b'data: {"error": {"message": "x", "type": "t", "code": "ttft_timeout", "param": null}}'
    check_reply("/v1/chat/completions", Reply(200, SSE, body + b"\n\n"))
    check_reply("/v1/chat/completions", Reply(200, SSE, b"data: [DONE]\n\n"))
