"""The HTTP layer in-process over a fake backend: access, limits, faults."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fakes import FakeBackend

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}

ClientFactory = Callable[..., Any]


async def test_api_key_is_required_everywhere_but_health(client_of) -> None:
    client = await client_of(api_key=["sk-a", "sk-b"])
    response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status == 401
    assert (await response.json())["error"]["code"] == "invalid_api_key"
    assert (await client.get("/health")).status == 200
    assert (await client.get("/metrics")).status == 401
    assert (await client.get("/debug/streams")).status == 401
    ok = await client.post(
        "/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer sk-b"}
    )
    assert ok.status == 200
    ok = await client.get("/v1/models", headers={"x-api-key": "sk-a"})
    assert ok.status == 200
    wrong = await client.get("/v1/models", headers={"Authorization": "Bearer sk-c"})
    assert wrong.status == 401


async def test_debug_endpoints_can_be_left_open(client_of) -> None:
    client = await client_of(api_key=["k"], protect_debug=False)
    assert (await client.get("/metrics")).status == 200
    assert (await client.get("/v1/models")).status == 401


async def test_body_over_the_limit_is_413(client_of) -> None:
    client = await client_of(max_body_bytes=2048)
    body = {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status == 413
    assert (await response.json())["error"]["code"] == "request_too_large"


async def test_too_many_messages_is_400(client_of) -> None:
    client = await client_of(max_messages=2)
    body = {**CHAT, "messages": [{"role": "user", "content": "x"}] * 3}
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status == 400
    assert (await response.json())["error"]["param"] == "messages"


async def test_cors_is_off_unless_configured(client_of) -> None:
    closed = await client_of()
    response = await closed.get("/v1/models", headers={"Origin": "http://evil.example"})
    assert "Access-Control-Allow-Origin" not in response.headers
    opened = await client_of(cors_allow_origin=["http://app.local"])
    response = await opened.get("/v1/models", headers={"Origin": "http://app.local"})
    assert response.headers["Access-Control-Allow-Origin"] == "http://app.local"
    preflight = await opened.options("/v1/chat/completions", headers={"Origin": "http://app.local"})
    assert preflight.status == 204


async def test_a_dead_engine_thread_is_reported_not_hung(client_of) -> None:
    backend = FakeBackend()

    def explode(items: object) -> list[int]:
        raise MemoryError("simulated crash inside the runtime")

    backend.decode_runs = explode  # type: ignore[method-assign,assignment]
    client = await client_of(backend)
    response = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    body = await response.text()
    assert "engine thread died" in body
    health = await client.get("/health")
    assert health.status == 503
    assert (await health.json())["status"] == "dead"
    refused = await client.post("/v1/chat/completions", json=CHAT)
    assert refused.status == 503
    assert (await refused.json())["error"]["code"] == "engine_unavailable"


async def test_streaming_through_the_fake_backend(client_of) -> None:
    client = await client_of()
    response = await client.post(
        "/v1/chat/completions",
        json={**CHAT, "stream": True, "stream_options": {"include_usage": True}},
    )
    text = await response.text()
    assert response.headers["X-Request-Id"].startswith("chatcmpl-")
    assert '"content":"t10 "' in text
    assert '"usage":{"prompt_tokens"' in text
    assert text.endswith("data: [DONE]\n\n")
