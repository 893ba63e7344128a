"""What a request asks of sampling, and what it gets back about a token: value types
the wire formats build and the engine consumes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)
    grammar: str | None = None  # GBNF text, root rule ``root``
    n_logprobs: int | None = None  # None: no logprobs; k >= 0: the chosen token's and top k

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def plain_greedy(self) -> bool:
        """Greedy with nothing that changes the logits: a bare argmax picks the token."""
        return (
            self.greedy
            and self.grammar is None
            and not self.logit_bias
            and self.presence_penalty == 0.0
            and self.frequency_penalty == 0.0
        )


@dataclass(frozen=True)
class TokenLogprob:
    """The model's log-probability of a sampled token and of its ``top`` alternatives
    (token id, logprob), most likely first; from the raw logits, before sampling
    (temperature, penalties, bias and grammar do not change it)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class SamplingDefaults:
    """What a request gets for each sampling field it leaves out: the model's
    recommendation (GGUF ``general.sampling.*``) over the engine's defaults."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0

    def overridden(self, recommended: dict[str, float]) -> SamplingDefaults:
        """These defaults with the model's recommended values put over them."""
        return SamplingDefaults(
            temperature=recommended.get("temperature", self.temperature),
            top_p=recommended.get("top_p", self.top_p),
            top_k=int(recommended.get("top_k", self.top_k)),
            min_p=recommended.get("min_p", self.min_p),
        )
