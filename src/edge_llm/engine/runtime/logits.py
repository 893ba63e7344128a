"""What sampling does to logits without llama.cpp: logprobs, penalties and logit bias on a
logits vector (numpy, float32, one entry per vocabulary token).

The llama backend owns the sampler chain and the grammar; these helpers change
the logits in place before the chain or argmax reads them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from edge_llm.protocol.sampling import SamplingParams, TokenLogprob

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

    def accept(self, token: int) -> None:
        """The bias does not depend on what was sampled."""


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


class RepetitionPenalty:
    """vLLM's (and CTRL's) ``repetition_penalty`` over every token of the prompt and
    of the output so far: a positive logit is divided by it, a negative one
    multiplied, so above 1 a seen token gets less likely either way."""

    def __init__(self, penalty: float, prompt_tokens: Sequence[int], n_vocab: int) -> None:
        self.penalty = penalty
        self._seen = np.zeros(n_vocab, dtype=bool)  # bounded by the vocabulary
        self._seen[[t for t in prompt_tokens if 0 <= t < n_vocab]] = True

    def apply(self, logits: Logits) -> None:
        seen = logits[self._seen]
        logits[self._seen] = np.where(seen > 0, seen / self.penalty, seen * self.penalty)

    def accept(self, token: int) -> None:
        self._seen[token] = True


class EndHold:
    """Keeps the tokens that would end the output from being sampled: the model's
    end-of-generation tokens and ``stop_token_ids`` until ``min_tokens`` tokens
    were sampled (vLLM's ``min_tokens``), the end-of-generation tokens always
    with ``ignore_eos`` (as llama-server bans them, so the output runs to
    ``max_tokens``)."""

    def __init__(self, params: SamplingParams, end_tokens: Sequence[int]) -> None:
        early = sorted(set(end_tokens) | set(params.stop_token_ids))
        self._early = np.array(early, dtype=np.int64)
        self._always = np.array(end_tokens if params.ignore_eos else [], dtype=np.int64)
        self.min_tokens = params.min_tokens
        self.num_sampled = 0

    def apply(self, logits: Logits) -> None:
        held = self._early if self.num_sampled < self.min_tokens else self._always
        logits[held] = -np.inf

    def accept(self, token: int) -> None:
        self.num_sampled += 1


class LogitRules:
    """What a request's sampling changes on the logits before a token is picked
    (bias, OpenAI's penalties, the repetition penalty, held-off end tokens), in
    place, and what each of them learns from the token picked."""

    def __init__(self, params: SamplingParams, n_vocab: int, end_tokens: Sequence[int]) -> None:
        rules: list[LogitBias | Penalties | RepetitionPenalty | EndHold] = []
        if params.logit_bias:
            rules.append(LogitBias(params.logit_bias))
        if params.presence_penalty != 0.0 or params.frequency_penalty != 0.0:
            rules.append(Penalties(params.presence_penalty, params.frequency_penalty))
        if params.repetition_penalty != 1.0:
            rules.append(
                RepetitionPenalty(params.repetition_penalty, params.prompt_tokens, n_vocab)
            )
        if params.holds_end:
            rules.append(EndHold(params, end_tokens))  # last: nothing may lift the hold
        self._rules = tuple(rules)

    def __bool__(self) -> bool:
        return bool(self._rules)

    def apply(self, logits: Logits) -> None:
        for rule in self._rules:
            rule.apply(logits)

    def accept(self, token: int) -> None:
        for rule in self._rules:
            rule.accept(token)


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
