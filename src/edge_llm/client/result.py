"""What a finished stream reports, and the progress a heartbeat carries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A sign of life while no token flows. Over WebSocket it carries the engine's
    ``state`` and prefill progress; over SSE (a bare ``: ping``) all fields are None."""

    state: str | None = None
    prefill_done: int | None = None
    prefill_total: int | None = None


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
