"""Prompt sets: the built-in ``short``, ``long`` and ``mixed`` sets, or a JSONL file.

- ``short``: short chat questions (a few dozen prompt tokens each).
- ``long``: about 1,000 prompt tokens each (the seed's slow-TTFT case). Each long prompt
  starts with a different document number and orders its sentences differently, so a
  server's prompt-prefix cache cannot turn later requests into cache hits. Note that
  edge-llm's default ``max_prompt_tokens`` is 512: run the engine with
  ``--max-prompt-tokens 2048`` for this set, otherwise every request is a 400
  ``prompt_too_long`` (reported as that error kind).
- ``mixed``: short and long alternating.

A JSONL file has one object per line: ``{"prompt": "..."}`` or ``{"messages": [...]}``,
optionally with ``"id"`` and ``"max_tokens"``. Blank lines and lines starting with ``#``
are skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROMPT_SETS = ("short", "long", "mixed")
LONG_PROMPT_VARIANTS = 8
LONG_PROMPT_SENTENCES = 58
MAX_PROMPTS = 100_000

_SHORT = (
    "Name the capital of France.",
    "Give me three tips for staying focused while studying.",
    "Explain what a hash table is in two sentences.",
    "Write a haiku about autumn rain.",
    "What is the difference between weather and climate?",
    "Name three primary colors.",
    "How do I boil an egg?",
    "Why is the sky blue?",
)

_LONG_SENTENCES = (
    "The harbour town woke slowly, its fishing boats rocking against the weathered pier.",
    "Merchants unrolled striped awnings and stacked crates of oranges, lemons and figs.",
    "A lighthouse keeper named Elena recorded the wind speed every morning at six.",
    "Her logbook, bound in cracked leather, held forty years of storms and calm seas.",
    "Children raced along the seawall, chasing gulls that refused to be impressed.",
    "In the bakery, loaves of rye and sourdough cooled on racks near the open window.",
    "The town council debated whether to repair the old bridge or build a new one.",
    "Engineers from the capital had estimated the cost at twice the annual budget.",
    "Farmers from the valley brought cheese, honey and wool to the Saturday market.",
    "A travelling musician played the accordion beside the fountain in the square.",
    "The school library had recently received a donation of atlases and star charts.",
    "Students measured the tides for a science project and plotted them on graph paper.",
    "The ferry to the island left twice a day, weather permitting, from the north quay.",
    "Its captain kept a small garden of herbs in wooden boxes on the upper deck.",
    "At dusk the streetlamps flickered on one by one, starting near the harbour office.",
    "The museum displayed ship models, brass instruments and maps drawn by hand.",
    "An annual regatta drew sailors from neighbouring towns and a crowd of spectators.",
    "Rain in late autumn filled the cisterns that supplied the upper streets with water.",
    "The post office sorted letters by hand because the machine had broken in spring.",
    "A retired teacher organised evening classes in navigation and astronomy.",
)
_LONG_QUESTION = (
    "Summarise the passage above in three sentences, then list two questions a visitor "
    "to the town might ask."
)


@dataclass(frozen=True, slots=True)
class Prompt:
    """One request's input: chat ``messages`` and an optional per-prompt max_tokens."""

    id: str
    messages: tuple[dict[str, str], ...]
    max_tokens: int | None = None

    @classmethod
    def user(cls, prompt_id: str, text: str, max_tokens: int | None = None) -> Prompt:
        return cls(prompt_id, ({"role": "user", "content": text},), max_tokens)

    def body_messages(self) -> list[dict[str, str]]:
        return [dict(message) for message in self.messages]

    def tagged(self, tag: str) -> Prompt:
        """The same prompt with ``[tag] `` before the first message's text: a prefix no
        earlier request had, so no server can answer it from a prompt cache."""
        first, *rest = self.messages
        marked = {**first, "content": f"[{tag}] {first['content']}"}
        return Prompt(self.id, (marked, *rest), self.max_tokens)


class PromptError(ValueError):
    """A prompt file or set name is invalid; the message names the line."""


def builtin_prompts(name: str) -> list[Prompt]:
    """The built-in set ``short``, ``long`` or ``mixed``; raises :class:`PromptError`."""
    if name == "short":
        return [Prompt.user(f"short-{i}", text) for i, text in enumerate(_SHORT)]
    if name == "long":
        return [Prompt.user(f"long-{i}", long_text(i)) for i in range(LONG_PROMPT_VARIANTS)]
    if name == "mixed":
        short, long = builtin_prompts("short"), builtin_prompts("long")
        return [p for pair in zip(short, long, strict=False) for p in pair]
    raise PromptError(f"unknown prompt set {name!r} (choose from {', '.join(PROMPT_SETS)})")


def long_text(variant: int, n_sentences: int = LONG_PROMPT_SENTENCES) -> str:
    """A deterministic passage of about 16.5 tokens per sentence (about 1,000 tokens with
    the question, by default), whose first line and sentence order depend on ``variant``."""
    sentences: list[str] = []
    repeat = 0
    while len(sentences) < n_sentences:
        order = _permutation(len(_LONG_SENTENCES), seed=variant * 131 + repeat)
        sentences.extend(_LONG_SENTENCES[i] for i in order)
        repeat += 1
    header = f"Document {variant + 1}: notes on a harbour town, part {variant + 1}."
    return header + "\n\n" + " ".join(sentences[:n_sentences]) + "\n\n" + _LONG_QUESTION


def _permutation(n: int, seed: int) -> list[int]:
    """A deterministic shuffle (a small LCG) independent of Python's ``random``."""
    items = list(range(n))
    state = seed * 2654435761 + 1
    for i in range(n - 1, 0, -1):
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        j = (state >> 33) % (i + 1)
        items[i], items[j] = items[j], items[i]
    return items


def load_jsonl(path: str | Path) -> list[Prompt]:
    """Prompts from a JSONL file; raises :class:`PromptError` naming the bad line."""
    prompts: list[Prompt] = []
    try:
        with open(path, encoding="utf-8") as fh:
            for number, line in enumerate(fh, start=1):
                text = line.strip()
                if not text or text.startswith("#"):
                    continue
                prompts.append(_prompt_from_line(text, number))
                if len(prompts) > MAX_PROMPTS:
                    raise PromptError(f"{path}: more than {MAX_PROMPTS} prompts")
    except OSError as exc:
        raise PromptError(f"cannot read prompt file {path}: {exc.strerror}") from exc
    if not prompts:
        raise PromptError(f"{path}: no prompts")
    return prompts


def _prompt_from_line(text: str, number: int) -> Prompt:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PromptError(f"line {number}: not JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise PromptError(f"line {number}: expected a JSON object")
    prompt_id = str(obj.get("id", f"line-{number}"))
    max_tokens = _max_tokens_of(obj, number)
    if isinstance(obj.get("prompt"), str):
        return Prompt.user(prompt_id, obj["prompt"], max_tokens)
    return Prompt(prompt_id, _messages_of(obj.get("messages"), number), max_tokens)


def _max_tokens_of(obj: dict[str, Any], number: int) -> int | None:
    value = obj.get("max_tokens")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PromptError(f"line {number}: max_tokens must be a positive integer")
    return value


def _messages_of(value: object, number: int) -> tuple[dict[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise PromptError(f'line {number}: needs "prompt" (string) or "messages" (list)')
    messages = []
    for message in value:
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            raise PromptError(f"line {number}: each message needs string role and content")
        messages.append({"role": message["role"], "content": message["content"]})
    return tuple(messages)
