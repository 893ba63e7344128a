"""Tools, the Responses API and count_tokens over HTTP, in-process with a fake
backend that generates a scripted answer (the real model: tests/e2e)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import WSCloseCode, WSMsgType
from aiohttp.test_utils import TestClient

from edge_llm.server import ws_route

from fakes import FakeBackend, text_script
from helpers import sse_events

CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
RESPONSES_TOOL = {"type": "function", **TOOL["function"]}
ANTHROPIC_TOOL = {"name": "get_weather", "input_schema": TOOL["function"]["parameters"]}
USER = [{"role": "user", "content": "Weather in Paris?"}]

Served = Callable[..., Any]


@pytest.fixture
def served(client_of) -> Served:
    """``make(answer)``: the server over a fake backend that generates ``answer``."""

    async def make(answer: str) -> tuple[TestClient, FakeBackend]:
        backend = FakeBackend(text_script(answer))
        return await client_of(backend), backend

    return make


async def test_chat_required_tool_call_stream_and_not(served: Served) -> None:
    client, backend = await served(CALL)
    body = {"messages": USER, "tools": [TOOL], "tool_choice": "required", "max_tokens": 200}
    whole = await (await client.post("/v1/chat/completions", json=body)).json()
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert call["id"].startswith("call_")
    grammar = next(iter(backend.params.values())).grammar
    assert grammar is not None and '"const": "get_weather"' in grammar

    streamed = await client.post("/v1/chat/completions", json={**body, "stream": True})
    chunks = [data for _, data in sse_events(await streamed.text()) if data]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    pieces = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert pieces[0]["id"].startswith("call_") and pieces[0]["function"]["name"] == "get_weather"
    assert len(pieces) > 3
    assert "".join(p["function"]["arguments"] for p in pieces) == call["function"]["arguments"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_chat_auto_tool_call_and_plain_answer(served: Served) -> None:
    client, backend = await served(CALL)
    body = {"messages": USER, "tools": [TOOL], "max_tokens": 200}
    whole = await (await client.post("/v1/chat/completions", json=body)).json()
    assert whole["choices"][0]["finish_reason"] == "tool_calls"
    assert all(p.grammar is None for p in backend.params.values())  # auto: no grammar
    client, _ = await served("It is sunny.")
    whole = await (await client.post("/v1/chat/completions", json=body)).json()
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "It is sunny."}
    assert whole["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("messages", "param", "words"),
    [
        ([{"role": "user"}], "messages.0", "needs content"),
        ([{"role": "tool", "content": "x"}], "messages.0", "tool_call_id"),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            "messages.0.content",
            "no vision input",
        ),
        ([{"role": "user", "content": [{"type": "video"}]}], "messages.0.content", "'video'"),
    ],
)
async def test_message_shapes_are_checked(served: Served, messages, param, words) -> None:
    client, _ = await served("x")
    response = await client.post("/v1/chat/completions", json={"messages": messages})
    error = (await response.json())["error"]
    assert response.status == 400
    assert error["param"] == param
    assert words in error["message"]


async def test_no_op_fields_are_accepted_and_unknown_ones_named(served: Served) -> None:
    client, _ = await served("ok")
    accepted = {
        "store": True,
        "metadata": {"k": "v"},
        "service_tier": "auto",
        "reasoning_effort": "low",
        "prediction": {"type": "content", "content": "ok"},
        "parallel_tool_calls": False,
    }
    response = await client.post("/v1/chat/completions", json={"messages": USER, **accepted})
    assert response.status == 200
    response = await client.post("/v1/chat/completions", json={"messages": USER, "colour": 1})
    assert (await response.json())["error"]["param"] == "colour"


async def test_responses_events_for_text_then_a_call(served: Served) -> None:
    client, _ = await served("Checking.\n<tool_call>" + CALL + "</tool_call>")
    body = {"input": "Weather?", "tools": [RESPONSES_TOOL], "stream": True}
    response = await client.post("/v1/responses", json=body)
    events = sse_events(await response.text())
    assert all(name == data["type"] for name, data in events)
    kinds = [name for i, (name, _) in enumerate(events) if i == 0 or events[i - 1][0] != name]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = events[-1][1]["response"]
    assert [item["type"] for item in final["output"]] == ["message", "function_call"]
    assert final["output"][0]["content"][0]["text"] == "Checking.\n"
    deltas = [data["delta"] for name, data in events if name == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == "Checking.\n"  # streamed before the call
    assert final["output"][1]["arguments"] == '{"city": "Paris"}'


async def test_responses_store_and_previous_response_id(served: Served) -> None:
    client, _ = await served("Hi there.")
    first = await (await client.post("/v1/responses", json={"input": "Hello"})).json()
    again = await client.post(
        "/v1/responses", json={"input": "More", "previous_response_id": first["id"]}
    )
    assert again.status == 200
    assert (await again.json())["usage"]["input_tokens"] > first["usage"]["input_tokens"]
    unstored = await (
        await client.post("/v1/responses", json={"input": "Hello", "store": False})
    ).json()
    missing = await client.post(
        "/v1/responses", json={"input": "x", "previous_response_id": unstored["id"]}
    )
    assert missing.status == 404
    assert (await missing.json())["error"]["param"] == "previous_response_id"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": [{"type": "input_image"}]}, "input"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input.0.content"),
        ({"input": "x", "tools": [{"type": "custom", "name": "apply_patch"}]}, "tools"),
        (
            {"input": "x", "tools": [{"type": "web_search"}], "tool_choice": "required"},
            "tool_choice",
        ),
        ({"input": "x", "tool_choice": "required"}, "tool_choice"),
        ({"input": "x", "background": True, "store": False}, "store"),
        ({"input": "x", "colour": 1}, "colour"),
    ],
)
async def test_responses_bad_requests_name_the_field(served: Served, body, param) -> None:
    client, _ = await served("x")
    response = await client.post("/v1/responses", json=body)
    assert response.status == 400
    assert (await response.json())["error"]["param"] == param


async def test_responses_codex_no_op_fields(served: Served) -> None:
    client, _ = await served("ok")
    body = {
        "input": [{"type": "message", "role": "developer", "content": "Be brief."}],
        "instructions": "You are a coding agent.",
        "store": False,
        "metadata": {"a": "b"},
        "reasoning": {"effort": "low", "summary": "auto"},
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "k",
        "client_metadata": {"x": 1},
        "service_tier": "auto",
        "user": "u",
        "truncation": "disabled",
        "parallel_tool_calls": False,
        "text": {"verbosity": "low"},
    }
    response = await client.post("/v1/responses", json=body)
    assert response.status == 200, await response.text()
    assert (await response.json())["output"][0]["content"][0]["text"] == "ok"


async def test_anthropic_tool_use_streamed_and_not(served: Served) -> None:
    client, _ = await served(CALL)
    body = {
        "model": "m",
        "max_tokens": 200,
        "messages": USER,
        "tools": [ANTHROPIC_TOOL],
        "tool_choice": {"type": "any"},
    }
    whole = await (await client.post("/v1/messages", json=body)).json()
    assert whole["stop_reason"] == "tool_use"
    (block,) = whole["content"]
    assert block["type"] == "tool_use" and block["id"].startswith("toolu_")
    assert block["input"] == {"city": "Paris"}

    response = await client.post("/v1/messages", json={**body, "stream": True})
    events = sse_events(await response.text())
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert events[2][1]["content_block"]["type"] == "tool_use"
    partial = [
        data["delta"]["partial_json"]
        for name, data in events
        if name == "content_block_delta" and data["delta"]["type"] == "input_json_delta"
    ]
    assert len(partial) > 3 and json.loads("".join(partial)) == {"city": "Paris"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


async def test_anthropic_tool_history_and_count_tokens(served: Served) -> None:
    client, _ = await served("It is sunny.")
    history = [
        *USER,
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}],
        },
    ]
    body = {"model": "m", "max_tokens": 20, "messages": history, "tools": [ANTHROPIC_TOOL]}
    whole = await (await client.post("/v1/messages", json=body)).json()
    assert whole["content"] == [{"type": "text", "text": "It is sunny."}]
    assert whole["stop_reason"] == "end_turn"
    counted = await client.post("/v1/messages/count_tokens", json={**body, "max_tokens": None})
    without_tools = await client.post(
        "/v1/messages/count_tokens", json={"model": "m", "messages": history}
    )
    count = (await counted.json())["input_tokens"]
    assert count == whole["usage"]["input_tokens"]
    assert (await without_tools.json())["input_tokens"] < count
    bad = await client.post("/v1/messages/count_tokens", json={"model": "m", "messages": []})
    assert bad.status == 400
    assert (await bad.json())["type"] == "error"


async def test_responses_text_format_reaches_the_sampler_as_a_grammar(served: Served) -> None:
    client, backend = await served('{"a": 1}')
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}
    response = await client.post("/v1/responses", json={"input": "x", "text": {"format": fmt}})
    body = await response.json()
    assert body["text"]["format"] == fmt
    assert body["output"][0]["content"][0]["text"] == '{"a": 1}'
    (params,) = backend.params.values()
    assert params.grammar == "fake-grammar " + json.dumps(schema)
    missing = await client.post(
        "/v1/responses", json={"input": "x", "text": {"format": {"type": "json_schema"}}}
    )
    assert (await missing.json())["error"]["param"] == "text.format.schema"


async def test_websocket_refuses_tools_it_cannot_frame(served: Served) -> None:
    client, _ = await served("ok")
    async with client.ws_connect("/v1/stream") as ws:
        request = {"messages": USER, "tools": [TOOL]}
        await ws.send_json({"type": "start", "request": request})
        frame = await ws.receive_json(timeout=30)
        assert frame["type"] == "error" and "tools" in frame["message"]
        await ws.send_json({"type": "start", "request": {**request, "tool_choice": "none"}})
        assert (await ws.receive_json(timeout=30))["type"] == "started"


async def test_responses_codex_tool_kinds(served: Served) -> None:
    client, backend = await served(CALL)
    namespace = {
        "type": "namespace",
        "name": "weather_tools",
        "description": "Weather",
        "tools": [{**RESPONSES_TOOL, "strict": False}],
    }
    hosted = {"type": "web_search", "external_web_access": False}
    body = {"input": "x", "tools": [namespace, hosted], "tool_choice": "required"}
    response = await client.post("/v1/responses", json=body)
    assert response.headers["X-Edge-LLM-Ignored"] == "tools.web_search"
    output = (await response.json())["output"]
    assert [(o["type"], o["name"]) for o in output] == [("function_call", "get_weather")]
    (params,) = backend.params.values()
    assert params.grammar is not None and "web_search" not in params.grammar


async def test_an_unexpected_error_on_a_websocket_closes_it_1011_not_an_http_500(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the upgrade the middleware's 500 would be written onto the socket's
    byte stream: the socket is closed with 1011 instead, and the server serves on."""
    client, _ = await served("ok")

    async def broken(self: object, data: str) -> None:
        raise RuntimeError("a bug")

    with monkeypatch.context() as patch:
        patch.setattr(ws_route._Connection, "_on_text", broken)
        async with client.ws_connect("/v1/stream") as ws:
            await ws.send_json({"type": "start", "request": {"messages": USER}})
            closed = await ws.receive(timeout=30)
            assert closed.type is WSMsgType.CLOSE and closed.data == WSCloseCode.INTERNAL_ERROR
    async with client.ws_connect("/v1/stream") as ws:
        await ws.send_json({"type": "start", "request": {"messages": USER}})
        assert (await ws.receive_json(timeout=30))["type"] == "started"
