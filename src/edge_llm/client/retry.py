"""Retry policy: which failures get another attempt, and how long to wait first.

A failure is retried when all hold: attempts remain (``max_attempts`` counts the
first one); no content has been handed to the caller yet (a retry would repeat
text); it is not a 4xx (never retried: the request itself is wrong); and its
``code`` or ``server_code`` is listed in ``retry_on``.

The wait is ``backoff_ms * 2**(attempt-1)`` with a random +/- ``jitter``
fraction, raised to the server's ``Retry-After`` when a 503 gives one, and capped
at ``max_backoff_ms``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from edge_llm.client.config import RetryConfig
from edge_llm.client.errors import ClientError, HTTPStatusError, OverloadedError


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """Wait ``delay_ms`` then make attempt number ``next_attempt``; ``cause`` is the
    ``retry_on`` entry that matched."""

    next_attempt: int
    delay_ms: float
    cause: str


class RetryPolicy:
    """Decides about retries; pass ``rng`` for reproducible jitter in tests."""

    def __init__(self, config: RetryConfig, rng: random.Random | None = None) -> None:
        self.config = config
        self._rng = rng or random.Random()

    def cause_of(self, error: ClientError) -> str | None:
        """The ``retry_on`` entry matching ``error``, or None if it is not retryable."""
        if isinstance(error, HTTPStatusError) and 400 <= error.status < 500:
            return None
        for code in (error.code, error.server_code):
            if code is not None and code in self.config.retry_on:
                return code
        return None

    def decide(self, error: ClientError, attempt: int, *, delivered: bool) -> RetryDecision | None:
        """After attempt number ``attempt`` (1-based) failed with ``error``: the retry
        to make, or None to give up. ``delivered`` is whether any content was
        already passed to the caller."""
        if delivered or attempt >= self.config.max_attempts:
            return None
        cause = self.cause_of(error)
        if cause is None:
            return None
        return RetryDecision(attempt + 1, self.backoff_ms(attempt, error), cause)

    def backoff_ms(self, attempt: int, error: ClientError | None = None) -> float:
        """The wait before attempt ``attempt + 1``."""
        base = float(self.config.backoff_ms * 2 ** (attempt - 1))
        delay = base * (1 + self._rng.uniform(-self.config.jitter, self.config.jitter))
        if isinstance(error, OverloadedError) and error.retry_after_s is not None:
            delay = max(delay, error.retry_after_s * 1000)
        return min(delay, float(self.config.max_backoff_ms))
