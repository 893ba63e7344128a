"""The one reader of a stream, local or relayed: its buffer to outbound events for
one connection, at that connection's pace.

:func:`read` is an async generator: the adapter writes each event to its socket and
only then asks for the next one. What was taken is committed (``sent``) after that
write returned, so a socket that stops draining stops the reader, the buffer fills
to its high mark and its producer pauses (the engine that sequence alone, the relay
its upstream socket). The rules (pause causes, the buffer's marks, when a heartbeat
is due) are :mod:`edge_llm.protocol.stream_rules`'; the two sources say where the
events come from: :class:`_Local` (the engine's ring, :func:`pump`) and
:class:`_Relayed` (an upstream's chunks, :func:`read_relayed`).

While nothing flows a :class:`Heartbeat` carries the stream's progress every
``heartbeat_interval_s``; with ``progress`` on, one also comes whenever the stream's
state or prefill count changes (queued, prefill chunk by chunk, preempted, decoding
again), so a client can show each step. A local stream's pause is reported after the
tokens generated before it (``pause_order.py``): after it, at most the token of the
step in flight. A relayed stream's pause is reported at once (its source owes no
tokens: what the relay buffered was read before the pause, as before).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

from edge_llm.engine import Engine, StreamHandle
from edge_llm.generation.pause_order import Pause, PauseOrder
from edge_llm.protocol.sampling import TokenLogprob
from edge_llm.protocol.stream_events import (
    Delta,
    Ending,
    Finished,
    Heartbeat,
    PauseChanged,
    StreamEvent,
)
from edge_llm.protocol.stream_rules import Heartbeats, StreamState
from edge_llm.upstream.stream import UpstreamChunk, UpstreamStream

UpstreamEvent = UpstreamChunk | Heartbeat | PauseChanged | Finished
Piece = TypeVar("Piece")
Piece_co = TypeVar("Piece_co", covariant=True)


@dataclass(frozen=True)
class PumpSettings:
    chunk_tokens: int = 1
    flush_interval_s: float = 0.02
    heartbeat_interval_s: float = 1.0


class _Source(Protocol[Piece_co]):
    """Where a stream's events come from."""

    @property
    def outcome(self) -> Ending | None: ...
    def pause(self) -> Pause | None:
        """Its pause now (None: not paused, or ended)."""

    def n_unsent(self) -> int:
        """Tokens buffered that a pause seen now is reported after."""

    def take(self, now: float, order: PauseOrder) -> tuple[Piece_co, ...] | float | None:
        """What to send now (within ``order``'s limit); seconds to wait for more (a
        partial chunk is held); None when nothing is buffered."""

    def sent(self, order: PauseOrder) -> None:
        """What :meth:`take` returned was written: commit it."""

    def tail(self) -> tuple[Piece_co, ...]:
        """What goes out before :class:`Finished` (text released at the end)."""

    def heartbeat(self) -> Heartbeat: ...
    def step(self) -> tuple[str, int]:
        """The state and prefill count a progress heartbeat reports a change of."""

    async def wait_changed(self, timeout: float) -> None: ...


async def pump(
    engine: Engine, handle: StreamHandle, settings: PumpSettings, *, progress: bool = False
) -> AsyncIterator[StreamEvent]:
    """A local stream's events until (and including) :class:`Finished`."""
    source = _Local(engine, handle, settings)
    async for event in read(source, settings.heartbeat_interval_s, progress=progress):
        yield event


def read_relayed(stream: UpstreamStream) -> AsyncIterator[UpstreamEvent]:
    """A relayed stream's chunks, heartbeats and pause changes until (and including)
    :class:`Finished`."""
    return read(_Relayed(stream), stream.settings.heartbeat_interval_s)


async def read(
    source: _Source[Piece], heartbeat_interval_s: float, *, progress: bool = False
) -> AsyncIterator[Piece | Heartbeat | PauseChanged | Finished]:
    """The events of ``source`` until (and including) :class:`Finished`."""
    order = PauseOrder()  # a pause goes after the tokens generated before it
    reported_step: tuple[str, int] | None = None
    beats = Heartbeats(heartbeat_interval_s, time.monotonic())
    pieces_flowed = False  # past the first token, a change of state is a pause's, above
    while True:
        ended = source.outcome is not None
        for cause in order.update(source.pause(), source.n_unsent(), ended=ended):
            yield PauseChanged(cause)
            if progress and source.outcome is None:
                beat = _as_told(source.heartbeat(), order)
                reported_step = _step(beat)
                yield beat
                beats.sent(time.monotonic())
        taken = source.take(time.monotonic(), order)
        if isinstance(taken, float):
            await source.wait_changed(taken)
            continue
        if taken is not None:
            pieces_flowed = True
            for piece in taken:
                yield piece
                beats.sent(time.monotonic())
            source.sent(order)
            continue
        if source.outcome is not None:
            for piece in source.tail():
                yield piece
            yield Finished(source.outcome)
            return
        wait_s = beats.wait_s(time.monotonic())
        if wait_s <= 0 or (progress and not pieces_flowed and source.step() != reported_step):
            beat = _as_told(source.heartbeat(), order)
            reported_step = _step(beat)  # as read under the lock
            yield beat
            beats.sent(time.monotonic())
            continue
        await source.wait_changed(wait_s)


def _as_told(beat: Heartbeat, order: PauseOrder) -> Heartbeat:
    """Progress says ``paused`` only while the client was told of a pause. A pause the
    order has not reported yet (a socket-full one that came back as the ring refilled,
    after ``resumed``) goes out after the tokens generated before it: until then it is
    not ``paused`` to the client, or those tokens would follow a ``paused``."""
    if beat.state == "paused" and not order.shown:
        return replace(beat, state=StreamState.DECODING.value)
    return beat


class _Local:
    """The engine's ring: up to ``chunk_tokens`` tokens a delta, a partial one held
    for ``flush_interval_s``; committed through ``Engine.consumed``."""

    def __init__(self, engine: Engine, handle: StreamHandle, settings: PumpSettings) -> None:
        self.engine = engine
        self.handle = handle
        self.settings = settings
        self.wants_logprobs = handle.seq.request.sampling.n_logprobs is not None
        self.carried = _Carried()
        self.held_since: float | None = None
        self.n_taken = 0

    @property
    def outcome(self) -> Ending | None:
        return self.handle.outcome

    def pause(self) -> Pause | None:
        seq = self.handle.seq
        cause = None if self.handle.finished else seq.pause_cause
        return Pause(cause.value, seq.paused_since) if cause else None

    def n_unsent(self) -> int:
        return len(self.handle.ring)

    def take(self, now: float, order: PauseOrder) -> tuple[Delta, ...] | float | None:
        handle, chunk = self.handle, self.settings.chunk_tokens
        pieces = handle.ring.peek(order.limit(chunk))
        if not pieces:
            return None
        self.held_since = self.held_since or now
        partial = len(pieces) < chunk and not handle.finished and not order.flushing
        if partial and now - self.held_since < self.settings.flush_interval_s:
            return self.held_since + self.settings.flush_interval_s - now
        self.held_since, self.n_taken = None, len(pieces)
        logprobs = handle.ring.peek_logprobs(len(pieces)) if self.wants_logprobs else []
        delta = self.carried.delta("".join(pieces), len(pieces), logprobs)
        return (delta,) if delta else ()

    def sent(self, order: PauseOrder) -> None:
        self.engine.consumed(self.handle, self.n_taken)
        order.sent(self.n_taken)

    def tail(self) -> tuple[Delta, ...]:
        tail = self.handle.outcome.tail if self.handle.outcome else ""
        return (self.carried.last(tail),) if tail or self.carried.logprobs else ()

    def heartbeat(self) -> Heartbeat:
        now = self.engine.progress(self.handle)
        return Heartbeat(
            now["state"],
            now["prefill_done"],
            now["prefill_total"],
            now["queue_position"],
            now["predicted_wait_ms"],
        )

    def step(self) -> tuple[str, int]:
        seq = self.handle.seq
        return _step(Heartbeat(seq.public_state(), seq.n_prefilled, seq.n_prompt))

    async def wait_changed(self, timeout: float) -> None:
        await self.handle.wait_changed(timeout)


class _Relayed:
    """An upstream's chunks, one at a time; a sent one may let the upstream be read
    again (the buffer drained)."""

    def __init__(self, stream: UpstreamStream) -> None:
        self.stream = stream

    @property
    def outcome(self) -> Ending | None:
        return self.stream.relay.outcome

    def pause(self) -> Pause | None:
        relay = self.stream.relay
        cause = None if relay.finished else relay.pause_cause
        return Pause(cause, relay.pauses.since) if cause else None

    def n_unsent(self) -> int:
        return 0

    def take(self, now: float, order: PauseOrder) -> tuple[UpstreamChunk, ...] | None:
        chunk = self.stream.take()
        return None if chunk is None else (chunk,)

    def sent(self, order: PauseOrder) -> None:
        self.stream.sent()

    def tail(self) -> tuple[UpstreamChunk, ...]:
        return ()

    def heartbeat(self) -> Heartbeat:
        return Heartbeat(self.stream.relay.state, 0, 0)

    def step(self) -> tuple[str, int]:
        return _step(self.heartbeat())

    async def wait_changed(self, timeout: float) -> None:
        await self.stream.wait_changed(timeout)


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


def _step(beat: Heartbeat) -> tuple[str, int]:
    """What a progress heartbeat reports a change of: the state, and the prompt tokens
    prefilled while in prefill (the last one may be computed with the first token)."""
    return beat.state, beat.prefill_done if beat.state == "prefill" else 0
