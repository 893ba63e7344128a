"""Sampling fields through the HTTP layer over the fake backend: what reaches the
engine, what is refused before admission, and the logprobs shapes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from fakes import FakeBackend

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.fixture
async def served(client_of) -> tuple[TestClient, FakeBackend]:
    backend = FakeBackend()
    return await client_of(backend), backend


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: {")]


async def test_json_schema_becomes_the_sequences_grammar(served) -> None:
    client, backend = served
    response_format = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
    response = await client.post(
        "/v1/chat/completions", json={**CHAT, "response_format": response_format}
    )
    assert response.status == 200
    (params,) = backend.params.values()
    assert params.grammar == "fake-grammar " + json.dumps(SCHEMA)


async def test_json_object_asks_for_any_object_and_text_for_no_grammar(served) -> None:
    client, backend = served
    for kind, grammar in (("json_object", "fake-grammar null"), ("text", None)):
        body = {**CHAT, "response_format": {"type": kind}}
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status == 200
        assert backend.last_params.grammar == grammar
    completion = {"prompt": "x", "max_tokens": 2, "response_format": {"type": "json_object"}}
    assert (await client.post("/v1/completions", json=completion)).status == 200
    assert backend.last_params.grammar == "fake-grammar null"


async def test_a_schema_that_cannot_be_converted_is_refused_before_admission(served) -> None:
    client, backend = served
    bad = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "strnig"}}}
    response = await client.post("/v1/chat/completions", json={**CHAT, "response_format": bad})
    assert response.status == 400
    error = (await response.json())["error"]
    assert error["param"] == "response_format"
    assert "strnig" in error["message"]
    assert backend.params == {}  # never reached the engine


async def test_logit_bias_on_a_token_outside_the_vocabulary_is_400(served) -> None:
    client, _ = served
    response = await client.post("/v1/chat/completions", json={**CHAT, "logit_bias": {"1000": 1}})
    assert response.status == 400
    assert (await response.json())["error"]["param"] == "logit_bias"


async def test_chat_logprobs_in_openais_shape(served) -> None:
    client, _ = served
    body = {**CHAT, "logprobs": True, "top_logprobs": 2}
    reply = await (await client.post("/v1/chat/completions", json=body)).json()
    choice = reply["choices"][0]
    content = choice["logprobs"]["content"]
    assert "".join(entry["token"] for entry in content) == choice["message"]["content"]
    first = content[0]
    assert first == {
        "token": "t10 ",
        "logprob": -0.25,
        "bytes": list(b"t10 "),
        "top_logprobs": [
            {"token": "t10 ", "logprob": -0.25, "bytes": list(b"t10 ")},
            {"token": "t11 ", "logprob": -0.5, "bytes": list(b"t11 ")},
        ],
    }
    plain = await (await client.post("/v1/chat/completions", json=CHAT)).json()
    assert plain["choices"][0]["logprobs"] is None


async def test_streamed_chat_logprobs_match_the_streamed_text(served) -> None:
    client, _ = served
    body = {**CHAT, "stream": True, "logprobs": True}
    events = _events(await (await client.post("/v1/chat/completions", json=body)).text())
    tokens, text = [], []
    for event in events:
        for choice in event["choices"]:
            text.append(choice["delta"].get("content") or "")
            if choice.get("logprobs"):
                tokens += [entry["token"] for entry in choice["logprobs"]["content"]]
                assert all(entry["top_logprobs"] == [] for entry in choice["logprobs"]["content"])
    assert len(tokens) == 3
    assert "".join(tokens) == "".join(text)


async def test_completions_logprobs_in_the_legacy_shape(served) -> None:
    client, _ = served
    body = {"prompt": "x", "max_tokens": 2, "temperature": 0, "logprobs": 1}
    reply = await (await client.post("/v1/completions", json=body)).json()
    logprobs = reply["choices"][0]["logprobs"]
    assert logprobs == {
        "tokens": ["t10 ", "t11 "],
        "token_logprobs": [-0.25, -0.25],
        "top_logprobs": [{"t10 ": -0.25}, {"t11 ": -0.25}],
        "text_offset": [0, 4],
    }
    stream = await client.post("/v1/completions", json={**body, "stream": True})
    offsets = [
        offset
        for event in _events(await stream.text())
        for choice in event["choices"]
        if choice["logprobs"]
        for offset in choice["logprobs"]["text_offset"]
    ]
    assert offsets == [0, 4]


async def test_penalties_and_bias_reach_the_sequence(served) -> None:
    client, backend = served
    body = {**CHAT, "presence_penalty": 1.5, "frequency_penalty": -0.5, "logit_bias": {"7": -100}}
    assert (await client.post("/v1/chat/completions", json=body)).status == 200
    params = backend.last_params
    assert (params.presence_penalty, params.frequency_penalty) == (1.5, -0.5)
    assert params.logit_bias == ((7, -100.0),)
