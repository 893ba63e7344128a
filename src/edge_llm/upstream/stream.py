"""One request relayed from an upstream's SSE stream, under this engine's contract:
the I/O driver around :class:`~edge_llm.upstream.relay_state.RelayState`.

A reader task reads the upstream's response and puts its chunks into a small
bounded buffer; the connection takes them with :meth:`UpstreamStream.events`
(the same events as the local pump, plus the upstream's chunk objects). The state
(buffer, pauses, progress, the end) and its decisions are the sans-I/O
``RelayState``'s; this module holds the loop's side: the reader task, aiohttp,
timers, failover, metrics and the event log.

- PAUSE (client): the reader stops reading the upstream socket. A full buffer
  (our client's socket stopped draining) stops it too (cause ``socket_full``).
  Unread, the upstream's bytes fill aiohttp's buffer and then the kernel's, and
  TCP flow control stops the upstream's writes.
- CANCEL, disconnect, supersede, TTFT and pause time-outs end the stream and
  close the upstream connection at once (the reader task is cancelled).
- An upstream that cannot be reached, answers 5xx/429 or breaks off before the
  first content chunk is given up for the next candidate; once content flowed,
  a failure ends the stream (a retry would duplicate it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, NoReturn

import aiohttp

from edge_llm.engine.sequence import PauseCause
from edge_llm.engine.streams.handle import Outcome
from edge_llm.errors import (
    Cancelled,
    EdgeLLMError,
    PauseTimeout,
    TtftTimeout,
    UpstreamFailure,
    UpstreamRejected,
    UpstreamUnavailable,
)
from edge_llm.observability.events import Event, EventSink
from edge_llm.protocol.sse import EventTooLarge, SSEParser
from edge_llm.protocol.stream_events import Finished, Heartbeat, PauseChanged
from edge_llm.upstream.metrics import BackendMetrics
from edge_llm.upstream.registry import Upstream, UpstreamRegistry
from edge_llm.upstream.relay_state import (
    DONE,
    Progress,
    RelayState,
    StreamSettings,
    UpstreamChunk,
    ended_reason,
)

__all__ = ["StreamSettings", "UpstreamChunk", "UpstreamEvent", "UpstreamStream", "rejected"]

_log = logging.getLogger("edge_llm.upstream")
_MAX_ERROR_BODY = 64 * 1024
_MAX_EVENT_BYTES = 1 << 20
_READ_BYTES = 16 * 1024

UpstreamEvent = UpstreamChunk | Heartbeat | PauseChanged | Finished


class _GiveUp(Exception):
    """This upstream cannot serve the request now; try the next one."""

    def __init__(self, reason: str, *, unhealthy: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.unhealthy = unhealthy


class UpstreamStream:
    """The loop's side of one relayed stream; its state and decisions are
    :attr:`relay`'s (:class:`~edge_llm.upstream.relay_state.RelayState`).

    Longer than most classes (about 340 lines) because the connection's side (pause,
    resume, cancel, the events it reads) and the reader task (connect, failover,
    read the SSE stream into the buffer) wait on the same asyncio events and timers;
    what is not I/O lives in the state machine."""

    def __init__(
        self,
        *,
        stream_id: str,
        path: str,
        body: dict[str, Any],
        candidates: Sequence[Upstream],
        registry: UpstreamRegistry,
        settings: StreamSettings,
        client_model: str,
        session: str | None,
        metrics: BackendMetrics,
        events: EventSink,
    ) -> None:
        self.id = stream_id
        self.path = path
        self.body = body
        self.candidates = list(candidates)
        self.registry = registry
        self.settings = settings
        self.client_model = client_model
        self.session = session
        self.metrics = metrics
        self.log_event = events
        first = self.candidates[0].name if self.candidates else "none"
        self.relay = RelayState(stream_id, client_model, settings, first, time.monotonic())
        self._unpaused = asyncio.Event()
        self._unpaused.set()
        self._room = asyncio.Event()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._timers: list[asyncio.TimerHandle] = []
        self._pause_timer: asyncio.TimerHandle | None = None

    # -- the state, as the dispatcher and /debug/streams read it ------------------------

    @property
    def backend(self) -> str:
        return self.relay.backend

    @property
    def outcome(self) -> Outcome | None:
        return self.relay.outcome

    @property
    def finished(self) -> bool:
        return self.relay.finished

    @property
    def finished_at(self) -> float | None:
        return self.relay.finished_at

    @property
    def progress(self) -> Progress:
        return self.relay.progress

    @property
    def pause_cause(self) -> str | None:
        return self.relay.pause_cause

    @property
    def state(self) -> str:
        return self.relay.state

    def usage(self) -> dict[str, Any]:
        return self.relay.usage()

    def stats(self, now: float) -> dict[str, Any]:
        return self.relay.stats(now)

    def describe(self, now: float) -> dict[str, Any]:
        return self.relay.describe(now, self.session)

    # -- control (event loop) ----------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name=f"upstream {self.id}")
        if self.settings.ttft_timeout_s:
            self._timers.append(loop.call_later(self.settings.ttft_timeout_s, self._ttft_expired))

    def pause(self) -> None:
        """The client asked to pause: stop reading the upstream."""
        if self.finished or PauseCause.CLIENT in self.relay.causes:
            return
        self._unpaused.clear()
        self.log_event(Event.PAUSE_RECEIVED, self.id, n_generated=self.progress.n_content)
        self._paused(self.relay.pause(PauseCause.CLIENT, time.monotonic()))
        if self.settings.max_pause_s:
            loop = asyncio.get_running_loop()
            self._pause_timer = loop.call_later(self.settings.max_pause_s, self._pause_expired)

    def resume(self) -> None:
        if self.finished or PauseCause.CLIENT not in self.relay.causes:
            return
        self._unpaused.set()
        self.log_event(Event.RESUME_RECEIVED, self.id, n_generated=self.progress.n_content)
        if self._pause_timer is not None:
            self._pause_timer.cancel()
        self._resumed(self.relay.resume(PauseCause.CLIENT, time.monotonic()))

    def cancel(self, reason: str) -> None:
        """End now; the upstream connection is closed by the reader task's cleanup."""
        self._finish(None, Cancelled(reason))

    async def wait_done(self) -> None:
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # -- what the connection reads ------------------------------------------------------

    async def events(self) -> AsyncIterator[UpstreamEvent]:
        """Chunks, heartbeats and pause changes until (and including) Finished."""
        reported: str | None = None
        last_sent = time.monotonic()
        interval = self.settings.heartbeat_interval_s
        while True:
            cause = None if self.finished else self.pause_cause
            if cause != reported:
                reported = cause
                yield PauseChanged(cause)
            if self.relay.buffer:
                chunk = self._take()
                last_sent = time.monotonic()
                yield chunk
                continue
            if self.outcome is not None:
                yield Finished(self.outcome)
                return
            idle = time.monotonic() - last_sent
            if idle >= interval:
                yield Heartbeat(self.state, 0, 0)
                last_sent = time.monotonic()
                continue
            await self._wait_changed(interval - idle)

    def _take(self) -> UpstreamChunk:
        chunk = self.relay.take()
        if self.relay.drained():
            self._resumed(self.relay.resume(PauseCause.SOCKET_FULL, time.monotonic()))
            self._room.set()
        return chunk

    async def _wait_changed(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._changed.wait()
        self._changed.clear()

    def _signal(self) -> None:
        self._changed.set()

    # -- what the state decided: logged, signalled --------------------------------------

    def _paused(self, began: bool) -> None:
        if began:
            self.log_event(Event.PAUSED, self.id, cause=self.pause_cause, backend=self.backend)
        self._signal()

    def _resumed(self, ended: bool) -> None:
        if ended:
            self.log_event(Event.RESUMED, self.id, backend=self.backend)
        self._signal()

    def _ttft_expired(self) -> None:
        if self.progress.first_token_at is None and not self.finished:
            timeout_ms = round((self.settings.ttft_timeout_s or 0) * 1000)
            error = TtftTimeout(
                f"no first token from upstream {self.backend!r} within {timeout_ms} ms",
                reason="ttft_timeout",
                backend=self.backend,
            )
            self._finish(None, error)

    def _pause_expired(self) -> None:
        if PauseCause.CLIENT in self.relay.causes and not self.finished:
            limit_ms = round((self.settings.max_pause_s or 0) * 1000)
            self._finish(None, PauseTimeout(f"paused longer than max_pause_ms ({limit_ms})"))

    def _finish(self, finish_reason: str | None, error: EdgeLLMError | None = None) -> None:
        now = time.monotonic()
        if not self.relay.finish(Outcome(finish_reason, error), now):
            return
        for timer in [*self._timers, self._pause_timer]:
            if timer is not None:
                timer.cancel()
        self._unpaused.set()
        self._room.set()
        reason = ended_reason(error)
        if reason:
            self.metrics.cancellations.labels(self.backend, reason).inc()
            self.log_event(
                Event.CANCEL, self.id, reason=reason, backend=self.backend, state="upstream"
            )
        self.log_event(
            Event.END,
            self.id,
            finish_reason=finish_reason,
            error=error.code if error else None,
            n_generated=self.progress.n_content,
            **self.stats(now),
        )
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()  # closes the upstream connection (see _attempt)
        self._signal()

    # -- the reader task ------------------------------------------------------------------

    async def _run(self) -> None:
        reasons: list[str] = []
        try:
            for upstream in self.candidates:
                if self.finished:
                    return
                try:
                    await self._attempt(upstream)
                    return
                except _GiveUp as exc:
                    reasons.append(f"{upstream.name}: {exc.reason}")
                    self._give_up(upstream, exc)
            tried = "; ".join(reasons) or "none configured or all at max_concurrency"
            self._finish(None, UpstreamUnavailable(f"no upstream could take the request ({tried})"))
        except EdgeLLMError as exc:
            self._finish(None, exc)
        except Exception as exc:  # a bug here must end the stream, not hang it
            _log.exception("upstream stream %s failed", self.id)
            self._finish(None, UpstreamFailure(f"upstream relay failed: {type(exc).__name__}"))

    def _give_up(self, upstream: Upstream, exc: _GiveUp) -> None:
        self.progress.failovers.append(upstream.name)
        self.metrics.failovers.labels(upstream.name, "unhealthy" if exc.unhealthy else "busy").inc()
        if exc.unhealthy:
            self.registry.mark(upstream, False, exc.reason)
        self.relay.connected = False
        self.log_event(Event.UPSTREAM_FAILOVER, self.id, backend=upstream.name, reason=exc.reason)

    async def _attempt(self, upstream: Upstream) -> None:
        """Relay from one upstream; _GiveUp if it failed before any content."""
        self.relay.attempt(upstream.name)
        upstream.num_open += 1
        response: aiohttp.ClientResponse | None = None
        try:
            response = await self._open(upstream)
            self.relay.connected = True
            self._signal()
            await self._relay(upstream, response)
        finally:
            upstream.num_open -= 1
            if response is not None:
                response.close()  # not returned to the pool: the upstream sees the close

    async def _open(self, upstream: Upstream) -> aiohttp.ClientResponse:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.settings.connect_timeout_s)
        body = {**self.body, "model": upstream.upstream_model(self.client_model)}
        try:
            response = await self.registry.session.post(
                upstream.url(self.path), json=body, headers=upstream.headers(), timeout=timeout
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise _GiveUp(f"{type(exc).__name__}: {exc}"[:300], unhealthy=True) from exc
        if response.status < 400:
            return response
        async with response:
            raw = await response.content.read(_MAX_ERROR_BODY)
        if response.status in (429, 503):
            raise _GiveUp(f"HTTP {response.status} (busy)", unhealthy=False)
        if response.status >= 500:
            raise _GiveUp(f"HTTP {response.status}", unhealthy=True)
        raise rejected(response.status, raw, upstream.name)

    async def _relay(self, upstream: Upstream, response: aiohttp.ClientResponse) -> None:
        parser = SSEParser(max_event_bytes=_MAX_EVENT_BYTES)
        try:
            while True:
                await self._unpaused.wait()
                if self.finished:
                    return
                data = await response.content.read(_READ_BYTES)
                events = parser.feed(data) if data else parser.close()
                for event in events:
                    if await self._on_event(event.data):
                        return
                if not data:
                    break
        except (aiohttp.ClientError, OSError, EventTooLarge) as exc:
            self._broke_off(upstream, f"stream broke: {type(exc).__name__}", exc)
        if self.progress.finish_reason is None:
            self._broke_off(upstream, "stream ended without a finish_reason or [DONE]")
        await self._push_all(self.relay.take_held())
        self._finish(self.progress.finish_reason or "stop")

    def _broke_off(
        self, upstream: Upstream, reason: str, cause: Exception | None = None
    ) -> NoReturn:
        """The upstream's stream broke: the next upstream gets the request if no
        content was sent yet; otherwise the stream ends with an error."""
        if self.progress.first_token_at is None:
            raise _GiveUp(reason, unhealthy=True) from cause
        self.registry.mark(upstream, False, reason)
        raise UpstreamFailure(f"upstream {upstream.name!r}: {reason}") from cause

    async def _on_event(self, data: str) -> bool:
        """Handle one SSE event; True when the stream ended ([DONE])."""
        read = self.relay.read(data)
        if read == DONE:
            await self._push_all(self.relay.take_held())
            self._finish(self.progress.finish_reason or "stop")
            return True
        if not isinstance(read, UpstreamChunk):
            return False
        chunks, first = self.relay.arrived(read, time.monotonic())
        if first:
            self._first_token()
        await self._push_all(chunks)
        return False

    def _first_token(self) -> None:
        ttft = self.relay.ttft_s() or 0.0
        self.metrics.ttft.labels(self.backend).observe(ttft)
        self.log_event(
            Event.FIRST_TOKEN, self.id, ttft_ms=round(ttft * 1000.0, 3), backend=self.backend
        )

    async def _push_all(self, chunks: list[UpstreamChunk]) -> None:
        for chunk in chunks:
            await self._push(chunk)

    async def _push(self, chunk: UpstreamChunk) -> None:
        """Into the bounded buffer; while it is full, nothing more is read."""
        while self.relay.full and not self.finished:
            if PauseCause.SOCKET_FULL not in self.relay.causes:
                self._room.clear()
                self._paused(self.relay.pause(PauseCause.SOCKET_FULL, time.monotonic()))
            await self._room.wait()
        if self.finished:
            return
        self.relay.put(chunk)
        if chunk.has_content:
            self.metrics.generated_chunks.labels(self.backend).inc()
        self._signal()


def rejected(status: int, raw: bytes, backend: str) -> UpstreamRejected:
    """The upstream's 4xx, with its code and message when it sent OpenAI's shape."""
    code, message = f"upstream_{status}", raw.decode("utf-8", "replace")[:500]
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        error = json.loads(raw)["error"]
        code = str(error.get("code") or error.get("type") or code)
        message = str(error.get("message") or message)
    return UpstreamRejected(status, code, f"upstream {backend!r}: {message}", backend=backend)
