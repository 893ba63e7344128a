"""The engine's shared draft history: the tokens of recently finished sequences, so one
request can draft from another's prompt and answer (llama-server's ngram-mod shares one
hash pool across its slots for the same reason; suffix decoding keeps a tree across
requests). An on-device user edits the same function twice, regenerates an answer,
asks again about the same document: the second request's text is in the first one.

A draft is only a guess that the model verifies, so the history changes no emitted
token (greedy text is the argmax, sampled text keeps the model's distribution); it
changes how fast a stream runs, which is all another request can learn from it.

Bounded: at most ``max_tokens`` tokens of retired sequences; the oldest go first, and
the n-gram index is rebuilt from what is left when stale entries pile up.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence

NGRAMS = (16, 8, 4, 3, 2)  # suffix lengths looked up, longest first
DEFAULT_MAX_TOKENS = 32_768
MIN_RETIRED_TOKENS = 8  # shorter sequences teach nothing worth their index entries


def ngram_keys(tokens: Sequence[int], stop: int) -> Iterator[tuple[int, ...]]:
    """The n-grams (each of :data:`NGRAMS` that fits) ending just before ``stop``."""
    for n in NGRAMS:
        if stop >= n:
            yield tuple(tokens[stop - n : stop])


class DraftHistory:
    """Token runs of retired sequences and an n-gram index into them: the n-gram ->
    (run, the position after its latest occurrence)."""

    def __init__(self, max_tokens: int = DEFAULT_MAX_TOKENS) -> None:
        self.max_tokens = max_tokens
        self._runs: OrderedDict[int, tuple[int, ...]] = OrderedDict()  # oldest first
        self._index: dict[tuple[int, ...], tuple[int, int]] = {}
        self._tokens = 0
        self._next_id = 0

    @property
    def num_tokens(self) -> int:
        return self._tokens

    def retire(self, tokens: Sequence[int]) -> None:
        """Keep a finished sequence's tokens (prompt and output) for later drafts."""
        run = tuple(tokens[-self.max_tokens :])
        if len(run) < MIN_RETIRED_TOKENS:
            return
        run_id, self._next_id = self._next_id, self._next_id + 1
        self._runs[run_id] = run
        self._tokens += len(run)
        while self._tokens > self.max_tokens:
            _, oldest = self._runs.popitem(last=False)
            self._tokens -= len(oldest)
        for stop in range(1, len(run)):
            for key in ngram_keys(run, stop):
                self._index[key] = (run_id, stop)
        if len(self._index) > len(NGRAMS) * 2 * self.max_tokens:
            self._reindex()

    def find(self, key: tuple[int, ...]) -> tuple[tuple[int, ...], int] | None:
        """(run, position after the n-gram ``key``) of its latest occurrence, if kept."""
        found = self._index.get(key)
        if found is None:
            return None
        run = self._runs.get(found[0])
        return (run, found[1]) if run is not None else None

    def _reindex(self) -> None:
        self._index = {}
        for run_id, run in self._runs.items():
            for stop in range(1, len(run)):
                for key in ngram_keys(run, stop):
                    self._index[key] = (run_id, stop)
