"""Prompt-lookup speculative decoding: drafts from text already seen, no draft model.

Small models mostly rewrite, summarise, edit and extract text that is already in the
prompt, so their output copies long runs of it. :class:`PromptLookup` finds the
longest n-gram ending the sequence (16, 8, 4, 3 or 2 tokens: :data:`NGRAMS`) that
occurred earlier in its own prompt or output, and proposes the tokens that followed its
latest occurrence. Only the sequence's own text: drafts from other requests change a
greedy text in the default mode (a draft changes the verify batch, and near-ties flip;
measured 2026-12-07), so a request's drafts never depend on another's. A
match near the end of the sequence's own text continues into the draft itself, so a
repeating pattern drafts whole periods. The engine feeds ``[last token, *draft]`` in
the same ``llama_decode`` as everyone else's tokens, with logits at every position;
:func:`verify` samples each position with the sequence's own sampler and keeps the
tokens up to the first one that differs from the draft.

Sampling each position from the model and accepting the draft token when the sample
equals it is the standard speculative-sampling rule for a deterministic draft
(accept with probability p(draft), else a token from the rest of p): the output
distribution is the model's, greedy output is the plain argmax, a grammar or
penalties see exactly the accepted tokens, and each emitted token draws the random
generator once, as without speculation.

The draft length follows measured acceptance, kept apart for long matches (8 tokens
or more, which continue a copy) and short ones (2-4 tokens, often a coincidence):
with a per-token acceptance rate ``a`` (accepted over accepted + rejections, recent
drafts weighing more), the k-th draft token is accepted with probability ``a**k`` and
costs what one more token adds to the step; it pays when ``a**k`` exceeds that cost
over the step's cost per token (``StepCosts.draft_price``, measured as the engine
runs; in the per-slot layout a draft position costs a row for every decoding
sequence, so drafts beside others rarely pay). After a rejection the next draft is
at most twice the run that was accepted (the copied passage may have ended). A
sequence whose drafts do not pay drafts one token every ``probe_every`` steps
(``PROBE_EVERY``, times the rows a probe costs) to notice when its text starts
copying; text without n-gram matches costs nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from edge_llm.engine.speculation.edits import EditTracker

NGRAMS = (16, 8, 4, 3, 2)  # suffix lengths looked up, longest first
LONG_MATCH = 8  # a match this long continues a copy: its acceptance is kept apart
# Before a kind of match has been drafted: short matches are often coincidences.
PRIOR_ACCEPTANCE = {False: 0.6, True: 0.8}  # by "long match"
PRIOR_TRIALS = 2.0
DECAY = 0.8  # per draft: the last ten or so drafts count
PROBE_EVERY = 16

T = TypeVar("T")


class _Acceptance:
    """A decayed acceptance rate: accepted tokens over accepted + rejections."""

    def __init__(self, prior: float) -> None:
        self.accepted = prior * PRIOR_TRIALS
        self.trials = PRIOR_TRIALS

    @property
    def rate(self) -> float:
        return self.accepted / self.trials

    def add(self, n_accepted: int, rejected: int) -> None:
        self.accepted = DECAY * self.accepted + n_accepted
        self.trials = DECAY * self.trials + n_accepted + rejected


class PromptLookup:
    """One sequence's n-gram index over its tokens, and its acceptance rates."""

    def __init__(self, max_draft: int) -> None:
        self.max_draft = max_draft
        self._index: dict[tuple[int, ...], int] = {}  # n-gram -> end of its latest occurrence
        self._indexed = 0  # n-grams ending before this position are in the index
        self._rates = {long: _Acceptance(prior) for long, prior in PRIOR_ACCEPTANCE.items()}
        self._last_long = False  # the kind of match of the last draft
        self._edits = EditTracker()
        # The last draft: its source, the source position of each token, and where
        # in the sequence the first one went (for the edit tracker on a rejection).
        self._last: tuple[Sequence[int], list[int], int] | None = None
        self._since_draft = 0
        self._caps = {long: max_draft for long in PRIOR_ACCEPTANCE}  # after a rejection:
        # twice the run it accepted (per kind of match)
        self.num_drafted = 0
        self.num_accepted = 0

    @property
    def acceptance(self) -> float:
        """Recent chance that a draft token from a short match is accepted, given the
        ones before it were."""
        return self._rates[False].rate

    @property
    def edits(self) -> dict[tuple[int, ...], tuple[int, ...]]:
        """The replacements learned where the copy diverged (source -> output tokens)."""
        return self._edits.edits

    def draft_length(
        self, threshold: float, probe_every: int = PROBE_EVERY, long: bool = False
    ) -> int:
        """The longest draft whose last token is still worth its cost
        (``threshold``); a one-token probe every ``probe_every`` proposals when none is."""
        a = self._rates[long].rate
        probe = 1 if self._since_draft >= probe_every else 0
        if a <= threshold:
            return probe
        cap = self._caps[long]
        if a >= 1.0 or threshold <= 0.0:
            return cap
        return min(cap, max(1, int(math.log(threshold) / math.log(a))))

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
        if limit <= 0:
            return []
        match = self._match(token_ids)
        if match is None:
            return []
        long, source, start = match
        k = min(self.draft_length(threshold, probe_every, long), limit)
        if k <= 0:
            return []
        self._since_draft = 0
        self._last_long = long
        if source is token_ids:  # a repeating text runs on into the draft
            source = _periodic(token_ids, start, k)
        draft, at = self._edits.apply(source, start, k)
        self._last = (source, at, len(token_ids))
        return draft

    def feedback(self, n_drafted: int, n_accepted: int) -> None:
        """What verification kept of the last draft."""
        if n_drafted == 0:
            return
        self.num_drafted += n_drafted
        self.num_accepted += n_accepted
        rejected = 1 if n_accepted < n_drafted else 0
        if rejected and self._last is not None:
            source, at, first = self._last
            self._edits.diverged(source, at[n_accepted], first + n_accepted)
        self._last = None
        self._caps[self._last_long] = max(1, 2 * n_accepted) if rejected else self.max_draft
        self._rates[self._last_long].add(n_accepted, rejected)

    def _match(self, token_ids: Sequence[int]) -> tuple[bool, Sequence[int], int] | None:
        """(long, source, start): where a copy goes on (a long match) after an edit
        (``edits.py``), else the longest n-gram ending ``token_ids`` seen before in its
        own text; ``start``: where what followed it starts in ``source``."""
        resumed = self._edits.resume(token_ids)
        if resumed is not None:
            return True, resumed[0], resumed[1]
        end = len(token_ids)
        for n in NGRAMS:
            if n >= end:
                continue
            key = tuple(token_ids[end - n :])
            own = self._index.get(key)
            if own is not None:
                return n >= LONG_MATCH, token_ids, own
        return None

    def _extend_index(self, token_ids: Sequence[int]) -> None:
        """Index the n-grams that end before the last token (each has a successor)."""
        last = len(token_ids) - 1
        for stop in range(max(self._indexed, 1), last + 1):
            for key in ngram_keys(token_ids, stop):
                self._index[key] = stop
        self._indexed = max(self._indexed, last + 1)


def ngram_keys(tokens: Sequence[int], stop: int) -> Iterator[tuple[int, ...]]:
    """The n-grams (each of :data:`NGRAMS` that fits) ending just before ``stop``."""
    for n in NGRAMS:
        if stop >= n:
            yield tuple(tokens[stop - n : stop])


def _periodic(token_ids: Sequence[int], start: int, k: int) -> Sequence[int]:
    """The sequence's own text as a draft source for ``k`` tokens from ``start``: past
    its end it runs on with what followed ``start``, as a repeating text would."""
    end = len(token_ids)
    if start + k <= end:
        return token_ids
    extended = list(token_ids)
    while len(extended) < start + k:
        extended.append(extended[start + len(extended) - end])
    return extended


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
