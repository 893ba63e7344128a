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

import pytest

from conftest import EngineFactory, EngineProcess
from support import STORY, cached, chat_body, complete, text_of

pytestmark = pytest.mark.e2e

MAX_TOKENS = 480  # a story prompt plus this passes 512 cells
OTHERS = (
    "Explain how bread rises, step by step, in detail.",
    "List twenty animals that live in the sea and describe each one.",
    "Write a long letter to a friend about a journey through the mountains.",
)


async def answer(engine: EngineProcess, content: str) -> dict[str, Any]:
    return await complete(engine.url, chat_body(content, max_tokens=MAX_TOKENS))


async def test_a_story_is_the_same_cached_in_its_slot_in_the_host_tier_or_not(
    engine_factory: EngineFactory,
) -> None:
    engine = engine_factory("--ttft-timeout-ms", "0")
    story = f"[{uuid.uuid4().hex[:8]}] {STORY}"
    first = await answer(engine, story)
    again = await answer(engine, story)
    assert cached(first) == 0 and cached(again) == again["usage"]["prompt_tokens"]
    # Four other prompts take every slot in turn: the story's cells go to the host tier.
    await asyncio.gather(*(answer(engine, other) for other in [*OTHERS, STORY]))
    assert engine.debug_streams()["kv_host_cache_entries"] >= 1
    before = engine.metric("edge_llm_prompt_cache_hits_total", tier="host")
    restored = await answer(engine, story)
    assert (
        cached(restored) > 0
        and engine.metric("edge_llm_prompt_cache_hits_total", tier="host") == before + 1
    )
    assert len(text_of(first)) > 1000
    assert text_of(again) == text_of(first)
    assert text_of(restored) == text_of(first)


async def test_deterministic_a_story_is_the_same_beside_others_and_without_speculation(
    engine_factory: EngineFactory,
) -> None:
    flags = ("--ttft-timeout-ms", "0", "--deterministic")
    alone = await answer(engine_factory(*flags), STORY)
    unspeculated = await answer(engine_factory(*flags, "--speculative", "off"), STORY)
    busy = engine_factory(*flags)
    results = await asyncio.gather(*(answer(busy, other) for other in OTHERS), answer(busy, STORY))
    assert cached(results[-1]) == 0  # computed beside the others, not copied from them
    assert text_of(unspeculated) == text_of(alone)
    assert text_of(results[-1]) == text_of(alone)


async def test_the_next_turn_is_the_same_with_the_earlier_turn_cached_or_not(
    engine_factory: EngineFactory,
) -> None:
    warm = engine_factory("--ttft-timeout-ms", "0")
    # Long enough to be prefilled in tiles: the next turn reuses it (kv_slots.py).
    opening = STORY + " " + " ".join(OTHERS) + " Use all of these as details."
    first = await answer(warm, opening)
    history = [
        {"role": "user", "content": opening},
        {"role": "assistant", "content": text_of(first)[:600]},
        {"role": "user", "content": "Now tell what the dragon did the next morning."},
    ]
    body = {"messages": history, "max_tokens": 300, "temperature": 0}
    hit = await complete(warm.url, body)
    miss = await complete(engine_factory("--ttft-timeout-ms", "0").url, body)
    assert cached(hit) > 0 and cached(miss) == 0
    assert text_of(hit) == text_of(miss)
