"""What the SSE and WebSocket transports share to resume a resumable stream.

A transport reads the stream (:meth:`ResumingTransport._read`); when the connection
drops (a transport error, a read error, a dead connection) and the stream is
resumable (the server named it), it opens a new connection that asks for what follows
the last event taken (:meth:`ResumingTransport._reopen`): the first try at once, then
with the backoff, up to ``resume_attempts`` tries in a row that bring no event. Each
try is a ``retry`` event with cause ``resume``.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable

import aiohttp

from edge_llm.client.attempt import Attempt
from edge_llm.client.connection import transport_error
from edge_llm.client.errors import ClientError, DeadConnectionError, ReadError
from edge_llm.client.stream_request import StreamRequest
from edge_llm.observability.events import Event


class ResumingTransport(ABC):
    """A transport whose stream may be resumed after a drop; one instance per stream."""

    def __init__(
        self,
        request: StreamRequest,
        *,
        resume_attempts: int = 0,
        backoff: Callable[[int], float] = lambda tries: 0.0,
    ) -> None:
        """``resume_attempts``: resumes in a row without an event (0: never resume);
        ``backoff(tries)``: seconds to wait before the try numbered ``tries``."""
        self._request = request
        self._resume_attempts = resume_attempts
        self._backoff = backoff
        self._stream_id: str | None = None  # set when the server made it resumable
        self._last_n = 0  # the number of the last event taken

    @abstractmethod
    async def _read(self, attempt: Attempt) -> None:
        """Read the current connection until the stream ends."""

    @abstractmethod
    async def _reopen(self, attempt: Attempt) -> None:
        """Let the current connection go and open one that resumes the stream after
        event ``_last_n``."""

    async def _read_resuming(self, attempt: Attempt) -> None:
        """Read the stream; after a drop, resume it (if it is resumable) until it ends
        or ``resume_attempts`` tries in a row bring no event."""
        tries, taken = 0, self._last_n
        while True:
            try:
                if tries:
                    await self._resume(attempt, tries)
                await self._read(attempt)
                return
            except (aiohttp.ClientError, OSError, ReadError, DeadConnectionError) as exc:
                tries = 1 if self._last_n > taken else tries + 1
                taken = self._last_n
                if self._stream_id is None or tries > self._resume_attempts:
                    if isinstance(exc, ClientError):
                        raise
                    raise transport_error(exc, url=self._request.url) from exc

    async def _resume(self, attempt: Attempt, tries: int) -> None:
        delay = self._backoff(tries)
        attempt.log.emit(
            Event.RETRY, attempt=attempt.number, backoff_ms=round(delay * 1000, 1),
            cause="resume", stream_id=self._stream_id, last_event=self._last_n,
        )  # fmt: skip
        await asyncio.sleep(delay)
        # The new connection's silence counts from now: after a dead connection the
        # old deadline has passed, and would fail every try before it connects.
        attempt.watchdog.touch(attempt.clock())
        await self._reopen(attempt)
