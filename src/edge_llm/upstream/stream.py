"""One request relayed from an upstream's SSE stream, under this engine's contract.

A reader task reads the upstream's response and puts its chunks into a small
bounded buffer; the connection takes them with :meth:`UpstreamStream.events`
(the same events as the local pump, plus the upstream's chunk objects).

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
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import aiohttp

from edge_llm.engine.stream import Outcome
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

_log = logging.getLogger("edge_llm.upstream")
_MAX_ERROR_BODY = 64 * 1024
_MAX_EVENT_BYTES = 1 << 20
_READ_BYTES = 16 * 1024


@dataclass(frozen=True)
class StreamSettings:
    buffer_chunks: int = 32  # outbound_buffer_tokens: chunks held for a slow client
    resume_threshold: float = 0.3
    heartbeat_interval_s: float = 1.0
    connect_timeout_s: float = 3.0
    ttft_timeout_s: float | None = 10.0
    max_pause_s: float | None = 60.0


@dataclass(frozen=True)
class UpstreamChunk:
    """One chunk object of the upstream, ``id`` and ``model`` set to ours."""

    data: dict[str, Any]
    text: str  # content text of its first choice ("" if none)
    has_content: bool  # text or a tool call: a token reached the client

    @property
    def usage_only(self) -> bool:
        return not self.data.get("choices") and "usage" in self.data


UpstreamEvent = UpstreamChunk | Heartbeat | PauseChanged | Finished


class _GiveUp(Exception):
    """This upstream cannot serve the request now; try the next one."""

    def __init__(self, reason: str, *, unhealthy: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.unhealthy = unhealthy


@dataclass
class _Progress:
    created_at: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    n_received: int = 0  # chunks put in the buffer
    n_sent: int = 0  # chunks taken by the connection
    n_content: int = 0
    pauses: int = 0
    paused_since: float | None = None
    paused_s: float = 0.0
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    failovers: list[str] = field(default_factory=list)


class UpstreamStream:
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
        self.backend = self.candidates[0].name if self.candidates else "none"
        self.connected = False
        self.outcome: Outcome | None = None
        self.progress = _Progress()
        self.finished_at: float | None = None
        self._buffer: deque[UpstreamChunk] = deque()
        self._client_paused = False
        self._socket_full = False
        self._unpaused = asyncio.Event()
        self._unpaused.set()
        self._room = asyncio.Event()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._timers: list[asyncio.TimerHandle] = []
        self._pause_timer: asyncio.TimerHandle | None = None

    # -- control (event loop) ----------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name=f"upstream {self.id}")
        if self.settings.ttft_timeout_s:
            self._timers.append(loop.call_later(self.settings.ttft_timeout_s, self._ttft_expired))

    @property
    def finished(self) -> bool:
        return self.outcome is not None

    @property
    def pause_cause(self) -> str | None:
        if self._client_paused:
            return "client"
        return "socket_full" if self._socket_full else None

    def pause(self) -> None:
        """The client asked to pause: stop reading the upstream."""
        if self.finished or self._client_paused:
            return
        self._client_paused = True
        self._unpaused.clear()
        self.log_event(Event.PAUSE_RECEIVED, self.id, n_generated=self.progress.n_content)
        self._note_pause_change(was_paused=self._socket_full)
        if self.settings.max_pause_s:
            loop = asyncio.get_running_loop()
            self._pause_timer = loop.call_later(self.settings.max_pause_s, self._pause_expired)

    def resume(self) -> None:
        if self.finished or not self._client_paused:
            return
        self._client_paused = False
        self._unpaused.set()
        self.log_event(Event.RESUME_RECEIVED, self.id, n_generated=self.progress.n_content)
        if self._pause_timer is not None:
            self._pause_timer.cancel()
        self._note_pause_change(was_paused=True)

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
            if self._buffer:
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
        chunk = self._buffer.popleft()
        self.progress.n_sent += 1
        low = int(self.settings.buffer_chunks * self.settings.resume_threshold)
        if self._socket_full and len(self._buffer) <= low:
            self._socket_full = False
            self._note_pause_change(was_paused=True)
            self._room.set()
        return chunk

    async def _wait_changed(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._changed.wait()
        self._changed.clear()

    def _signal(self) -> None:
        self._changed.set()

    # -- state for /debug/streams, usage and stats ---------------------------------------

    @property
    def state(self) -> str:
        if self.outcome is not None:
            error = self.outcome.error
            return "cancelled" if isinstance(error, Cancelled) else "done"
        if self.pause_cause is not None:
            return "paused"
        if self.progress.first_token_at is not None:
            return "decoding"
        return "prefill" if self.connected else "queued"

    def usage(self) -> dict[str, Any]:
        usage = self.progress.usage
        if usage is not None:
            return usage
        n = self.progress.n_content
        return {"prompt_tokens": 0, "completion_tokens": n, "total_tokens": n}

    def ttft_ms(self) -> float | None:
        first = self.progress.first_token_at
        return None if first is None else round((first - self.progress.created_at) * 1000.0, 3)

    def paused_ms(self, now: float) -> float:
        p = self.progress
        current = now - p.paused_since if p.paused_since is not None else 0.0
        return round((p.paused_s + current) * 1000.0, 3)

    def stats(self, now: float) -> dict[str, Any]:
        return {
            "ttft_ms": self.ttft_ms(),
            "pauses": self.progress.pauses,
            "paused_ms": self.paused_ms(now),
            "backend": self.backend,
        }

    def describe(self, now: float) -> dict[str, Any]:
        p = self.progress
        error = self.outcome.error if self.outcome else None
        return {
            "id": self.id,
            "session": self.session,
            "backend": self.backend,
            "state": self.state,
            "pause_cause": self.pause_cause,
            "ring_write": p.n_received,
            "ring_read": p.n_sent,
            "ring_capacity": self.settings.buffer_chunks,
            "kv_tokens": None,  # held by the upstream, not here
            "n_generated": p.n_content,
            "pauses": p.pauses,
            "paused_ms": self.paused_ms(now),
            "ttft_ms": self.ttft_ms(),
            "finish_reason": self.outcome.finish_reason if self.outcome else None,
            "cancel_reason": error.extra.get("reason") if isinstance(error, Cancelled) else None,
            "error": error.code if error is not None else None,
            "failovers": list(p.failovers),
            "age_ms": round((now - p.created_at) * 1000.0, 3),
        }

    # -- pause bookkeeping --------------------------------------------------------------

    def _note_pause_change(self, *, was_paused: bool) -> None:
        now = time.monotonic()
        p = self.progress
        paused = self.pause_cause is not None
        if paused and not was_paused:
            p.pauses += 1
            p.paused_since = now
            self.log_event(Event.PAUSED, self.id, cause=self.pause_cause, backend=self.backend)
        elif was_paused and not paused and p.paused_since is not None:
            p.paused_s += now - p.paused_since
            p.paused_since = None
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
        if self._client_paused and not self.finished:
            limit_ms = round((self.settings.max_pause_s or 0) * 1000)
            self._finish(None, PauseTimeout(f"paused longer than max_pause_ms ({limit_ms})"))

    def _finish(self, finish_reason: str | None, error: EdgeLLMError | None = None) -> None:
        if self.outcome is not None:
            return
        self.outcome = Outcome(finish_reason, error)
        now = time.monotonic()
        self.finished_at = now
        if self.progress.paused_since is not None:
            self.progress.paused_s += now - self.progress.paused_since
            self.progress.paused_since = None
        for timer in [*self._timers, self._pause_timer]:
            if timer is not None:
                timer.cancel()
        self._unpaused.set()
        self._room.set()
        reason = error.extra.get("reason") if error is not None else None
        if reason:
            self.metrics.cancellations.labels(self.backend, str(reason)).inc()
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
        self.connected = False
        self.log_event(Event.UPSTREAM_FAILOVER, self.id, backend=upstream.name, reason=exc.reason)

    async def _attempt(self, upstream: Upstream) -> None:
        """Relay from one upstream; _GiveUp if it failed before any content."""
        self.backend = upstream.name
        upstream.num_open += 1
        response: aiohttp.ClientResponse | None = None
        try:
            response = await self._open(upstream)
            self.connected = True
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
        held: list[UpstreamChunk] = []  # before the first content chunk: dropped on failover
        try:
            while True:
                await self._unpaused.wait()
                if self.finished:
                    return
                data = await response.content.read(_READ_BYTES)
                events = parser.feed(data) if data else parser.close()
                for event in events:
                    if await self._on_event(event.data, held):
                        return
                if not data:
                    break
        except (aiohttp.ClientError, OSError, EventTooLarge) as exc:
            self._broke_off(upstream, f"stream broke: {type(exc).__name__}", exc)
        if self.progress.finish_reason is None:
            self._broke_off(upstream, "stream ended without a finish_reason or [DONE]")
        await self._flush(held)
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

    async def _on_event(self, data: str, held: list[UpstreamChunk]) -> bool:
        """Handle one SSE event; True when the stream ended ([DONE])."""
        if data.strip() == "[DONE]":
            await self._flush(held)
            self._finish(self.progress.finish_reason or "stop")
            return True
        chunk = self._chunk(data)
        if chunk is None:
            return False
        if self.progress.first_token_at is None and not chunk.has_content:
            held.append(chunk)
            return False
        if chunk.has_content and self.progress.first_token_at is None:
            self._first_token()
        await self._flush(held)
        await self._push(chunk)
        return False

    def _chunk(self, data: str) -> UpstreamChunk | None:
        try:
            obj = json.loads(data)
        except ValueError:
            return None  # not JSON (a stray line): skipped, as robust clients do
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

    def _first_token(self) -> None:
        p = self.progress
        p.first_token_at = time.monotonic()
        ttft = p.first_token_at - p.created_at
        self.metrics.ttft.labels(self.backend).observe(ttft)
        self.log_event(
            Event.FIRST_TOKEN, self.id, ttft_ms=round(ttft * 1000.0, 3), backend=self.backend
        )

    async def _flush(self, held: list[UpstreamChunk]) -> None:
        while held:
            await self._push(held.pop(0))

    async def _push(self, chunk: UpstreamChunk) -> None:
        """Into the bounded buffer; while it is full, nothing more is read."""
        while len(self._buffer) >= self.settings.buffer_chunks and not self.finished:
            if not self._socket_full:
                self._socket_full = True
                self._room.clear()
                self._note_pause_change(was_paused=self._client_paused)
            await self._room.wait()
        if self.finished:
            return
        self._buffer.append(chunk)
        self.progress.n_received += 1
        if chunk.has_content:
            self.progress.n_content += 1
            self.metrics.generated_chunks.labels(self.backend).inc()
        self._signal()


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


def rejected(status: int, raw: bytes, backend: str) -> UpstreamRejected:
    """The upstream's 4xx, with its code and message when it sent OpenAI's shape."""
    code, message = f"upstream_{status}", raw.decode("utf-8", "replace")[:500]
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        error = json.loads(raw)["error"]
        code = str(error.get("code") or error.get("type") or code)
        message = str(error.get("message") or message)
    return UpstreamRejected(status, code, f"upstream {backend!r}: {message}", backend=backend)


def stream_error(error: object, backend: str) -> UpstreamFailure:
    message = error.get("message") if isinstance(error, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    failure = UpstreamFailure(f"upstream {backend!r}: {message or error}", backend=backend)
    if isinstance(code, str) and code:
        failure.code = code
    return failure
