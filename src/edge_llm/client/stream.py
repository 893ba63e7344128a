"""One streamed chat completion, consumed as an async iterator of text deltas.

Usage (the caller must use ``async with`` so an abandoned stream is cancelled)::

    async with client.stream(messages) as stream:
        async for text in stream:
            render(text)
    result = stream.result

A background reader task runs the attempts (with the retry policy) and pushes
content into a bounded :class:`~edge_llm.client.render_queue.RenderQueue`; the
caller's iteration pops from it. When the queue reaches its high watermark the
transport is paused (WebSocket: a PAUSE frame; SSE: the socket is not read) unless
``send_pause`` is False; when it drains to the low watermark it is resumed. A
full queue always stops the reader, so memory stays bounded either way.
Iteration raises the stream's :class:`~edge_llm.client.errors.ClientError`
after the chunks received before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from types import TracebackType
from typing import Any, Protocol

from edge_llm.client.attempt import Attempt, Clock, HeartbeatCallback
from edge_llm.client.config import ClientConfig
from edge_llm.client.errors import ClientError
from edge_llm.client.render_queue import RenderQueue, Watermark
from edge_llm.client.request_log import RequestLog
from edge_llm.client.result import StreamResult
from edge_llm.client.retry import RetryPolicy
from edge_llm.observability.events import Event


class Transport(Protocol):
    """Runs one attempt to completion or raises a ClientError (see sse/ws_transport)."""

    name: str

    async def run(self, attempt: Attempt) -> None: ...


class ChatStream:
    """Async iterator of text deltas; :attr:`result` once it is exhausted."""

    def __init__(
        self,
        *,
        config: ClientConfig,
        transport: Transport,
        queue: RenderQueue[str],
        log: RequestLog,
        policy: RetryPolicy,
        send_pause: bool = True,
        on_heartbeat: HeartbeatCallback | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.config = config
        self.send_pause = send_pause
        self.log = log
        self._transport = transport
        self._queue = queue
        self._policy = policy
        self._on_heartbeat = on_heartbeat
        self._clock = clock
        self._not_empty = asyncio.Event()
        self._not_full = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._attempt: Attempt | None = None
        self._error: BaseException | None = None
        self._finished = False
        self._started_at = 0.0
        self._ended_at: float | None = None
        self._pauses = 0

    # -- caller side -------------------------------------------------------------------

    async def __aenter__(self) -> ChatStream:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __aiter__(self) -> ChatStream:
        return self

    async def __anext__(self) -> str:
        self.start()
        while not self._queue and not self._finished:
            self._not_empty.clear()
            await self._not_empty.wait()
        if self._queue:
            return await self._pop()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        raise StopAsyncIteration

    async def drain(self) -> list[str]:
        """Every chunk already queued (possibly none), without waiting for more."""
        return [await self._pop() for _ in range(len(self._queue))]

    @property
    def done(self) -> bool:
        """The stream ended and every chunk was taken."""
        return self._finished and not self._queue

    def start(self) -> None:
        """Start the reader task (iteration and ``async with`` do this)."""
        if self._task is None:
            self._started_at = self._clock()
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def aclose(self) -> None:
        """Cancel the stream if it still runs (sends CANCEL / closes the socket)."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @property
    def result(self) -> StreamResult:
        """The outcome; raises RuntimeError before the stream finished."""
        if not self._finished or self._attempt is None:
            raise RuntimeError("the stream has not finished")
        return self._build_result(self._attempt)

    async def _pop(self) -> str:
        item, mark = self._queue.pop()
        self._not_full.set()
        if mark is Watermark.LOW:
            self.log.emit(Event.WATERMARK_LOW, queue_fill=round(self._queue.fill, 3))
            flow = self._attempt.flow if self._attempt is not None else None
            if flow is not None and self.send_pause:
                await flow.resume()
        return item

    # -- reader side -------------------------------------------------------------------

    async def _push(self, text: str) -> None:
        while self._queue.is_full:
            self._not_full.clear()
            await self._not_full.wait()
        mark = self._queue.push(text)
        self._not_empty.set()
        if mark is Watermark.HIGH:
            await self._on_high()

    async def _on_high(self) -> None:
        self.log.emit(
            Event.WATERMARK_HIGH,
            queue_fill=round(self._queue.fill, 3),
            queue_len=len(self._queue),
            queue_capacity=self._queue.capacity,
            pause_enabled=self.send_pause,
        )
        flow = self._attempt.flow if self._attempt is not None else None
        if flow is not None and self.send_pause:
            self._pauses += 1
            await flow.pause()

    async def _run(self) -> None:
        try:
            await self._attempts()
            self._log_end(self._current().finish_reason)
        except ClientError as exc:
            self._fail(exc, exc.code, exc.server_code)
        except asyncio.CancelledError:
            self._log_end("cancelled")
            raise
        except Exception as exc:  # a bug: report it to the caller, not to the loop
            self._fail(exc, "internal_error", None)
        finally:
            self._finished = True
            self._ended_at = self._clock()
            self._not_empty.set()

    async def _attempts(self) -> None:
        number = 1
        while True:
            self._attempt = self._new_attempt(number)
            try:
                await self._transport.run(self._attempt)
                return
            except ClientError as exc:
                delivered = self._attempt.n_chunks > 0
                decision = self._policy.decide(exc, number, delivered=delivered)
                if decision is None:
                    raise
                self.log.emit(
                    Event.RETRY,
                    attempt=decision.next_attempt,
                    backoff_ms=round(decision.delay_ms, 1),
                    cause=decision.cause,
                    message=exc.message,
                )
                await asyncio.sleep(decision.delay_ms / 1000)
                number = decision.next_attempt

    def _new_attempt(self, number: int) -> Attempt:
        self.log.request_id = None
        return Attempt(
            number=number,
            config=self.config,
            log=self.log,
            deliver=self._push,
            clock=self._clock,
            on_heartbeat=self._on_heartbeat,
        )

    def _current(self) -> Attempt:
        if self._attempt is None:
            raise RuntimeError("no attempt was made")
        return self._attempt

    def _fail(self, exc: BaseException, code: str, server_code: str | None) -> None:
        self._error = exc
        fields: dict[str, Any] = {"code": code, "message": str(exc)}
        if server_code is not None:
            fields["server_code"] = server_code
        self.log.emit(Event.ERROR, **fields)

    def _log_end(self, finish_reason: str | None) -> None:
        attempt = self._attempt
        if attempt is None:
            return
        self.log.emit(
            Event.END,
            finish_reason=finish_reason,
            n_chunks=attempt.n_chunks,
            n_tokens=attempt.n_tokens,
            ttft_ms=attempt.ms_since_start(attempt.first_token_at),
            pauses=self._pauses,
        )

    def _build_result(self, attempt: Attempt) -> StreamResult:
        ended = self._ended_at if self._ended_at is not None else self._clock()
        return StreamResult(
            text="".join(attempt.text_parts),
            finish_reason=attempt.finish_reason,
            usage=attempt.usage,
            request_id=self.log.request_id,
            client_request_id=self.log.client_request_id,
            transport=self._transport.name,
            attempts=attempt.number,
            n_chunks=attempt.n_chunks,
            n_tokens=attempt.n_tokens,
            ttfr_ms=attempt.ms_since_start(attempt.first_data_at),
            ttft_ms=attempt.ms_since_start(attempt.first_token_at),
            itl_ms=tuple(attempt.itl_ms),
            e2e_ms=attempt.ms_since_start(attempt.last_token_at),
            total_ms=round((ended - self._started_at) * 1000, 3),
            pauses=self._pauses,
            server_pauses=tuple(attempt.server_pauses),
            server_stats=attempt.server_stats,
        )
