"""Forced tool calls with the real model (grammar-constrained sampling), through the
official openai and anthropic SDKs: the arguments always validate against the
function's schema, streamed pieces reassemble to the same call, and a full round
trip (call, result, answer) works on every API."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from conftest import EngineProcess, start_engine
from support import anthropic_sdk, openai_sdk, served_model

pytestmark = pytest.mark.e2e

PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
DESCRIPTION = "Current weather of a city"
CHAT_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": DESCRIPTION, "parameters": PARAMETERS},
}
RESPONSES_TOOL = {"type": "function", **CHAT_TOOL["function"]}
ANTHROPIC_TOOL = {"name": "get_weather", "description": DESCRIPTION, "input_schema": PARAMETERS}
QUESTION = "What is the weather in Paris?"
RESULT = "22 C, sunny"
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def engine_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """Tools make prompts of some 150 tokens: no TTFT timeout, so that a loaded
    machine (slow prefill) cannot fail these tests with a 504."""
    engine = start_engine(tmp_path_factory.mktemp("tools"), "--ttft-timeout-ms", "0")
    yield engine
    engine.stop()


def test_chat_required_call_validates_and_streams_the_same(engine_server: Any) -> None:
    model = served_model(engine_server)
    ask: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": QUESTION}],
        "tools": [CHAT_TOOL],
        "tool_choice": "required",
        "max_tokens": 64,
        **GREEDY,
    }
    with openai_sdk(engine_server) as client:
        whole = client.chat.completions.create(**ask)
        chunks = list(client.chat.completions.create(**ask, stream=True))
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), PARAMETERS)
    pieces = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert (pieces[0].id or "").startswith("call_") and pieces[0].function.name == "get_weather"
    assert all(p.id is None for p in pieces[1:])
    assert len(pieces) > 2  # the arguments arrive in pieces
    assert "".join(p.function.arguments or "" for p in pieces) == call.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_chat_named_function_round_trip(engine_server: Any) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    with openai_sdk(engine_server) as client:
        asked = client.chat.completions.create(
            model=served_model(engine_server),
            messages=messages,
            tools=[CHAT_TOOL],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            max_tokens=64,
            **GREEDY,
        )
        message = asked.choices[0].message
        (call,) = message.tool_calls or []
        messages += [
            message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": RESULT},
        ]
        answer = client.chat.completions.create(
            model=served_model(engine_server),
            messages=messages,
            tools=[CHAT_TOOL],
            max_tokens=32,
            **GREEDY,
        )
    jsonschema.validate(json.loads(call.function.arguments), PARAMETERS)
    # The history with the call and its result is accepted and answered. What the
    # 135M model answers with (text, or its call again: greedy picks either on a
    # near-tie, e.g. with speculation on) is the model's business, not the server's.
    reply = answer.choices[0]
    if reply.finish_reason == "tool_calls":
        assert reply.message.tool_calls and reply.message.tool_calls[0].function.name
    else:
        assert reply.message.content and reply.message.content.strip()
        assert reply.finish_reason in ("stop", "length")


def test_responses_forced_call_create_and_stream(engine_server: Any) -> None:
    ask: dict[str, Any] = {
        "model": served_model(engine_server),
        "input": QUESTION,
        "tools": [RESPONSES_TOOL],
        "tool_choice": "required",
        "max_output_tokens": 64,
        **GREEDY,
    }
    with openai_sdk(engine_server) as client:
        whole = client.responses.create(**ask)
        with client.responses.stream(**ask) as stream:
            events = list(stream)
            final = stream.get_final_response()
    call = whole.output[0]
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), PARAMETERS)
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert len(deltas) > 2
    assert "".join(deltas) == done.arguments == call.arguments
    streamed = final.output[0]
    assert streamed.type == "function_call" and streamed.arguments == call.arguments
    assert events[-1].type == "response.completed"


def test_responses_function_call_round_trip(engine_server: Any) -> None:
    with openai_sdk(engine_server) as client:
        asked = client.responses.create(
            input=QUESTION,
            tools=[RESPONSES_TOOL],
            tool_choice={"type": "function", "name": "get_weather"},
            max_output_tokens=64,
            **GREEDY,
        )
        call = asked.output[0]
        assert call.type == "function_call"
        result = {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}
        # From the stored conversation, and with the whole history as input.
        chained = client.responses.create(
            input=[result],
            previous_response_id=asked.id,
            tools=[RESPONSES_TOOL],
            tool_choice="none",
            max_output_tokens=32,
            **GREEDY,
        )
        history = [
            {"role": "user", "content": QUESTION},
            call.model_dump(exclude_none=True),
            result,
        ]
        explicit = client.responses.create(
            input=history,
            tools=[RESPONSES_TOOL],
            tool_choice="none",
            max_output_tokens=32,
            **GREEDY,
        )
    for answer in (chained, explicit):
        assert [item.type for item in answer.output] == ["message"]
        assert answer.output_text.strip()
    assert chained.usage is not None and explicit.usage is not None
    assert chained.usage.input_tokens == explicit.usage.input_tokens
    assert chained.output_text == explicit.output_text


def test_anthropic_tool_use_streamed_and_round_trip(engine_server: Any) -> None:
    ask: dict[str, Any] = {
        "model": "m",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": QUESTION}],
        "tools": [ANTHROPIC_TOOL],
        "tool_choice": {"type": "any"},
        "extra_body": GREEDY,
    }
    with anthropic_sdk(engine_server) as client:
        whole = client.messages.create(**ask)
        with client.messages.stream(**ask) as stream:
            events = list(stream)
            final = stream.get_final_message()
        (block,) = whole.content
        assert block.type == "tool_use"
        history = [
            *ask["messages"],
            {"role": "assistant", "content": [block.model_dump(exclude_none=True)]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": block.id, "content": RESULT}],
            },
        ]
        answer = client.messages.create(
            **{**ask, "messages": history, "tool_choice": {"type": "none"}}
        )
    assert whole.stop_reason == "tool_use"
    assert block.name == "get_weather" and block.id.startswith("toolu_")
    jsonschema.validate(block.input, PARAMETERS)
    partial = [
        e.delta.partial_json
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    assert len(partial) > 2
    assert json.loads("".join(partial)) == block.input
    assert final.content[0].type == "tool_use" and final.content[0].input == block.input
    assert final.stop_reason == "tool_use"
    assert [b.type for b in answer.content] == ["text"]
    assert answer.stop_reason in ("end_turn", "max_tokens")
