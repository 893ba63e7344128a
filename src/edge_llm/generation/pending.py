"""A streamed answer whose model is pulled on first use: it streams from the start.

With ``pull = "missing"``, a streamed request (SSE, WebSocket) that names a model not
pulled yet gets a :class:`PendingAnswer` at once. Until the stream exists its events
are heartbeats: state ``downloading`` with the file's bytes so far and its size, then
``loading`` while the model loads and the request is admitted; then the stream's own
events. Without it the request would wait in silence for the whole download, and a
client's read time-out would give up first. A request that does not stream waits for
the pull before its answer starts, as before (its reply is one object).

What the stream would be told before it exists is kept for it: a pause (the
client's, or a resumable stream's detach) applies as soon as it runs; a cancel or a
close ends the wait (the pull goes on: other requests may wait for it, and the next
request finds the model). A failure (the pull's 404, a refusal of the prompt) is the
answer's :class:`~edge_llm.generation.events.Failed`: a plain HTTP error while nothing
was sent, else an error event, as after any progress chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from edge_llm.errors import Cancelled, EdgeLLMError
from edge_llm.generation.dispatch import Answer
from edge_llm.generation.events import AnswerEvent, Failed
from edge_llm.models.pulling import PullFlight
from edge_llm.protocol.stream_events import Ending, Heartbeat, WaitState
from edge_llm.protocol.stream_rules import Heartbeats, Outcome, PauseCause
from edge_llm.upstream.router import LOCAL

_log = logging.getLogger("edge_llm.server")

# What runs once the model is pulled: the request started on the model's served
# name (loaded first if needed), as any other request.
Start = Callable[[str], Awaitable[Answer]]
Pulled = Callable[[PullFlight], Awaitable[str | None]]


class PendingAnswer(Answer):
    def __init__(
        self,
        flight: PullFlight,
        pulled: Pulled,
        start: Start,
        *,
        request_id: str,
        progress: bool,
        heartbeat_interval_s: float,
    ) -> None:
        """``pulled``: the served name once ``flight`` pulled it; ``start``: the
        request's answer on that model; ``progress``: a heartbeat at each step too."""
        self.id = request_id
        self.model = flight.name  # the name a pulled source is served under
        self.n_prompt = 0  # known once the stream exists
        self.headers = {"X-Request-Id": request_id}
        self.flight = flight
        self.progress = progress
        self.heartbeat_interval_s = heartbeat_interval_s
        self.state = WaitState.DOWNLOADING
        self.inner: Answer | None = None
        self._outcome: Outcome | None = None  # ended before the stream existed
        self._paused: set[PauseCause] = set()
        self._closed = False
        self._changed = asyncio.Event()
        flight.watch(self._changed.set)
        self._task = asyncio.create_task(self._run(pulled, start))
        self._task.add_done_callback(self._started)

    async def _run(self, pulled: Pulled, start: Start) -> Answer:
        served = await pulled(self.flight)
        self.state = WaitState.LOADING
        self._changed.set()
        return await start(served or self.flight.name)

    def _started(self, task: asyncio.Task[Answer]) -> None:
        """The wait ended: the stream runs, or the answer ended with why it could not."""
        self._changed.set()
        if task.cancelled():
            self._end(Cancelled("disconnect"))
            return
        error = task.exception()
        if error is not None:
            if not isinstance(error, EdgeLLMError):
                _log.error("starting %s failed", self.id, exc_info=error)
                error = EdgeLLMError("the stream failed inside the server (its log says why)")
            self._end(error)
            return
        inner = task.result()
        if self._outcome is not None or self._closed:  # given up meanwhile
            inner.close()
            return
        self.inner, self.n_prompt, self.headers = inner, inner.n_prompt, inner.headers
        for cause in self._paused:
            self._hold(cause, True)

    def _end(self, error: EdgeLLMError) -> None:
        if self._outcome is None:
            self._outcome = Outcome(None, error)

    # -- the events --------------------------------------------------------------------

    async def events(self, new_id: Callable[[], str]) -> AsyncIterator[AnswerEvent]:
        async for beat in self._waiting():
            yield beat
        if self.inner is None:
            assert self._outcome is not None and self._outcome.error is not None
            yield Failed(self._outcome.error)
            return
        async for event in self.inner.events(new_id):
            yield event

    async def _waiting(self) -> AsyncIterator[Heartbeat]:
        """Heartbeats until the stream exists or the answer ended: one per interval,
        and with ``progress`` one at each step (a state, a percent of the file)."""
        beats = Heartbeats(self.heartbeat_interval_s, time.monotonic())
        told: tuple[str, int] | None = None
        while self.inner is None and self._outcome is None:
            self._changed.clear()
            beat = self.heartbeat()
            wait_s = beats.wait_s(time.monotonic())
            if wait_s <= 0 or (self.progress and _step(beat) != told):
                told = _step(beat)
                yield beat
                beats.sent(time.monotonic())
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), wait_s)

    def heartbeat(self) -> Heartbeat:
        if self.state is WaitState.LOADING:
            return Heartbeat(self.state.value, 0, 0)
        download = (self.flight.done, self.flight.total)
        return Heartbeat(self.state.value, 0, 0, download=download)

    # -- what the stream is told, kept until it exists -----------------------------------

    @property
    def backend(self) -> str:
        return LOCAL if self.inner is None else self.inner.backend

    @property
    def outcome(self) -> Ending | None:
        return self._outcome if self.inner is None else self.inner.outcome

    @property
    def finished(self) -> bool:
        return self.outcome is not None if self.inner is None else self.inner.finished

    @property
    def text_only(self) -> bool:
        return self.inner is not None and self.inner.text_only

    @property
    def token_bytes(self) -> Callable[[int], bytes] | None:
        return self._token_bytes  # read when the answer starts: the model is not known

    def _token_bytes(self, token: int) -> bytes:
        of = self.inner.token_bytes if self.inner is not None else None
        return b"" if of is None else of(token)

    def usage(self) -> dict[str, Any]:
        if self.inner is None:
            return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        return self.inner.usage()

    def stats(self) -> dict[str, Any]:
        return {} if self.inner is None else self.inner.stats()

    def pause(self) -> None:
        self._hold(PauseCause.CLIENT, True)

    def resume(self) -> None:
        self._hold(PauseCause.CLIENT, False)

    def detach(self) -> None:
        self._hold(PauseCause.DISCONNECTED, True)

    def reattach(self, **detail: Any) -> None:
        if self.inner is not None:
            self.inner.reattach(**detail)
        self._paused.discard(PauseCause.DISCONNECTED)

    def _hold(self, cause: PauseCause, paused: bool) -> None:
        """A pause of ``cause`` begins (``paused``) or ends: the stream's, or kept."""
        inner = self.inner
        if inner is None and paused:
            self._paused.add(cause)
        elif inner is None:
            self._paused.discard(cause)
        elif cause is PauseCause.DISCONNECTED:
            inner.detach()
        elif paused:
            inner.pause()
        else:
            inner.resume()

    def cancel(self, reason: str) -> None:
        if self.inner is not None:
            self.inner.cancel(reason)
            return
        self._end(Cancelled(reason))
        self._task.cancel()
        self._changed.set()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.inner is not None:
            self.inner.close()
        else:
            self.cancel("disconnect")


def _step(beat: Heartbeat) -> tuple[str, int]:
    """What a progress heartbeat reports a change of: the state, and while downloading
    the percent of the file (MiB while its size is not known)."""
    if beat.download is None:
        return beat.state, 0
    done, total = beat.download
    return beat.state, done * 100 // total if total else done >> 20
