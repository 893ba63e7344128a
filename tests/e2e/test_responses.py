"""POST /v1/responses with the real model, through the official openai SDK unchanged."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest

from support import RawSseClient, wait_until

pytestmark = pytest.mark.e2e

QUESTION = "Name the capital of France."
STORY = "Write a very long story about a dragon and a knight."
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather of a city",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 40},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}


def sdk(engine: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=engine.base_url, api_key="unused", max_retries=0)


def served_model(engine: Any) -> str:
    return str(engine.get_json("/v1/models")["data"][0]["id"])


def assert_weather_arguments(arguments: str) -> None:
    """Valid against WEATHER's parameters (checked by hand: two fields)."""
    parsed = json.loads(arguments)
    assert set(parsed) == {"city", "unit"}
    assert isinstance(parsed["city"], str) and len(parsed["city"]) <= 40
    assert parsed["unit"] in ("celsius", "fahrenheit")


def test_text_create_and_stream_agree(engine_server: Any) -> None:
    model = served_model(engine_server)
    with sdk(engine_server) as client:
        whole = client.responses.create(
            model=model, input=QUESTION, temperature=0, max_output_tokens=24
        )
        with client.responses.stream(
            model=model, input=QUESTION, temperature=0, max_output_tokens=24
        ) as stream:
            events = list(stream)
            final = stream.get_final_response()
    assert whole.status == "completed"
    assert "Paris" in whole.output_text
    assert whole.usage is not None and whole.usage.input_tokens > 0
    assert whole.usage.output_tokens > 0
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == final.output_text == whole.output_text
    numbers = [event.sequence_number for event in events]
    assert numbers == list(range(len(events)))


def test_max_output_tokens_makes_it_incomplete(engine_server: Any) -> None:
    with sdk(engine_server) as client:
        response = client.responses.create(input=STORY, temperature=0, max_output_tokens=5)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.output_tokens == 5


def test_previous_response_id_continues_the_stored_conversation(engine_server: Any) -> None:
    with sdk(engine_server) as client:
        first = client.responses.create(
            input="My name is Ada.", instructions="Be brief.", temperature=0, max_output_tokens=16
        )
        second = client.responses.create(
            input="What is my name?",
            previous_response_id=first.id,
            temperature=0,
            max_output_tokens=16,
        )
        alone = client.responses.create(
            input="What is my name?", temperature=0, max_output_tokens=16, store=False
        )
        with pytest.raises(openai.NotFoundError) as missing:
            client.responses.create(input="x", previous_response_id=alone.id)
    assert first.usage is not None and second.usage is not None and alone.usage is not None
    # The earlier turns (question and answer) are in the second prompt; the first's
    # instructions are not carried over.
    carried = second.usage.input_tokens - alone.usage.input_tokens
    assert carried >= first.usage.output_tokens + 4
    error = missing.value.body
    assert isinstance(error, dict)
    assert error["param"] == "previous_response_id"


def test_forced_function_call_create_and_stream(engine_server: Any) -> None:
    model = served_model(engine_server)
    ask = {
        "model": model,
        "input": "What is the weather in Paris?",
        "tools": [WEATHER],
        "tool_choice": "required",
        "temperature": 0,
        "max_output_tokens": 64,
    }
    with sdk(engine_server) as client:
        whole = client.responses.create(**ask)
        with client.responses.stream(**ask) as stream:
            events = list(stream)
            final = stream.get_final_response()
    call = whole.output[0]
    assert call.type == "function_call"
    assert call.name == "get_weather"
    assert call.call_id.startswith("call_")
    assert_weather_arguments(call.arguments)
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) > 1  # streamed as generated, not in one piece
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert "".join(deltas) == done.arguments == call.arguments
    streamed = final.output[0]
    assert streamed.type == "function_call"
    assert streamed.arguments == call.arguments
    assert [e.type for e in events][-1] == "response.completed"


def test_function_call_round_trip(engine_server: Any) -> None:
    with sdk(engine_server) as client:
        asked = client.responses.create(
            input="What is the weather in Paris?",
            tools=[WEATHER],
            tool_choice={"type": "function", "name": "get_weather"},
            temperature=0,
            max_output_tokens=64,
        )
        call = asked.output[0]
        assert call.type == "function_call"
        result = {"type": "function_call_output", "call_id": call.call_id, "output": "22 C, sunny"}
        # Once from the stored conversation, once with the whole history as input.
        chained = client.responses.create(
            input=[result],
            previous_response_id=asked.id,
            tools=[WEATHER],
            tool_choice="none",
            temperature=0,
            max_output_tokens=32,
        )
        history = [
            {"role": "user", "content": "What is the weather in Paris?"},
            call.model_dump(exclude_none=True),
            result,
        ]
        explicit = client.responses.create(
            input=history, tools=[WEATHER], tool_choice="none", temperature=0, max_output_tokens=32
        )
    for answer in (chained, explicit):
        assert [item.type for item in answer.output] == ["message"]
        assert answer.output_text.strip()
    assert chained.output_text == explicit.output_text
    assert chained.usage is not None and explicit.usage is not None
    assert chained.usage.input_tokens == explicit.usage.input_tokens


async def test_stalled_reader_pauses_and_disconnect_frees_kv(engine_server: Any) -> None:
    body = {"input": STORY, "max_output_tokens": 400, "temperature": 0, "stream": True}
    slow = RawSseClient(engine_server.url, body, path="/v1/responses")
    try:
        stream_id = slow.request_id()
        stalled = await wait_until(
            lambda: (s := engine_server.stream(stream_id))["state"] == "paused" and s,
            timeout=240,  # some 130 tokens fill the buffers: minutes on a loaded machine
            what="the unread Responses stream to pause",
        )
        assert stalled["pause_cause"] == "socket_full"
        await asyncio.sleep(0.5)  # give a stream that ignored the pause time to show it
        assert engine_server.stream(stream_id)["n_generated"] == stalled["n_generated"]
    finally:
        slow.close()
    ended = await wait_until(
        lambda: (s := engine_server.stream(stream_id))["state"] == "cancelled" and s,
        what="the abandoned stream to be cancelled",
    )
    assert ended["cancel_reason"] == "disconnect"
    assert b"event: response.output_text.delta" in slow.received
    await wait_until(
        lambda: engine_server.debug_streams()["kv_used_bytes"] == 0, what="its KV freed"
    )
