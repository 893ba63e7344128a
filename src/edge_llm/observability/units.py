"""How byte figures are shown: one rounding everywhere, so the same KV capacity reads
the same in the serve banner, ``edge-llm top``, ``edge-llm doctor`` and the playground
(whose ``app.js`` applies this rule in its ``mib()``)."""

from __future__ import annotations

import math

MIB = 1024 * 1024


def mib(num_bytes: float) -> str:
    """``265420800`` -> ``"253.1"``: MiB with one decimal, a half rounded up (as in
    JavaScript, so the playground prints the same digits)."""
    return f"{math.floor(num_bytes / MIB * 10 + 0.5) / 10:.1f}"
