"""Sampling without llama.cpp's chain where numpy is several times cheaper: a draw at
a temperature from the whole vocabulary, or from its top-p nucleus (no top-k, no
min-p: OpenAI's defaults and the engine's).

llama.cpp's chain spends about 0.55 ms a token there for SmolLM2's 49,152 tokens (it
sorts them for top-p and builds a discrete distribution over them), 3-5 % of a
decode step on two cores; this takes 0.1-0.2 ms. It follows llama.cpp's rules: top-p
keeps the most likely tokens, in order, until their probability at temperature 1
reaches ``top_p`` (the chain applies it before the temperature), then the temperature
scales the kept logits and one uniform number picks a token. Each draw uses the
generator once, so a seeded stream repeats whatever the batch, the drafts or the load.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from edge_llm.engine.runtime.logits import Logits

BLOCK = 512  # the draw finds its block by block totals, then its token inside the block
NUCLEUS_TRIES = (256, 4096)  # the nucleus is looked for among this many top tokens first


class TemperatureDraw:
    """One sequence's draws: ``temperature`` > 0, ``top_p`` in (0, 1]."""

    def __init__(self, temperature: float, top_p: float, seed: int | None) -> None:
        self.temperature = temperature
        self.top_p = top_p
        self._rng = np.random.default_rng(seed)  # None: the OS's entropy
        self._weights = np.empty(0, dtype=np.float32)

    def __call__(self, logits: Logits) -> int:
        """The index of the drawn entry of ``logits`` (-inf: never drawn)."""
        peak = float(logits.max())
        if not np.isfinite(peak):  # everything banned: no distribution to draw from
            return int(logits.argmax())
        if self.top_p < 1.0:
            kept = self._nucleus(logits, peak)
            return int(kept[self._draw(logits[kept], peak)])
        return self._draw(logits, peak)

    def _draw(self, logits: Logits, peak: float) -> int:
        weights = self._scratch(len(logits))
        used = weights[: len(logits)]
        np.subtract(logits, peak, out=used)
        used *= np.float32(1.0 / self.temperature)
        np.exp(used, out=used)
        weights[len(logits) :] = 0.0
        return _index_at(weights, self._rng.random())

    def _scratch(self, n: int) -> Logits:
        """A buffer of at least ``n`` weights, padded to whole blocks."""
        size = -(-n // BLOCK) * BLOCK
        if len(self._weights) < size:
            self._weights = np.empty(size, dtype=np.float32)
        return self._weights[:size]

    def _nucleus(self, logits: Logits, peak: float) -> npt.NDArray[np.intp]:
        """The ids top-p keeps, most likely first."""
        probs = np.exp(logits - peak)  # at temperature 1, unnormalised
        target = self.top_p * float(probs.sum(dtype=np.float64))
        for k in (*(k for k in NUCLEUS_TRIES if k < len(probs)), len(probs)):
            top = np.argpartition(probs, -k)[-k:] if k < len(probs) else np.arange(k)
            top = top[np.argsort(-probs[top], kind="stable")]
            reached = np.cumsum(probs[top], dtype=np.float64)
            cut = int(np.searchsorted(reached, target))  # the first index at the target
            if cut < k:
                return top[: cut + 1]
        return top  # rounding kept the total under the target: every token


def _index_at(weights: Logits, uniform: float) -> int:
    """The entry where the running total of ``weights`` (a whole number of blocks)
    first passes ``uniform`` times their sum; a zero weight never does."""
    sums = weights.reshape(-1, BLOCK).sum(axis=1, dtype=np.float64)
    totals = np.cumsum(sums)
    point = uniform * totals[-1]
    block = int(np.searchsorted(totals, point, side="right"))
    if block >= len(sums):  # rounding: the last block that holds any weight
        block = int(np.flatnonzero(sums)[-1])
    inside = weights[block * BLOCK : (block + 1) * BLOCK]
    before = totals[block - 1] if block else 0.0
    running = np.cumsum(inside, dtype=np.float64)
    index = int(np.searchsorted(running, point - before, side="right"))
    if index >= BLOCK or inside[index] == 0.0:  # rounding ran past the block's end
        index = int(np.flatnonzero(inside)[-1])
    return block * BLOCK + index
