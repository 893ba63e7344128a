"""Edits learned while copying: where a copy diverged from its source and came back.

An on-device coder's typical answer is its input with small edits: a variable
renamed, a call reformatted. Plain n-gram lookup loses the copy at every edited spot
and finds it again only when a later n-gram matches, often at the wrong (latest)
occurrence of a common one like ``" = "``. :class:`EditTracker` keeps the place in
the source where the copy diverged; once the output matches the source again a few
tokens on (at most ``MAX_SKIPPED`` source tokens replaced by at most
``MAX_INSERTED`` output tokens), it resumes the copy right there, and remembers the
replacement (source tokens -> output tokens, e.g. ``" total"`` -> ``" running",
"_total"``) so that later drafts from the source apply it: the second and later
occurrences of a renamed variable are drafted renamed.

Drafts are guesses the model verifies, so a wrong replacement costs a rejected draft
token, never a wrong output token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAX_SKIPPED = 4  # source tokens an edit replaces
MAX_INSERTED = 8  # output tokens it replaces them with
MIN_AGREEMENT = 2  # output tokens that must match the source again to resume there
MAX_EDITS = 8  # replacements remembered (the latest win)


@dataclass(frozen=True)
class _Divergence:
    source: Sequence[int]
    at_source: int  # the source token the model did not emit
    at_output: int  # where in the output the model's own token went


class EditTracker:
    """One sequence's last divergence from its copy source and its learned edits."""

    def __init__(self) -> None:
        self._diverged: _Divergence | None = None
        self._edits: dict[tuple[int, ...], tuple[int, ...]] = {}  # source -> output tokens

    @property
    def edits(self) -> dict[tuple[int, ...], tuple[int, ...]]:
        return dict(self._edits)

    def diverged(self, source: Sequence[int], at_source: int, at_output: int) -> None:
        """A draft from ``source`` was rejected: the model's token at output position
        ``at_output`` replaced ``source[at_source]``."""
        self._diverged = _Divergence(source, at_source, at_output)

    def resume(self, tokens: Sequence[int]) -> tuple[Sequence[int], int] | None:
        """(source, position): where the copy goes on, if the output has come back to
        the source since it diverged (the edit between is learned); else None."""
        d = self._diverged
        if d is None:
            return None
        since = len(tokens) - d.at_output
        if since > MAX_INSERTED + MIN_AGREEMENT + 1:
            self._diverged = None  # no edit this short: it was not a copy any more
            return None
        for inserted in range(0, min(MAX_INSERTED, since - MIN_AGREEMENT) + 1):
            agreed = tokens[d.at_output + inserted :]
            for skipped in range(0, MAX_SKIPPED + 1):
                if inserted == skipped == 0:
                    continue
                start = d.at_source + skipped
                resume_at = start + len(agreed)
                # The copy goes on only where the source has a token after the agreement
                # (a source that is the output itself would otherwise "agree" with its tail).
                if resume_at < len(d.source) and list(d.source[start:resume_at]) == list(agreed):
                    self._learn(
                        d.source[d.at_source : start],
                        tokens[d.at_output : d.at_output + inserted],
                    )
                    self._diverged = None
                    return d.source, resume_at
        return None

    def apply(self, source: Sequence[int], start: int, k: int) -> tuple[list[int], list[int]]:
        """``k`` draft tokens from ``source[start:]`` with the learned edits applied,
        and the source position each came from (an edit's tokens: its first one's)."""
        draft: list[int] = []
        at: list[int] = []
        i = start
        while len(draft) < k and i < len(source):
            old = self._edit_at(source, i)
            if old is None:
                draft.append(source[i])
                at.append(i)
                i += 1
                continue
            new = self._edits[old][: k - len(draft)]
            draft.extend(new)
            at.extend([i] * len(new))
            i += len(old)
        return draft, at

    def _edit_at(self, source: Sequence[int], i: int) -> tuple[int, ...] | None:
        if not self._edits:
            return None
        return next((o for o in self._edits if tuple(source[i : i + len(o)]) == o), None)

    def _learn(self, old: Sequence[int], new: Sequence[int]) -> None:
        if not old or tuple(old) == tuple(new):
            return  # an insertion has no source tokens to recognise it by
        self._edits.pop(tuple(old), None)
        self._edits[tuple(old)] = tuple(new)
        while len(self._edits) > MAX_EDITS:
            del self._edits[next(iter(self._edits))]
