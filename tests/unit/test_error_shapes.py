"""Errors come in the shape of the API their path belongs to, whichever layer raised
them (a route, the auth or connection middleware, aiohttp itself): the official
``anthropic`` SDK sees its own error classes under /v1/messages, the OpenAI
routes keep OpenAI's shape. The status is the same either way."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anthropic
import pytest
from aiohttp.test_utils import TestClient

from edge_llm.engine import Engine
from edge_llm.server.context import CONTEXT

from conftest import app_engine

KEY = "sk-test"
QUESTION = [{"role": "user", "content": "hi"}]
Served = tuple[TestClient, Engine]


@pytest.fixture
def serve(client_of) -> Callable[..., Awaitable[Served]]:
    """The server over the fake backend, requiring ``KEY``; (client, its engine)."""

    async def make(**overrides: object) -> Served:
        client = await client_of(api_key=[KEY], **overrides)
        return client, app_engine(client.app)

    return make


def _sdk(client: TestClient, api_key: str = KEY) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=str(client.make_url("")), api_key=api_key, max_retries=0
    )


async def _create(sdk: anthropic.AsyncAnthropic, **fields: Any) -> Any:
    async with sdk:
        return await sdk.messages.create(
            **{"model": "fake", "max_tokens": 4, "messages": QUESTION, **fields}
        )


def _anthropic_error(info: pytest.ExceptionInfo[anthropic.APIStatusError]) -> dict[str, Any]:
    body = info.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    error: dict[str, Any] = body["error"]
    assert error["type"] == info.value.type
    return error


async def test_401_is_an_authentication_error(serve) -> None:
    client, _ = await serve()
    with pytest.raises(anthropic.AuthenticationError) as info:
        await _create(_sdk(client, api_key="sk-wrong"))
    assert info.value.status_code == 401
    error = _anthropic_error(info)
    assert (error["type"], error["code"]) == ("authentication_error", "invalid_api_key")


async def test_413_is_a_content_too_large_error(serve) -> None:
    client, _ = await serve(max_body_bytes=2048)
    big = [{"role": "user", "content": "x" * 4096}]
    with pytest.raises(anthropic.ContentTooLargeError) as info:
        await _create(_sdk(client), messages=big)
    assert info.value.status_code == 413
    assert _anthropic_error(info)["type"] == "request_too_large"


async def test_400_is_a_bad_request_error_naming_the_field(serve) -> None:
    client, _ = await serve()
    with pytest.raises(anthropic.BadRequestError) as info:
        await _create(_sdk(client), max_tokens=0)
    error = _anthropic_error(info)
    assert (error["type"], error["param"]) == ("invalid_request_error", "max_tokens")
    with pytest.raises(anthropic.BadRequestError) as info:
        await _create(_sdk(client), messages=[{"role": "user", "content": "word " * 600}])
    assert _anthropic_error(info)["code"] == "prompt_too_long"


async def test_503_is_a_service_unavailable_error_with_retry_after(serve) -> None:
    client, engine = await serve()
    engine.begin_drain()  # admits nothing more: 503 engine_unavailable
    with pytest.raises(anthropic.ServiceUnavailableError) as info:
        await _create(_sdk(client))
    assert info.value.status_code == 503
    assert info.value.response.headers["Retry-After"] == "5"
    error = _anthropic_error(info)
    assert (error["type"], error["code"]) == ("overloaded_error", "engine_unavailable")


async def test_errors_from_the_middleware_and_aiohttp_take_the_paths_shape(serve) -> None:
    client, _ = await serve(max_connections=1)
    headers = {"x-api-key": KEY}
    unknown = await client.get("/v1/messages/nope", headers=headers)
    assert unknown.status == 404
    assert (await unknown.json())["error"]["type"] == "not_found_error"
    wrong_method = await client.get("/v1/messages", headers=headers)
    assert wrong_method.status == 405
    assert (await wrong_method.json())["type"] == "error"
    count = await client.post("/v1/messages/count_tokens", json={}, headers=headers)
    assert (count.status, (await count.json())["type"]) == (400, "error")
    client.server.app[CONTEXT].count_connections = lambda: 2  # over max_connections
    crowded = await client.post("/v1/messages", json={}, headers=headers)
    assert (crowded.status, crowded.headers["Connection"]) == (503, "close")
    assert (await crowded.json())["error"]["code"] == "too_many_connections"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/v1/messagesX"])
async def test_other_paths_keep_openais_shape(serve, path: str) -> None:
    client, _ = await serve()
    response = await client.post(path, json={})
    assert response.status in (401, 404)
    body = await response.json()
    assert "type" not in body
    assert set(body["error"]) >= {"message", "type", "code", "param"}
