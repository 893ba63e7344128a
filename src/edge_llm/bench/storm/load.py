"""The storm's load model: who sends what, when they give up, how they read. Pure.

Every user has a profile drawn once (patience before pressing regenerate, whether it
renders slowly) and an unbounded sequence of turns (prompt length and text, whether the
turn is abandoned mid-stream and after how many tokens, think time after it). Each draw
comes from a ``random.Random`` seeded by ``(seed, user)`` or ``(seed, user, turn)``, so a
schedule depends only on the settings, never on timing: the same seed gives every target
the same users and prompts, and a re-run gives the same load again.

Prompt lengths are in tokens, approximated by words (``words_per_token``: about 0.75 for
English prose with a GPT-style BPE); the server's ``usage.prompt_tokens`` is recorded
beside the requested length. With ``fit_prompts`` the range is lowered to what the
targets accept (:func:`fitted`), so that the default load is not refused as too long.

Besides the interactive users, ``batch_users`` run a background batch: one job after
another, no think time, never regenerated, never abandoned, read at once. With
``priorities`` their requests carry ``priority: batch_priority`` (less urgent than the
interactive users' default 0); without, the same load runs in one class.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, replace
from typing import Any

from edge_llm.bench.prompts import Prompt
from edge_llm.bench.storm.corpus import corpus_words
from edge_llm.protocol.priority import MAX_PRIORITY, MIN_PRIORITY

QUESTION = "Summarise the passage above in two sentences."


class StormSettingsError(ValueError):
    """A storm setting is out of range; the message names it."""


@dataclass(frozen=True, slots=True)
class StormSettings:
    """Everything that shapes the load (times in seconds, shares in 0..1)."""

    users: int = 16
    duration_s: float = 60.0
    prompt_tokens: tuple[int, int] = (128, 1024)
    max_tokens: int = 128
    patience_s: tuple[float, float] = (3.0, 8.0)
    max_regenerates: int = 3
    abandon_share: float = 0.15
    abandon_after_tokens: tuple[int, int] = (4, 32)
    slow_share: float = 0.25
    slow_tokens_per_s: float = 4.0
    slow_rcvbuf: int = 4096
    think_s: tuple[float, float] = (1.0, 4.0)
    ttft_slo_ms: float = 3000.0
    timeout_s: float = 120.0
    seed: int = 0
    words_per_token: float = 0.75
    batch_users: int = 0
    batch_priority: int = 5
    priorities: bool = True
    fit_prompts: bool = False

    def check(self) -> None:
        """Raise :class:`StormSettingsError` naming the first bad setting."""
        _require(self.users >= 1, "users must be >= 1")
        _require(self.duration_s > 0, "duration must be > 0")
        _require_range(self.prompt_tokens, "prompt_tokens", minimum=1)
        _require(self.max_tokens >= 1, "max_tokens must be >= 1")
        _require_range(self.patience_s, "patience", minimum=0.0)
        _require(self.max_regenerates >= 0, "max_regenerates must be >= 0")
        _require(0.0 <= self.abandon_share <= 1.0, "abandon_share must be within 0..1")
        _require_range(self.abandon_after_tokens, "abandon_after_tokens", minimum=1)
        _require(0.0 <= self.slow_share <= 1.0, "slow_share must be within 0..1")
        _require(self.slow_tokens_per_s > 0, "slow_tokens_per_s must be > 0")
        _require(self.slow_rcvbuf >= 1024, "slow_rcvbuf must be >= 1024")
        _require_range(self.think_s, "think", minimum=0.0)
        _require(self.ttft_slo_ms > 0, "ttft_slo_ms must be > 0")
        _require(self.timeout_s > 0, "timeout must be > 0")
        _require(0.1 <= self.words_per_token <= 4.0, "words_per_token must be within 0.1..4")
        _require(self.batch_users >= 0, "batch_users must be >= 0")
        _require(
            MIN_PRIORITY <= self.batch_priority <= MAX_PRIORITY,
            f"batch_priority must be within {MIN_PRIORITY}..{MAX_PRIORITY}",
        )

    def priority_of(self, profile: UserProfile) -> int | None:
        """The ``priority`` field a user's requests carry (None: none, the default)."""
        return self.batch_priority if profile.batch and self.priorities else None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise StormSettingsError(message)


def _require_range(pair: tuple[float, float], name: str, minimum: float) -> None:
    low, high = pair
    _require(
        minimum <= low <= high, f"{name} must be a range LOW-HIGH with {minimum} <= LOW <= HIGH"
    )


INTERACTIVE, BATCH = "interactive", "batch"
# Prompt tokens a fitted range leaves for the chat template, the tag and the question,
# and the factor for a tokenizer that splits the text finer than ``words_per_token``
# says (SmolLM2's: 0.91-1.16 tokens per requested token with the tag and question).
FIT_OVERHEAD_TOKENS = 64
FIT_MARGIN = 1.2


@dataclass(frozen=True, slots=True)
class UserProfile:
    """What a user is like for the whole run."""

    user: int
    patience_s: float
    slow: bool
    batch: bool = False  # a background job runner, not an interactive user

    @property
    def session(self) -> str:
        """The ``X-Session-Id`` of this user's requests (regenerates share it)."""
        return f"storm-user-{self.user}"

    @property
    def kind(self) -> str:
        return BATCH if self.batch else INTERACTIVE


@dataclass(frozen=True, slots=True)
class Turn:
    """One question of one user: the prompt, whether it is abandoned, the think time after."""

    user: int
    index: int
    prompt_tokens: int
    window_start: int
    abandon_after_tokens: int | None
    think_s: float

    def prompt(self, settings: StormSettings, tag: str) -> Prompt:
        """The prompt text: ``[tag]``, a window of the corpus of about ``prompt_tokens``
        tokens, then the question. Regenerates of this turn send exactly the same text."""
        words = corpus_words()
        n_words = max(1, round(self.prompt_tokens * settings.words_per_token))
        window = [words[(self.window_start + i) % len(words)] for i in range(n_words)]
        text = f"[{tag}] " + " ".join(window) + "\n\n" + QUESTION
        return Prompt.user(f"u{self.user}-t{self.index}", text, settings.max_tokens)


def profiles(settings: StormSettings) -> list[UserProfile]:
    """Users ``0 .. users - 1`` are interactive, the next ``batch_users`` run the batch
    (each waits for its answer up to ``timeout_s`` and reads at full speed)."""
    batch = range(settings.users, settings.users + settings.batch_users)
    return [user_profile(settings, u) for u in range(settings.users)] + [
        UserProfile(u, settings.timeout_s, slow=False, batch=True) for u in batch
    ]


def user_profile(settings: StormSettings, user: int) -> UserProfile:
    """An interactive user's profile."""
    rng = random.Random(f"{settings.seed}/user/{user}")
    return UserProfile(
        user=user,
        patience_s=rng.uniform(*settings.patience_s),
        slow=rng.random() < settings.slow_share,
    )


def user_turn(settings: StormSettings, user: int, index: int, *, batch: bool = False) -> Turn:
    """A turn of a user; a batch job is never abandoned and the next follows at once."""
    rng = random.Random(f"{settings.seed}/user/{user}/turn/{index}")
    prompt_tokens = rng.randint(*settings.prompt_tokens)
    window_start = rng.randrange(len(corpus_words()))
    abandon = rng.random() < settings.abandon_share
    abandon_after = rng.randint(*settings.abandon_after_tokens) if abandon else None
    think = rng.uniform(*settings.think_s)
    if batch:
        abandon_after, think = None, 0.0
    return Turn(user, index, prompt_tokens, window_start, abandon_after, think)


def fitted(settings: StormSettings, max_prompt_tokens: int | None) -> StormSettings:
    """With ``fit_prompts``, the prompt range lowered so that every prompt stays within
    the smallest ``max_prompt_tokens`` of the targets (None: none says)."""
    if not settings.fit_prompts or max_prompt_tokens is None:
        return settings
    high = int((max_prompt_tokens - FIT_OVERHEAD_TOKENS) / FIT_MARGIN)
    low, wanted = settings.prompt_tokens
    high = max(1, min(wanted, high))
    return replace(settings, prompt_tokens=(min(low, high), high))


def start_offset(settings: StormSettings, user: int) -> float:
    """When the user sends its first request, spread over the first think-time range so
    that users do not all arrive in the same millisecond."""
    rng = random.Random(f"{settings.seed}/user/{user}/start")
    return rng.uniform(0.0, settings.think_s[1])
