"""A request's priority class as the APIs and the configuration give it (no server)."""

from __future__ import annotations

from typing import Any

import pytest

from edge_llm.config.tree import ConfigError, load_config
from edge_llm.errors import InvalidRequest
from edge_llm.protocol import anthropic, openai, responses
from edge_llm.protocol.priority import header_priority
from edge_llm.upstream.router import upstream_body
from edge_llm.upstream.translate import messages_chat_body, responses_chat_body

CHAT: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}]}
MESSAGES: dict[str, Any] = {**CHAT, "model": "claude", "max_tokens": 8}


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, None),
        ({"priority": -10}, -10),
        ({"priority": 10}, 10),
        ({"service_tier": "priority"}, -1),
        ({"service_tier": "scale"}, -1),
        ({"service_tier": "auto"}, 0),
        ({"service_tier": "default"}, 0),
        ({"service_tier": "flex"}, 1),
        ({"service_tier": "flex", "priority": -3}, -3),  # the number is the more precise
    ],
)
def test_openai_bodies_map_priority_and_service_tier(fields: dict[str, Any], expected: Any) -> None:
    chat = openai.parse_request(openai.ChatCompletionRequest, {**CHAT, **fields})
    text = openai.parse_request(openai.CompletionRequest, {"prompt": "hi", **fields})
    response = responses.parse({"input": "hi", **fields})
    assert chat.explicit_priority == text.explicit_priority == expected
    assert response.explicit_priority == expected


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, None),
        ({"service_tier": "auto"}, 0),
        ({"service_tier": "standard_only"}, 1),
        ({"service_tier": "standard_only", "priority": -2}, -2),
    ],
)
def test_anthropic_tiers_map_onto_classes(fields: dict[str, Any], expected: Any) -> None:
    assert anthropic.parse_request({**MESSAGES, **fields}).explicit_priority == expected


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"priority": 11}, "priority"),
        ({"priority": -11}, "priority"),
        ({"priority": "1"}, "priority"),
        ({"priority": 1.0}, "priority"),
        ({"priority": True}, "priority"),
        ({"service_tier": "turbo"}, "service_tier"),
        ({"service_tier": 0}, "service_tier"),
        ({"return_progress": "yes"}, "return_progress"),
        ({"stream_options": {"include_progress": 1}}, "stream_options.include_progress"),
    ],
)
def test_bad_values_name_the_field(fields: dict[str, Any], param: str) -> None:
    text: dict[str, Any] = {"prompt": "hi"}
    for model, body in ((openai.ChatCompletionRequest, CHAT), (openai.CompletionRequest, text)):
        with pytest.raises(InvalidRequest) as caught:
            openai.parse_request(model, {**body, **fields})
        assert caught.value.param == param


def test_anthropic_refuses_openai_tiers_and_bad_priorities() -> None:
    for fields, param in (
        ({"service_tier": "priority"}, "service_tier"),
        ({"priority": 99}, "priority"),
    ):
        with pytest.raises(InvalidRequest) as caught:
            anthropic.parse_request({**MESSAGES, **fields})
        assert caught.value.param == param


def test_responses_refuses_an_unknown_tier() -> None:
    with pytest.raises(InvalidRequest) as caught:
        responses.parse({"input": "hi", "service_tier": "standard_only"})
    assert caught.value.param == "service_tier"


def test_progress_is_asked_by_either_name() -> None:
    def wants(fields: dict[str, Any]) -> bool:
        return openai.parse_request(
            openai.ChatCompletionRequest, {**CHAT, **fields}
        ).include_progress

    assert not wants({})
    assert wants({"return_progress": True})
    assert wants({"stream_options": {"include_progress": True}})
    assert not wants({"stream_options": {"include_usage": True}})


@pytest.mark.parametrize(("text", "expected"), [(None, None), ("3", 3), (" -10 ", -10), ("+2", 2)])
def test_the_header_gives_a_class(text: str | None, expected: int | None) -> None:
    assert header_priority(text) == expected


@pytest.mark.parametrize("text", ["high", "", "11", "-11", "1_0", "٣", "1.5", "0x1"])
def test_a_bad_header_is_refused_naming_it(text: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        header_priority(text)
    assert caught.value.param == "X-Priority"
    assert caught.value.status == 400


def test_relays_keep_the_priority_field() -> None:
    chat = {**CHAT, "priority": 4, "service_tier": "flex"}
    assert upstream_body(chat)["priority"] == 4
    assert upstream_body(chat)["service_tier"] == "flex"
    progress = {**chat, "return_progress": True, "stream_options": {"include_progress": True}}
    relayed = upstream_body(progress)
    assert "return_progress" not in relayed  # between the client and this server only
    assert relayed["stream_options"] == {"include_usage": True}
    reply = responses.parse({"input": "hi", "priority": -1, "service_tier": "priority"})
    body = responses_chat_body(reply, reply.input_messages())
    assert (body["priority"], body["service_tier"]) == (-1, "priority")
    assert "priority" not in responses_chat_body(*_plain_responses())
    message = anthropic.parse_request({**MESSAGES, "priority": 2, "service_tier": "standard_only"})
    body = messages_chat_body(message, None)
    assert body["priority"] == 2
    assert "service_tier" not in body  # Anthropic's tiers are not chat's


def _plain_responses() -> tuple[responses.ResponsesRequest, list[dict[str, Any]]]:
    req = responses.parse({"input": "hi"})
    return req, req.input_messages()


# -- the defaults in the configuration --------------------------------------------------


def test_defaults_load_from_flags_env_and_toml(tmp_path) -> None:
    path = tmp_path / "engine.toml"
    path.write_text('[server]\napi_key = ["sk-a=="]\nkey_priority = ["sk-a===3"]\n')
    env = {"EDGE_LLM_ROUTE_PRIORITY": "/v1/completions=5, /v1/stream=-1"}
    server = load_config(path, env=env).server
    assert server.route_priorities() == {"/v1/completions": 5, "/v1/stream": -1}
    assert server.key_priorities() == {"sk-a==": 3}  # the number is after the last "="
    flagged = load_config(None, env={}, overrides={"route_priority": ["/v1/messages=2"]})
    assert flagged.server.route_priorities() == {"/v1/messages": 2}


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"route_priority": ["/v1/chat/completions=eleven"]}, "'/v1/chat/completions=eleven'"),
        ({"route_priority": ["/v1/chat/completions=11"]}, "'/v1/chat/completions=11'"),
        ({"route_priority": ["/v1/chat/completions"]}, "'/v1/chat/completions'"),
        ({"route_priority": ["/v1/models=1"]}, "'/v1/models' is not a route"),
        ({"route_priority": ["=1"]}, "'=1'"),
        ({"api_key": ["a"], "key_priority": ["b=1"]}, "key 'b' is not one of api_key"),
        ({"key_priority": ["b=11"]}, "'b=11'"),
    ],
)
def test_a_bad_default_names_the_entry_and_the_key(overrides: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, env={}, overrides=overrides)
    message = str(caught.value)
    assert named in message
    key = "key_priority" if "key_priority" in overrides else "route_priority"
    assert f"server.{key}" in message
