"""max_tokens as an upper bound on every API, prompts that cannot fit, and the
sampling a request gets for the fields it leaves out (in-process, fake backend)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from edge_llm.protocol.sampling import SamplingParams

from fakes import FakeBackend

CHAT = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0}
N_CHAT_PROMPT = len("<user>hi<assistant>")  # the fake tokenizer: one token per character
ANTHROPIC = {"model": "claude-x", "messages": [{"role": "user", "content": "hi"}]}


class RecordingBackend(FakeBackend):
    """Remembers the sampling each sequence was started with."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.started: list[SamplingParams] = []

    def start_sequence(self, slot: int, params: SamplingParams) -> None:
        self.started.append(params)
        super().start_sequence(slot, params)


@dataclasses.dataclass
class Served:
    client: TestClient
    backend: RecordingBackend
    events: list[tuple[str, str, dict[str, Any]]]


@pytest.fixture
def serve(client_of) -> Callable[..., Awaitable[Served]]:
    async def make(backend: RecordingBackend | None = None, **overrides: object) -> Served:
        backend = backend or RecordingBackend()
        events: list[tuple[str, str, dict[str, Any]]] = []

        def record(event: str, request_id: str | None = None, **fields: Any) -> None:
            events.append((event, request_id or "", fields))

        client = await client_of(backend, events=record, **overrides)
        return Served(client, backend, events)

    return make


def clamp_events(served: Served) -> list[dict[str, Any]]:
    return [fields for event, _, fields in served.events if event == "max_tokens_clamped"]


async def test_max_tokens_beyond_the_context_is_lowered_and_reported(serve: Any) -> None:
    served = await serve(max_prompt_tokens=4000)
    response = await served.client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 3000})
    assert response.status == 200
    room = 2048 - N_CHAT_PROMPT  # the fake model's n_ctx_train is 2048
    assert response.headers["X-Max-Tokens-Clamped"] == str(room)
    assert clamp_events(served) == [{"requested": 3000, "max_tokens": room, "limit": "context"}]


async def test_max_tokens_above_the_cap_is_clamped_in_a_stream(serve: Any) -> None:
    served = await serve(max_tokens_cap=3)
    body = {**CHAT, "max_tokens": 32000, "stream": True}
    response = await served.client.post("/v1/chat/completions", json=body)
    assert response.status == 200
    assert response.headers["X-Max-Tokens-Clamped"] == "3"
    text = await response.text()
    finals = [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: {")]
    assert finals[-1]["choices"][0]["finish_reason"] == "length"
    assert clamp_events(served)[0]["limit"] == "max_tokens_cap"


async def test_max_tokens_beyond_one_sequences_kv_is_lowered(serve: Any) -> None:
    served = await serve(RecordingBackend(kv_capacity_tokens=300))
    body = {"prompt": "abc", "max_tokens": 999}
    response = await served.client.post("/v1/completions", json=body)
    assert response.status == 200
    assert response.headers["X-Max-Tokens-Clamped"] == str(300 - 3)
    assert clamp_events(served)[0]["limit"] == "kv"


async def test_a_max_tokens_that_fits_is_not_reported(serve: Any) -> None:
    served = await serve()
    response = await served.client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 3})
    assert response.status == 200
    assert "X-Max-Tokens-Clamped" not in response.headers
    assert clamp_events(served) == []


async def test_anthropic_max_tokens_32000_is_granted_what_fits(serve: Any) -> None:
    served = await serve(max_tokens_cap=2)
    response = await served.client.post("/v1/messages", json={**ANTHROPIC, "max_tokens": 32000})
    assert response.status == 200
    assert response.headers["X-Max-Tokens-Clamped"] == "2"
    assert (await response.json())["stop_reason"] == "max_tokens"


async def test_prompt_with_no_room_in_the_context_is_prompt_too_long(serve: Any) -> None:
    served = await serve(max_prompt_tokens=100000)
    long_prompt = "x" * 2100
    response = await served.client.post("/v1/completions", json={"prompt": long_prompt})
    assert response.status == 400
    error = (await response.json())["error"]
    assert error["code"] == "prompt_too_long"
    assert (error["n_prompt_tokens"], error["max_prompt_tokens"]) == (2100, 2047)
    assert error["limited_by"] == "context"
    assert "more than the model's context leaves room for (2047)" in error["message"]
    assert error["message"].endswith("or serve a model with a longer context")


async def test_prompt_too_long_names_the_server_setting_that_raises_it(serve: Any) -> None:
    served = await serve(max_prompt_tokens=10)
    response = await served.client.post("/v1/chat/completions", json=CHAT)
    assert response.status == 400
    error = (await response.json())["error"]
    assert (error["n_prompt_tokens"], error["max_prompt_tokens"]) == (N_CHAT_PROMPT, 10)
    assert error["limited_by"] == "max_prompt_tokens"
    message = error["message"]
    assert f"prompt has {N_CHAT_PROMPT} tokens, more than max_prompt_tokens (10)" in message
    assert "shorten the prompt (nothing is truncated)" in message
    for knob in ("--max-prompt-tokens", "EDGE_LLM_MAX_PROMPT_TOKENS", "[engine.backpressure]"):
        assert knob in message


async def test_a_prompt_over_one_sequences_kv_share_names_the_kv_budget(serve: Any) -> None:
    served = await serve(RecordingBackend(kv_capacity_tokens=300))
    response = await served.client.post("/v1/completions", json={"prompt": "x" * 400})
    error = (await response.json())["error"]
    assert (error["limited_by"], error["max_prompt_tokens"]) == ("kv", 299)
    assert "--max-kv-cache-mb" in error["message"]
    assert "EDGE_LLM_MAX_KV_CACHE_MB" in error["message"]


async def test_anthropic_prompt_too_long_names_both_counts(serve: Any) -> None:
    served = await serve(max_prompt_tokens=10)
    response = await served.client.post("/v1/messages", json={**ANTHROPIC, "max_tokens": 5})
    assert response.status == 400
    error = (await response.json())["error"]
    assert error["code"] == "prompt_too_long"
    assert (error["n_prompt_tokens"], error["max_prompt_tokens"]) == (N_CHAT_PROMPT, 10)
    assert f"prompt has {N_CHAT_PROMPT} tokens" in error["message"]


async def test_sampling_left_out_gets_the_engine_defaults(serve: Any) -> None:
    served = await serve(default_temperature=0.3, default_top_p=0.8)
    body = {"messages": CHAT["messages"], "max_tokens": 2, "top_p": 0.5}
    assert (await served.client.post("/v1/chat/completions", json=body)).status == 200
    anthropic = {**ANTHROPIC, "max_tokens": 2}
    assert (await served.client.post("/v1/messages", json=anthropic)).status == 200
    given = [(p.temperature, p.top_p) for p in served.backend.started]
    assert given == [(0.3, 0.5), (0.3, 0.8)]


async def test_the_models_recommended_sampling_comes_first(serve: Any) -> None:
    backend = RecordingBackend()
    recommended = {"temperature": 0.6, "top_k": 20.0}
    backend.info = dataclasses.replace(backend.info, recommended_sampling=recommended)
    served = await serve(backend, default_temperature=0.3)
    for temperature in (None, 0.0):
        body: dict[str, Any] = {"messages": CHAT["messages"], "max_tokens": 2}
        if temperature is not None:
            body["temperature"] = temperature
        assert (await served.client.post("/v1/chat/completions", json=body)).status == 200
    first, second = served.backend.started
    assert (first.temperature, first.top_p, first.top_k) == (0.6, 0.9, 20)
    assert second.greedy  # temperature 0 stays greedy whatever the defaults


async def test_anthropic_output_format_is_enforced_by_a_grammar(serve: Any) -> None:
    served = await serve()
    schema = {"type": "object", "properties": {"title": {"type": "string"}}}
    output_config = {"effort": "high", "format": {"type": "json_schema", "schema": schema}}
    body = {**ANTHROPIC, "max_tokens": 2, "output_config": output_config}
    response = await served.client.post("/v1/messages", json=body)
    assert response.status == 200
    assert served.backend.started[-1].grammar == "fake-grammar " + json.dumps(schema)
    bad = {**output_config, "format": {"type": "json_schema", "schema": {"type": "tuple"}}}
    refused = await served.client.post("/v1/messages", json={**body, "output_config": bad})
    assert refused.status == 400
    assert (await refused.json())["error"]["param"] == "output_config.format"
