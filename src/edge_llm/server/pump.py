"""Turns a stream's ring into outbound events for one connection.

The pump is an async generator: the adapter writes each event to its socket and
only then asks for the next one. Tokens of a delta are committed to the ring
(``Engine.consumed``) after that write returned, so a socket that stops draining
stops the pump, the ring fills, and the engine pauses that sequence alone.

While no token flows a :class:`Heartbeat` carries the stream's progress
(``Engine.progress``) every ``heartbeat_interval_s``; with ``progress`` on, one
also comes whenever the stream's state or prefill count changes (queued, prefill
chunk by chunk, preempted, decoding again), so a client can show each step.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from edge_llm.engine.engine import Engine
from edge_llm.engine.stream import StreamHandle
from edge_llm.protocol.sampling import TokenLogprob
from edge_llm.protocol.stream_events import Delta, Finished, Heartbeat, PauseChanged, StreamEvent


@dataclass(frozen=True)
class PumpSettings:
    chunk_tokens: int = 1
    flush_interval_s: float = 0.02
    heartbeat_interval_s: float = 1.0


async def pump(
    engine: Engine, handle: StreamHandle, settings: PumpSettings, *, progress: bool = False
) -> AsyncIterator[StreamEvent]:
    """Yield the stream's events until (and including) :class:`Finished`."""
    reported_cause: str | None = None
    reported_step: tuple[str, int] | None = None
    last_sent = time.monotonic()
    held_since: float | None = None
    carried_tokens = 0
    carried_logprobs: list[TokenLogprob] = []
    wants_logprobs = handle.seq.request.sampling.n_logprobs is not None
    n_deltas = 0
    while True:
        cause = None if handle.finished else _cause(handle)
        if cause != reported_cause:
            reported_cause = cause
            yield PauseChanged(cause)
        pieces = handle.ring.peek(settings.chunk_tokens)
        if pieces:
            now = time.monotonic()
            held_since = held_since or now
            partial = len(pieces) < settings.chunk_tokens and not handle.finished
            if partial and now - held_since < settings.flush_interval_s:
                await handle.wait_changed(held_since + settings.flush_interval_s - now)
                continue
            held_since = None
            text = "".join(pieces)
            if wants_logprobs:
                carried_logprobs.extend(handle.ring.peek_logprobs(len(pieces)))
            if text:
                logprobs = tuple(carried_logprobs)
                yield Delta(text, carried_tokens + len(pieces), n_deltas, logprobs)
                n_deltas += 1
                carried_tokens = 0
                carried_logprobs.clear()
                last_sent = time.monotonic()
            else:
                carried_tokens += len(pieces)  # a character still incomplete: send with the next
            engine.consumed(handle, len(pieces))
            continue
        if handle.outcome is not None:
            if handle.outcome.tail or carried_logprobs:
                yield Delta(handle.outcome.tail, carried_tokens, n_deltas, tuple(carried_logprobs))
            yield Finished(handle.outcome)
            return
        step = _step(handle.seq.public_state(), handle.seq.n_prefilled)
        idle = time.monotonic() - last_sent
        if idle >= settings.heartbeat_interval_s or (progress and step != reported_step):
            beat = _heartbeat(engine, handle)
            reported_step = _step(beat.state, beat.prefill_done)  # as read under the lock
            yield beat
            last_sent = time.monotonic()
            continue
        await handle.wait_changed(settings.heartbeat_interval_s - idle)


def _step(state: str, prefill_done: int) -> tuple[str, int]:
    """What a progress heartbeat reports a change of: the state, and the prompt tokens
    prefilled while in prefill (the last one may be computed with the first token)."""
    return state, prefill_done if state == "prefill" else 0


def _heartbeat(engine: Engine, handle: StreamHandle) -> Heartbeat:
    now = engine.progress(handle)
    return Heartbeat(
        now["state"],
        now["prefill_done"],
        now["prefill_total"],
        now["queue_position"],
        now["predicted_wait_ms"],
    )


def _cause(handle: StreamHandle) -> str | None:
    cause = handle.seq.pause_cause
    return cause.value if cause else None
