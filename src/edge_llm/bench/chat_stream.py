"""One streaming chat completion, read as it arrives, filling a :class:`RequestRecord`.

:class:`ChatStream` separates opening from reading so that the slow-consumer probe can
read a few chunks, stop reading, and resume. :func:`run_request` is the plain case:
open, read to the end, record. Every failure becomes an error kind on the record
(never an exception): ``"400 prompt_too_long"`` (status and the server's code),
``"stream_error <code>"`` (an error inside a 200 stream), ``connect_error``,
``read_error``, ``protocol_error``, ``not_streaming``, ``malformed_chunk``,
``incomplete_stream`` (no ``[DONE]``), ``no_content``, ``too_many_chunks``, ``timeout``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edge_llm.bench.connection import DEFAULT_LIMIT, HttpError, Response, open_request
from edge_llm.bench.prompts import Prompt
from edge_llm.bench.record import RequestRecord
from edge_llm.bench.targets import Target
from edge_llm.client.errors import ClientError, ServerStreamError
from edge_llm.client.sse import SSEEvent, SSEParser, parse_chunk, read_events

MAX_ERROR_BODY_BYTES = 64 * 1024
Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class RequestOptions:
    """What every request asks for. ``temperature`` 0 (greedy) makes output lengths
    comparable between servers running the same model; None leaves it to the server."""

    max_tokens: int = 64
    temperature: float | None = 0.0
    include_usage: bool = True
    timeout_s: float = 300.0

    def max_chunks(self, max_tokens: int) -> int:
        """Bound on data events per stream, so a runaway server cannot exhaust memory."""
        return 16 * max_tokens + 1024


def request_body(target: Target, prompt: Prompt, options: RequestOptions) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": prompt.body_messages(),
        "max_tokens": prompt.max_tokens or options.max_tokens,
        "stream": True,
    }
    if target.model:
        body["model"] = target.model
    if options.temperature is not None:
        body["temperature"] = options.temperature
    if options.include_usage:
        body["stream_options"] = {"include_usage": True}
    return body


class ChatStream:
    """A streaming request whose every content chunk is timestamped on arrival.

    Call :meth:`open`, then :meth:`read_some` until it returns False, then
    :meth:`close`. Errors are recorded on :attr:`record`, never raised.
    ``rcvbuf``/``limit`` shape the socket for the slow-consumer probe; ``headers`` are
    sent besides the target's (a storm user's ``X-Session-Id``), ``body`` fields
    besides the request's own (a storm batch job's ``priority``).
    """

    def __init__(
        self,
        target: Target,
        prompt: Prompt,
        options: RequestOptions,
        record: RequestRecord,
        *,
        clock: Clock = time.perf_counter,
        rcvbuf: int | None = None,
        limit: int = DEFAULT_LIMIT,
        headers: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        self.target = target
        self.extra_headers = headers or {}
        self.extra_body = body or {}
        self.prompt = prompt
        self.options = options
        self.record = record
        self.clock = clock
        self.rcvbuf = rcvbuf
        self.limit = limit
        self.start = 0.0
        self.response: Response | None = None
        self._parser = SSEParser()
        self._max_events = options.max_chunks(prompt.max_tokens or options.max_tokens)
        self._events = 0
        self._content: list[str] = []
        self.finished = False

    @property
    def text(self) -> str:
        """The content received so far, concatenated."""
        return "".join(self._content)

    def now(self) -> float:
        """Seconds since this request started."""
        return self.clock() - self.start

    async def open(self, epoch: float) -> bool:
        """Send the request; True when a 200 event stream follows. ``epoch`` is the run's
        start on the same clock, for :attr:`RequestRecord.started_at`."""
        self.start = self.clock()
        self.record.started_at = self.start - epoch
        fields = request_body(self.target, self.prompt, self.options) | self.extra_body
        body = json.dumps(fields).encode()
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            **self.target.headers(),
            **self.extra_headers,
        }
        try:
            self.response = await open_request(
                self.target.chat_url,
                method="POST",
                headers=headers,
                body=body,
                rcvbuf=self.rcvbuf,
                limit=self.limit,
            )
        except HttpError as exc:
            return self._finish_failed(exc.kind, str(exc))
        return await self._check_response(self.response)

    async def _check_response(self, response: Response) -> bool:
        self.record.status = response.status
        self.record.stream_id = response.headers.get("x-request-id")
        if response.status != 200:
            kind, message = await _http_error(response)
            return self._finish_failed(kind, message)
        content_type = response.headers.get("content-type", "")
        if "text/event-stream" not in content_type:
            return self._finish_failed("not_streaming", f"Content-Type is {content_type!r}")
        return True

    async def read_some(self) -> bool:
        """Read once and process the events it completes; False once the stream ended."""
        if self.finished or self.response is None:
            return False
        try:
            data = await self.response.read()
            arrived = self.now()
            events = read_events(self._parser, data)
            for event in events:
                self._take(event, arrived)
            if not data:
                self._end(arrived)
        except HttpError as exc:
            self._finish_failed(exc.kind, str(exc))
        except ClientError as exc:
            self._finish_failed(_stream_error_kind(exc), exc.message)
        return not self.finished

    async def run_to_end(self) -> None:
        while await self.read_some():
            pass

    def queued_bytes(self) -> int | None:
        """Bytes waiting in the kernel receive queue (FIONREAD)."""
        return self.response.queued_bytes() if self.response else None

    def close(self) -> None:
        if self.response is not None:
            self.response.close()

    def fail_timeout(self, seconds: float) -> None:
        self._finish_failed("timeout", f"no complete response within {seconds:g} s")

    def _take(self, event: SSEEvent, arrived: float) -> None:
        if self.finished:
            return
        record = self.record
        if record.ttfr is None:
            record.ttfr = arrived
        self._events += 1
        if self._events > self._max_events:
            self._finish_failed("too_many_chunks", f"more than {self._max_events} events")
            return
        chunk = parse_chunk(event)
        if chunk is None:
            record.done = True
            self._end(arrived)
            return
        if chunk.content:
            record.chunk_times.append(arrived)
            self._content.append(chunk.content)
        if chunk.finish_reason:
            record.finish_reason = chunk.finish_reason
        if chunk.usage:
            _take_usage(record, chunk.usage)

    def _end(self, arrived: float) -> None:
        if self.finished:
            return
        self.finished = True
        self.record.ended_at = arrived
        if not self.record.done:
            self.record.fail("incomplete_stream", "the stream ended without data: [DONE]")
        elif not self.record.chunk_times:
            self.record.fail("no_content", "the stream had no content chunk")
        self.close()

    def _finish_failed(self, kind: str, message: str) -> bool:
        self.record.fail(kind, message)
        self.record.ended_at = self.now()
        self.finished = True
        self.close()
        return False


def _take_usage(record: RequestRecord, usage: dict[str, Any]) -> None:
    completion = usage.get("completion_tokens")
    prompt = usage.get("prompt_tokens")
    if isinstance(completion, int) and not isinstance(completion, bool):
        record.completion_tokens = completion
    if isinstance(prompt, int) and not isinstance(prompt, bool):
        record.prompt_tokens = prompt


def _stream_error_kind(exc: ClientError) -> str:
    if isinstance(exc, ServerStreamError):
        return f"stream_error {exc.server_code or 'unknown'}"
    return exc.code


async def _http_error(response: Response) -> tuple[str, str]:
    """(kind, message) from a non-200 response: ``"400 prompt_too_long"``."""
    try:
        body = await response.read_all(MAX_ERROR_BODY_BYTES)
    except HttpError:
        body = b""
    error = _error_object(body)
    code = _error_code(error)
    kind = f"{response.status} {code}" if code else str(response.status)
    message = error.get("message") if isinstance(error.get("message"), str) else None
    return kind, str(message or body[:200].decode("utf-8", errors="replace"))


def _error_object(body: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    error = obj.get("error") if isinstance(obj, dict) else None
    return error if isinstance(error, dict) else {}


def _error_code(error: dict[str, Any]) -> str | None:
    for key in ("code", "type"):
        value = error.get(key)
        if isinstance(value, str) and value:
            return value
    return None


async def run_request(
    target: Target,
    prompt: Prompt,
    options: RequestOptions,
    record: RequestRecord,
    *,
    epoch: float,
    clock: Clock = time.perf_counter,
) -> RequestRecord:
    """Open, read to the end and return the filled ``record`` (errors recorded)."""
    return (await read_stream(target, prompt, options, record, epoch=epoch, clock=clock)).record


async def read_stream(
    target: Target,
    prompt: Prompt,
    options: RequestOptions,
    record: RequestRecord,
    *,
    epoch: float,
    clock: Clock = time.perf_counter,
) -> ChatStream:
    """As :func:`run_request`, returning the stream read (its text too)."""
    stream = ChatStream(target, prompt, options, record, clock=clock)
    try:
        async with asyncio.timeout(options.timeout_s):
            if await stream.open(epoch):
                await stream.run_to_end()
    except TimeoutError:
        stream.fail_timeout(options.timeout_s)
    finally:
        stream.close()
    return stream
