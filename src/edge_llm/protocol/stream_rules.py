"""A stream's rules, written once, with no I/O: no socket, loop, thread or clock.

The engine's streams (``engine/streams/``) and the relayed ones (``upstream/``)
both keep this contract; each feeds the rules what happened, with the time it
happened (``now``), and carries out what they answer:

- :class:`Pauses`: why a stream is held (:class:`PauseCause`), the one cause it
  reports (:data:`PRECEDENCE`), since when and for how long. ``add`` answers
  whether the cause is new (the caller stops producing and logs it), ``remove``
  how long that cause held (None: it did not).
- :class:`TimeLimits`: the TTFT and pause time-outs. ``next_due`` says when the
  caller must ask again (arm a timer, or bound a wait), ``expired`` which one
  fell due (:class:`TimeOut`), and :meth:`TimeOut.error` the typed error that
  ends the stream.
- :class:`Marks`: the outbound buffer's high and low marks. At ``full`` the
  producer pauses (``socket_full``); once ``drained`` it resumes.
- :class:`Heartbeats`: when a sign of life falls due while nothing is sent.
- :class:`Outcome`: how a stream ended, with its typed error.
- :class:`StreamState`, :class:`Happening` and :data:`TRANSITIONS`: where a stream
  stands and what moves it (:func:`advance`); :func:`reported_state` what a
  connection and ``/debug/streams`` are told, pauses included. docs/architecture.md
  shows both tables, generated from these (scripts/stream-rules-table).

Tested by feeding events with a fake clock (tests/unit/test_stream_rules.py).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edge_llm.errors import EdgeLLMError, PauseTimeout, TtftTimeout
from edge_llm.observability.events import Event


class StreamState(enum.Enum):
    """Where a stream stands, pauses aside (they hold it in any live state)."""

    QUEUED = "queued"  # waiting for a slot, or for an upstream to answer
    PREFILL = "prefill"  # its prompt computed (locally), or the upstream connected
    DECODING = "decoding"  # past its first token
    DONE = "done"  # a finish reason (stop, length, a stop string) or a failure
    CANCELLED = "cancelled"  # cut short: a cancel, a supersede, a time-out

    @property
    def finished(self) -> bool:
        return self in (StreamState.DONE, StreamState.CANCELLED)


class Happening(enum.Enum):
    """What moves a stream from one state to the next (:data:`TRANSITIONS`)."""

    STARTED = "started"
    REQUEUED = "requeued"
    FIRST_TOKEN = "first token"
    FINISHED = "finished"
    CUT_SHORT = "cut short"

    @property
    def meaning(self) -> str:
        return _MEANINGS[self]


_MEANINGS = {
    Happening.STARTED: "admitted to a slot; an upstream answered",
    Happening.REQUEUED: "an upstream given up before any content (the next one is tried)",
    Happening.FIRST_TOKEN: "its first token was sampled, or relayed",
    Happening.FINISHED: "a finish reason (stop, length, a stop string), or a failure",
    Happening.CUT_SHORT: "cancelled, superseded or timed out (the outcome has a reason)",
}

_LIVE = (StreamState.QUEUED, StreamState.PREFILL, StreamState.DECODING)
TRANSITIONS: dict[tuple[StreamState, Happening], StreamState] = {
    (StreamState.QUEUED, Happening.STARTED): StreamState.PREFILL,
    (StreamState.PREFILL, Happening.REQUEUED): StreamState.QUEUED,
    (StreamState.PREFILL, Happening.FIRST_TOKEN): StreamState.DECODING,
    **{(state, Happening.FINISHED): StreamState.DONE for state in _LIVE},
    **{(state, Happening.CUT_SHORT): StreamState.CANCELLED for state in _LIVE},
}


def advance(state: StreamState, happening: Happening) -> StreamState:
    """The state ``happening`` moves ``state`` to; ValueError for a move the rules do
    not have (a caller's bug: a stream that ended stays ended)."""
    moved = TRANSITIONS.get((state, happening))
    if moved is None:
        raise ValueError(f"a {state.value} stream cannot be {happening.value}")
    return moved


class PauseCause(enum.Enum):
    CLIENT = "client"  # the reader sent PAUSE
    SOCKET_FULL = "socket_full"  # the outbound buffer reached its high mark
    PREEMPTED = "preempted"  # a request of a more urgent class needed its slot (local)
    DISCONNECTED = "disconnected"  # a resumable stream's connection dropped (detached)


# The cause a paused stream reports: the reader's own PAUSE first (it asked for it);
# otherwise the cause that came first. Causes the engine holds on its own (a
# preemption, a detach) do not start the max_pause clock: they have their own bounds.
PRECEDENCE = (PauseCause.CLIENT,)
READER_CAUSES = frozenset({PauseCause.CLIENT, PauseCause.SOCKET_FULL})
# Causes under which the client holds the stream back itself (its PAUSE, its dropped
# connection): that time is not the server's, so the TTFT clock stops during it. A
# stream detached in its prefill keeps its resume grace; one paused there, max_pause.
CLIENT_CAUSES = frozenset({PauseCause.CLIENT, PauseCause.DISCONNECTED})


@dataclass
class Pauses:
    """Why one stream is held, since when, and how long it was held in all."""

    causes: dict[PauseCause, float] = field(default_factory=dict)  # cause -> since
    count: int = 0  # causes added (as backpressure_pauses_total{cause} counts them)
    peak: int = 0  # most causes held at once
    since: float | None = None  # held since (any cause)
    held_s: float = 0.0  # ended pauses, in seconds
    by_cause_s: dict[PauseCause, float] = field(default_factory=dict)
    client_since: float | None = None  # held by a client cause (CLIENT_CAUSES) since
    client_s: float = 0.0  # ended holds by client causes, in seconds

    @property
    def held(self) -> bool:
        return bool(self.causes)

    @property
    def cause(self) -> PauseCause | None:
        """The one cause reported (:data:`PRECEDENCE`), None when not held."""
        for cause in PRECEDENCE:
            if cause in self.causes:
                return cause
        return next(iter(self.causes), None)

    @property
    def reader_since(self) -> float | None:
        """Since when the reader has held the stream (client or socket full): the
        clock ``max_pause`` bounds."""
        return min((t for c, t in self.causes.items() if c in READER_CAUSES), default=None)

    def add(self, cause: PauseCause, now: float) -> bool:
        """True when ``cause`` is new: the caller stops producing and logs the pause."""
        if cause in self.causes:
            return False
        if not self.causes:
            self.since = now
        if cause in CLIENT_CAUSES and self.client_since is None:
            self.client_since = now
        self.causes[cause] = now
        self.count += 1
        self.peak = max(self.peak, len(self.causes))
        return True

    def remove(self, cause: PauseCause, now: float) -> float | None:
        """Seconds ``cause`` held the stream; None if it did not (nothing to do).
        The stream runs again once :attr:`held` is False."""
        began = self.causes.pop(cause, None)
        if began is None:
            return None
        elapsed = now - began
        self.by_cause_s[cause] = self.by_cause_s.get(cause, 0.0) + elapsed
        if not self.causes and self.since is not None:
            self.held_s += now - self.since
            self.since = None
        if self.client_since is not None and not CLIENT_CAUSES & self.causes.keys():
            self.client_s += now - self.client_since
            self.client_since = None
        return elapsed

    def held_ms(self, now: float) -> float:
        """Wall time held for any cause, the current pause included."""
        current = now - self.since if self.since is not None else 0.0
        return (self.held_s + current) * 1000.0


# What a live stream reports when (first match wins); otherwise its state. A stream
# that ended reports its state.
REPORTED: tuple[tuple[str, str, Callable[[Pauses, bool], bool]], ...] = (
    ("held by a preemption", "preempted", lambda p, _: PauseCause.PREEMPTED in p.causes),
    ("held by a dropped connection", "detached", lambda p, _: PauseCause.DISCONNECTED in p.causes),
    ("its KV offloaded to host memory", "offloaded", lambda _, offloaded: offloaded),
    ("held by its reader (client, socket_full)", "paused", lambda p, _: p.held),
)


def reported_state(state: StreamState, pauses: Pauses, *, offloaded: bool = False) -> str:
    """What a connection and ``/debug/streams`` are told (:data:`REPORTED`)."""
    if state.finished:
        return state.value
    told = (name for _, name, applies in REPORTED if applies(pauses, offloaded))
    return next(told, state.value)


class TimeOut(enum.Enum):
    TTFT = Event.TTFT_TIMEOUT
    PAUSE = Event.PAUSE_TIMEOUT

    def error(self, limits: TimeLimits, detail: str = "", **extra: Any) -> EdgeLLMError:
        """The error that ends the stream; ``detail`` says where it stood (``; ...``),
        ``extra`` goes into the error's body (the upstream's name, say)."""
        if self is TimeOut.PAUSE:
            limit_ms = round((limits.max_pause_s or 0) * 1000)
            message = f"paused longer than max_pause_ms ({limit_ms} ms){detail}"
            return PauseTimeout(message, reason=self.value, **extra)
        limit_ms = round((limits.ttft_timeout_s or 0) * 1000)
        message = f"no first token within ttft_timeout_ms ({limit_ms} ms){detail}"
        return TtftTimeout(message, reason=self.value, **extra)


@dataclass(frozen=True)
class TimeLimits:
    """No first token ``ttft_timeout_s`` after the stream was created (the time its
    client held it aside), or held by its reader longer than ``max_pause_s``: the
    stream ends (None or 0: never)."""

    ttft_timeout_s: float | None = None
    max_pause_s: float | None = None

    def deadlines(
        self, created_at: float, first_token_at: float | None, pauses: Pauses
    ) -> list[tuple[float, TimeOut]]:
        """The TTFT time-out counts the server's time only: none while the client
        holds the stream, and later by as long as it held it (:data:`CLIENT_CAUSES`)."""
        due = []
        if self.ttft_timeout_s and first_token_at is None and pauses.client_since is None:
            due.append((created_at + self.ttft_timeout_s + pauses.client_s, TimeOut.TTFT))
        since = pauses.reader_since
        if self.max_pause_s and since is not None:
            due.append((since + self.max_pause_s, TimeOut.PAUSE))
        return due

    def next_due(
        self, created_at: float, first_token_at: float | None, pauses: Pauses
    ) -> float | None:
        """When the caller must ask :meth:`expired` again (None: no time-out pending)."""
        return min((when for when, _ in self.deadlines(created_at, first_token_at, pauses)),
                   default=None)  # fmt: skip

    def expired(
        self, created_at: float, first_token_at: float | None, pauses: Pauses, now: float
    ) -> TimeOut | None:
        """The time-out that fell due by ``now`` (the earliest), None while none did."""
        due = sorted(self.deadlines(created_at, first_token_at, pauses), key=lambda d: d[0])
        return next((kind for when, kind in due if when <= now), None)


@dataclass(frozen=True)
class Marks:
    """The outbound buffer's marks: ``capacity`` items is full (the producer pauses,
    ``socket_full``); at ``resume_threshold`` of it or below, it drained (resume)."""

    capacity: int
    resume_threshold: float = 0.3

    @property
    def low(self) -> int:
        return int(self.capacity * self.resume_threshold)

    def full(self, n_buffered: int) -> bool:
        return n_buffered >= self.capacity

    def drained(self, n_buffered: int) -> bool:
        return n_buffered <= self.low


@dataclass
class Heartbeats:
    """A heartbeat falls due ``interval_s`` after the last thing sent."""

    interval_s: float
    last_sent: float

    def sent(self, now: float) -> None:
        self.last_sent = now

    def wait_s(self, now: float) -> float:
        """Seconds until the next heartbeat is due; 0 or less: send one now."""
        return self.last_sent + self.interval_s - now


@dataclass(frozen=True)
class Outcome:
    """How a stream ended: its finish reason, or the typed error that ended it.
    ``tail`` is text released only at the end (held bytes of an unfinished character
    or a partial stop string); ``stop_sequence`` the stop string that ended it."""

    finish_reason: str | None
    error: EdgeLLMError | None = None
    tail: str = ""
    stop_sequence: str | None = None

    @property
    def reason(self) -> str | None:
        """Why it was cut short (cancel reasons, time-outs), None for a plain end."""
        reason = self.error.extra.get("reason") if self.error is not None else None
        return str(reason) if reason else None

    @property
    def happening(self) -> Happening:
        return Happening.CUT_SHORT if self.reason else Happening.FINISHED
