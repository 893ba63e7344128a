"""Streaming over SSE: ``POST {base}/chat/completions`` with ``stream: true``.

Works against this engine and any OpenAI-compatible server. Flow control is TCP
backpressure: when the render queue crosses its high watermark the transport
stops reading the socket (``read_paused``) until the queue drains to its low
watermark (``read_resumed``); with the small socket buffers from
:mod:`edge_llm.client.connection` the server's writes then block. Cancelling
means closing the connection.

A stream that asked for progress (``return_progress``) gets progress chunks (no
choices, a ``progress`` object) from edge-llm while no token flows: each is a
:class:`~edge_llm.client.result.Heartbeat`. A server that refuses the field as
unknown (a 400 naming it, as OpenAI's API does) is asked again without it.

A resumable stream (``stream_options.resumable``, on by default: ``resumable`` in the
configuration) carries ``X-Stream-Id`` and an id on every event. When its connection
drops (a read error, the body ending before ``[DONE]``, a dead connection), the
transport resumes it: ``GET {base}/streams/{id}`` with ``Last-Event-ID``, at once,
then with the retry backoff, up to ``resume_attempts`` tries in a row without an event. An event
whose number it already took is skipped, so no text is rendered twice or lost. Giving a
resumable stream up (the TTFT hard time-out, a cancelled task) sends
``DELETE {base}/streams/{id}``: closing the connection alone would only detach it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

import aiohttp

from edge_llm.client.attempt import LOGGER_NAME, Attempt
from edge_llm.client.connection import read_bounded, status_error, transport_error
from edge_llm.client.errors import (
    HTTPStatusError,
    NotStreamingError,
    ReadError,
    TtftTimeoutError,
)
from edge_llm.client.render_queue import RenderQueue
from edge_llm.client.result import Heartbeat
from edge_llm.client.resuming import ResumingTransport
from edge_llm.client.sse import SSEEvent, SSEParser, parse_chunk, read_events
from edge_llm.observability.events import Event
from edge_llm.protocol.sse import parse_event_id

EVENT_STREAM = "text/event-stream"
PROGRESS_FIELD = "return_progress"
RESUMABLE_FIELD = "resumable"
STREAM_ID_HEADER = "X-Stream-Id"
CHAT_PATH = "/chat/completions"
NOT_STREAMING_PREVIEW_BYTES = 4096
CANCEL_TIMEOUT_S = 2.0  # a resumable stream's DELETE when the client gives it up


class ReadPause:
    """SSE flow control: :meth:`pause` blocks the reader until :meth:`resume`."""

    def __init__(self, attempt: Attempt, queue: RenderQueue[str]) -> None:
        self._attempt = attempt
        self._queue = queue
        self._resumed = asyncio.Event()
        self._paused = False

    async def pause(self) -> None:
        self._resumed.clear()
        self._paused = True
        self._attempt.log.emit(Event.READ_PAUSED, queue_fill=round(self._queue.fill, 3))
        await self._resumed.wait()
        self._attempt.log.emit(Event.READ_RESUMED, queue_fill=round(self._queue.fill, 3))

    async def resume(self) -> None:
        if self._paused:
            self._paused = False
            self._resumed.set()


class SSETransport(ResumingTransport):
    """Runs attempts over SSE; one instance per stream."""

    name = "sse"

    _response: aiohttp.ClientResponse | None = None  # the response read now

    async def run(self, attempt: Attempt) -> None:
        """Make one request and stream it to completion ([DONE] or a finish_reason
        and end of body), resuming it after a drop when it is resumable. Raises a
        :class:`~edge_llm.client.errors.ClientError`."""
        attempt.log.emit(
            Event.REQUEST_SENT, transport=self.name, attempt=attempt.number, url=self._request.url
        )
        self._stream_id, self._last_n = None, 0
        try:
            self._response = await attempt.read(self._post)
            self._response = await self._checked(self._response, attempt)
            self._stream_id = self._response.headers.get(STREAM_ID_HEADER)
            attempt.flow = ReadPause(attempt, self._request.queue)
            await self._read_resuming(attempt)
        except TtftTimeoutError:
            attempt.cancelled("ttft_timeout", method=await self._give_up())
            raise
        except asyncio.CancelledError:
            attempt.cancelled("client", method=await self._give_up())
            raise
        except (aiohttp.ClientError, OSError) as exc:
            raise transport_error(exc, url=self._request.url) from exc
        finally:
            attempt.flow = None
            if self._response is not None:
                self._response.close()

    async def _give_up(self) -> str:
        """Cancel the stream: closing the connection does, unless it is resumable
        (that only detaches it, keeping its KV): then ``DELETE {base}/streams/{id}``
        too, within ``CANCEL_TIMEOUT_S``. Returns how (``close`` or ``delete``)."""
        if self._stream_id is None:
            return "close"
        try:
            async with asyncio.timeout(CANCEL_TIMEOUT_S):
                url = f"{self._base()}/streams/{self._stream_id}"
                response = await self._request.session.delete(url, headers=self._request.headers)
                response.release()
        except (aiohttp.ClientError, OSError, TimeoutError):
            return "close"  # the server forgets it after resume_grace_ms anyway
        return "delete"

    def _base(self) -> str:
        url = self._request.url
        return url[: url.rfind(CHAT_PATH)] if CHAT_PATH in url else url.rsplit("/", 1)[0]

    async def _read(self, attempt: Attempt) -> None:
        await self._read_events(self._require_response(), attempt)

    async def _reopen(self, attempt: Attempt) -> None:
        """A GET for the events after the last one taken."""
        if self._response is not None:
            self._response.close()
        self._response = await attempt.read(self._get_resumed)
        await self._check(self._response, attempt)

    async def _get_resumed(self) -> aiohttp.ClientResponse:
        headers = {**self._request.headers, "Last-Event-ID": f"{self._stream_id}.{self._last_n}"}
        url = f"{self._base()}/streams/{self._stream_id}"
        return await self._request.session.get(url, headers=headers)

    def _require_response(self) -> aiohttp.ClientResponse:
        if self._response is None:
            raise RuntimeError("no response to read")
        return self._response

    async def _post(self) -> aiohttp.ClientResponse:
        return await self._request.session.post(
            self._request.url, json=self._request.body, headers=self._request.headers
        )

    async def _checked(
        self, response: aiohttp.ClientResponse, attempt: Attempt
    ) -> aiohttp.ClientResponse:
        """The response once it is a 200 event stream; a refusal of the progress or
        the resumable field makes the request again without it (once each)."""
        for _ in range(3):
            try:
                await self._check(response, attempt)
                return response
            except HTTPStatusError as exc:
                refused = _refused_field(exc, self._request.body)
                if refused is None:
                    raise
                response.close()
                self._request = replace(self._request, body=_without(self._request.body, refused))
                logging.getLogger(LOGGER_NAME).info(
                    "%s refuses %s: asked again without", exc, refused
                )
                response = await attempt.read(self._post)
        await self._check(response, attempt)
        return response

    async def _check(self, response: aiohttp.ClientResponse, attempt: Attempt) -> None:
        attempt.set_request_id(response.headers.get("X-Request-Id"))
        if response.status != 200:
            body = await attempt.read(lambda: read_bounded(response.content))
            raise status_error(response.status, response.headers, body, url=self._request.url)
        content_type = response.headers.get("Content-Type", "")
        if not content_type.lower().startswith(EVENT_STREAM):
            preview = await attempt.read(
                lambda: read_bounded(response.content, NOT_STREAMING_PREVIEW_BYTES)
            )
            raise NotStreamingError(
                f"the server did not stream: Content-Type is {content_type or 'missing'!r}, "
                f"expected {EVENT_STREAM} (body starts {preview[:120]!r})"
            )

    async def _read_events(self, response: aiohttp.ClientResponse, attempt: Attempt) -> None:
        parser = SSEParser()
        while True:
            data = await attempt.read(response.content.readany)
            if data:
                attempt.on_bytes()
            comments = parser.comments
            events = read_events(parser, data)
            if parser.comments > comments:
                attempt.on_heartbeat(Heartbeat())
            for event in events:
                if await self._on_event(event, attempt):
                    return
            if not data:
                if attempt.finish_reason is None:
                    raise ReadError(f"the stream from {self._request.url} ended before [DONE]")
                return

    async def _on_event(self, event: SSEEvent, attempt: Attempt) -> bool:
        """Handle one event; True when the stream is complete ([DONE])."""
        if self._stream_id is not None and event.id is not None:
            number = parse_event_id(event.id)
            if number is not None and number[1] <= self._last_n:
                return False  # taken before the drop: a replay never renders twice
            self._last_n = number[1] if number is not None else self._last_n
        attempt.on_data()
        chunk = parse_chunk(event)
        if chunk is None:
            return True
        attempt.set_request_id(chunk.id)
        progress = chunk.raw.get("progress")
        if isinstance(progress, dict) and not chunk.raw.get("choices"):
            attempt.on_heartbeat(Heartbeat.of(progress))
        attempt.on_usage(chunk.usage)
        attempt.on_finish(chunk.finish_reason)
        await attempt.on_content(chunk.content)
        return False


def _refused_field(error: HTTPStatusError, body: dict[str, Any]) -> str | None:
    """The field of ours a 400 names (an unknown field the request carried): the
    progress field or the resumable stream option; None when it is neither."""
    if error.status != 400:
        return None
    options = body.get("stream_options")
    carried = [PROGRESS_FIELD] if PROGRESS_FIELD in body else []
    if isinstance(options, dict) and RESUMABLE_FIELD in options:
        carried.append(RESUMABLE_FIELD)
    param = str(error.error.get("param") or "")
    return next((f for f in carried if param.endswith(f) or f in str(error)), None)


def _without(body: dict[str, Any], field: str) -> dict[str, Any]:
    if field == PROGRESS_FIELD:
        return {k: v for k, v in body.items() if k != field}
    options = {k: v for k, v in body["stream_options"].items() if k != field}
    return {**body, "stream_options": options}
