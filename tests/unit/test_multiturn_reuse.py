"""Four users chatting at once over the per-slot layout (the benchmark's multi-turn
chat, issue 60): each later turn starts from every cell of the user's earlier prompt
and answer, whatever the other users' streams do meanwhile.

On 2026-12-07 the 1.5B model's later turns took 2.65-2.95x llama-server's TTFT. The
real 135M model re-prefilled nothing there (2026-12-08: each turn cached its earlier
prompt + answer less the answer's last token); this test keeps the engine's side of
that true with streams ending, waiting and starting in any order.
"""

from __future__ import annotations

import asyncio

from edge_llm.engine.sequence import GenerationRequest

from fakes import FakeBackend, drain

USERS = 4
TURNS = 3
SYSTEM = list(range(1000, 1100))  # the system prompt all users share
TURN_TOKENS = 200
ANSWER = list(range(10, 60))  # the fake's script: 50 tokens, then the end token


def turn_tokens(user: int, turn: int) -> list[int]:
    start = 5000 + user * 1000 + turn * TURN_TOKENS
    return list(range(start, start + TURN_TOKENS))


async def chat(engine, user: int) -> list[tuple[int, int, int]]:
    """(turn, prompt tokens, cached tokens) of one user's turns, each answer sent back."""
    prompt = list(SYSTEM)
    seen = []
    for turn in range(TURNS):
        prompt += turn_tokens(user, turn)
        handle = engine.submit(GenerationRequest(prompt_tokens=list(prompt), max_tokens=100))
        await drain(engine, handle)
        seq = handle.seq
        seen.append((turn, seq.n_prompt, seq.num_cached))
        prompt += [t for t in seq.token_ids[seq.n_prompt :] if t in ANSWER]  # no end token
    return seen


async def test_every_later_turn_reuses_the_earlier_prompt_and_answer(engine_of) -> None:
    backend = FakeBackend(ANSWER, per_slot=True, kv_capacity_tokens=USERS * 2560)
    backend.step_delay_s = 0.002  # users' turns end, wait and start interleaved
    engine = engine_of(backend)
    for seen in await asyncio.gather(*(chat(engine, u) for u in range(USERS))):
        for turn, n_prompt, n_cached in seen[1:]:
            earlier = n_prompt - TURN_TOKENS  # the earlier turns' prompts and answers
            # All of them: the answer's last sampled token (here the end token, not
            # sent back) is the one never fed back.
            assert n_cached == earlier, (turn, n_prompt, n_cached)
