"""Prompts that are equal, or prefix one another, arriving together at the engine over
the fake backend: every layout, speculation on and off, each order of arrival. Each
stream gets its first token; none waits for its TTFT time-out (the stall of issue 59:
a follower attached the whole prompt from the leader's prefill, without the logits of
its last token, and no step ever sampled its first token)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from edge_llm.engine.sequence import GenerationRequest

from fakes import FakeBackend, drain

PROMPT = list(range(200, 260))  # past HOLD_FOR_PREFIX_TOKENS: followers wait for it

LAYOUTS = [
    pytest.param({"per_slot": True}, {}, id="per-slot"),
    pytest.param({"per_slot": True}, {"speculative": True}, id="per-slot-spec"),
    pytest.param({}, {}, id="pool"),
    pytest.param({}, {"speculative": True}, id="pool-spec"),
]


def request(prompt: list[int], max_tokens: int = 6) -> GenerationRequest:
    return GenerationRequest(prompt_tokens=list(prompt), max_tokens=max_tokens)


async def run_together(engine_of, backend_kw, settings, prompts: list[list[int]]) -> list[str]:
    """Submit ``prompts`` while the engine cannot step, then let it run; every stream
    must end with text and without error, long before a TTFT time-out."""
    backend = FakeBackend(**backend_kw, max_sequences=8)
    backend.gate = threading.Semaphore(0)
    engine = engine_of(backend, ttft_timeout_s=30.0, **settings)
    handles = [engine.submit(request(p)) for p in prompts]
    backend.gate.release(10_000)
    texts = await asyncio.wait_for(asyncio.gather(*(drain(engine, h) for h in handles)), timeout=10)
    for handle, text in zip(handles, texts, strict=True):
        assert handle.outcome is not None and handle.outcome.error is None, handle.outcome
        assert text, handle.seq
    return list(texts)


@pytest.mark.parametrize(("backend_kw", "settings"), LAYOUTS)
async def test_identical_prompts_together_all_answer(engine_of, backend_kw, settings) -> None:
    texts = await run_together(engine_of, backend_kw, settings, [PROMPT] * 4)
    assert len(set(texts)) == 1


@pytest.mark.parametrize(("backend_kw", "settings"), LAYOUTS)
async def test_identical_prompt_arriving_after_the_leaders_prefill_answers(
    engine_of, backend_kw, settings
) -> None:
    """The follower comes once the leader decodes: its whole prompt is the leader's."""
    backend = FakeBackend(**backend_kw, max_sequences=8)
    engine = engine_of(backend, ttft_timeout_s=30.0, **settings)
    leader = engine.submit(request(PROMPT, max_tokens=40))
    while leader.seq.n_generated < 2:
        assert await leader.wait_changed(10.0)
    follower = engine.submit(request(PROMPT))
    assert await asyncio.wait_for(drain(engine, follower), timeout=10)
    await drain(engine, leader)


@pytest.mark.parametrize(("backend_kw", "settings"), LAYOUTS)
async def test_prompts_that_prefix_one_another_all_answer(engine_of, backend_kw, settings) -> None:
    longer = [PROMPT, [*PROMPT, 7, 8], [*PROMPT, 7, 8, 9, 10]]
    await run_together(engine_of, backend_kw, settings, longer)
    await run_together(engine_of, backend_kw, settings, longer[::-1])


@pytest.mark.parametrize(("backend_kw", "settings"), LAYOUTS)
async def test_identical_short_prompts_after_a_cached_start_wait_for_one_prefill(
    engine_of, backend_kw, settings
) -> None:
    """The template's system prompt is cached; the rest of identical prompts is short
    (under HOLD_FOR_PREFIX_TOKENS): one computes it, the others wait and attach it
    (the whole prompt, with the kept logits), instead of each computing its own copy."""
    system = list(range(500, 540))
    backend = FakeBackend(**backend_kw, max_sequences=8)
    engine = engine_of(backend, ttft_timeout_s=30.0, **settings)
    await drain(engine, engine.submit(request([*system, 1, 2])))  # caches the start
    backend.gate = threading.Semaphore(0)
    prompt = [*system, *range(600, 620)]
    handles = [engine.submit(request(prompt)) for _ in range(4)]
    backend.gate.release(10_000)
    await asyncio.wait_for(asyncio.gather(*(drain(engine, h) for h in handles)), timeout=10)
    computed = sum(h.seq.n_prompt - h.seq.num_cached for h in handles)
    assert computed <= len(prompt) - len(system) + 1, [h.seq.num_cached for h in handles]
