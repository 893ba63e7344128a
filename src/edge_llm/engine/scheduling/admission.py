"""Deadline-aware admission: predict a new request's TTFT, refuse it at once if it
would miss ``ttft_timeout_ms``. Pure: numbers in, a prediction out; no engine, no clock.

Without it a flood is admitted, prefilled for ``ttft_timeout_ms`` and then cancelled
with 504 ``ttft_timeout``, the prefill spent for nothing. With it the engine answers 503
``queue_full`` with ``Retry-After`` before spending anything.

The model, from what the scheduler does (chunked prefill, shortest remaining prompt
first among admitted sequences, a FIFO queue for slots and KV):

- admitted now (a slot and KV free, nobody queued): its prompt is prefilled after the
  admitted prompts shorter than it, so ``ahead`` = their remaining tokens;
- queued: after every admitted prompt and every queued one, once a slot frees: the
  running sequence closest to ``max_tokens`` decodes its remaining tokens first;
- time = (ahead + own prompt) x seconds per prompt token + decode steps to wait x
  seconds per decode step, both from the engine's measured step costs
  (:class:`StepCosts`: an effective rate, prefill steps also carry decode tokens).
"""

from __future__ import annotations

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
    waiting_prompt_tokens: Iterable[int],
) -> QueueView:
    """``running``: (prompt tokens still to prefill, tokens still to decode) per admitted
    sequence; ``waiting_prompt_tokens``: the prompts queued before this one."""
    running = list(running)
    if admitted_now:
        shorter = sum(p for p, _ in running if 0 < p <= own_prompt_tokens)
        return QueueView(own_prompt_tokens, shorter)
    ahead = sum(p for p, _ in running) + sum(waiting_prompt_tokens)
    decoding = [d for _, d in running if d > 0]
    return QueueView(own_prompt_tokens, ahead, min(decoding, default=0), max(len(decoding), 1))


def predict_ttft_s(view: QueueView, costs: StepCosts) -> float:
    prefill = (view.prefill_ahead_tokens + view.own_prompt_tokens) * costs.prompt_token_s
    return prefill + view.decode_steps_to_wait * costs.decode_step_s(view.num_decoding)


def retry_after_s(predicted_s: float, deadline_s: float) -> int:
    """Seconds after which the queue ahead should have drained enough to meet the deadline."""
    wait = math.ceil(predicted_s - deadline_s)
    return max(MIN_RETRY_AFTER_S, min(MAX_RETRY_AFTER_S, wait))


def refuse_if_late(view: QueueView, costs: StepCosts, deadline_s: float) -> None:
    """Refuse at once (503 ``queue_full``) a request whose predicted TTFT exceeds its
    deadline."""
    predicted = predict_ttft_s(view, costs)
    if predicted > deadline_s:
        raise QueueFull(
            f"predicted time to first token {predicted:.1f} s exceeds ttft_timeout_ms "
            f"({deadline_s * 1000:.0f}): {view.prefill_ahead_tokens} prompt tokens ahead",
            retry_after_s=retry_after_s(predicted, deadline_s),
            predicted_ttft_ms=round(predicted * 1000.0),
        )
