"""What a finished stream reports, and the progress a heartbeat carries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A progress event while no token flows. From edge-llm over WebSocket, and over
    SSE when the stream asked for progress, it carries the engine's ``state``
    (``queued``, ``prefill``, ``preempted``, ``decoding``, ...), prefill progress, the
    place in the queue (1: next) and the predicted wait for the first token; a bare
    ``: ping`` leaves every field None. A ``paused`` frame with cause ``preempted``
    (a more urgent request took the slot; the stream resumes by itself) comes as
    state ``preempted``. Before the stream exists a model pulled on first use is
    ``downloading`` (bytes done, of the file's) and then ``loading``."""

    state: str | None = None
    prefill_done: int | None = None
    prefill_total: int | None = None
    queue_position: int | None = None
    predicted_wait_ms: int | None = None
    download_done: int | None = None
    download_total: int | None = None

    @classmethod
    def of(cls, progress: dict[str, Any]) -> Heartbeat:
        """From a progress object or heartbeat frame; fields of the wrong type are None."""
        state = progress.get("state")
        return cls(
            state=state if isinstance(state, str) else None,
            prefill_done=_int_or_none(progress.get("prefill_done")),
            prefill_total=_int_or_none(progress.get("prefill_total")),
            queue_position=_int_or_none(progress.get("queue_position")),
            predicted_wait_ms=_int_or_none(progress.get("predicted_wait_ms")),
            download_done=_int_or_none(progress.get("download_done")),
            download_total=_int_or_none(progress.get("download_total")),
        )


@dataclass(frozen=True, slots=True)
class StreamResult:
    """The outcome of one streamed completion (times in milliseconds, from the
    start of the attempt that succeeded; ``total_ms`` from the first attempt).

    ``ttfr_ms``: first data event (SSE) or ``started`` frame (WS); ``ttft_ms``:
    first chunk with content; ``itl_ms``: gaps between content chunks; ``e2e_ms``:
    last content chunk. ``pauses``: PAUSE frames sent (WS) or times the client
    stopped reading the socket (SSE); ``server_pauses``: causes of the server's
    ``paused`` frames (WS). ``n_tokens``: the server's count when it gave one
    (usage or WS deltas), else the number of content chunks.
    """

    text: str
    finish_reason: str | None
    usage: dict[str, Any] | None
    request_id: str | None
    client_request_id: str
    transport: str
    attempts: int
    n_chunks: int
    n_tokens: int
    ttfr_ms: float | None
    ttft_ms: float | None
    itl_ms: tuple[float, ...]
    e2e_ms: float | None
    total_ms: float
    pauses: int
    server_pauses: tuple[str, ...] = ()
    server_stats: dict[str, Any] | None = None


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
