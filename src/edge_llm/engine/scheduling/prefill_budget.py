"""What a decode step costs, and so how many prompt tokens the next one may prefill,
how long a draft pays and when a new request should get its first token: pure
arithmetic on measured step times, no clock. The engine's one cost model.

:class:`StepCosts` fits ``seconds = fixed_s + token_s * n_tokens`` to recent steps
without prompt tokens (least squares, older steps weighing less), and learns what a
prompt token adds to a step that also decodes and what a prompt token costs in
any step (``prompt_token_s``: admission's service rate, ``admission.py``).

:class:`PrefillBudget`: a lone prompt (nothing decoding, no other prompt) gets the
whole batch, so it prefills in as few ``llama_decode`` calls as the batch allows, as
llama-server does. While streams decode or other prompts wait for their first
token, every prompt token in a step delays them all, so the step gets only the
prompt tokens that keep it near ``itl_target_s``
(token-budget scheduling as in Sarathi-Serve), or near twice a decode step when
that is longer (a loaded machine, a big model), so that a long prompt still makes
progress: at least a decode step's worth of prompt tokens, and at least one. Until
2026-12-07 the floor was 32 tokens, whatever they cost: on a model whose prompt
tokens cost ten times more (the 1.5B model against the 135M one) that tripled every
step beside decoding streams, and the streams stuttered (issue 60).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Before anything is measured: SmolLM2-135M on 2 cores (docs/design.md), a step of one
# token 10 ms and of nine 37 ms; measured steps outweigh these within a few dozen.
_PRIOR_POINTS = ((1.0, 0.010), (9.0, 0.037))
_PRIOR_WEIGHT = 0.5
DECAY = 0.97
DEFAULT_PREFILL_TOKEN_S = 1.0 / 300.0
EWMA_WEIGHT = 0.3
SERVICE_WEIGHT = 0.2
# A step with prompt tokens may take this many decode steps, whatever the target: on
# a loaded machine, where a decode step alone exceeds the target, a long prompt still
# prefills in a bounded number of steps.
MIN_STEP_IN_DECODE_STEPS = 2.0
MIN_SAMPLE_TOKENS = 4  # prefill steps smaller than this say more about overhead than cost


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


def _prior() -> _Sums:
    sums = _Sums()
    for x, y in _PRIOR_POINTS:
        sums.add(x, y, _PRIOR_WEIGHT)
    return sums


@dataclass
class StepCosts:
    prefill_token_s: float = DEFAULT_PREFILL_TOKEN_S  # a prompt token beside decoding streams
    prompt_token_s: float = DEFAULT_PREFILL_TOKEN_S  # a step's seconds per prompt token in it
    _measured: _Sums = field(default_factory=_Sums)
    _prior: _Sums = field(default_factory=_prior)

    def fit(self) -> tuple[float, float]:
        """(fixed_s, token_s) of a step without prompt tokens."""
        s = self._measured.plus(self._prior)
        spread = s.w * s.xx - s.x * s.x
        token_s = max((s.w * s.xy - s.x * s.y) / spread, 0.0) if spread > 0 else 0.0
        fixed_s = max((s.y - token_s * s.x) / s.w, 0.0)
        return fixed_s, token_s

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

    def observe(self, n_prefill: int, n_decode: int, seconds: float) -> None:
        """One step took ``seconds`` for ``n_prefill`` prompt tokens beside
        ``n_decode`` decode tokens (drafts included)."""
        if seconds <= 0 or n_decode + n_prefill == 0:
            return
        if n_prefill > 0:
            sample = seconds / n_prefill
            self.prompt_token_s += SERVICE_WEIGHT * (sample - self.prompt_token_s)
        if n_prefill == 0:
            self._measured.decay(DECAY)
            self._measured.add(n_decode, seconds)
            return
        if n_decode == 0 or n_prefill < MIN_SAMPLE_TOKENS:
            return  # a lone prompt's big batch costs less per token than a mixed step's
        # The step's cost per token: above the marginal cost of a prompt token (the
        # step's fixed part is spread over it), so budgets err on the short side, and
        # it needs no difference of two noisy estimates.
        per_token = seconds / (n_prefill + n_decode)
        self.prefill_token_s += EWMA_WEIGHT * (per_token - self.prefill_token_s)


@dataclass
class PrefillBudget:
    max_tokens: int
    itl_target_s: float | None  # None: always ``max_tokens`` (a fixed chunk)
    costs: StepCosts = field(default_factory=StepCosts)

    def tokens(self, n_decode_tokens: int, n_prefilling: int = 1) -> int:
        """Prompt tokens for a step that also carries ``n_decode_tokens`` (drafts
        included) while ``n_prefilling`` prompts are being prefilled."""
        alone = n_decode_tokens == 0 and n_prefilling <= 1
        if alone or self.itl_target_s is None:
            return self.max_tokens
        decode_s = self.costs.decode_step_s(n_decode_tokens)
        spare_s = max(self.itl_target_s, MIN_STEP_IN_DECODE_STEPS * decode_s) - decode_s
        # spare_s >= decode_s: the step stays within max(itl_target_s, two decode
        # steps) whatever a prompt token costs.
        budget = int(spare_s / self.costs.prefill_token_s)
        return max(1, min(budget, self.max_tokens))
