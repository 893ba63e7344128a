"""The logits of a prompt's last token, kept beside the prefix cache.

A regenerate sends a prompt whose every cell the prefix cache still holds; only the
last token was computed again, for its logits, which give the first token. Keeping
those logits (one vector of ``n_vocab`` floats per prompt, a few hundred KB for a
small model) lets such a request sample its first token without any decode: the
same logits as the first time, so the same greedy token, and for sampling the same
distribution. Bounded: the least recently used prompts are forgotten first. An entry
is only used when the cache attached the whole prompt, so a stale one costs nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

MAX_PROMPTS = 8


class FirstTokenLogits:
    def __init__(self, max_prompts: int = MAX_PROMPTS) -> None:
        self.max_prompts = max_prompts
        self._by_prompt: OrderedDict[tuple[int, ...], Any] = OrderedDict()

    def put(self, prompt: Sequence[int], logits: Any) -> None:
        key = tuple(prompt)
        self._by_prompt[key] = logits
        self._by_prompt.move_to_end(key)
        while len(self._by_prompt) > self.max_prompts:
            self._by_prompt.popitem(last=False)

    def get(self, prompt: Sequence[int]) -> Any | None:
        key = tuple(prompt)
        logits = self._by_prompt.get(key)
        if logits is not None:
            self._by_prompt.move_to_end(key)
        return logits

    def __len__(self) -> int:
        return len(self._by_prompt)
