"""What a request asks of sampling, and what it gets back about a token: value types
the wire formats build and the engine consumes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace


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
    # The dialects of vLLM, SGLang and llama-server (docs/http-api.md#request-dialects).
    ignore_eos: bool = False  # end-of-generation tokens are never sampled
    min_tokens: int = 0  # end tokens (and stop_token_ids) held off until this many
    repetition_penalty: float = 1.0  # vLLM's: over the prompt's and the output's tokens
    stop_token_ids: tuple[int, ...] = ()  # these tokens end the output, as EOS does
    include_stop_str: bool = False  # the matched stop string stays in the output
    skip_special_tokens: bool = True  # False: control tokens are written out as text
    # Set by the engine when the sequence starts, for repetition_penalty only.
    prompt_tokens: tuple[int, ...] = ()

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
            and self.repetition_penalty == 1.0
            and not self.holds_end
        )

    @property
    def holds_end(self) -> bool:
        """End tokens are kept from being sampled for a while (or always)."""
        return self.ignore_eos or self.min_tokens > 0

    def with_prompt(self, prompt_tokens: Sequence[int]) -> SamplingParams:
        """These params with the prompt a repetition penalty also counts (unchanged
        when there is no such penalty: no copy of the prompt is kept then)."""
        if self.repetition_penalty == 1.0:
            return self
        return replace(self, prompt_tokens=tuple(prompt_tokens))


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
