"""Anthropic tool use and count_tokens with the real model, through the official SDK."""

from __future__ import annotations

from typing import Any

import pytest

from support import anthropic_sdk

pytestmark = pytest.mark.e2e

GREEDY = {"temperature": 0}
WEATHER = {
    "name": "get_weather",
    "description": "Current weather of a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 40}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
QUESTION = {"role": "user", "content": "What is the weather in Paris?"}


def test_count_tokens_matches_the_prompt_a_message_uses(engine_server: Any) -> None:
    with anthropic_sdk(engine_server) as client:
        with_tools = client.messages.count_tokens(
            model="m", messages=[QUESTION], tools=[WEATHER], system="Be brief."
        )
        plain = client.messages.count_tokens(model="m", messages=[QUESTION], system="Be brief.")
        answer = client.messages.create(
            model="m",
            max_tokens=8,
            messages=[QUESTION],
            tools=[WEATHER],
            system="Be brief.",
            extra_body=GREEDY,
        )
    # As Anthropic counts: usage.input_tokens leaves out what the prefix cache read.
    cache_read = answer.usage.cache_read_input_tokens or 0
    assert with_tools.input_tokens == answer.usage.input_tokens + cache_read
    assert plain.input_tokens < with_tools.input_tokens


def test_tool_result_in_the_history_gets_an_answer(engine_server: Any) -> None:
    history = [
        QUESTION,
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "22 C, sunny"}
            ],
        },
    ]
    with anthropic_sdk(engine_server) as client:
        answer = client.messages.create(
            model="m",
            max_tokens=32,
            messages=history,
            tools=[WEATHER],
            tool_choice={"type": "none"},
            extra_body=GREEDY,
        )
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert [block.type for block in answer.content] == ["text"]
    assert answer.content[0].text.strip()
