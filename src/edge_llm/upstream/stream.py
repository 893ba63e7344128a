"""One request relayed from an upstream's SSE stream, under this engine's contract:
the I/O driver around :class:`~edge_llm.upstream.relay_state.RelayState`.

A reader task reads the upstream's response and puts its chunks into a small
bounded buffer; the connection takes them through the one reader of every stream
(:func:`edge_llm.generation.pump.read_relayed`: the same events as the local pump,
plus the upstream's chunk objects). The state (buffer, pauses, progress, the end)
and the rules it keeps (:mod:`edge_llm.protocol.stream_rules`) are the sans-I/O
``RelayState``'s; this module holds the loop's side: the reader task, aiohttp,
the one timer the rules ask for, failover, metrics and the event log.

- PAUSE (client): the reader stops reading the upstream socket. A full buffer
  (our client's socket stopped draining) stops it too (cause ``socket_full``);
  either pause counts toward ``max_pause``, as on the local path.
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
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import aiohttp

from edge_llm.errors import (
    Cancelled,
    EdgeLLMError,
    UpstreamFailure,
    UpstreamRejected,
    UpstreamUnavailable,
)
from edge_llm.observability.events import Event, EventSink
from edge_llm.protocol.sse import EventTooLarge, SSEParser
from edge_llm.protocol.stream_rules import Outcome, PauseCause
from edge_llm.upstream.metrics import BackendMetrics
from edge_llm.upstream.registry import Upstream, UpstreamRegistry
from edge_llm.upstream.relay_log import RelayLog
from edge_llm.upstream.relay_state import DONE, RelayState, StreamSettings, UpstreamChunk

__all__ = ["StreamSettings", "UpstreamChunk", "UpstreamStream", "rejected"]

_log = logging.getLogger("edge_llm.upstream")
_MAX_ERROR_BODY = 64 * 1024
_MAX_EVENT_BYTES = 1 << 20
_READ_BYTES = 16 * 1024


class _GiveUp(Exception):
    """This upstream cannot serve the request now; try the next one."""

    def __init__(self, reason: str, *, unhealthy: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.unhealthy = unhealthy


class UpstreamStream:
    """The loop's side of one relayed stream; its state and decisions are
    :attr:`relay`'s (:class:`~edge_llm.upstream.relay_state.RelayState`: read the
    state there), told by :attr:`log` (:class:`~edge_llm.upstream.relay_log.RelayLog`).

    The connection's side (pause, resume, cancel, what it takes) and the reader task
    (connect, failover, read the SSE stream into the buffer) wait on the same asyncio
    events and the one timer; what is not I/O lives in the state machine."""

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
        trace_headers: Callable[[], dict[str, str]] = dict,
    ) -> None:
        self.id = stream_id
        self.path = path
        self.body = body
        self.candidates = list(candidates)
        self.registry = registry
        self.settings = settings
        self.client_model = client_model
        self.session = session
        self.trace_headers = trace_headers  # W3C trace context, read at each call
        first = self.candidates[0].name if self.candidates else "none"
        self.relay = RelayState(stream_id, client_model, settings, first, time.monotonic())
        self.log = RelayLog(self.relay, events, metrics)
        self._unpaused = asyncio.Event()
        self._unpaused.set()
        self._room = asyncio.Event()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None  # at the rules' next time-out

    @property
    def finished(self) -> bool:
        return self.relay.finished

    # -- control (event loop) ----------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name=f"upstream {self.id}")
        self._arm()

    def pause(self) -> None:
        """The client asked to pause: stop reading the upstream."""
        if self.finished or self.relay.paused_by(PauseCause.CLIENT):
            return
        self._unpaused.clear()
        self.log.received(Event.PAUSE_RECEIVED)
        self._paused(self.relay.pause(PauseCause.CLIENT, time.monotonic()))

    def resume(self) -> None:
        if self.finished or not self.relay.paused_by(PauseCause.CLIENT):
            return
        self._unpaused.set()
        self.log.received(Event.RESUME_RECEIVED)
        self._resumed(self.relay.resume(PauseCause.CLIENT, time.monotonic()))

    def cancel(self, reason: str) -> None:
        """End now; the upstream connection is closed by the reader task's cleanup."""
        self._finish(None, Cancelled(reason))

    # -- what the connection takes (generation/pump.py reads it) -----------------------

    def take(self) -> UpstreamChunk | None:
        """The next chunk to send, None while the buffer is empty."""
        return self.relay.take() if self.relay.buffer else None

    def sent(self) -> None:
        """A chunk was written: once the buffer drained, the upstream is read again."""
        if self.relay.drained():
            self._resumed(self.relay.resume(PauseCause.SOCKET_FULL, time.monotonic()))
            self._room.set()

    async def wait_changed(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._changed.wait()
        self._changed.clear()

    # -- what the state decided, carried out ---------------------------------------------

    def _paused(self, began: bool) -> None:
        if began:
            self.log.paused()
        self._arm()
        self._changed.set()

    def _resumed(self, ended: bool) -> None:
        if ended:
            self.log.resumed()
        self._arm()
        self._changed.set()

    def _arm(self) -> None:
        """One timer, at the next time-out the rules name (re-armed on every change)."""
        if self._timer is not None:
            self._timer.cancel()
        due = self.relay.next_due()
        self._timer = None
        if due is not None:
            delay = max(0.0, due - time.monotonic())
            self._timer = asyncio.get_running_loop().call_later(delay, self._expire)

    def _expire(self) -> None:
        error = self.relay.expired(time.monotonic())
        if error is not None:
            self._finish(None, error)
        else:
            self._arm()

    def _finish(self, finish_reason: str | None, error: EdgeLLMError | None = None) -> None:
        now = time.monotonic()
        if not self.relay.finish(Outcome(finish_reason, error), now):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._unpaused.set()
        self._room.set()
        self.log.ended(now)
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()  # closes the upstream connection (see _attempt)
        self._changed.set()

    # -- the reader task: failover, then the upstream's stream into the buffer ----------

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
        self.relay.progress.failovers.append(upstream.name)
        if exc.unhealthy:
            self.registry.mark(upstream, False, exc.reason)
        self.relay.gave_up()
        self.log.failover(upstream.name, exc.reason, exc.unhealthy)

    async def _attempt(self, upstream: Upstream) -> None:
        """Relay from one upstream; _GiveUp if it failed before any content, or has
        no room. The room is read and taken with no await between: requests that
        arrive together each see the others' (the router's earlier look cannot)."""
        if not upstream.has_room:
            raise _GiveUp("at max_concurrency", unhealthy=False)
        self.relay.attempt(upstream.name)
        upstream.num_open += 1
        response: aiohttp.ClientResponse | None = None
        try:
            body = {**self.body, "model": upstream.upstream_model(self.client_model)}
            headers = {**upstream.headers(), **self.trace_headers()}
            response = await _post(
                self.registry, upstream, self.path, body, self.settings, headers=headers
            )
            self.relay.connected()
            self._changed.set()
            await self._relay(upstream, response)
        finally:
            upstream.num_open -= 1
            if response is not None:
                response.close()  # not returned to the pool: the upstream sees the close

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
        if self.relay.progress.finish_reason is None:
            self._broke_off(upstream, "stream ended without a finish_reason or [DONE]")
        await self._push_all(self.relay.take_held())
        self._finish(self.relay.progress.finish_reason or "stop")

    def _broke_off(
        self, upstream: Upstream, reason: str, cause: Exception | None = None
    ) -> NoReturn:
        """The upstream's stream broke: the next upstream gets the request if no
        content was sent yet; otherwise the stream ends with an error."""
        if self.relay.progress.first_token_at is None:
            raise _GiveUp(reason, unhealthy=True) from cause
        self.registry.mark(upstream, False, reason)
        raise UpstreamFailure(f"upstream {upstream.name!r}: {reason}") from cause

    async def _on_event(self, data: str) -> bool:
        """Handle one SSE event; True when the stream ended ([DONE])."""
        read = self.relay.read(data)
        if read == DONE:
            await self._push_all(self.relay.take_held())
            self._finish(self.relay.progress.finish_reason or "stop")
            return True
        if not isinstance(read, UpstreamChunk):
            return False
        chunks, first = self.relay.arrived(read, time.monotonic())
        if first:
            self._arm()  # the TTFT time-out is no longer pending
            self.log.first_token()
        await self._push_all(chunks)
        return False

    async def _push_all(self, chunks: list[UpstreamChunk]) -> None:
        for chunk in chunks:
            await self._push(chunk)

    async def _push(self, chunk: UpstreamChunk) -> None:
        """Into the bounded buffer; while it is full, nothing more is read."""
        while self.relay.full and not self.finished:
            if not self.relay.paused_by(PauseCause.SOCKET_FULL):
                self._room.clear()
                self._paused(self.relay.pause(PauseCause.SOCKET_FULL, time.monotonic()))
            await self._room.wait()
        if self.finished:
            return
        self.relay.put(chunk)
        if chunk.has_content:
            self.log.chunk()
        self._changed.set()


async def _post(
    registry: UpstreamRegistry,
    upstream: Upstream,
    path: str,
    body: dict[str, Any],
    settings: StreamSettings,
    *,
    headers: dict[str, str],
) -> aiohttp.ClientResponse:
    """The upstream's streaming response; _GiveUp when it cannot take the request now
    (unreachable, busy, 5xx), its 4xx as :class:`UpstreamRejected`."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=settings.connect_timeout_s)
    try:
        response = await registry.session.post(
            upstream.url(path), json=body, headers=headers, timeout=timeout
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


def rejected(status: int, raw: bytes, backend: str) -> UpstreamRejected:
    """The upstream's 4xx, with its code and message when it sent OpenAI's shape."""
    code, message = f"upstream_{status}", raw.decode("utf-8", "replace")[:500]
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        error = json.loads(raw)["error"]
        code = str(error.get("code") or error.get("type") or code)
        message = str(error.get("message") or message)
    return UpstreamRejected(status, code, f"upstream {backend!r}: {message}", backend=backend)
