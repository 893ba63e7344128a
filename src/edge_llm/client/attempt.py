"""One attempt of a streamed request: the state a transport reports into.

A transport (SSE or WebSocket) drives one attempt: it wraps every wait for the
server in :meth:`Attempt.read` (which enforces the TTFT and dead-connection
deadlines), and reports what it sees: :meth:`on_bytes`, :meth:`on_data`,
:meth:`on_heartbeat`, :meth:`on_content` (which hands text to the render queue
and may wait there), :meth:`set_request_id`, :meth:`on_usage`, :meth:`on_finish`.
It sets :attr:`flow` to its :class:`FlowControl` while the stream runs, so the
render queue's watermarks can pause and resume it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from edge_llm.client.config import ClientConfig
from edge_llm.client.errors import DeadConnectionError, TtftTimeoutError
from edge_llm.client.request_log import RequestLog
from edge_llm.client.result import Heartbeat
from edge_llm.client.watchdog import Deadline, Watchdog
from edge_llm.observability.events import Event

T = TypeVar("T")
Deliver = Callable[[str], Awaitable[None]]
HeartbeatCallback = Callable[[Heartbeat], None]
Clock = Callable[[], float]
LOGGER_NAME = "edge_llm.client"


class FlowControl(Protocol):
    """How a transport slows the server down: PAUSE/RESUME frames (WebSocket) or
    stopping and restarting socket reads (SSE). ``pause`` may block until resumed."""

    async def pause(self) -> None: ...

    async def resume(self) -> None: ...


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


class Attempt:
    """State and timing of one attempt (number starts at 1)."""

    def __init__(
        self,
        *,
        number: int,
        config: ClientConfig,
        log: RequestLog,
        deliver: Deliver,
        clock: Clock,
        on_heartbeat: HeartbeatCallback | None = None,
    ) -> None:
        self.number = number
        self.log = log
        self.clock = clock
        self.start = clock()
        self.watchdog = Watchdog(
            start=self.start,
            ttft_warn_s=config.ttft_warn_ms / 1000,
            ttft_hard_s=config.ttft_hard_timeout_ms / 1000,
            dead_after_s=config.heartbeat_interval_ms * config.dead_after_heartbeats / 1000,
        )
        if config.require_heartbeat:
            self.watchdog.arm()
        self.flow: FlowControl | None = None
        self.first_byte_at: float | None = None
        self.first_data_at: float | None = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.itl_ms: list[float] = []
        self.text_parts: list[str] = []
        self.n_chunks = 0
        self.n_server_tokens = 0
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.server_stats: dict[str, Any] | None = None
        self.server_pauses: list[str] = []
        self._deliver = deliver
        self._on_heartbeat = on_heartbeat

    def elapsed_ms(self) -> float:
        return _ms(self.clock() - self.start)

    async def read(self, receive: Callable[[], Awaitable[T]]) -> T:
        """Await ``receive()`` under the deadlines. A TTFT warning is logged and the
        wait goes on; the TTFT hard timeout raises :class:`TtftTimeoutError` and a
        silent armed connection raises :class:`DeadConnectionError` (the pending
        receive is cancelled first; the caller must then cancel or close)."""
        if self.watchdog.seconds_left(self.clock()) is None:
            return await receive()
        task = asyncio.ensure_future(receive())
        try:
            while True:
                done, _ = await asyncio.wait(
                    {task}, timeout=self.watchdog.seconds_left(self.clock())
                )
                if done:
                    return task.result()
                self._deadline_passed()
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait({task})

    def _deadline_passed(self) -> None:
        now = self.clock()
        kind = self.watchdog.expired(now)
        elapsed = _ms(now - self.start)
        if kind is Deadline.TTFT_WARN:
            self.log.emit(Event.TTFT_WARN, elapsed_ms=elapsed)
            logging.getLogger(LOGGER_NAME).warning(
                "no first token after %.0f ms (ttft_warn_ms); still waiting", elapsed
            )
        elif kind is Deadline.TTFT_HARD:
            raise TtftTimeoutError(f"no first token after {elapsed:.0f} ms", elapsed_ms=elapsed)
        elif kind is Deadline.DEAD:
            silent = _ms(now - self.watchdog.last_activity)
            raise DeadConnectionError(
                f"no byte from the server for {silent:.0f} ms (heartbeats stopped)",
                elapsed_ms=silent,
            )

    def set_request_id(self, request_id: object) -> None:
        """Adopt the server's id for the log lines that follow (first one wins)."""
        if isinstance(request_id, str) and request_id and self.log.request_id is None:
            self.log.request_id = request_id

    def on_bytes(self) -> None:
        now = self.clock()
        self.watchdog.bytes_received(now)
        if self.first_byte_at is None:
            self.first_byte_at = now
            self.log.emit(Event.FIRST_BYTE, elapsed_ms=_ms(now - self.start))

    def on_data(self) -> None:
        """A data event (SSE) or the ``started`` frame (WS) arrived: sets TTFR."""
        if self.first_data_at is None:
            self.first_data_at = self.clock()

    def on_heartbeat(self, heartbeat: Heartbeat) -> None:
        """The server heartbeats, so silence from now on means a dead connection."""
        self.watchdog.arm()
        if self._on_heartbeat is not None:
            self._on_heartbeat(heartbeat)

    async def on_content(self, text: str, n_tokens: int = 0) -> None:
        """A content chunk arrived; hand it to the render queue (may wait there)."""
        if not text:
            return
        now = self.clock()
        if self.first_token_at is None:
            self.first_token_at = now
            self.watchdog.first_token()
            self.log.emit(Event.FIRST_TOKEN, ttft_ms=_ms(now - self.start))
        elif self.last_token_at is not None:
            self.itl_ms.append(_ms(now - self.last_token_at))
        self.last_token_at = now
        self.n_chunks += 1
        self.n_server_tokens += n_tokens
        self.text_parts.append(text)
        await self._deliver(text)
        self.watchdog.touch(self.clock())

    def on_usage(self, usage: dict[str, Any] | None) -> None:
        if usage is not None:
            self.usage = usage

    def on_finish(self, finish_reason: str | None) -> None:
        if finish_reason is not None:
            self.finish_reason = finish_reason

    def on_server_paused(self, cause: str) -> None:
        self.server_pauses.append(cause)

    def cancelled(self, reason: str, *, method: str) -> None:
        """Record that the client cancelled this attempt (``method``: frame or close)."""
        self.log.emit(Event.CANCEL_SENT, reason=reason, method=method, elapsed_ms=self.elapsed_ms())

    @property
    def n_tokens(self) -> int:
        """Completion tokens: usage, else the server's per-delta counts, else chunks."""
        if self.usage is not None and isinstance(self.usage.get("completion_tokens"), int):
            return int(self.usage["completion_tokens"])
        return self.n_server_tokens or self.n_chunks

    def ms_since_start(self, at: float | None) -> float | None:
        return None if at is None else _ms(at - self.start)
