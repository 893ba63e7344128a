"""Resumable streams: a dropped connection detaches a stream instead of ending it.

A request that opts in (``stream_options.resumable``, the WebSocket's ``"resumable":
true``) gets a :class:`Detachable`: its id (128 random bits), the answer it carries and
a bounded :class:`ReplayLog` of the frames it sent, numbered from 1. The route's
encoder runs in a task of its own (the *producer*) and hands every frame to
:meth:`Detachable.send`, which logs it first and then writes it to the connection
attached at that moment (a :class:`Sink`).

When a write fails or the connection's handler is cancelled, the stream detaches:
the answer is paused (cause ``disconnected``: nothing more is generated, its KV is
kept and offloaded under the usual idle rules) and the producer waits. A new
connection attaches with the number of the last frame it got: the frames after it
are replayed from the log, the answer resumes and the producer goes on writing to
the new connection. Not resumed within ``resume_grace_ms``, the answer is cancelled
(reason ``resume_timeout``) and the stream forgotten. A stream that ended stays
resumable for as long (its last frames may not have arrived).

Invariant that keeps a resume exact: a frame is in the log before any write of it,
and an attach writes everything logged before it takes the connection, so a frame
is either written to the new connection by the attach or by the producer after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar

from edge_llm.errors import EdgeLLMError, ResumeGap, StreamNotFound
from edge_llm.generation.dispatch import Answer
from edge_llm.observability.events import Event, EventSink

_log = logging.getLogger("edge_llm.server")

STREAM_ID_HEADER = "X-Stream-Id"
STREAM_ID_BITS = 128
MAX_REPLAY_BYTES = 1 << 20

F = TypeVar("F", bytes, str)


class StreamGone(Exception):
    """The stream expired or was dropped while its producer waited to write."""


class Sink(Protocol[F]):
    """One connection a stream writes to."""

    async def write(self, frames: list[F]) -> None:
        """Write ``frames``; raises ConnectionError when the connection is gone."""

    async def open(self) -> None:
        """Start the connection's response now (a resume answers at once)."""

    async def end(self) -> None:
        """The stream is over: end the connection's response."""

    def gone(self) -> None:
        """The stream no longer writes here (dropped, or another connection took it)."""

    def abort(self) -> None:
        """Another connection took the stream: drop this one now. A connection that
        went quiet without a reset is not seen dead for minutes, and a write of the
        producer blocked on it would hold the stream back from the new one."""

    def refuse(self, error: EdgeLLMError) -> bool:
        """The stream failed before its first frame: answer with a plain error if the
        connection allows it still (True), else False."""


class ReplayLog(Generic[F]):
    """The frames a stream sent, numbered from 1: the newest ``max_frames`` of them,
    within ``max_bytes``."""

    def __init__(self, max_frames: int, max_bytes: int = MAX_REPLAY_BYTES) -> None:
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self._frames: deque[F] = deque()
        self._bytes = 0
        self.last_n = 0  # the number of the newest frame (0: none yet)

    @property
    def first_n(self) -> int:
        """The number of the oldest frame still held."""
        return self.last_n - len(self._frames) + 1

    def add(self, frame: F) -> int:
        """Log ``frame``; returns its number."""
        self._frames.append(frame)
        self._bytes += len(frame)
        self.last_n += 1
        while len(self._frames) > self.max_frames or (
            self._bytes > self.max_bytes and len(self._frames) > 1
        ):
            self._bytes -= len(self._frames.popleft())
        return self.last_n

    def after(self, n: int) -> list[F]:
        """The frames after frame ``n``; ResumeGap when the log no longer holds them
        all or ``n`` was never sent."""
        if n > self.last_n or n < 0:
            raise ResumeGap(f"event {n} was never sent (the last is {self.last_n})")
        if n + 1 < self.first_n:
            raise ResumeGap(
                f"events after {n} are no longer held (the oldest kept is {self.first_n})"
            )
        skip = n + 1 - self.first_n
        return [self._frames[i] for i in range(skip, len(self._frames))]


class Detachable(Generic[F]):
    """One resumable stream: the answer, its log and the connection attached now."""

    def __init__(
        self,
        stream_id: str,
        owner: str,
        answer: Answer,
        log: ReplayLog[F],
        book: ResumableStreams,
        *,
        kind: str,
    ) -> None:
        self.id = stream_id
        self.kind = kind  # "sse" or "ws": a stream resumes on the transport it started on
        self.owner = owner
        self.answer = answer
        self.log: ReplayLog[F] = log
        self.book = book
        self.sink: Sink[F] | None = None
        self.ended = False  # the producer sent its last frame
        self.gone = False  # expired, dropped beyond the cap, or forgotten
        self.detached_at: float | None = None  # the answer is paused (cause disconnected)
        self.resumes = 0
        self.client_paused = False  # its client paused it (WebSocket); a take-up lifts it
        self._changed = asyncio.Event()
        self._attaching = asyncio.Lock()
        self._replaying: Sink[F] | None = None  # the connection attach() writes to now
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    # -- the producer's side -----------------------------------------------------------

    def start(self, produce: Awaitable[object]) -> None:
        """Run the route's encoder (which writes through :meth:`send`) in a task of its
        own: it outlives the connection that started it."""
        self._task = asyncio.get_running_loop().create_task(self._produce(produce))

    async def _produce(self, produce: Awaitable[object]) -> None:
        try:
            await produce
        except StreamGone:
            pass
        except Exception:
            _log.exception("resumable stream %s failed", self.id)
        finally:
            self.answer.close()  # ends a stream still running (reason disconnect)
            await self.end()

    async def send(self, frames: list[F]) -> None:
        """Log ``frames`` and deliver them: to the connection attached, else (detached)
        by the replay of the next attach. Raises StreamGone if none comes in time."""
        for frame in frames:
            self.log.add(frame)
        if (sink := self.sink) is not None:
            try:
                await sink.write(frames)
                return
            except ConnectionError:
                self.lost(sink)
        # Whichever connection attaches (or did while the write failed) replays them.
        await self._reattached()

    async def send_unlogged(self, frame: F) -> None:
        """A sign of life (a ping): written if a connection is attached, never replayed."""
        sink = self.sink
        if sink is None:
            return
        try:
            await sink.write([frame])
        except ConnectionError:
            self.lost(sink)

    async def _reattached(self) -> None:
        while self.sink is None and not self.gone:
            self._changed.clear()
            await self._changed.wait()
        if self.gone:
            raise StreamGone(self.id)

    def refuse(self, error: EdgeLLMError) -> bool:
        """The answer failed before its first frame: the attached connection answers
        with a plain HTTP error if it can (True: the stream is over and forgotten)."""
        sink = self.sink
        if sink is None or self.log.last_n or not sink.refuse(error):
            return False
        self.ended = True
        self.forget()
        return True

    async def end(self) -> None:
        """The producer is done: the connection attached ends its response; the stream
        stays resumable for the grace period (its last frames may not have arrived)."""
        if self.ended:
            return
        self.ended = True
        self._restart_timer(self.forget)
        if (sink := self.sink) is not None:
            await self._end_on(sink)

    # -- connections -------------------------------------------------------------------

    def lost(self, sink: Sink[F]) -> None:
        """``sink``'s connection dropped: the stream detaches (if it was still writing
        there), or ends like any stream beyond ``max_detached_streams``."""
        if self.sink is not sink:
            return
        self.sink = None
        sink.gone()
        if self.ended or self.gone:
            return
        self.book.detach(self)

    async def attach(
        self, sink: Sink[F], after: int, *, resume: bool = True, end_in_band: bool = False
    ) -> int:
        """Make ``sink`` the stream's connection, first replaying the frames after
        frame ``after``; returns how many were replayed. A resume's response starts at
        once; the first connection's waits for its first frame (an error before it
        is still a plain HTTP error). ``end_in_band``: the connection cannot show an
        end by itself (a WebSocket stays open; its stream ends with a frame), so a
        resume of an ended stream after its last frame is refused: it would get no
        frame at all, and wait for one forever. Raises StreamNotFound (gone),
        ResumeGap, or the ConnectionError of a connection that dropped meanwhile."""
        if (replaying := self._replaying) is not None:
            replaying.abort()  # taken over mid-replay: its write may never return
        async with self._attaching:
            if self.gone:
                raise StreamNotFound(f"stream {self.id} has expired")
            frames = self.log.after(after)  # the gap is checked before taking over
            if end_in_band and self.ended and not frames:
                raise ResumeGap(f"stream {self.id} ended with event {after}: nothing follows it")
            if (old := self.sink) is not None:
                self.sink = None  # its connection is dead, not noticed yet: taken over
                old.gone()
                old.abort()
            self._replaying = sink
            try:
                if resume:
                    await sink.open()
                replayed = await self._replay(sink, after, frames)
            except ConnectionError:
                if self.detached_at is None and not self.ended:
                    self.book.detach(self)  # it was taken over: it waits as any drop does
                raise
            finally:
                self._replaying = None
            self._attached(sink, after, replayed)
        if self.ended:
            await self._end_on(sink)
        return replayed

    async def _end_on(self, sink: Sink[F]) -> None:
        """``sink``'s part is over. It is let go: a later resume, maybe on the same
        keep-alive connection, has nothing to take over (or abort)."""
        if self.sink is sink:
            self.sink = None
        await _quietly(sink.end())

    async def _replay(self, sink: Sink[F], after: int, frames: list[F]) -> int:
        """Write every frame logged after ``after``, including those the producer logs
        while the replay is written."""
        replayed, sent = 0, after
        while frames:
            sent = self.log.last_n
            await sink.write(frames)
            replayed += len(frames)
            frames = self.log.after(sent)
        return replayed

    def _attached(self, sink: Sink[F], after: int, replayed: int) -> None:
        self.sink = sink
        if self._timer is not None and not self.ended:
            self._timer.cancel()
            self._timer = None
        if self.detached_at is not None:
            detached_ms = round((time.monotonic() - self.detached_at) * 1000.0, 3)
            self.detached_at = None
            self.resumes += 1
            self.answer.reattach(
                last_event=after, replayed=replayed, detached_ms=detached_ms, resumes=self.resumes
            )
        self._changed.set()

    # -- the book's decisions --------------------------------------------------------------

    def detached(self, grace_s: float) -> None:
        """Paused (cause disconnected); expires unless resumed within ``grace_s``."""
        self.detached_at = time.monotonic()
        self.answer.detach()
        self._restart_timer(self.expire, grace_s)

    def drop(self, reason: str) -> None:
        """End the stream now (``reason``) and forget it."""
        self.answer.cancel(reason)
        self.forget()

    def expire(self) -> None:
        """Not resumed within the grace period: cancelled (KV freed within one step)."""
        if not self.ended:
            detached_ms = round((time.monotonic() - (self.detached_at or 0.0)) * 1000.0, 3)
            self.book.events(
                Event.RESUME_TIMEOUT, self.answer.id, stream_id=self.id,
                last_event=self.log.last_n, detached_ms=detached_ms,
            )  # fmt: skip
            self.answer.cancel("resume_timeout")
        self.forget()

    def forget(self) -> None:
        self.gone = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.book.forget(self)
        self._changed.set()

    def _restart_timer(self, action: Callable[[], None], delay: float | None = None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        wait = self.book.grace_s if delay is None else delay
        self._timer = asyncio.get_running_loop().call_later(wait, action)


class ResumableStreams:
    """The resumable streams of a server, by id: at most ``max_detached`` detached at
    once, and as many ended ones kept for a late resume (the oldest forgotten first)."""

    def __init__(
        self, grace_s: float, max_detached: int, buffer_events: int, events: EventSink
    ) -> None:
        self.grace_s = grace_s
        self.max_detached = max_detached
        self.buffer_events = buffer_events
        self.events = events
        self._streams: dict[str, Detachable[Any]] = {}

    @property
    def enabled(self) -> bool:
        return self.grace_s > 0

    def open(self, answer: Answer, key: str | None, log: ReplayLog[F], kind: str) -> Detachable[F]:
        """A new resumable stream carrying ``answer`` for the caller with API ``key``,
        on transport ``kind``."""
        self._forget_oldest_ended()
        stream_id = secrets.token_hex(STREAM_ID_BITS // 8)
        stream = Detachable(stream_id, owner_digest(key), answer, log, self, kind=kind)
        self._streams[stream_id] = stream
        answer.hand_over()
        return stream

    def new_log(self) -> ReplayLog[bytes]:
        return ReplayLog(self.buffer_events)

    def new_text_log(self) -> ReplayLog[str]:
        return ReplayLog(self.buffer_events)

    def find(self, stream_id: str, key: str | None, kind: str) -> Detachable[Any]:
        """The stream ``stream_id`` of the caller with API ``key`` on transport ``kind``;
        StreamNotFound when unknown, expired or another key's (which must not learn it
        exists)."""
        stream = self._streams.get(stream_id)
        if (
            stream is None
            or stream.gone
            or stream.kind != kind
            or not hmac.compare_digest(stream.owner, owner_digest(key))
        ):
            raise StreamNotFound(f"no resumable stream {stream_id!r} (unknown or expired)")
        return stream

    def find_any(self, stream_id: str, key: str | None) -> Detachable[Any]:
        """The stream ``stream_id`` of the caller with API ``key``, on either transport."""
        stream = self._streams.get(stream_id)
        return self.find(stream_id, key, stream.kind if stream is not None else "sse")

    def detach(self, stream: Detachable[F]) -> None:
        if self.num_detached >= self.max_detached:
            stream.drop("disconnect")
            return
        stream.detached(self.grace_s)
        self.events(
            Event.DETACHED, stream.answer.id, stream_id=stream.id,
            last_event=stream.log.last_n, grace_ms=round(self.grace_s * 1000.0),
        )  # fmt: skip

    def forget(self, stream: Detachable[F]) -> None:
        if self._streams.get(stream.id) is stream:
            del self._streams[stream.id]

    @property
    def num_detached(self) -> int:
        return sum(1 for s in self._streams.values() if s.detached_at is not None and not s.gone)

    def detached(self) -> list[Detachable[Any]]:
        return [s for s in self._streams.values() if s.detached_at is not None]

    def _forget_oldest_ended(self) -> None:
        ended = [s for s in self._streams.values() if s.ended]
        if len(ended) >= max(1, self.max_detached):
            ended[0].forget()  # dicts keep insertion order: the oldest

    def close(self) -> None:
        """Shutdown: the detached streams end (reason ``shutdown``); attached ones run
        on through the drain like any stream."""
        for stream in self.detached():
            stream.drop("shutdown")

    def __len__(self) -> int:
        return len(self._streams)


def owner_digest(key: str | None) -> str:
    """What a stream keeps of its caller's key: a digest, compared in constant time."""
    return hashlib.sha256((key or "").encode()).hexdigest()


async def _quietly(ending: Awaitable[None]) -> None:
    with contextlib.suppress(ConnectionError):
        await ending
