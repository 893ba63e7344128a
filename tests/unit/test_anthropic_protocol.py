"""Anthropic Messages: request validation and response objects, then the route
in-process over the fake backend (event sequence, stop reasons, errors, pings)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

from edge_llm.engine import Engine
from edge_llm.errors import (
    AuthenticationFailed,
    Cancelled,
    InvalidRequest,
    ModelNotFound,
    PromptTooLong,
    QueueFull,
    TtftTimeout,
)
from edge_llm.protocol import anthropic
from edge_llm.protocol.sampling import SamplingDefaults
from edge_llm.protocol.sse import SSEParser

from conftest import app_engine
from fakes import FakeBackend


def body(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "hi"}],
    }
    base.update(fields)
    return base


def invalid(**fields: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        anthropic.parse_request(body(**fields))
    return info.value


def test_minimal_request_maps_to_chat_messages() -> None:
    req = anthropic.parse_request(body())
    assert req.chat_messages() == [{"role": "user", "content": "hi"}]
    assert req.prefill is None
    assert req.stream is False
    assert req.ignored() == []


def test_system_string_and_blocks_become_a_system_turn() -> None:
    as_string = anthropic.parse_request(body(system="be brief"))
    blocks = [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]
    as_blocks = anthropic.parse_request(body(system=blocks))
    expected = {"role": "system", "content": "be brief"}
    assert as_string.chat_messages()[0] == expected
    assert as_blocks.chat_messages()[0] == expected


def test_text_block_content_is_joined() -> None:
    content = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    req = anthropic.parse_request(body(messages=[{"role": "user", "content": content}]))
    assert req.chat_messages() == [{"role": "user", "content": "ab"}]


def test_trailing_assistant_message_is_a_prefill() -> None:
    turns = [{"role": "user", "content": "count"}, {"role": "assistant", "content": "1, 2,"}]
    req = anthropic.parse_request(body(messages=turns))
    assert req.prefill == "1, 2,"
    assert req.chat_messages() == [{"role": "user", "content": "count"}]


def test_sampling() -> None:
    req = anthropic.parse_request(
        body(
            temperature=0,
            top_p=0.9,
            top_k=40,
            stop_sequences=["\n\n", "END"],
            metadata={"user_id": "u-1"},
        )
    )
    params = req.sampling(SamplingDefaults(temperature=0.7, top_p=0.5, top_k=5))
    assert (params.temperature, params.top_p, params.top_k) == (0.0, 0.9, 40)
    assert params.stop == ("\n\n", "END")


def test_sampling_left_out_gets_the_defaults_given() -> None:
    defaults = SamplingDefaults(temperature=0.2, top_p=0.9, top_k=7, min_p=0.05)
    params = anthropic.parse_request(body(top_k=3)).sampling(defaults)
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.2, 0.9, 3, 0.05)


def test_system_messages_inside_messages_stay_in_place() -> None:
    turns = [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
        {"role": "user", "content": "again"},
    ]
    req = anthropic.parse_request(body(system="top", messages=turns))
    assert [m["role"] for m in req.chat_messages()] == ["system", "user", "system", "user"]
    assert req.chat_messages()[2]["content"] == "be brief"


@pytest.mark.parametrize(
    "thinking",
    [{"type": "adaptive"}, {"type": "enabled", "budget_tokens": 2048}, {"type": "disabled"}],
)
def test_thinking_kinds_are_accepted_and_ignored(thinking: dict[str, Any]) -> None:
    req = anthropic.parse_request(
        body(thinking=thinking, context_management={"edits": []}, output_config={"effort": "high"})
    )
    assert req.ignored() == ["thinking", "context_management", "output_config"]


def test_output_format_is_a_schema_to_enforce() -> None:
    schema = {"type": "object", "properties": {"title": {"type": "string"}}}
    req = anthropic.parse_request(
        body(output_config={"format": {"type": "json_schema", "schema": schema}})
    )
    assert req.output_schema == schema
    assert req.ignored() == []  # honoured, not ignored


def test_unknown_thinking_kind_is_named() -> None:
    assert invalid(thinking={"type": "deep"}).param == "thinking.type"


def test_any_model_id_is_accepted() -> None:
    assert anthropic.parse_request(body(model="claude-opus-4-1")).model == "claude-opus-4-1"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "16"}, "max_tokens"),
        ({"temperature": 1.5}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"messages": []}, "messages"),
        ({"stream": "yes"}, "stream"),
        ({"stop_sequences": ["a"] * 5}, "stop_sequences"),
        ({"metadata": {"user_id": "u", "other": 1}}, "metadata.other"),
        ({"frobnicate": True}, "frobnicate"),
        ({"tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools"),
        ({"tools": [{"name": "Bash"}]}, "tools.0.input_schema"),
        ({"output_config": {"format": {"type": "json_object"}}}, "output_config"),
        ({"output_config": {"format": {"type": "json_schema"}}}, "output_config"),
    ],
)
def test_bad_fields_are_named(fields: dict[str, Any], param: str) -> None:
    assert invalid(**fields).param == param


def test_required_fields_are_named() -> None:
    for name in ("model", "max_tokens", "messages"):
        fields = body()
        del fields[name]
        with pytest.raises(InvalidRequest) as info:
            anthropic.parse_request(fields)
        assert info.value.param == name


def test_non_text_block_is_named_in_the_message() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
    error = invalid(messages=[{"role": "user", "content": [image]}])
    assert error.param == "messages.0.content"
    assert "'image' is not supported" in error.message


def test_a_non_object_body_is_rejected() -> None:
    with pytest.raises(InvalidRequest):
        anthropic.parse_request([1, 2])


def test_claude_code_extras_are_accepted_and_reported_as_ignored() -> None:
    system = [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}]
    req = anthropic.parse_request(
        body(
            system=system,
            tools=[{"name": "Bash", "input_schema": {"type": "object"}}],
            tool_choice={"type": "auto"},
            thinking={"type": "enabled", "budget_tokens": 1024},
        )
    )
    assert req.ignored() == ["thinking", "cache_control"]


def test_newer_sdk_fields_are_accepted_and_reported_as_ignored() -> None:
    req = anthropic.parse_request(
        body(
            cache_control={"type": "ephemeral"},
            output_config={"effort": "low"},
            speed="standard",
            inference_geo="us",
        )
    )
    assert req.ignored() == ["cache_control", "speed", "inference_geo", "output_config"]


# -- stop reasons ------------------------------------------------------------------


def test_length_is_max_tokens() -> None:
    assert anthropic.stop_reason("length", None) == ("max_tokens", None)


def test_end_of_generation_is_end_turn() -> None:
    assert anthropic.stop_reason("stop", None) == ("end_turn", None)


def test_stop_string_is_stop_sequence() -> None:
    assert anthropic.stop_reason("stop", "END") == ("stop_sequence", "END")


# -- responses ---------------------------------------------------------------------


def test_message_shape() -> None:
    msg = anthropic.message(
        "msg_1", "m", "hello", ("end_turn", None), anthropic.usage(prompt_tokens=3, output_tokens=2)
    )
    assert msg["type"] == "message"
    assert msg["role"] == "assistant"
    assert msg["content"] == [{"type": "text", "text": "hello"}]
    assert msg["stop_reason"] == "end_turn"
    assert msg["usage"]["input_tokens"] == 3
    assert msg["usage"]["output_tokens"] == 2


def test_message_start_is_an_empty_message() -> None:
    start = anthropic.message_start("msg_1", "m", 7)
    assert start["type"] == "message_start"
    assert start["message"]["content"] == []
    assert start["message"]["stop_reason"] is None
    assert start["message"]["usage"]["input_tokens"] == 7


def test_message_delta_carries_stop_and_usage() -> None:
    delta = anthropic.message_delta(("stop_sequence", "END"), anthropic.usage(3, 5))
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert delta["usage"]["output_tokens"] == 5


def test_message_id_reuses_the_request_id() -> None:
    assert anthropic.message_id("chatcmpl-abc123") == "msg_abc123"


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (InvalidRequest("bad", param="x"), "invalid_request_error"),
        (PromptTooLong(600, 512), "invalid_request_error"),
        (AuthenticationFailed("no"), "authentication_error"),
        (ModelNotFound("no"), "not_found_error"),
        (QueueFull("busy"), "overloaded_error"),
        (TtftTimeout("slow"), "timeout_error"),
        (Cancelled("superseded"), "invalid_request_error"),
        (Cancelled("shutdown"), "api_error"),
    ],
)
def test_error_types(error: Any, kind: str) -> None:
    payload = anthropic.error_body(error)
    assert payload["type"] == "error"
    assert payload["error"]["type"] == kind
    assert payload["error"]["message"] == error.message
    assert payload["error"]["code"] == error.code


def test_error_keeps_the_details() -> None:
    payload = anthropic.error_body(PromptTooLong(600, 512))
    assert payload["error"]["n_prompt_tokens"] == 600
    assert payload["error"]["max_prompt_tokens"] == 512


# -- the route, in-process over the fake backend ----------------------------------------

FAKE_SCRIPT = (10, 11, 12)  # "t10 t11 t12 ", then end of generation
EXPECTED_SEQUENCE = [
    "message_start",
    "content_block_start",
    "ping",
    "content_block_delta",
    "content_block_delta",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
]


@dataclass
class Served:
    client: TestClient
    backend: FakeBackend
    engine: Engine


@pytest.fixture
def serve_fake(client_of) -> Callable[..., Awaitable[Served]]:
    async def make(backend: FakeBackend | None = None, **overrides: object) -> Served:
        backend = backend or FakeBackend(FAKE_SCRIPT)
        client = await client_of(backend, **overrides)
        return Served(client, backend, app_engine(client.app))

    return make


async def events_of(response: ClientResponse) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    parser = SSEParser()
    async for data in response.content.iter_any():
        for event in parser.feed(data):
            yield event.event or "", json.loads(event.data)
    for event in parser.close():
        yield event.event or "", json.loads(event.data)


async def all_events(response: ClientResponse) -> list[tuple[str, dict[str, Any]]]:
    return [event async for event in events_of(response)]


async def test_stream_event_sequence(serve_fake: Any) -> None:
    served = await serve_fake()
    response = await served.client.post("/v1/messages", json=body(stream=True))
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/event-stream")
    events = await all_events(response)
    assert [name for name, _ in events] == EXPECTED_SEQUENCE
    assert all(payload["type"] == name for name, payload in events)
    start = events[0][1]["message"]
    assert start["model"] == "fake"  # the served model, whatever was asked
    assert start["id"].startswith("msg_")
    text = "".join(p["delta"]["text"] for n, p in events if n == "content_block_delta")
    assert text == "t10 t11 t12 "
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 4  # three tokens and the end-of-generation one


async def test_non_streaming_message(serve_fake: Any) -> None:
    served = await serve_fake()
    response = await served.client.post("/v1/messages", json=body(max_tokens=2))
    message = await response.json()
    assert message["type"] == "message"
    assert message["content"] == [{"type": "text", "text": "t10 t11 "}]
    assert message["stop_reason"] == "max_tokens"
    assert message["usage"]["output_tokens"] == 2
    assert response.headers["X-Request-Id"].startswith("chatcmpl-")


@pytest.mark.parametrize("stops", [["t11"], ["zz", "t11"], ["t12", "1 t1"]])
async def test_stop_sequence(serve_fake: Any, stops: list[str]) -> None:
    served = await serve_fake()
    response = await served.client.post("/v1/messages", json=body(stop_sequences=stops))
    message = await response.json()
    assert message["stop_reason"] == "stop_sequence"
    assert message["stop_sequence"] == stops[-1]
    assert message["content"][0]["text"] == "t10 t11 t12 ".split(stops[-1], maxsplit=1)[0]


async def test_max_tokens_above_the_cap_is_lowered(serve_fake: Any) -> None:
    served = await serve_fake(max_tokens_cap=2)
    response = await served.client.post("/v1/messages", json=body(max_tokens=32000))
    assert (await response.json())["stop_reason"] == "max_tokens"


async def test_ignored_fields_are_reported(serve_fake: Any) -> None:
    served = await serve_fake()
    thinking = {"type": "enabled", "budget_tokens": 1024}
    response = await served.client.post("/v1/messages", json=body(thinking=thinking))
    assert response.status == 200
    assert response.headers["X-Edge-LLM-Ignored"] == "thinking"


async def test_bad_request_has_anthropics_error_shape(serve_fake: Any) -> None:
    served = await serve_fake()
    fields = body()
    del fields["max_tokens"]
    response = await served.client.post("/v1/messages", json=fields)
    assert response.status == 400
    payload = await response.json()
    assert payload["type"] == "error"
    assert payload["error"]["type"] == "invalid_request_error"
    assert payload["error"]["param"] == "max_tokens"
    bad_json = await served.client.post("/v1/messages", data=b"{")
    assert (await bad_json.json())["error"]["type"] == "invalid_request_error"


async def test_prompt_too_long_keeps_the_counts(serve_fake: Any) -> None:
    served = await serve_fake(max_prompt_tokens=8)
    response = await served.client.post("/v1/messages", json=body())
    payload = await response.json()
    assert response.status == 400
    assert payload["error"]["code"] == "prompt_too_long"
    assert payload["error"]["max_prompt_tokens"] == 8


async def test_backend_failure_before_any_byte_is_an_http_error(serve_fake: Any) -> None:
    backend = FakeBackend(FAKE_SCRIPT)
    backend.fail_slots = set(range(backend.max_sequences))
    served = await serve_fake(backend)
    response = await served.client.post("/v1/messages", json=body(stream=True))
    assert response.status == 500
    payload = await response.json()
    assert payload["error"]["type"] == "api_error"
    assert payload["error"]["code"] == "backend_error"


async def test_prefill_continues_the_assistant_turn(serve_fake: Any) -> None:
    served = await serve_fake()
    turns = [{"role": "user", "content": "count"}, {"role": "assistant", "content": "1, 2,"}]
    response = await served.client.post("/v1/messages", json=body(messages=turns))
    plain = await served.client.post("/v1/messages", json=body(messages=turns[:1]))
    with_prefill, without = await response.json(), await plain.json()

    # "<user>count<assistant>1, 2," against "<user>count<assistant>": five characters more
    def prompt(usage: dict[str, int]) -> int:  # cached tokens are counted apart, as Anthropic does
        return usage["input_tokens"] + usage["cache_read_input_tokens"]

    assert prompt(with_prefill["usage"]) == prompt(without["usage"]) + 5


async def test_pings_flow_while_no_token_does(serve_fake: Any) -> None:
    backend = FakeBackend(FAKE_SCRIPT)
    backend.gate = threading.Semaphore(0)  # no decode step until released
    served = await serve_fake(backend, heartbeat_interval_ms=20)
    response = await served.client.post("/v1/messages", json=body(stream=True))
    names = []
    async for name, _ in events_of(response):
        names.append(name)
        if names.count("ping") == 2:
            break
    assert names == ["message_start", "content_block_start", "ping", "ping"]
    backend.gate.release(1000)
    rest = [name async for name, _ in events_of(response)]
    assert rest[-3:] == ["content_block_stop", "message_delta", "message_stop"]


async def test_error_after_the_stream_started_is_an_error_event(serve_fake: Any) -> None:
    backend = FakeBackend(FAKE_SCRIPT)
    backend.gate = threading.Semaphore(2)  # prefill: two steps, the last prompt token alone
    served = await serve_fake(backend)
    session = {"stream": True, "max_tokens": 32}
    first = await served.client.post(
        "/v1/messages", json=body(**session), headers={"X-Session-Id": "user-1"}
    )
    events = events_of(first)
    names = [name async for name, _ in _until_first_delta(events)]
    assert names[-1] == "content_block_delta"
    second = asyncio.create_task(
        served.client.post("/v1/messages", json=body(**session), headers={"X-Session-Id": "user-1"})
    )
    rest = [event async for event in events]
    name, payload = rest[-1]
    assert name == "error"
    assert payload["type"] == "error"
    assert payload["error"]["code"] == "cancelled"
    assert payload["error"]["reason"] == "superseded"
    backend.gate.release(1000)
    (await second).close()


async def test_requests_of_one_metadata_user_run_side_by_side(serve_fake: Any) -> None:
    """metadata.user_id names a user, not a session: Claude Code sends all its
    requests with one (a side request beside the main one, parallel subagents), so
    none supersedes another; X-Session-Id does (above)."""
    backend = FakeBackend(FAKE_SCRIPT)
    backend.gate = threading.Semaphore(2)
    served = await serve_fake(backend)
    user = {"metadata": {"user_id": '{"device_id":"d","session_id":"s"}'}, "stream": True}
    first = await served.client.post("/v1/messages", json=body(**user))
    events = events_of(first)
    [name async for name, _ in _until_first_delta(events)]
    second = asyncio.create_task(served.client.post("/v1/messages", json=body(**user)))
    backend.gate.release(1000)
    assert [name async for name, _ in events][-1] == "message_stop"
    assert [name for name, _ in await all_events(await second)][-1] == "message_stop"


async def _until_first_delta(
    events: AsyncIterator[tuple[str, dict[str, Any]]],
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    async for name, payload in events:
        yield name, payload
        if name == "content_block_delta":
            return
