"""Turns a stream's ring into outbound events for one connection.

The pump is an async generator: the adapter writes each event to its socket and
only then asks for the next one. Tokens of a delta are committed to the ring
(``Engine.consumed``) after that write returned, so a socket that stops draining
stops the pump, the ring fills, and the engine pauses that sequence alone.

While no token flows a :class:`Heartbeat` carries the stream's progress
(``Engine.progress``) every ``heartbeat_interval_s``; with ``progress`` on, one
also comes whenever the stream's state or prefill count changes (queued, prefill
chunk by chunk, preempted, decoding again), so a client can show each step. A pause
is reported after the tokens generated before it (``pause_order.py``): after it, at
most the token of the step in flight.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from edge_llm.engine.engine import Engine
from edge_llm.engine.streams.handle import StreamHandle
from edge_llm.generation.pause_order import Pause, PauseOrder
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
    pauses = PauseOrder()  # a pause goes after the tokens generated before it
    reported_step: tuple[str, int] | None = None
    last_sent = time.monotonic()
    held_since: float | None = None
    tokens_flowed = False  # past the first token, a change of state is a pause's, above
    carried = _Carried()
    wants_logprobs = handle.seq.request.sampling.n_logprobs is not None
    while True:
        for cause in pauses.update(_pause(handle), len(handle.ring), ended=handle.finished):
            yield PauseChanged(cause)
            if progress and not handle.finished:
                beat = _heartbeat(engine, handle)
                reported_step = _step(beat.state, beat.prefill_done)
                yield beat
                last_sent = time.monotonic()
        pieces = handle.ring.peek(pauses.limit(settings.chunk_tokens))
        if pieces:
            now = time.monotonic()
            held_since = held_since or now
            partial = len(pieces) < settings.chunk_tokens and not handle.finished
            partial = partial and not pauses.flushing
            if partial and now - held_since < settings.flush_interval_s:
                await handle.wait_changed(held_since + settings.flush_interval_s - now)
                continue
            held_since, tokens_flowed = None, True
            logprobs = handle.ring.peek_logprobs(len(pieces)) if wants_logprobs else []
            if delta := carried.delta("".join(pieces), len(pieces), logprobs):
                yield delta
                last_sent = time.monotonic()
            engine.consumed(handle, len(pieces))
            pauses.sent(len(pieces))
            continue
        if handle.outcome is not None:
            if handle.outcome.tail or carried.logprobs:
                yield carried.last(handle.outcome.tail)
            yield Finished(handle.outcome)
            return
        step = _step(handle.seq.public_state(), handle.seq.n_prefilled)
        idle = time.monotonic() - last_sent
        changed = progress and not tokens_flowed and step != reported_step
        if idle >= settings.heartbeat_interval_s or changed:
            beat = _heartbeat(engine, handle)
            reported_step = _step(beat.state, beat.prefill_done)  # as read under the lock
            yield beat
            last_sent = time.monotonic()
            continue
        await handle.wait_changed(settings.heartbeat_interval_s - idle)


@dataclass
class _Carried:
    """Tokens read whose text is not sent yet (a character still incomplete: it goes
    with the next delta), their log-probabilities, and the deltas sent so far."""

    tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    n_deltas: int = 0

    def delta(self, text: str, n_tokens: int, logprobs: list[TokenLogprob]) -> Delta | None:
        """The delta to send for ``n_tokens`` more tokens, None while no text is whole."""
        self.logprobs.extend(logprobs)
        self.tokens += n_tokens
        return self.last(text) if text else None

    def last(self, text: str) -> Delta:
        delta = Delta(text, self.tokens, self.n_deltas, tuple(self.logprobs))
        self.n_deltas += 1
        self.tokens = 0
        self.logprobs.clear()
        return delta


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


def _pause(handle: StreamHandle) -> Pause | None:
    seq = handle.seq
    cause = None if handle.finished else seq.pause_cause
    return Pause(cause.value, seq.paused_since) if cause else None
