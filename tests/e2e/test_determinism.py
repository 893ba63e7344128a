"""Greedy text at temperature 0 is a function of the request alone, with the real
model: with the default configuration the same story whether its prompt was cached (in
its slot or in the host tier) or not, and the same next turn; with ``deterministic``
also with speculation on or off and beside other streams (``engine/kv_slots.py`` and
``Scheduler._pad`` say how). The story prompt has near-ties between next tokens, so
any difference in how a cell was computed shows in the text."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import aiohttp
import pytest

from conftest import EngineFactory, EngineProcess
from support import STORY, chat_body

pytestmark = pytest.mark.e2e

MAX_TOKENS = 480  # a story prompt plus this passes 512 cells
OTHERS = (
    "Explain how bread rises, step by step, in detail.",
    "List twenty animals that live in the sea and describe each one.",
    "Write a long letter to a friend about a journey through the mountains.",
)


async def complete(engine: EngineProcess, content: str, **extra: Any) -> dict[str, Any]:
    body = chat_body(content, max_tokens=MAX_TOKENS, stream=False, **extra)
    async with aiohttp.ClientSession() as session:
        async with session.post(engine.url + "/v1/chat/completions", json=body) as response:
            assert response.status == 200, await response.text()
            result: dict[str, Any] = await response.json()
            return result


def text(result: dict[str, Any]) -> str:
    return str(result["choices"][0]["message"]["content"])


def cached(result: dict[str, Any]) -> int:
    return int(result["usage"]["prompt_tokens_details"]["cached_tokens"])


async def test_a_story_is_the_same_cached_in_its_slot_in_the_host_tier_or_not(
    engine_factory: EngineFactory,
) -> None:
    engine = engine_factory("--ttft-timeout-ms", "0")
    story = f"[{uuid.uuid4().hex[:8]}] {STORY}"
    first = await complete(engine, story)
    again = await complete(engine, story)
    assert cached(first) == 0 and cached(again) == again["usage"]["prompt_tokens"]
    # Four other prompts take every slot in turn: the story's cells go to the host tier.
    await asyncio.gather(*(complete(engine, other) for other in [*OTHERS, STORY]))
    assert engine.debug_streams()["kv_host_cache_entries"] >= 1
    before = engine.metric("edge_llm_prompt_cache_hits_total", tier="host")
    restored = await complete(engine, story)
    assert (
        cached(restored) > 0
        and engine.metric("edge_llm_prompt_cache_hits_total", tier="host") == before + 1
    )
    assert len(text(first)) > 1000
    assert text(again) == text(first)
    assert text(restored) == text(first)


async def test_deterministic_a_story_is_the_same_beside_others_and_without_speculation(
    engine_factory: EngineFactory,
) -> None:
    flags = ("--ttft-timeout-ms", "0", "--deterministic")
    alone = await complete(engine_factory(*flags), STORY)
    unspeculated = await complete(engine_factory(*flags, "--speculative", "off"), STORY)
    busy = engine_factory(*flags)
    results = await asyncio.gather(
        *(complete(busy, other) for other in OTHERS), complete(busy, STORY)
    )
    assert cached(results[-1]) == 0  # computed beside the others, not copied from them
    assert text(unspeculated) == text(alone)
    assert text(results[-1]) == text(alone)


async def test_the_next_turn_is_the_same_with_the_earlier_turn_cached_or_not(
    engine_factory: EngineFactory,
) -> None:
    warm = engine_factory("--ttft-timeout-ms", "0")
    # Long enough to be prefilled in tiles: the next turn reuses it (kv_slots.py).
    opening = STORY + " " + " ".join(OTHERS) + " Use all of these as details."
    first = await complete(warm, opening)
    history = [
        {"role": "user", "content": opening},
        {"role": "assistant", "content": text(first)[:600]},
        {"role": "user", "content": "Now tell what the dragon did the next morning."},
    ]
    body = {"messages": history, "max_tokens": 300, "temperature": 0}
    async with aiohttp.ClientSession() as session:
        answers = []
        for engine in (warm, engine_factory("--ttft-timeout-ms", "0")):
            async with session.post(engine.url + "/v1/chat/completions", json=body) as response:
                assert response.status == 200, await response.text()
                answers.append(await response.json())
    hit, miss = answers
    assert cached(hit) > 0 and cached(miss) == 0
    assert text(hit) == text(miss)
