"""Deadline-aware admission: predict a new request's TTFT, refuse it at once if it
would miss ``ttft_timeout_ms``. Pure: numbers in, a prediction out; no engine, no clock.

Without it a flood is admitted, prefilled for ``ttft_timeout_ms`` and then cancelled
with 504 ``ttft_timeout``, the prefill spent for nothing. With it the engine answers 503
``queue_full`` with ``Retry-After`` before spending anything: at arrival, and again for
a request still queued when the prediction moves past what its time-out leaves it
(more urgent requests, or preempted streams coming back, went ahead of it; steps got
slower), before its prefill starts.

The model, from what the scheduler does (chunked prefill, shortest remaining prompt
first among admitted sequences, a queue in priority order for slots and KV):

- admitted now (a slot and KV free, nobody queued): its prompt is prefilled after the
  admitted prompts shorter than it, so ``ahead`` = their remaining tokens;
- queued: after every admitted prompt and every one ahead of it (queued before it in
  the queue's order, or an offloaded stream that comes back first), once a slot is
  free for it: each one ahead takes the next slot to free (a running sequence's after
  it decodes to its ``max_tokens``; a client-paused one's not at all) and holds it for
  its own ``max_tokens``: with k ahead it waits for the (k+1)-th slot, not the first
  (counting only the first, a request with k ahead was predicted as if it were next);
- time = (ahead + own prompt) x seconds per prompt token + decode steps to wait x
  seconds per decode step, both from the engine's measured step costs
  (:class:`StepCosts`: an effective rate, prefill steps also carry decode tokens).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass

from edge_llm.engine.scheduling.prefill_budget import StepCosts
from edge_llm.errors import QueueFull

MIN_RETRY_AFTER_S = 1
MAX_RETRY_AFTER_S = 30


@dataclass(frozen=True, slots=True)
class QueueView:
    """What is ahead of a new request, in tokens."""

    own_prompt_tokens: int
    prefill_ahead_tokens: int
    decode_steps_to_wait: int = 0
    num_decoding: int = 1  # streams sharing each decode step meanwhile


def queue_view(
    own_prompt_tokens: int,
    admitted_now: bool,
    running: Iterable[tuple[int, int]],
    ahead: Iterable[tuple[int, int]] = (),
    free_slots: int = 0,
) -> QueueView:
    """``running``: (prompt tokens still to prefill, tokens still to decode; 0: paused by
    its client, it frees no slot) per admitted sequence; ``ahead``: the same for each
    one that starts before this one, in order (queued prompts, offloaded streams that
    come back first); ``free_slots``: slots free now (a queue waiting for KV)."""
    running = list(running)
    if admitted_now:
        shorter = sum(p for p, _ in running if 0 < p <= own_prompt_tokens)
        return QueueView(own_prompt_tokens, shorter)
    ahead = list(ahead)
    prefill_ahead = sum(p for p, _ in running) + sum(p for p, _ in ahead)
    decoding = [d for _, d in running if d > 0]
    steps = slot_wait_steps(decoding, free_slots, [d for _, d in ahead])
    return QueueView(own_prompt_tokens, prefill_ahead, steps, max(len(decoding), 1))


def slot_wait_steps(running: Iterable[int], free_slots: int, ahead: Iterable[int]) -> int:
    """Decode steps until a slot is free for a request behind ``ahead``: each one ahead
    takes the slot that frees first and holds it for its own decode. ``running``: the
    decode steps after which each running sequence frees its slot. 0 when no slot is
    known to free (every one held by a paused stream): nothing to predict from."""
    slots = [0] * free_slots + list(running)
    heapq.heapify(slots)
    if not slots:
        return 0
    for decode in ahead:
        heapq.heappush(slots, heapq.heappop(slots) + decode)
    return slots[0]


def predict_ttft_s(view: QueueView, costs: StepCosts) -> float:
    prefill = (view.prefill_ahead_tokens + view.own_prompt_tokens) * costs.prompt_token_s
    return prefill + view.decode_steps_to_wait * costs.decode_step_s(view.num_decoding)


def refuse_if_late_in_queue(
    view: QueueView, predicted_s: float, left_s: float, deadline_s: float
) -> None:
    """Refuse a queued request (nothing spent on it yet) whose predicted TTFT now falls
    past the ``left_s`` seconds its time-out leaves it: requests more urgent than it
    went ahead, or steps slowed, since it was admitted to the queue."""
    if predicted_s > left_s:
        raise QueueFull(
            f"predicted time to first token {predicted_s:.1f} s exceeds the {left_s:.1f} s "
            f"left of ttft_timeout_ms ({deadline_s * 1000:.0f}) while queued: "
            f"{view.prefill_ahead_tokens} prompt tokens ahead, {view.decode_steps_to_wait} "
            "decode steps until a slot frees",
            retry_after_s=retry_after_s(predicted_s, deadline_s),
            predicted_ttft_ms=round(predicted_s * 1000.0),
        )


def retry_after_s(predicted_s: float, deadline_s: float) -> int:
    """Seconds after which the queue ahead should have drained enough to meet the deadline."""
    wait = math.ceil(predicted_s - deadline_s)
    return max(MIN_RETRY_AFTER_S, min(MAX_RETRY_AFTER_S, wait))


def refuse_if_late(view: QueueView, predicted_s: float, deadline_s: float) -> None:
    """Refuse at once (503 ``queue_full``) a request whose predicted TTFT
    (:func:`predict_ttft_s`) exceeds its deadline."""
    if predicted_s > deadline_s:
        raise QueueFull(
            f"predicted time to first token {predicted_s:.1f} s exceeds ttft_timeout_ms "
            f"({deadline_s * 1000:.0f}): {view.prefill_ahead_tokens} prompt tokens ahead"
            + (f", {view.decode_steps_to_wait} decode steps until a slot frees"
               if view.decode_steps_to_wait else ""),
            retry_after_s=retry_after_s(predicted_s, deadline_s),
            predicted_ttft_ms=round(predicted_s * 1000.0),
        )  # fmt: skip
