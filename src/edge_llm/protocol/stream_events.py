"""What one connection is told about its stream, whoever generates it (no I/O).

The local pump (:mod:`edge_llm.generation.pump`) and the upstream relay
(:mod:`edge_llm.upstream.stream`) both yield these; the routes encode them as
SSE chunks or WebSocket frames. They live here, below both, so that neither the
relay nor the engine has to import the server to speak about a stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from edge_llm.errors import EdgeLLMError
from edge_llm.protocol.sampling import TokenLogprob


@dataclass(frozen=True)
class Delta:
    text: str
    n_tokens: int
    seq: int
    logprobs: tuple[TokenLogprob, ...] = ()  # of these tokens, when the request asked


class WaitState(StrEnum):
    """Where a request stands before its stream exists: the model it names is pulled
    on first use (``pull = "missing"``), then loaded."""

    DOWNLOADING = "downloading"
    LOADING = "loading"


@dataclass(frozen=True)
class Heartbeat:
    """A sign of life while no token flows, with the stream's progress: its state
    (queued, prefill, preempted, decoding, paused, ...; before it exists downloading,
    loading), prompt tokens prefilled, its place in the queue (1: next; None when not
    waiting) and the predicted wait for its first token (None once it came, or when
    the backend cannot tell); while downloading, the model file's bytes so far and
    its size (None until known)."""

    state: str
    prefill_done: int
    prefill_total: int
    queue_position: int | None = None
    predicted_wait_ms: int | None = None
    download: tuple[int, int | None] | None = None

    def progress(self) -> dict[str, Any]:
        """The ``progress`` object of an SSE progress chunk (the download's fields only
        while downloading)."""
        progress: dict[str, Any] = {
            "state": self.state,
            "queue_position": self.queue_position,
            "prefill_done": self.prefill_done,
            "prefill_total": self.prefill_total,
            "predicted_wait_ms": self.predicted_wait_ms,
        }
        if self.download is not None:
            progress["download_done"], progress["download_total"] = self.download
        return progress


@dataclass(frozen=True)
class PauseChanged:
    cause: str | None  # None: resumed


class Ending(Protocol):
    """How a stream ended (the engine's ``Outcome`` is one): a finish reason, or
    the error that ended it, and the stop string that ended it if one did."""

    @property
    def finish_reason(self) -> str | None: ...
    @property
    def error(self) -> EdgeLLMError | None: ...
    @property
    def stop_sequence(self) -> str | None: ...


@dataclass(frozen=True)
class Finished:
    outcome: Ending


StreamEvent = Delta | Heartbeat | PauseChanged | Finished
