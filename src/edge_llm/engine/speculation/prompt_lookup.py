"""Prompt-lookup speculative decoding: drafts from a sequence's own tokens, no draft model.

Small models mostly rewrite, summarise and extract text that is already in the
prompt, so their output copies long runs of it. :class:`PromptLookup` finds the
longest n-gram (``MAX_NGRAM`` down to ``MIN_NGRAM`` tokens) ending the sequence
that occurred earlier in its prompt or output, and proposes the tokens that followed
its latest occurrence. The engine feeds ``[last token, *draft]`` in the same
``llama_decode`` as everyone else's tokens, with logits at every position;
:func:`verify` samples each position with the sequence's own sampler and keeps the
tokens up to the first one that differs from the draft.

Sampling each position from the model and accepting the draft token when the sample
equals it is the standard speculative-sampling rule for a deterministic draft
(accept with probability p(draft), else a token from the rest of p): the output
distribution is the model's, greedy output is the plain argmax, a grammar or
penalties see exactly the accepted tokens, and each emitted token draws the random
generator once, as without speculation.

The draft length follows the sequence's measured acceptance: with a per-token
acceptance rate ``a`` (accepted over accepted + rejections, recent drafts weighing
more), the k-th draft token is accepted with probability ``a**k`` and costs what one
more token adds to the step; it pays when ``a**k`` exceeds that cost over the
step's cost per token (``StepCosts.draft_price``, measured as the engine runs: with
the embedded model and the project's llama.cpp patches about 0.1-0.2 for one stream,
and higher beside others, whose batch already uses the compute; in the
per-slot layout a draft position costs a row for every decoding sequence, so drafts
beside others rarely pay). After a rejection the next draft is at most twice the
run that was accepted (the copied passage may have ended). A sequence whose drafts
do not pay drafts one token every ``probe_every`` steps (``PROBE_EVERY``, times the
rows a probe costs) to notice when its text starts copying; text without n-gram
matches costs nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypeVar

MIN_NGRAM = 2
MAX_NGRAM = 4
PRIOR_ACCEPTANCE = 0.6  # before a sequence's first draft
PRIOR_TRIALS = 2.0
DECAY = 0.8  # per draft: the last ten or so drafts count
PROBE_EVERY = 16

T = TypeVar("T")


class PromptLookup:
    """One sequence's n-gram index over its tokens and its acceptance rate."""

    def __init__(self, max_draft: int) -> None:
        self.max_draft = max_draft
        self._index: dict[tuple[int, ...], int] = {}  # n-gram -> end of its latest occurrence
        self._indexed = 0  # n-grams ending before this position are in the index
        self._accepted = PRIOR_ACCEPTANCE * PRIOR_TRIALS
        self._trials = PRIOR_TRIALS
        self._since_draft = 0
        self._cap = max_draft  # after a rejection: twice the run it accepted
        self.num_drafted = 0
        self.num_accepted = 0

    @property
    def acceptance(self) -> float:
        """Recent chance that a draft token is accepted, given the ones before it were."""
        return self._accepted / self._trials

    def draft_length(self, threshold: float, probe_every: int = PROBE_EVERY) -> int:
        """The longest draft whose last token is still worth its cost
        (``threshold``); a one-token probe every ``probe_every`` proposals when none is."""
        a = self.acceptance
        probe = 1 if self._since_draft >= probe_every else 0
        if a <= threshold:
            return probe
        if a >= 1.0 or threshold <= 0.0:
            k = self._cap
        else:
            k = min(self._cap, max(1, int(math.log(threshold) / math.log(a))))
        return k

    def propose(
        self,
        token_ids: Sequence[int],
        limit: int,
        threshold: float = 0.0,
        probe_every: int = PROBE_EVERY,
    ) -> list[int]:
        """At most ``limit`` tokens likely to follow ``token_ids``, as many as pay at
        ``threshold`` (see :meth:`draft_length`); [] when none."""
        self._extend_index(token_ids)
        self._since_draft += 1
        k = min(self.draft_length(threshold, probe_every), limit)
        if k <= 0:
            return []
        end = len(token_ids)
        for n in range(min(MAX_NGRAM, end - 1), MIN_NGRAM - 1, -1):
            found = self._index.get(tuple(token_ids[end - n :]))
            if found is not None:
                self._since_draft = 0
                return list(token_ids[found : found + k])
        return []

    def feedback(self, n_drafted: int, n_accepted: int) -> None:
        """What verification kept of the last draft."""
        if n_drafted == 0:
            return
        self.num_drafted += n_drafted
        self.num_accepted += n_accepted
        rejected = 1 if n_accepted < n_drafted else 0
        self._cap = max(1, 2 * n_accepted) if rejected else self.max_draft
        self._accepted = DECAY * self._accepted + n_accepted
        self._trials = DECAY * self._trials + n_accepted + rejected

    def _extend_index(self, token_ids: Sequence[int]) -> None:
        """Index the n-grams that end before the last token (each has a successor)."""
        last = len(token_ids) - 1
        for stop in range(max(self._indexed, 1), last + 1):
            for n in range(MIN_NGRAM, MAX_NGRAM + 1):
                if stop >= n:
                    self._index[tuple(token_ids[stop - n : stop])] = stop
        self._indexed = max(self._indexed, last + 1)


def verify(
    draft: Sequence[int],
    sample_at: Callable[[int], T],
    token_of: Callable[[T], int],
    go_on: Callable[[], bool] = lambda: True,
) -> list[T]:
    """Sample logit positions 0..len(draft) in order (position i follows draft[:i]),
    stopping after the first sample that differs from the draft: the accepted run.
    Every position is sampled only once the previous one matched, so samplers with
    state (grammar, penalties) see exactly the tokens emitted. Before each position
    after the first, ``go_on()`` may end the run there (the stream was paused: it
    gets the one token of the step in flight, as without a draft)."""
    run: list[T] = []
    for i in range(len(draft) + 1):
        if i and not go_on():
            break
        sampled = sample_at(i)
        run.append(sampled)
        if i == len(draft) or token_of(sampled) != draft[i]:
            break
    return run
