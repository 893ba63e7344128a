"""Who goes first: priority classes (a lower number first), waiting requests aging toward
the front, turns shared between sessions within a class, and which running stream a
more urgent request may preempt. Pure: sequences in, an order or a choice out.

A request's class is its ``priority`` (default 0). A waiting request moves up one
class every ``AGING_S`` it waits, so background work is never starved by a steady
stream of interactive requests. Within a class the session with the fewest
sequences already running goes first, then the oldest request: one session sending
many requests cannot take every slot from another. Prompts being prefilled share the
step's budget the same way: the most urgent class first, then each session's first
prompt before anyone's second, then the shortest.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from edge_llm.engine.sequence import Sequence

AGING_S = 10.0


def effective_class(seq: Sequence, now: float) -> int:
    """Its priority, one class better for every ``AGING_S`` it has waited."""
    return seq.priority - int(max(0.0, now - seq.created_at) // AGING_S)


def next_in_line(waiting: Iterable[Sequence], running: Iterable[Sequence], now: float) -> Sequence:
    """The waiting sequence to admit next (``waiting`` must not be empty)."""
    return min(waiting, key=queue_key(running, now))


def queue_position(
    seq: Sequence, waiting: Iterable[Sequence], running: Iterable[Sequence], now: float
) -> int:
    """Where ``seq`` stands in the queue now: 1 for the next in line."""
    key = queue_key(running, now)
    mine = key(seq)
    return 1 + sum(1 for other in waiting if other is not seq and key(other) < mine)


def queue_key(
    running: Iterable[Sequence], now: float
) -> Callable[[Sequence], tuple[int, int, float]]:
    """Sorts waiting sequences in the order they are admitted."""
    busy = Counter(_session(seq) for seq in running)
    return lambda s: (effective_class(s, now), busy[_session(s)], s.created_at)


def prefill_order(prefilling: list[Sequence]) -> list[Sequence]:
    """The most urgent class first, then each session's first prompt before any
    session's second, then the shortest remaining."""
    rank: dict[str, int] = {}
    seen: Counter[str] = Counter()
    for seq in sorted(prefilling, key=lambda s: s.created_at):
        rank[seq.id] = seen[_session(seq)]
        seen[_session(seq)] += 1
    return sorted(prefilling, key=lambda s: (s.priority, rank[s.id], s.prefill_remaining))


def preemption_victim(
    urgent: Sequence, running: Iterable[Sequence], max_preemptions: int
) -> Sequence | None:
    """The running stream ``urgent`` may preempt: of a strictly lower class, not
    preempted ``max_preemptions`` times already (so background work still ends), with
    cells to save; the lowest class, then the youngest (the least work to save)."""
    candidates = [
        s for s in running
        if s.priority > urgent.priority and s.preemptions < max_preemptions
        and s.num_computed and not s.offloaded
    ]  # fmt: skip
    return max(candidates, key=lambda s: (s.priority, s.created_at), default=None)


def _session(seq: Sequence) -> str:
    """A request without a session is a session of its own."""
    return seq.session or seq.id
