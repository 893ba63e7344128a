"""What a decode step costs, and so how many prompt tokens the next one may prefill,
how long a draft pays and when a new request should get its first token: pure
arithmetic on measured step times, no clock. The engine's one cost model.

:class:`StepCosts` fits ``seconds = fixed_s + token_s * n_tokens`` to recent steps
without prompt tokens (least squares, older steps weighing less), and learns what a
prompt token adds to a step that also decodes (``prefill_token_s``: the step's time
beyond its decode rows, per prompt token; per-slot, also ``chunk_call_s``, a line
through the chunks' times) and what a prompt token costs in any step
(``prompt_token_s``: admission's service rate, ``admission.py``).

:class:`PrefillBudget`: a lone prompt (nothing decoding, no other prompt) gets the
whole batch, so it prefills in as few ``llama_decode`` calls as the batch allows, as
llama-server does. While streams decode or other prompts wait for their first
token, every prompt token in a step delays them all, so the step gets only the
prompt tokens that keep it near ``itl_target_s``
(token-budget scheduling as in Sarathi-Serve), or near twice a decode step when
that is longer (a loaded machine, a big model), so that a long prompt still makes
progress.

In the per-slot layout each prompt chunk gets a ``llama_decode`` of its own
(``ModelRunner.prefill_apart``), which costs a call's fixed part (a pass over the
weights, the threads' barriers: ``chunk_call_s``) whatever the chunk's size. The budget
counts it, and a chunk gets at least the tokens whose cost matches it, so that no
call is mostly overhead: a step with prompt tokens takes at most
``max(itl_target_s, two decode steps, a decode step and two calls' fixed parts)``.
Until 2026-12-07 the floor was 32 tokens whatever they cost (three times the step
beside decoding streams on the 1.5B model, issue 60); then no floor, with the
prompt token's cost learnt as the whole step's time per token: in the per-slot
layout that cost rose as chunks shrank (each paying a call), the budget fell with
it to 2-6 tokens a step, and a short prompt beside three decoding streams waited
5.3 s for its first token instead of 0.6 s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Before anything is measured: SmolLM2-135M on 2 cores (docs/design.md), a step of one
# token 10 ms and of nine 37 ms; measured steps outweigh these within a few dozen.
_PRIOR_POINTS = ((1.0, 0.010), (9.0, 0.037))
_PRIOR_WEIGHT = 0.5
DECAY = 0.97
DEFAULT_PREFILL_TOKEN_S = 1.0 / 300.0
SERVICE_WEIGHT = 0.2
# What a prompt token adds to a mixed step: seconds over tokens of recent mixed steps,
# each older step weighing PROMPT_DECAY as much, the starting value counting as
# PRIOR_PROMPT_TOKENS tokens (outweighed within a few steps).
PROMPT_DECAY = 0.9
PRIOR_PROMPT_TOKENS = 16.0
# A chunk decoded apart, before any is measured: the prior's one-token step without
# its token, and two chunk sizes at which the prior line starts.
DEFAULT_CHUNK_CALL_S = 0.0066
_PRIOR_CHUNK_TOKENS = (8.0, 64.0)
# A prompt token costs at least this share of a decode row: a noisy step cannot make
# prompt tokens look free (and the next chunk the whole batch).
MIN_PROMPT_TOKEN_SHARE = 0.1
# A step with prompt tokens may take this many decode steps, whatever the target: on
# a loaded machine, where a decode step alone exceeds the target, a long prompt still
# prefills in a bounded number of steps.
MIN_STEP_IN_DECODE_STEPS = 2.0


@dataclass
class _Sums:
    w: float = 0.0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0

    def add(self, x: float, y: float, weight: float = 1.0) -> None:
        self.w += weight
        self.x += weight * x
        self.y += weight * y
        self.xx += weight * x * x
        self.xy += weight * x * y

    def decay(self, factor: float) -> None:
        self.w, self.x, self.y = self.w * factor, self.x * factor, self.y * factor
        self.xx, self.xy = self.xx * factor, self.xy * factor

    def plus(self, other: _Sums) -> _Sums:
        return _Sums(
            self.w + other.w, self.x + other.x, self.y + other.y,
            self.xx + other.xx, self.xy + other.xy,
        )  # fmt: skip

    def line(self) -> tuple[float, float]:
        """(intercept, slope) of the weighted least-squares line, both >= 0."""
        spread = self.w * self.xx - self.x * self.x
        slope = max((self.w * self.xy - self.x * self.y) / spread, 0.0) if spread > 0 else 0.0
        return max((self.y - slope * self.x) / self.w, 0.0), slope


def _points(points: tuple[tuple[float, float], ...]) -> _Sums:
    sums = _Sums()
    for x, y in points:
        sums.add(x, y, _PRIOR_WEIGHT)
    return sums


@dataclass
class StepCosts:
    prefill_token_s: float = DEFAULT_PREFILL_TOKEN_S  # a prompt token beside decoding streams
    prompt_token_s: float = DEFAULT_PREFILL_TOKEN_S  # a step's seconds per prompt token in it
    # The fixed part of a prompt chunk's own ``llama_decode`` (per-slot layout): what it
    # costs before its first token (a pass over the weights, the threads' barriers).
    chunk_call_s: float = DEFAULT_CHUNK_CALL_S
    _measured: _Sums = field(default_factory=_Sums)
    _prior: _Sums = field(default_factory=lambda: _points(_PRIOR_POINTS))
    _prompt_s: float = field(init=False)  # decayed seconds the pooled prompt tokens added
    _prompt_n: float = field(init=False)  # decayed prompt tokens of those steps
    _chunks: _Sums = field(init=False)  # (tokens, seconds) of chunks decoded apart

    def __post_init__(self) -> None:
        self._prompt_s = self.prefill_token_s * PRIOR_PROMPT_TOKENS
        self._prompt_n = PRIOR_PROMPT_TOKENS
        x0, x1 = _PRIOR_CHUNK_TOKENS
        self._chunks = _points(
            tuple((x, self.chunk_call_s + self.prefill_token_s * x) for x in (x0, x1))
        )

    def fit(self) -> tuple[float, float]:
        """(fixed_s, token_s) of a step without prompt tokens."""
        return self._measured.plus(self._prior).line()

    def decode_step_s(self, n_tokens: int) -> float:
        fixed_s, token_s = self.fit()
        return fixed_s + token_s * n_tokens

    def draft_price(self, n_decoding: int, padded: bool) -> float:
        """What a draft token costs, in units of what a token of the shared step
        costs: a draft token pays when its chance of acceptance is above it.
        ``padded``: every decoding sequence gets a row for each draft position
        (per-slot KV, ``Scheduler._pad``), so a draft position costs a row for each."""
        fixed_s, token_s = self.fit()
        n = max(n_decoding, 1)
        per_token = (fixed_s + token_s * n) / n
        if per_token <= 0:
            return 0.0
        rows = n if padded else 1
        return token_s * rows / per_token

    def observe(self, n_prefill: int, n_decode: int, seconds: float, n_calls: int = 0) -> None:
        """One step took ``seconds`` for ``n_prefill`` prompt tokens beside
        ``n_decode`` decode tokens (drafts included); ``n_calls``: the prompt chunks
        that had a ``llama_decode`` of their own (per-slot layout; 0: one call)."""
        if seconds <= 0 or n_decode + n_prefill == 0:
            return
        if n_prefill > 0:
            sample = seconds / n_prefill
            self.prompt_token_s += SERVICE_WEIGHT * (sample - self.prompt_token_s)
        if n_prefill == 0:
            self._measured.decay(DECAY)
            self._measured.add(n_decode, seconds)
            return
        if n_decode == 0:
            return  # a lone prompt's big batch costs less per token than a mixed step's
        # What the prompt tokens added to the decode rows' step. Before 2026-12-07 the
        # whole step's time per token: per-slot, each chunk's own call was charged to
        # its tokens, small chunks looked dear, and the budget shrank them further.
        added = seconds - self.decode_step_s(n_decode)
        least = max(MIN_PROMPT_TOKEN_SHARE * self.fit()[1], 1e-6)
        if n_calls:
            self._learn_chunks(n_prefill / n_calls, added / n_calls, n_calls, least)
            return
        self._prompt_s = PROMPT_DECAY * self._prompt_s + added
        self._prompt_n = PROMPT_DECAY * self._prompt_n + n_prefill
        self.prefill_token_s = max(self._prompt_s / self._prompt_n, least)

    def _learn_chunks(self, tokens: float, seconds: float, n_calls: int, least: float) -> None:
        """A chunk decoded apart costs ``chunk_call_s + prefill_token_s * tokens``: a
        line through recent chunks (their sizes vary: budgets, prompts' last chunks)."""
        self._chunks.decay(PROMPT_DECAY)
        self._chunks.add(tokens, seconds, n_calls)
        call_s, token_s = self._chunks.line()
        # A call's fixed part is at most a one-row decode step's.
        self.chunk_call_s = min(call_s, self.decode_step_s(1))
        self.prefill_token_s = max(token_s, least)


@dataclass
class PrefillBudget:
    max_tokens: int
    itl_target_s: float | None  # None: always ``max_tokens`` (a fixed chunk)
    costs: StepCosts = field(default_factory=StepCosts)
    apart: bool = False  # each prompt chunk has a ``llama_decode`` of its own (per-slot)

    def observe(self, n_prefill: int, n_chunks: int, n_decode: int, seconds: float) -> None:
        """A step's time: ``n_prefill`` prompt tokens in ``n_chunks`` chunks beside
        ``n_decode`` decode tokens."""
        self.costs.observe(n_prefill, n_decode, seconds, n_chunks if self.apart else 0)

    def tokens(self, n_decode_tokens: int, n_prefilling: int = 1) -> int:
        """Prompt tokens for a step that also carries ``n_decode_tokens`` (drafts
        included) while ``n_prefilling`` prompts are being prefilled."""
        alone = n_decode_tokens == 0 and n_prefilling <= 1
        if alone or self.itl_target_s is None:
            return self.max_tokens
        token_s = self.costs.prefill_token_s
        call_s = self.costs.chunk_call_s if self.apart else 0.0
        decode_s = self.costs.decode_step_s(n_decode_tokens)
        spare_s = max(self.itl_target_s, MIN_STEP_IN_DECODE_STEPS * decode_s) - decode_s - call_s
        # A chunk decoded apart is worth its call: its tokens cost at least the call's
        # fixed part. Pooled, a chunk rides the decode rows' call: one token is worth it.
        worth = max(1, math.ceil(call_s / token_s))
        budget = int(spare_s / token_s) if spare_s > 0 else 0
        return min(max(worth, budget), self.max_tokens)
