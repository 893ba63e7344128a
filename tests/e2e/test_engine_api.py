"""The OpenAI-compatible API with the real model (issue: engine foundation)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
import pytest

from conftest import EngineProcess
from support import chat_body, wait_until

pytestmark = pytest.mark.e2e

QUESTION = "Name the capital of France."


def test_openai_sdk_streaming_and_not(engine_server) -> None:
    client = openai.OpenAI(base_url=engine_server.base_url, api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": QUESTION}], temperature=0, max_tokens=24
    )
    assert "Paris" in reply.choices[0].message.content
    assert reply.usage.completion_tokens > 0
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": QUESTION}],
        temperature=0,
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert text == reply.choices[0].message.content  # same greedy answer either way


def test_chat_uses_the_models_own_template_with_its_default_system_prompt(engine_server) -> None:
    """SmolLM2's template adds "You are a helpful AI assistant named SmolLM..." when
    the request has no system message (llama.cpp's built-in ChatML renderer does not)."""
    client = openai.OpenAI(base_url=engine_server.base_url, api_key="unused", max_retries=0)

    def prompt_tokens(messages: list[dict[str, str]]) -> int:
        reply = client.chat.completions.create(
            model="SmolLM2-135M-Instruct", messages=messages, temperature=0, max_tokens=1
        )
        return reply.usage.prompt_tokens

    user = {"role": "user", "content": "hi"}
    with_default = prompt_tokens([user])
    with_own = prompt_tokens([{"role": "system", "content": "x"}, user])
    assert with_default >= with_own + 10


def test_completions_endpoint(engine_server) -> None:
    client = openai.OpenAI(base_url=engine_server.base_url, api_key="unused", max_retries=0)
    reply = client.completions.create(
        model="SmolLM2-135M-Instruct",
        prompt="The capital of France is",
        max_tokens=8,
        temperature=0,
    )
    assert reply.choices[0].text.strip()
    assert reply.usage.prompt_tokens > 0


async def test_sse_lines_end_with_done(engine_server) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            engine_server.base_url + "/chat/completions", json=chat_body(QUESTION)
        ) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/event-stream")
            body = (await response.read()).decode()
    events = [block for block in body.split("\n\n") if block]
    assert all(e.startswith("data: ") or e.startswith(": ping") for e in events)
    assert events[-1] == "data: [DONE]"
    first = json.loads(next(e for e in events if e.startswith("data: "))[6:])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}


async def test_four_streams_share_decode_steps(engine_server) -> None:
    """Batched: four 48-token streams take far fewer engine steps than 4 x 48."""
    before = engine_server.debug_streams()["steps"]
    async with aiohttp.ClientSession() as session:

        async def one(i: int) -> str:
            body = chat_body(f"Write a long story about a dragon number {i}.", max_tokens=48)
            body["stream"] = False
            async with session.post(engine_server.base_url + "/chat/completions", json=body) as r:
                data = await r.json()
                assert data["usage"]["completion_tokens"] == 48
                return str(data["choices"][0]["message"]["content"])

        texts = await asyncio.gather(*(one(i) for i in range(4)))
    steps = engine_server.debug_streams()["steps"] - before
    assert all(len(t.split()) > 10 for t in texts)
    assert steps < 2 * 48 + 8, f"{steps} steps for 4 x 48 tokens: not batched"


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"messages": "hi"}, 400, "invalid_request", "messages"),
        (
            {"messages": [{"role": "user", "content": "x"}], "temperature": -1},
            400,
            "invalid_request",
            "temperature",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "colour": "red"},
            400,
            "invalid_request",
            "colour",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "model": "gpt-9"},
            404,
            "model_not_found",
            "model",
        ),
        (
            # max_tokens above what fits is clamped (an upper bound); below 1 is an error
            {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
            400,
            "invalid_request",
            "max_tokens",
        ),
    ],
)
async def test_bad_requests_get_openai_errors(engine_server, body, status, code, param) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(engine_server.base_url + "/chat/completions", json=body) as r:
            assert r.status == status
            error = (await r.json())["error"]
    assert error["code"] == code
    assert error["param"] == param
    assert error["message"]


async def test_non_json_and_non_utf8_bodies_are_400(engine_server) -> None:
    async with aiohttp.ClientSession() as session:
        for raw in (b"{not json", b'{"messages": "\xff\xfe"}', b"NaN"):
            async with session.post(engine_server.base_url + "/chat/completions", data=raw) as r:
                assert r.status == 400
                assert (await r.json())["error"]["code"] == "invalid_request"


async def test_empty_completion_prompt_is_400_not_500(engine_server) -> None:
    """Regression: found by schemathesis (an empty batch made llama_decode fail)."""
    async with aiohttp.ClientSession() as session:
        async with session.post(engine_server.base_url + "/completions", json={"prompt": ""}) as r:
            assert r.status == 400
            assert (await r.json())["error"]["param"] == "prompt"


async def test_prompt_too_long_reports_both_counts(engine_server) -> None:
    body = chat_body("word " * 700, stream=False)
    async with aiohttp.ClientSession() as session:
        async with session.post(engine_server.base_url + "/chat/completions", json=body) as r:
            assert r.status == 400
            error = (await r.json())["error"]
    assert error["code"] == "prompt_too_long"
    assert error["max_prompt_tokens"] == 512
    assert error["n_prompt_tokens"] > 512


async def test_unknown_path_is_404_in_openai_shape(engine_server) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(engine_server.url + "/v2/nothing") as r:
            assert r.status == 404
            assert (await r.json())["error"]["code"] == "not_found"


async def test_short_request_gets_first_token_during_a_long_prefill(engine_factory) -> None:
    """A short request admitted while a 1,000-token prompt is prefilled gets its first
    token before that prefill ends. The short one is sent once the long one's first
    chunk is logged; that it was admitted before the long prefill ended is checked
    from the log, and the pair is tried again (a new long prompt: no cache hit) if a
    loaded machine finished the long prefill first."""
    engine = engine_factory(
        "--max-prompt-tokens", "2048", "--prefill-chunk-tokens", "64", "--ttft-timeout-ms", "0"
    )
    for attempt in range(3):
        long_id, short_id = await long_and_short(engine, attempt)
        times = await wait_until(
            lambda ids=(long_id, short_id): timeline(engine, *ids), what="both requests logged"
        )
        if times["short_admitted"] < times["long_prefilled"]:
            break
    else:
        raise AssertionError("the long prefill ended before the short request came, 3 times")
    assert times["short_first_token"] < times["long_prefilled"], (
        "the short request waited for the whole long prefill"
    )


def timeline(engine: EngineProcess, long_id: str, short_id: str) -> dict[str, float]:
    """When (monotonic) the short request was admitted and got its first token, and
    when the long prompt's last chunk was prefilled; empty until both ended."""
    events = engine.events()
    if not {long_id, short_id} <= {e["request_id"] for e in events if e["event"] == "end"}:
        return {}
    at = {(e["event"], e["request_id"]): e for e in events}  # the last of each
    last_chunk = at[("prefill_progress", long_id)]
    # Every prompt token is prefilled; the chunk with the last one samples the first token.
    assert last_chunk["prefill_done"] == last_chunk["prefill_total"] >= 1000
    return {
        "short_admitted": at[("admitted", short_id)]["mono"],
        "short_first_token": at[("first_token", short_id)]["mono"],
        "long_prefilled": last_chunk["mono"],
    }


async def long_and_short(engine: EngineProcess, attempt: int) -> tuple[str, str]:
    """Send a long prompt, then a short one once the long one's first chunk is logged;
    the two request ids."""
    long_body = chat_body(f"[{attempt}] " + "The history of the river and its towns. " * 110)
    url = engine.base_url + "/chat/completions"
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json={**long_body, "max_tokens": 4}) as long_reply:
            assert long_reply.status == 200
            long_id = long_reply.headers["X-Request-Id"]
            await wait_until(
                lambda: engine.events_of("prefill_progress", long_id),
                what="the long prompt's first chunk",
            )
            async with session.post(url, json=chat_body("Hi!", max_tokens=4)) as short_reply:
                assert short_reply.status == 200
                await short_reply.read()
                short_id = short_reply.headers["X-Request-Id"]
            await long_reply.read()
    return long_id, short_id


async def test_chinese_text_streams_as_whole_characters(engine_server) -> None:
    body = chat_body("请用中文介绍一下长城。", max_tokens=40)
    async with aiohttp.ClientSession() as session:
        async with session.post(engine_server.base_url + "/chat/completions", json=body) as r:
            raw = await r.read()
    deltas = [
        json.loads(line[6:])["choices"][0]["delta"].get("content", "")
        for line in raw.decode("utf-8").split("\n")
        if line.startswith("data: {") and '"choices":[{' in line
    ]
    text = "".join(deltas)
    assert text
    assert "\ufffd" not in text  # no character was cut between two deltas
    assert any("\u4e00" <= ch <= "\u9fff" for ch in text)
