"""The request dialects of vLLM, SGLang and llama-server against the real model
(issue 43): each implemented field does what it says, and the bodies guidellm and
SGLang Model Gateway send are answered. guidellm itself needs torch and runs from a
virtualenv of its own in benchmarks/guidellm_scenarios.py; here its request bodies
are sent as it sends them (NOTES.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import llama_cpp
import pytest

from edge_llm.engine.runtime.llama_backend import default_model_path

pytestmark = pytest.mark.e2e

QUESTION = "Name the capital of France."
SHORT = "Say hello."


@pytest.fixture(scope="module")
def http(engine_server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=engine_server.url, timeout=300) as client:
        yield client


@pytest.fixture(scope="module")
def vocab() -> llama_cpp.Llama:
    return llama_cpp.Llama(model_path=str(default_model_path()), vocab_only=True, verbose=False)


def chat(http: httpx.Client, content: str = SHORT, **fields: Any) -> dict[str, Any]:
    body = {"messages": [{"role": "user", "content": content}], "temperature": 0, **fields}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def text_of(result: dict[str, Any]) -> str:
    return str(result["choices"][0]["message"]["content"])


def n_generated(result: dict[str, Any]) -> int:
    return int(result["usage"]["completion_tokens"])


def sse_chunks(response: httpx.Response) -> list[dict[str, Any]]:
    lines = response.text.split("\n")
    assert lines[-3:] == ["data: [DONE]", "", ""], response.text[-200:]
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


@pytest.fixture(scope="module")
def plain(http: httpx.Client) -> dict[str, Any]:
    """The short question's greedy answer: it ends by itself (EOS), well before 200."""
    result = chat(http, max_tokens=200)
    assert result["choices"][0]["finish_reason"] == "stop"
    assert n_generated(result) < 150
    return result


def test_ignore_eos_gives_exactly_max_tokens(http: httpx.Client, plain: dict[str, Any]) -> None:
    wanted = n_generated(plain) + 25
    result = chat(http, max_tokens=wanted, ignore_eos=True)
    assert n_generated(result) == wanted
    assert result["choices"][0]["finish_reason"] == "length"
    assert text_of(result).startswith(text_of(plain))  # greedy: the same up to the EOS
    completion = http.post(
        "/v1/completions",
        json={"prompt": "The end.", "max_tokens": 40, "ignore_eos": True, "temperature": 0},
    ).json()
    assert completion["usage"]["completion_tokens"] == 40


def test_min_tokens_holds_off_the_end(http: httpx.Client, plain: dict[str, Any]) -> None:
    floor = n_generated(plain) + 10
    result = chat(http, max_tokens=floor + 60, min_tokens=floor)
    assert n_generated(result) >= floor
    assert text_of(result).startswith(text_of(plain))
    # Below the natural length, min_tokens changes nothing.
    assert text_of(chat(http, max_tokens=200, min_tokens=2)) == text_of(plain)


def test_guidellm_chat_bodies_get_exact_lengths_and_usage_on_every_chunk(
    http: httpx.Client,
) -> None:
    """guidellm 0.8.1 asks for fixed output lengths with ``ignore_eos`` and reads the
    usage of every chunk; its multi-turn scenario sends the history back."""
    history: list[dict[str, Any]] = []
    for turn, n_tokens in enumerate((17, 33)):
        history.append({"role": "user", "content": [{"type": "text", "text": f"Turn {turn}."}]})
        body = {
            "model": "SmolLM2-135M-Instruct",
            "messages": history,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "max_tokens": n_tokens,
            "max_completion_tokens": n_tokens,
            "stop": None,
            "ignore_eos": True,
        }
        response = http.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        chunks = sse_chunks(response)
        assert all("usage" in chunk for chunk in chunks)
        assert chunks[-1]["usage"]["completion_tokens"] == n_tokens
        answer = "".join(
            c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]
        )
        history.append({"role": "assistant", "content": answer})


def test_the_sglang_gateway_body_is_answered(http: httpx.Client, plain: dict[str, Any]) -> None:
    result = chat(
        http, max_completion_tokens=200, no_stop_trim=False, ignore_eos=False,
        continue_final_message=False, skip_special_tokens=True, separate_reasoning=True,
        stream_reasoning=True, return_hidden_states=False, logprobs=False, cache_prompt=True,
    )  # fmt: skip
    assert text_of(result) == text_of(plain)


def test_stop_token_ids_end_the_answer_at_that_token(
    http: httpx.Client, plain: dict[str, Any], vocab: llama_cpp.Llama
) -> None:
    tokens = vocab.tokenize(text_of(plain).encode(), add_bos=False, special=False)
    at = next(i for i in range(2, len(tokens)) if tokens[i] not in tokens[:i])
    result = chat(http, max_tokens=200, stop_token_ids=[tokens[at]])
    assert result["choices"][0]["finish_reason"] == "stop"
    assert n_generated(result) == at + 1  # the stop token is generated, not written
    assert text_of(result) == vocab.detokenize(tokens[:at]).decode()


def test_include_stop_str_in_output_keeps_the_stop_string(
    http: httpx.Client, plain: dict[str, Any]
) -> None:
    words = text_of(plain).split()
    stop = words[len(words) // 2]
    cut = text_of(plain).index(stop)
    trimmed = chat(http, max_tokens=200, stop=[stop])
    assert text_of(trimmed) == text_of(plain)[:cut]
    kept = chat(http, max_tokens=200, stop=[stop], include_stop_str_in_output=True)
    assert text_of(kept) == text_of(plain)[: cut + len(stop)]


def test_skip_special_tokens_false_writes_control_tokens(
    http: httpx.Client, vocab: llama_cpp.Llama
) -> None:
    (im_start,) = vocab.tokenize(b"<|im_start|>", add_bos=False, special=True)
    forced = {"max_tokens": 2, "logit_bias": {str(im_start): 100}}
    assert "<|im_start|>" not in text_of(chat(http, **forced))
    written = text_of(chat(http, **forced, skip_special_tokens=False))
    assert written == "<|im_start|>" * 2


def test_repetition_penalty_breaks_a_loop_and_both_names_agree(http: httpx.Client) -> None:
    def complete(**fields: Any) -> str:
        body = {"prompt": "1, 1, 1, 1, 1, 1, 1, 1,", "max_tokens": 24, "temperature": 0}
        response = http.post("/v1/completions", json={**body, **fields})
        assert response.status_code == 200, response.text
        return str(response.json()["choices"][0]["text"])

    plain = complete()
    assert plain.count("1,") >= 6  # greedy, the model goes on with the loop
    penalized = complete(repetition_penalty=1.8)
    assert penalized.count("1,") < 2  # the prompt's tokens are penalized too
    assert complete(repeat_penalty=1.8) == penalized
    assert complete(repetition_penalty=1.0) == plain


def test_top_k_one_and_min_p_one_are_greedy_at_any_temperature(
    http: httpx.Client, plain: dict[str, Any]
) -> None:
    for fields in ({"top_k": 1}, {"min_p": 1.0}):
        for seed in (1, 2):
            result = chat(http, max_tokens=200, temperature=1.5, seed=seed, **fields)
            assert text_of(result) == text_of(plain), fields


def test_continue_final_message_continues_the_assistants_text(http: httpx.Client) -> None:
    answer = text_of(chat(http, QUESTION, max_tokens=30))
    start = " ".join(answer.split()[:3])
    assert answer.startswith(start) and len(answer) > len(start) + 3
    messages = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": start},
    ]
    body = {"messages": messages, "temperature": 0, "max_tokens": 20}
    continued = http.post(
        "/v1/chat/completions",
        json={**body, "continue_final_message": True, "add_generation_prompt": False},
    ).json()
    rest = text_of(continued)
    assert (start + rest).startswith(answer[: len(start) + 8])
    fresh = text_of(http.post("/v1/chat/completions", json=body).json())
    assert not (start + fresh).startswith(answer[: len(start) + 8])  # a new turn, not this


def test_cache_prompt_false_computes_the_whole_prompt_and_keeps_it(http: httpx.Client) -> None:
    """llama-server's ``cache_prompt: false``: no cached cell is reused although the
    same prompt was just answered (``cached_tokens`` 0, twice); the prompt it
    computed is kept, so the same request with true, or without the field, reuses it."""
    content = f"{QUESTION} Answer in one short sentence, please."

    def usage(**fields: Any) -> dict[str, Any]:
        result: dict[str, Any] = chat(http, content, max_tokens=4, **fields)["usage"]
        return result

    n_prompt = usage()["prompt_tokens"]
    for _ in range(2):
        assert usage(cache_prompt=False)["prompt_tokens_details"]["cached_tokens"] == 0
    for fields in ({"cache_prompt": True}, {}):
        assert usage(**fields)["prompt_tokens_details"]["cached_tokens"] >= n_prompt - 1


@pytest.mark.parametrize(
    ("field", "value"),
    [("return_hidden_states", True), ("cache_prompt", "false"), ("min_tokens", 500)],
)
def test_a_value_that_cannot_be_honoured_is_a_400_naming_it(
    http: httpx.Client, field: str, value: object
) -> None:
    body = {"messages": [{"role": "user", "content": SHORT}], "max_tokens": 5, field: value}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == field
