"""Scenarios where a request continues an earlier one (issue 42): the next turn of a
conversation, and several users chatting over a shared system prompt.

A conversation sends each answer back as the assistant's message, as a chat client
does, so a server that kept the earlier prompt *and* its answer in its KV cache
prefills only the new user turn. Every conversation starts with a tag unique to the
repeat (``ctx.variant``), so nothing is reused across repeats or scenarios.
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass
from typing import Any

from scenarios import Context, Figures, failures, throughput

from edge_llm.bench.chat_stream import ChatStream
from edge_llm.bench.prompts import Prompt, long_text
from edge_llm.bench.record import RequestRecord
from edge_llm.bench.stats import percentile
from edge_llm.client.sse import SSEEvent, parse_chunk

NEXT_TURN_SENTENCES = 24  # with the template: about 459 prompt tokens
NEXT_TURN_ANSWER_TOKENS = 100
NEXT_TURN_REPLY_TOKENS = 16  # only its TTFT counts
NEXT_TURN_CONVERSATIONS = 3
NEXT_TURN_QUESTION = "Now list three of the places in the town that the passage names."

MULTITURN_USERS = 4
MULTITURN_TURNS = 3
MULTITURN_SYSTEM_SENTENCES = 5  # about 100 tokens with its opening line
MULTITURN_USER_SENTENCES = 11  # about 200 tokens with the question
MULTITURN_ANSWER_TOKENS = 100
MULTITURN_QUESTIONS = (
    "Which of these details would a first-time visitor notice first, and why?",
    "Which two of them would you put on a postcard? Explain briefly.",
    "What would you ask the town council about these notes?",
)


class UsageStream(ChatStream):
    """A :class:`ChatStream` that also keeps the stream's last ``usage`` object, for
    ``prompt_tokens_details.cached_tokens``."""

    usage: dict[str, Any] | None = None

    def _take(self, event: SSEEvent, arrived: float) -> None:
        super()._take(event, arrived)  # raises for an error event: read_some records it
        chunk = parse_chunk(event)
        if chunk is not None and chunk.usage:
            self.usage = chunk.usage


@dataclass
class Reply:
    record: RequestRecord
    text: str
    cached_tokens: int | None  # None: the server did not say


async def chat(ctx: Context, prompt: Prompt, max_tokens: int, index: int = 0) -> Reply:
    """One streamed request read to its end: its record, its text, its cached tokens."""
    record = ctx.record(prompt, index)
    stream = UsageStream(ctx.target, prompt, ctx.options(max_tokens), record)
    try:
        async with asyncio.timeout(ctx.settings.timeout_s):
            if await stream.open(ctx.epoch):
                await stream.run_to_end()
    except TimeoutError:
        stream.fail_timeout(ctx.settings.timeout_s)
    finally:
        stream.close()
    return Reply(record, stream.text, _cached_tokens(stream.usage))


def _cached_tokens(usage: dict[str, Any] | None) -> int | None:
    details = (usage or {}).get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) and not isinstance(cached, bool) else None


def sentences(variant: int, n: int) -> str:
    """``n`` of the harbour-town sentences in ``variant``'s order (no header, no question)."""
    return long_text(variant, n).split("\n\n")[1]


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


async def next_turn(ctx: Context) -> Figures:
    """TTFT of a short next turn after a ~459-token prompt and its ~100-token greedy
    answer: the median of NEXT_TURN_CONVERSATIONS fresh conversations, one after the
    other. Details: each next turn's TTFT and ``cached_tokens`` when the server reports
    it (all of the earlier prompt and answer would be ``prompt_tokens - new turn``)."""
    ttfts: list[float] = []
    turns: list[dict[str, object]] = []
    records: list[RequestRecord] = []
    for i in range(NEXT_TURN_CONVERSATIONS):
        first_text = f"(Conversation {ctx.variant}.{i}.) " + long_text(
            ctx.variant * 10 + i, NEXT_TURN_SENTENCES
        )
        tag = f"next-{ctx.variant}-{i}"
        first = await chat(ctx, Prompt(tag, (user(first_text),)), NEXT_TURN_ANSWER_TOKENS, 2 * i)
        records.append(first.record)
        if not first.record.ok:
            continue
        messages = (user(first_text), assistant(first.text), user(NEXT_TURN_QUESTION))
        second = await chat(ctx, Prompt(tag + "-next", messages), NEXT_TURN_REPLY_TOKENS, 2 * i + 1)
        records.append(second.record)
        if second.record.ok and second.record.ttft is not None:
            ttfts.append(second.record.ttft)
        turns.append(
            {
                "first_prompt_tokens": first.record.prompt_tokens,
                "answer_tokens": first.record.n_output_tokens,
                "next_prompt_tokens": second.record.prompt_tokens,
                "next_cached_tokens": second.cached_tokens,
                "next_ttft_s": second.record.ttft,
            }
        )
    value = statistics.median(ttfts) if len(ttfts) == NEXT_TURN_CONVERSATIONS else None
    return Figures(value, {"conversations": turns, **failures(records)})


def system_prompt(ctx: Context) -> str:
    return (
        f"(Session {ctx.variant}.) You are the visitor guide of a harbour town. Answer "
        "plainly and briefly. What you know of the town: "
        + sentences(ctx.variant * 10, MULTITURN_SYSTEM_SENTENCES)
    )


def user_turn(ctx: Context, user_index: int, turn: int) -> str:
    variant = ctx.variant * 10 + 1 + user_index * MULTITURN_TURNS + turn
    notes = sentences(variant, MULTITURN_USER_SENTENCES)
    return f"Here are my notes from today:\n\n{notes}\n\n{MULTITURN_QUESTIONS[turn]}"


async def _one_user(ctx: Context, user_index: int) -> list[Reply]:
    """One user's MULTITURN_TURNS turns, each answer sent back with the next turn."""
    messages = [{"role": "system", "content": system_prompt(ctx)}]
    replies: list[Reply] = []
    for turn in range(MULTITURN_TURNS):
        messages.append(user(user_turn(ctx, user_index, turn)))
        prompt = Prompt(f"multiturn-{ctx.variant}-{user_index}-{turn}", tuple(messages))
        reply = await chat(ctx, prompt, MULTITURN_ANSWER_TOKENS, user_index * 10 + turn)
        replies.append(reply)
        if not reply.record.ok:
            break
        messages.append(assistant(reply.text))
    return replies


async def multiturn(ctx: Context) -> Figures:
    """MULTITURN_USERS users at once, each a MULTITURN_TURNS-turn chat (a ~100-token
    system prompt shared by all, ~200-token user turns, ~100-token greedy answers).
    Value: output tok/s over the whole exchange (every request's completion tokens over
    first start to last token); details: TTFT p50 and p95 per turn over the users, and
    each user's prompt and ``cached_tokens`` per turn (a server that kept the earlier
    turns and answers caches all but the new user turn and the template around it)."""
    replies = await asyncio.gather(*(_one_user(ctx, u) for u in range(MULTITURN_USERS)))
    per_user = [[reply.record for reply in one] for one in replies]
    records = [r for one in per_user for r in one]
    details: dict[str, object] = {}
    for turn in range(MULTITURN_TURNS):
        ttfts = [
            ttft
            for one in per_user
            if len(one) > turn and one[turn].ok and (ttft := one[turn].ttft) is not None
        ]
        complete = len(ttfts) == MULTITURN_USERS
        details[f"ttft_p50_turn{turn + 1}"] = percentile(ttfts, 50) if complete else None
        details[f"ttft_p95_turn{turn + 1}"] = percentile(ttfts, 95) if complete else None
        details[f"prompt_tokens_turn{turn + 1}"] = [
            one[turn].prompt_tokens for one in per_user if len(one) > turn
        ]
        details[f"cached_tokens_turn{turn + 1}"] = [
            one[turn].cached_tokens for one in replies if len(one) > turn
        ]
    complete = len(records) == MULTITURN_USERS * MULTITURN_TURNS and all(r.ok for r in records)
    value = throughput(records) if complete else None
    details["output_tokens"] = sum(r.n_output_tokens for r in records if r.ok)
    return Figures(value, details | failures(records))
