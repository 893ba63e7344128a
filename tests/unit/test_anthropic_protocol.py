"""Anthropic Messages request validation and response objects (no server)."""

from __future__ import annotations

from typing import Any

import pytest

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


def test_sampling_and_session() -> None:
    req = anthropic.parse_request(
        body(
            temperature=0,
            top_p=0.9,
            top_k=40,
            stop_sequences=["\n\n", "END"],
            metadata={"user_id": "u-1"},
        )
    )
    params = req.sampling()
    assert (params.temperature, params.top_p, params.top_k) == (0.0, 0.9, 40)
    assert params.stop == ("\n\n", "END")
    assert req.session == "u-1"


def test_default_temperature_is_anthropics() -> None:
    assert anthropic.parse_request(body()).sampling().temperature == 1.0


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
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
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
    assert req.ignored() == ["tools", "thinking", "cache_control"]


# -- stop reasons ------------------------------------------------------------------


def test_length_is_max_tokens() -> None:
    reason = anthropic.stop_reason("length", end_of_generation=False, stops=(), last_text="x")
    assert reason == ("max_tokens", None)


def test_end_of_generation_is_end_turn_even_with_stops() -> None:
    reason = anthropic.stop_reason("stop", end_of_generation=True, stops=("END",), last_text="")
    assert reason == ("end_turn", None)


def test_stop_string_is_stop_sequence() -> None:
    reason = anthropic.stop_reason("stop", end_of_generation=False, stops=("END",), last_text="D")
    assert reason == ("stop_sequence", "END")


@pytest.mark.parametrize(
    ("stops", "last_text", "expected"),
    [
        (("foo", "bar"), "bar", "bar"),
        (("foo", "bar"), "ar", "bar"),  # "b" was held back as the start of "bar"
        (("foo", "bar"), "o.", "foo"),
        (("foo", "bar"), "xyz", None),
    ],
)
def test_which_stop_sequence_matched(
    stops: tuple[str, ...], last_text: str, expected: str | None
) -> None:
    assert anthropic.matched_stop(stops, last_text) == expected


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
