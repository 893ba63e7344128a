"""Requests whose prompts are equal, or one a prefix of another, arriving together
(SPEC section 25): each gets its first token, whichever route they come by. The first
such group a server saw used to stall: one answered, the others attached the whole
prompt from the one prefilling it, had no logits for its last token and waited until
their ``ttft_timeout`` (an error here). How soon they answer (the goal: within 2x a
lone request's TTFT) is a speed figure, measured by benchmarks/interleavings.py."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from conftest import EngineProcess, start_engine
from support import STORY, chat_body

pytestmark = pytest.mark.e2e

N_TOGETHER = 4  # max_sequences: a fifth would wait for a slot, not for a prefix
SETTING = (
    "The dragon lives in a cave above a small fishing village by the sea, and every "
    "evening it watches the boats come home while the knight rides along the cliffs."
)
MAX_TOKENS = 8


@dataclass
class Answer:
    ttft_s: float | None  # None: no content came
    text: str
    error: Any = None


def story(tag: str) -> str:
    """The issue's prompt, made unique so that no earlier test's cache serves it, and
    long enough that requests arriving together wait for one prefill of it (a server
    that has cached only the chat template's system prompt: a fresh one)."""
    return f"[{tag}] {STORY} {SETTING}"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """A fresh server in the default configuration (per-slot KV, speculation on)."""
    process = start_engine(tmp_path_factory.mktemp("identical"))
    yield process
    process.stop()


@pytest.fixture(scope="module")
def pool_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """The unified pool, where live streams share a prompt's cells in place."""
    process = start_engine(
        tmp_path_factory.mktemp("identical-pool"), "--kv-unified", "--max-sequences", "8"
    )
    yield process
    process.stop()


async def sse(url: str, path: str, body: dict[str, Any], text_of: Any) -> Answer:
    """One streamed request: the time to its first content, its text, its error."""
    began = time.monotonic()
    ttft, parts, error = None, [], None
    async with aiohttp.ClientSession() as session:
        async with session.post(url + path, json=body) as response:
            if response.status != 200:
                return Answer(None, "", await response.text())
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data: {"):
                    continue
                data = json.loads(line.removeprefix("data: "))
                if "error" in data or data.get("type") == "error":
                    error = data
                    continue
                if piece := text_of(data):
                    ttft = ttft or time.monotonic() - began
                    parts.append(piece)
    return Answer(ttft, "".join(parts), error)


def chat_text(data: dict[str, Any]) -> str:
    choices = data.get("choices") or [{}]
    return str(choices[0].get("delta", {}).get("content") or choices[0].get("text") or "")


def messages_text(data: dict[str, Any]) -> str:
    delta = data.get("delta", {}) if data.get("type") == "content_block_delta" else {}
    return str(delta.get("text") or "")


async def chat(url: str, prompt: str) -> Answer:
    body = chat_body(prompt, max_tokens=MAX_TOKENS)
    return await sse(url, "/v1/chat/completions", body, chat_text)


async def completion(url: str, prompt: str) -> Answer:
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
    return await sse(url, "/v1/completions", body, chat_text)


async def message(url: str, prompt: str) -> Answer:
    body = {
        "model": "any", "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True,
        "messages": [{"role": "user", "content": prompt}],
    }  # fmt: skip
    return await sse(url, "/v1/messages", body, messages_text)


async def websocket(url: str, prompt: str) -> Answer:
    began = time.monotonic()
    ttft, parts = None, []
    ws_url = url.replace("http", "ws") + "/v1/stream"
    async with aiohttp.ClientSession() as session, session.ws_connect(ws_url) as ws:
        request = chat_body(prompt, max_tokens=MAX_TOKENS)
        await ws.send_json({"type": "start", "request": request})
        while True:
            frame = await ws.receive_json(timeout=120)
            if frame["type"] == "delta":
                ttft = ttft or time.monotonic() - began
                parts.append(frame["text"])
            elif frame["type"] in ("done", "error"):
                error = frame if frame["type"] == "error" else None
                return Answer(ttft, "".join(parts), error)


async def together(ask: Any, url: str, prompts: list[str]) -> list[Answer]:
    return list(await asyncio.gather(*(ask(url, prompt) for prompt in prompts)))


def assert_all_answered(answers: list[Answer]) -> None:
    for answer in answers:
        assert answer.error is None and answer.text and answer.ttft_s is not None, answers


async def identical_group(engine: EngineProcess, ask: Any) -> list[Answer]:
    """``N_TOGETHER`` identical requests sent at once: all answer. (Their texts may
    differ by default: the story prompt has near-ties, and a stream's batch shape
    decides them; docs/architecture.md.)"""
    prompt = story(uuid.uuid4().hex[:8])
    answers = await together(ask, engine.url, [prompt] * N_TOGETHER)
    assert_all_answered(answers)
    return answers


async def test_identical_chat_requests_on_a_fresh_server_all_answer(engine) -> None:
    await identical_group(engine, chat)


async def test_identical_requests_over_the_websocket_all_answer(engine) -> None:
    await identical_group(engine, websocket)


async def test_identical_anthropic_messages_all_answer(engine) -> None:
    await identical_group(engine, message)


@pytest.mark.parametrize("order", ["shortest first", "longest first"])
async def test_prompts_that_prefix_one_another_all_answer(engine, order) -> None:
    """A prompt, the same prompt, and two extensions of it (completions: the text is
    the prompt), arriving together."""
    base = story(uuid.uuid4().hex[:8])
    prompts = [base, base, base + " It was small.", base + " It was small and green."]
    if order == "longest first":
        prompts.reverse()
    answers = await together(completion, engine.url, prompts)
    assert_all_answered(answers)


async def test_identical_chat_requests_in_the_unified_pool_all_answer(pool_engine) -> None:
    await identical_group(pool_engine, chat)
