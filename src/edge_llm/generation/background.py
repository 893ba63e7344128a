"""Background responses: an answer that runs detached from any connection.

A request that asks for it (the Responses API's ``background: true``) gets a
:class:`BackgroundRun`: the answer, a producer task that reads it to the end
whoever listens, and a bounded :class:`~edge_llm.generation.resumable.ReplayLog` of
the encoded events, numbered as the API numbers them (``sequence_number`` from 0:
log frame ``n`` is event ``n - 1``). Nobody reading never pauses it: the producer
takes every event as it comes, so the engine's ring never fills.

Any number of connections may follow a run (:meth:`BackgroundRun.follow`): each
gets the events after the one it names, then the new ones as they come, then the
end; a follower that drops or stalls holds up only itself. Cancelling ends the
answer (its KV is freed at the engine's next step) and the run.

:class:`BackgroundResponses` keeps the runs of a server by id, for the API key that
created them only (another key is told the id does not exist, as for resumable
streams), each for ``retention_s`` after it ended, at most ``max_responses`` at
once (the oldest ended one is forgotten first; with every one still running, a new
request is refused). A run waits for its first token ``ttft_timeout_s`` at most (0:
as long as foreground work holds the engine), not the engine's ``ttft_timeout_ms``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any, Protocol

from edge_llm.errors import NotFound, QueueFull
from edge_llm.generation.dispatch import Answer
from edge_llm.generation.resumable import ReplayLog, owner_digest

_log = logging.getLogger("edge_llm.server")

# What one run keeps for replay: a 2,000-token answer is ~2,000 events of ~250 bytes.
MAX_RUN_EVENTS = 65536
MAX_RUN_BYTES = 2 << 20
RETRY_AFTER_S = 5


class ResponseObject(Protocol):
    """What the API shows of a run (the Responses API's builder is one)."""

    def snapshot(self) -> dict[str, Any]:
        """The object now."""

    def cancel(self) -> None:
        """Say ``cancelled`` from now on."""


class BackgroundRun:
    """One background response: its answer, its events and their followers."""

    def __init__(
        self,
        run_id: str,
        owner: str,
        answer: Answer,
        obj: ResponseObject,
        book: BackgroundResponses,
    ) -> None:
        self.id = run_id
        self.owner = owner
        self.answer = answer
        self.object = obj
        self.book = book
        self.log: ReplayLog[bytes] = ReplayLog(MAX_RUN_EVENTS, MAX_RUN_BYTES)
        self.ended = False
        self.cancelled = False
        self.ended_at: float | None = None
        self._done = asyncio.Event()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- the producer's side -----------------------------------------------------------

    def start(self, produce: Awaitable[object]) -> None:
        """Run the route's encoder (which logs through :meth:`add`) in a task of its
        own, outliving the request that started it."""
        self._task = asyncio.get_running_loop().create_task(self._produce(produce))

    async def _produce(self, produce: Awaitable[object]) -> None:
        try:
            await produce
        except Exception:
            _log.exception("background response %s failed", self.id)
        finally:
            self.answer.close()  # ends a stream still running (reason disconnect)
            self._end()

    def add(self, frames: list[bytes]) -> None:
        """Log ``frames`` (one encoded event each) and wake the followers; never waits."""
        if not frames:
            return
        for frame in frames:
            self.log.add(frame)
        self._wake()

    def _end(self) -> None:
        self.ended = True
        self.ended_at = time.monotonic()
        self._done.set()
        self._wake()
        self.book.ended(self)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # -- the API's side ------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return self.object.snapshot()

    async def follow(self, after: int, heartbeat_s: float) -> AsyncIterator[list[bytes]]:
        """The frames after frame ``after`` as they come, in batches, until the run
        ended and all were given; an empty batch when none came for ``heartbeat_s``
        (time for a sign of life). Raises ResumeGap if the log no longer holds them."""
        sent = after
        while True:
            changed = self._changed  # taken before reading: a frame added after wakes it
            frames = self.log.after(sent)
            if frames:
                sent += len(frames)
                yield frames
                continue
            if self.ended:
                return
            try:
                await asyncio.wait_for(changed.wait(), heartbeat_s)
            except TimeoutError:
                yield []

    async def cancel(self) -> None:
        """End the answer now, reason ``client`` (its KV is freed at the engine's next
        step), unless it already finished: then wait for its last events, so that
        the object read next says how it really ended."""
        if not self.ended and not self.answer.finished:
            self.cancelled = True
            self.object.cancel()
            self.answer.cancel("client")
            self._wake()
            return
        await self._done.wait()

    def stop(self, reason: str) -> None:
        """The server shuts down: the answer ends with ``reason``."""
        if not self.ended:
            self.cancelled = True
            self.object.cancel()
            self.answer.cancel(reason)


class BackgroundResponses:
    """The background responses of a server, by id."""

    def __init__(self, retention_s: float, max_responses: int, ttft_timeout_s: float = 0.0) -> None:
        self.retention_s = retention_s
        self.max_responses = max_responses
        self.ttft_timeout_s = ttft_timeout_s
        self._runs: dict[str, BackgroundRun] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def check_room(self) -> None:
        """Refuse (503 ``queue_full``) when every place is taken by a running response."""
        if len(self._runs) >= self.max_responses and not self._oldest_ended():
            raise QueueFull(
                f"{self.max_responses} background responses are running "
                f"(max_background_responses); retry when one ends",
                retry_after_s=RETRY_AFTER_S,
            )

    def open(
        self, run_id: str, key: str | None, answer: Answer, obj: ResponseObject
    ) -> BackgroundRun:
        """A new run carrying ``answer`` for the caller with API ``key``; the oldest
        ended run makes room if needed (503 if none can). The answer is the run's to
        close from now."""
        self.check_room()
        while len(self._runs) >= self.max_responses and (oldest := self._oldest_ended()):
            self.forget(oldest)
        run = BackgroundRun(run_id, owner_digest(key), answer, obj, self)
        self._runs[run_id] = run
        answer.hand_over()
        return run

    def find(self, run_id: str, key: str | None) -> BackgroundRun:
        """The run ``run_id`` of the caller with API ``key``; 404 when unknown,
        forgotten, or another key's (which must not learn it exists)."""
        run = self._runs.get(run_id)
        if run is None or not hmac.compare_digest(run.owner, owner_digest(key)):
            raise NotFound(
                f"response {run_id!r} not found: only background responses can be read "
                f"back, each for {self.retention_s:g} s after it ended "
                f"(background_retention_ms)",
                param="response_id",
            )
        return run

    def ended(self, run: BackgroundRun) -> None:
        """Keep ``run`` for the retention period, then forget it."""
        if self._runs.get(run.id) is not run:
            return
        loop = asyncio.get_running_loop()
        self._timers[run.id] = loop.call_later(self.retention_s, self.forget, run.id)

    def forget(self, run_id: str) -> None:
        self._runs.pop(run_id, None)
        if (timer := self._timers.pop(run_id, None)) is not None:
            timer.cancel()

    def _oldest_ended(self) -> str | None:
        ended = [run for run in self._runs.values() if run.ended]
        return min(ended, key=lambda run: run.ended_at or 0.0).id if ended else None

    def close(self) -> None:
        """Shutdown: the running responses end (reason ``shutdown``)."""
        for run in list(self._runs.values()):
            run.stop("shutdown")
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def __len__(self) -> int:
        return len(self._runs)
