"""The request dialects of vLLM, SGLang and llama-server (SPEC section 20): the logit
rules on a logits vector, the fields through the HTTP layer over the fake backend,
and the refusals that name the field. The real model's behaviour is in
tests/e2e/test_dialects_e2e.py."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from aiohttp.test_utils import TestClient

from edge_llm.engine.runtime.logits import EndHold, LogitRules, RepetitionPenalty
from edge_llm.errors import InvalidRequest
from edge_llm.protocol import openai
from edge_llm.protocol.sampling import SamplingDefaults, SamplingParams

from fakes import FakeBackend, text_script

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0}
# What SGLang Model Gateway 0.3.2 adds to every chat request (NOTES.md, 2026-12-06).
SGLANG_GATEWAY_DEFAULTS = {
    "no_stop_trim": False,
    "ignore_eos": False,
    "continue_final_message": False,
    "skip_special_tokens": True,
    "separate_reasoning": True,
    "stream_reasoning": True,
    "return_hidden_states": False,
    "logprobs": False,
}


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: {")]


# -- logit rules ---------------------------------------------------------------------


def test_the_repetition_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    penalty = RepetitionPenalty(2.0, prompt_tokens=[0], n_vocab=4)
    logits = np.array([4.0, -1.0, 3.0, 1.0], dtype=np.float32)
    penalty.apply(logits)
    assert logits.tolist() == [2.0, -1.0, 3.0, 1.0]  # only the prompt's token so far
    penalty.accept(1)
    penalty.apply(logits)
    assert logits.tolist() == [1.0, -2.0, 3.0, 1.0]


def test_min_tokens_holds_off_end_and_stop_tokens_then_lets_them_through() -> None:
    hold = EndHold(SamplingParams(min_tokens=2, stop_token_ids=(3,)), end_tokens=[0])
    for _ in range(2):
        logits = np.zeros(4, dtype=np.float32)
        hold.apply(logits)
        assert logits.tolist() == [-np.inf, 0.0, 0.0, -np.inf]
        hold.accept(1)
    logits = np.zeros(4, dtype=np.float32)
    hold.apply(logits)
    assert logits.tolist() == [0.0, 0.0, 0.0, 0.0]


def test_ignore_eos_bans_end_tokens_always_but_not_stop_token_ids() -> None:
    hold = EndHold(SamplingParams(ignore_eos=True, stop_token_ids=(3,)), end_tokens=[0, 2])
    for _ in range(50):
        hold.accept(1)
    logits = np.ones(4, dtype=np.float32)
    hold.apply(logits)
    assert logits.tolist() == [-np.inf, 1.0, -np.inf, 1.0]


def test_logit_rules_hold_end_tokens_after_a_bias_that_favours_them() -> None:
    params = SamplingParams(ignore_eos=True, logit_bias=((0, 100.0),))
    rules = LogitRules(params, n_vocab=4, end_tokens=[0])
    logits = np.zeros(4, dtype=np.float32)
    rules.apply(logits)
    assert logits[0] == -np.inf
    assert not LogitRules(SamplingParams(), n_vocab=4, end_tokens=[0])


# -- protocol ------------------------------------------------------------------------


def _chat(**fields: Any) -> openai.ChatCompletionRequest:
    return openai.parse_request(openai.ChatCompletionRequest, {**CHAT, **fields})


def test_the_dialect_fields_reach_the_sampling_params() -> None:
    params = _chat(
        ignore_eos=True, min_tokens=3, repeat_penalty=1.3, stop_token_ids=[7, 9],
        include_stop_str_in_output=True, skip_special_tokens=False, top_k=-1,
    ).sampling(SamplingDefaults())  # fmt: skip
    assert params.ignore_eos and params.min_tokens == 3
    assert params.repetition_penalty == 1.3
    assert params.stop_token_ids == (7, 9)
    assert params.include_stop_str and not params.skip_special_tokens
    assert params.top_k == 0  # vLLM's -1: no top-k
    assert _chat(no_stop_trim=True).sampling(SamplingDefaults()).include_stop_str


def test_the_gateway_and_guidellm_defaults_are_accepted() -> None:
    req = _chat(
        **SGLANG_GATEWAY_DEFAULTS, max_completion_tokens=5, cache_prompt=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}, stream=True,
    )  # fmt: skip
    assert req.requested_max_tokens == 5
    assert req.continuous_usage
    assert req.sampling(SamplingDefaults()) == _chat().sampling(SamplingDefaults())


REFUSED: list[tuple[dict[str, Any], str, str]] = [
    ({"return_hidden_states": True}, "return_hidden_states", "hidden states"),
    ({"cache_prompt": "false"}, "cache_prompt", "valid boolean"),
    ({"min_tokens": 9}, "min_tokens", "above max_tokens"),
    ({"repetition_penalty": 1.2, "repeat_penalty": 1.3}, "repeat_penalty", "give one"),
    ({"repetition_penalty": 0}, "repetition_penalty", "greater than or equal"),
    ({"ignore_eos": True, "response_format": {"type": "json_object"}}, "ignore_eos", "grammar"),
    ({"min_tokens": 2, "response_format": {"type": "json_object"}}, "min_tokens", "grammar"),
    ({"add_generation_prompt": False}, "add_generation_prompt", "continue_final_message"),
    ({"continue_final_message": True}, "continue_final_message", "assistant"),
    ({"stop_token_ids": [-1]}, "stop_token_ids.0", "greater than"),
    ({"stop_token_ids": list(range(65))}, "stop_token_ids", "at most 64"),
    ({"min_tokens": "3"}, "min_tokens", "valid integer"),
    ({"ignore_eos": "yes"}, "ignore_eos", "valid boolean"),
    (
        {"stream_options": {"continuous_usage_stats": 1}},
        "stream_options.continuous_usage_stats",
        "",
    ),
    ({"not_a_dialect_field": True}, "not_a_dialect_field", "unknown field"),
]


@pytest.mark.parametrize(("fields", "param", "why"), REFUSED)
def test_a_value_that_cannot_be_honoured_is_a_400_naming_the_field(
    fields: dict[str, Any], param: str, why: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        _chat(**fields).tool_setup()
    assert caught.value.param == param
    assert why in caught.value.message


def test_continuing_needs_no_generation_prompt_and_both_true_is_refused() -> None:
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello the"}]
    req = _chat(messages=history, continue_final_message=True, add_generation_prompt=False)
    assert req.prefill == "Hello the"
    assert [m["role"] for m in req.chat_messages()] == ["user"]
    assert _chat(messages=history, continue_final_message=True).prefill == "Hello the"
    with pytest.raises(InvalidRequest, match="cannot be true"):
        _chat(messages=history, continue_final_message=True, add_generation_prompt=True)


def test_a_forced_tool_call_cannot_wait_for_held_end_tokens() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    req = _chat(tools=[tool], tool_choice="required", ignore_eos=True)
    with pytest.raises(InvalidRequest) as caught:
        req.tool_setup()
    assert caught.value.param == "ignore_eos"
    assert _chat(tools=[tool], ignore_eos=True).tool_setup() is not None  # auto: no grammar


def test_completions_take_max_completion_tokens_and_logprobs_false() -> None:
    body = {"prompt": "x", "max_completion_tokens": 4, "logprobs": False, "ignore_eos": True}
    req = openai.parse_request(openai.CompletionRequest, body)
    assert req.requested_max_tokens == 4
    assert req.n_logprobs is None


# -- through the HTTP layer ------------------------------------------------------------


@pytest.fixture
async def served(client_of) -> tuple[TestClient, FakeBackend]:
    backend = FakeBackend()
    return await client_of(backend), backend


async def test_a_stop_token_id_ends_the_answer_without_its_text(served) -> None:
    client, _ = served  # the fake writes tokens 10, 11, 12... as "t10 t11 t12 "
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", {"prompt": "x"})):
        response = await client.post(path, json={**body, "max_tokens": 8, "stop_token_ids": [12]})
        assert response.status == 200
        reply = await response.json()
        choice = reply["choices"][0]
        assert choice.get("text", choice.get("message", {}).get("content")) == "t10 t11 "
        assert choice["finish_reason"] == "stop"
        assert reply["usage"]["completion_tokens"] == 3


async def test_cache_prompt_false_reuses_no_cached_cell_and_keeps_its_own(served) -> None:
    """llama-server's meaning: the prompt is computed whole (0 cached tokens) and
    kept, so that the same prompt with cache_prompt true (or absent) reuses it."""
    client, _ = served
    prompt = {"prompt": "a prompt of several words, computed once or twice", "max_tokens": 2}
    cached = []
    for flag in (None, False, False, True, None):
        body = prompt if flag is None else {**prompt, "cache_prompt": flag}
        response = await client.post("/v1/completions", json=body)
        assert response.status == 200
        cached.append((await response.json())["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert cached[:3] == [0, 0, 0]
    assert cached[3] > 0 and cached[4] > 0


async def test_a_stop_token_id_outside_the_vocabulary_is_a_400(served) -> None:
    client, backend = served
    response = await client.post("/v1/chat/completions", json={**CHAT, "stop_token_ids": [5000]})
    assert response.status == 400
    error = (await response.json())["error"]
    assert error["param"] == "stop_token_ids"
    assert "not in the vocabulary" in error["message"]
    assert backend.params == {}


async def test_include_stop_str_in_output_keeps_the_stop_string(client_of) -> None:
    client = await client_of(FakeBackend(text_script("one, two. three")))
    body = {**CHAT, "max_tokens": 20, "stop": ["."]}
    for extra, text in (({}, "one, two"), ({"include_stop_str_in_output": True}, "one, two.")):
        for stream in (False, True):
            response = await client.post(
                "/v1/chat/completions", json={**body, **extra, "stream": stream}
            )
            assert response.status == 200
            if stream:
                chunks = _events(await response.text())
                got = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
            else:
                got = (await response.json())["choices"][0]["message"]["content"]
            assert got == text
    reply = await client.post("/v1/chat/completions", json={**body, "no_stop_trim": True})
    assert (await reply.json())["choices"][0]["message"]["content"] == "one, two."


async def test_continuous_usage_stats_puts_usage_on_every_chunk(served) -> None:
    client, _ = served
    options = {"include_usage": True, "continuous_usage_stats": True}
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", {"prompt": "x"})):
        response = await client.post(
            path, json={**body, "max_tokens": 4, "stream": True, "stream_options": options}
        )
        assert response.status == 200
        chunks = _events(await response.text())
        assert chunks and all("usage" in chunk for chunk in chunks)
        counts = [chunk["usage"]["completion_tokens"] for chunk in chunks]
        assert counts == sorted(counts)
        assert counts[-1] == 4
        assert chunks[-1]["choices"] == []  # include_usage's final chunk as well
    plain = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert not any("usage" in chunk for chunk in _events(await plain.text()))


async def test_the_gateway_body_is_answered(served) -> None:
    client, backend = served
    body = {**CHAT, **SGLANG_GATEWAY_DEFAULTS, "max_completion_tokens": 4}
    del body["max_tokens"]
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status == 200, await response.text()
    assert (await response.json())["usage"]["completion_tokens"] == 4
    assert backend.last_params.ignore_eos is False
