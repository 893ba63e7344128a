"""Sampling logic that needs no llama.cpp: logprobs, penalties and logit bias on a
logits vector (numpy, float32, one entry per vocabulary token).

The llama backend owns the sampler chain and the grammar; these helpers change
the logits in place before the chain or argmax reads them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from edge_llm.protocol.sampling import TokenLogprob

Logits = npt.NDArray[np.float32]


def token_logprob(raw: Logits, token: int, k: int) -> TokenLogprob:
    """Log-softmax of the raw logits: the chosen token's logprob and the top ``k``."""
    peak = float(raw.max())
    log_total = peak + float(np.log(np.exp(raw - peak).sum(dtype=np.float64)))
    top: tuple[tuple[int, float], ...] = ()
    if k > 0:
        k = min(k, raw.shape[0])
        best = np.argpartition(raw, -k)[-k:]
        best = best[np.argsort(raw[best])[::-1]]
        top = tuple((int(t), float(raw[t]) - log_total) for t in best)
    return TokenLogprob(token, float(raw[token]) - log_total, top)


class LogitBias:
    """OpenAI's ``logit_bias``: a value added to a token's logit; -100 bans it."""

    BAN = -100.0

    def __init__(self, pairs: Sequence[tuple[int, float]]) -> None:
        self.ids = np.array([token for token, _ in pairs], dtype=np.int64)
        # A bias of -100 must remove the token whatever its logit: make it -inf.
        values = [-np.inf if bias <= self.BAN else bias for _, bias in pairs]
        self.values = np.array(values, dtype=np.float32)

    def apply(self, logits: Logits) -> None:
        logits[self.ids] += self.values


class Penalties:
    """OpenAI's presence and frequency penalties over the tokens generated so far:
    ``logit -= count * frequency + (count > 0) * presence``."""

    def __init__(self, presence: float, frequency: float) -> None:
        self.presence = presence
        self.frequency = frequency
        self._counts: dict[int, int] = {}

    def apply(self, logits: Logits) -> None:
        if not self._counts:
            return
        ids = np.fromiter(self._counts.keys(), dtype=np.int64, count=len(self._counts))
        counts = np.fromiter(self._counts.values(), dtype=np.float32, count=len(self._counts))
        logits[ids] -= counts * self.frequency + self.presence

    def accept(self, token: int) -> None:
        self._counts[token] = self._counts.get(token, 0) + 1


_REPEAT_KEYS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
_PATTERN_REPEAT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


def check_schema_bounds(schema: object, limit: int) -> None:
    """Raise ValueError if a length or count bound in a JSON schema exceeds
    ``limit``: llama.cpp's converter spells a bound of n as n nested rules, so a
    huge one would take the converter's time and memory without end."""
    if isinstance(schema, list):
        for item in schema:
            check_schema_bounds(item, limit)
        return
    if not isinstance(schema, dict):
        return
    for key, value in schema.items():
        if key in _REPEAT_KEYS and isinstance(value, int) and value > limit:
            raise ValueError(f"{key} {value} is above {limit}")
        if key == "pattern" and isinstance(value, str):
            for match in _PATTERN_REPEAT.finditer(value):
                if any(n and int(n) > limit for n in match.groups()):
                    raise ValueError(f"pattern repeats {match.group(0)}, above {limit}")
        check_schema_bounds(value, limit)
