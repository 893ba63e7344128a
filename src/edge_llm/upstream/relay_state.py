"""One relayed stream's state as a sans-I/O machine: no socket, loop or clock.

The driver (:class:`~edge_llm.upstream.stream.UpstreamStream`) feeds it what
happened, with the time: the upstream's SSE events (:meth:`RelayState.read`,
:meth:`RelayState.arrived`), the client's pause and resume, the buffer taken and
filled, the end. It answers what the driver must do next: which chunks to put in
the buffer, whether a pause began or ended (to log it, to stop or go on reading),
whether the buffer drained enough to read again, which time-out fell due. The
rules are every stream's (:mod:`edge_llm.protocol.stream_rules`: pause causes,
time-outs, the buffer's marks, the outcome), kept here for a relayed one; tested by
feeding it, without a network (tests/unit/test_relay_state.py).
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Final

from edge_llm.errors import Cancelled, EdgeLLMError, UpstreamFailure
from edge_llm.protocol.stream_rules import (
    Happening,
    Marks,
    Outcome,
    PauseCause,
    Pauses,
    StreamState,
    TimeLimits,
    advance,
    reported_state,
)


@dataclass(frozen=True)
class StreamSettings:
    buffer_chunks: int = 32  # outbound_buffer_tokens: chunks held for a slow client
    resume_threshold: float = 0.3
    heartbeat_interval_s: float = 1.0
    connect_timeout_s: float = 3.0
    ttft_timeout_s: float | None = 10.0
    max_pause_s: float | None = 60.0

    @property
    def limits(self) -> TimeLimits:
        return TimeLimits(self.ttft_timeout_s, self.max_pause_s)

    @property
    def marks(self) -> Marks:
        return Marks(self.buffer_chunks, self.resume_threshold)


@dataclass(frozen=True)
class UpstreamChunk:
    """One chunk object of the upstream, ``id`` and ``model`` set to ours."""

    data: dict[str, Any]
    text: str  # content text of its first choice ("" if none)
    has_content: bool  # text or a tool call: a token reached the client

    @property
    def usage_only(self) -> bool:
        return not self.data.get("choices") and "usage" in self.data


DONE: Final = "[DONE]"


@dataclass
class Progress:
    created_at: float
    first_token_at: float | None = None
    n_received: int = 0  # chunks put in the buffer
    n_sent: int = 0  # chunks taken by the connection
    n_content: int = 0
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    failovers: list[str] = field(default_factory=list)


class RelayState:
    """What one relayed stream holds and has done; every method returns at once."""

    def __init__(
        self, stream_id: str, client_model: str, settings: StreamSettings, backend: str, now: float
    ) -> None:
        self.id = stream_id
        self.client_model = client_model
        self.settings = settings
        self.backend = backend  # the candidate being tried (the last one, once ended)
        self.progress = Progress(created_at=now)
        self.buffer: deque[UpstreamChunk] = deque()
        self.pauses = Pauses()
        self.limits = settings.limits
        self.marks = settings.marks
        self.phase = StreamState.QUEUED  # its place in stream_rules.TRANSITIONS
        self.outcome: Outcome | None = None
        self.finished_at: float | None = None
        self._held: list[UpstreamChunk] = []  # before the first content: dropped on failover

    @property
    def finished(self) -> bool:
        return self.outcome is not None

    # -- pauses: a client's, a full buffer's ---------------------------------------------

    @property
    def pause_cause(self) -> str | None:
        cause = self.pauses.cause
        return None if cause is None else str(cause.value)

    def paused_by(self, cause: PauseCause) -> bool:
        return cause in self.pauses.causes

    def pause(self, cause: PauseCause, now: float) -> bool:
        """Paused for ``cause``; True when the stream was not paused before (a pause
        began: the driver logs it)."""
        began = not self.pauses.held
        return self.pauses.add(cause, now) and began

    def resume(self, cause: PauseCause, now: float) -> bool:
        """``cause`` is gone; True when no other holds the stream (the pause ended)."""
        return self.pauses.remove(cause, now) is not None and not self.pauses.held

    # -- time-outs -----------------------------------------------------------------------

    def next_due(self) -> float | None:
        """When :meth:`expired` must be asked again (None: no time-out pending)."""
        if self.finished:
            return None
        p = self.progress
        return self.limits.next_due(p.created_at, p.first_token_at, self.pauses)

    def expired(self, now: float) -> EdgeLLMError | None:
        """The error that ends the stream if a time-out fell due by ``now``."""
        p = self.progress
        due = self.limits.expired(p.created_at, p.first_token_at, self.pauses, now)
        if due is None or self.finished:
            return None
        return due.error(self.limits, f"; upstream {self.backend!r}", backend=self.backend)

    # -- the buffer ----------------------------------------------------------------------

    @property
    def full(self) -> bool:
        return self.marks.full(len(self.buffer))

    def put(self, chunk: UpstreamChunk) -> None:
        self.buffer.append(chunk)
        self.progress.n_received += 1
        if chunk.has_content:
            self.progress.n_content += 1

    def take(self) -> UpstreamChunk:
        self.progress.n_sent += 1
        return self.buffer.popleft()

    def drained(self) -> bool:
        """Held for a full buffer and now down to the low mark: read again."""
        return self.paused_by(PauseCause.SOCKET_FULL) and self.marks.drained(len(self.buffer))

    # -- the upstream's events -----------------------------------------------------------

    def attempt(self, backend: str) -> None:
        """A candidate is tried: chunks held from the one before are dropped."""
        self.backend = backend
        self._held.clear()

    def connected(self) -> None:
        """The candidate answered: its stream is read."""
        self.phase = advance(self.phase, Happening.STARTED)

    def gave_up(self) -> None:
        """The candidate failed before any content: the next one is tried."""
        if self.phase is StreamState.PREFILL:
            self.phase = advance(self.phase, Happening.REQUEUED)

    def read(self, data: str) -> UpstreamChunk | str | None:
        """One SSE event's data: :data:`DONE`, a chunk (``id`` and ``model`` ours), or
        None for what is not a JSON object (skipped, as robust clients do). Raises the
        upstream's in-stream error."""
        if data.strip() == DONE:
            return DONE
        try:
            obj = json.loads(data)
        except ValueError:
            return None
        if not isinstance(obj, dict):
            return None
        if "error" in obj:
            raise stream_error(obj["error"], self.backend)
        obj["id"] = self.id
        obj["model"] = self.client_model
        if obj.get("usage"):
            self.progress.usage = obj["usage"]
        text, has_content, finish = _read_choice(obj)
        if finish:
            self.progress.finish_reason = finish
        return UpstreamChunk(obj, text, has_content)

    def arrived(self, chunk: UpstreamChunk, now: float) -> tuple[list[UpstreamChunk], bool]:
        """The chunks to put in the buffer now (none while no content came: they are
        held, a failover drops them), and whether ``chunk`` is the first token."""
        if self.progress.first_token_at is None:
            if not chunk.has_content:
                self._held.append(chunk)
                return [], False
            self.progress.first_token_at = now
            self.phase = advance(self.phase, Happening.FIRST_TOKEN)
            return [*self.take_held(), chunk], True
        return [*self.take_held(), chunk], False

    def take_held(self) -> list[UpstreamChunk]:
        held, self._held = self._held, []
        return held

    def finish(self, outcome: Outcome, now: float) -> bool:
        """The stream ends with ``outcome``; False if it had ended already."""
        if self.outcome is not None:
            return False
        self.outcome = outcome
        self.phase = advance(self.phase, outcome.happening)
        self.finished_at = now
        for cause in list(self.pauses.causes):
            self.pauses.remove(cause, now)
        return True

    # -- readings for /debug/streams, usage and stats -------------------------------------

    @property
    def state(self) -> str:
        return reported_state(self.phase, self.pauses)

    def usage(self) -> dict[str, Any]:
        usage = self.progress.usage
        if usage is not None:
            return usage
        n = self.progress.n_content
        return {"prompt_tokens": 0, "completion_tokens": n, "total_tokens": n}

    def ttft_s(self) -> float | None:
        first = self.progress.first_token_at
        return None if first is None else first - self.progress.created_at

    def ttft_ms(self) -> float | None:
        ttft = self.ttft_s()
        return None if ttft is None else round(ttft * 1000.0, 3)

    def paused_ms(self, now: float) -> float:
        return round(self.pauses.held_ms(now), 3)

    def stats(self, now: float) -> dict[str, Any]:
        return {
            "ttft_ms": self.ttft_ms(),
            "pauses": self.pauses.count,
            "paused_ms": self.paused_ms(now),
            "backend": self.backend,
        }

    def describe(self, now: float, session: str | None) -> dict[str, Any]:
        p = self.progress
        error = self.outcome.error if self.outcome else None
        return {
            "id": self.id,
            "session": session,
            "backend": self.backend,
            "state": self.state,
            "pause_cause": self.pause_cause,
            "ring_write": p.n_received,
            "ring_read": p.n_sent,
            "ring_capacity": self.settings.buffer_chunks,
            "kv_tokens": None,  # held by the upstream, not here
            "n_generated": p.n_content,
            "pauses": self.pauses.count,
            "paused_ms": self.paused_ms(now),
            "ttft_ms": self.ttft_ms(),
            "finish_reason": self.outcome.finish_reason if self.outcome else None,
            "cancel_reason": error.extra.get("reason") if isinstance(error, Cancelled) else None,
            "error": error.code if error is not None else None,
            "failovers": list(p.failovers),
            "age_ms": round((now - p.created_at) * 1000.0, 3),
        }


def _read_choice(obj: dict[str, Any]) -> tuple[str, bool, str | None]:
    """(content text, carries a token, finish_reason) of a chat or text chunk."""
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return "", False, None
    choice = choices[0]
    delta = choice.get("delta")
    if isinstance(delta, dict):
        text = delta.get("content") or ""
        has_content = bool(text) or bool(delta.get("tool_calls"))
    else:
        text = choice.get("text") or ""
        has_content = bool(text)
    finish = choice.get("finish_reason")
    return (str(text), has_content, str(finish) if finish else None)


def stream_error(error: object, backend: str) -> UpstreamFailure:
    message = error.get("message") if isinstance(error, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    failure = UpstreamFailure(f"upstream {backend!r}: {message or error}", backend=backend)
    if isinstance(code, str) and code:
        failure.code = code
    return failure
