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
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

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
from edge_llm.client.sse import SSEEvent, SSEParser, parse_chunk, read_events
from edge_llm.client.stream_request import StreamRequest
from edge_llm.observability.events import Event

EVENT_STREAM = "text/event-stream"
PROGRESS_FIELD = "return_progress"
NOT_STREAMING_PREVIEW_BYTES = 4096


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


class SSETransport:
    """Runs attempts over SSE; one instance per stream."""

    name = "sse"

    def __init__(self, request: StreamRequest) -> None:
        self._request = request

    async def run(self, attempt: Attempt) -> None:
        """Make one request and stream it to completion ([DONE] or a finish_reason
        and end of body). Raises a :class:`~edge_llm.client.errors.ClientError`."""
        attempt.log.emit(
            Event.REQUEST_SENT, transport=self.name, attempt=attempt.number, url=self._request.url
        )
        response = None
        try:
            response = await attempt.read(self._post)
            response = await self._checked(response, attempt)
            attempt.flow = ReadPause(attempt, self._request.queue)
            await self._read_events(response, attempt)
        except TtftTimeoutError:
            attempt.cancelled("ttft_timeout", method="close")
            raise
        except asyncio.CancelledError:
            attempt.cancelled("client", method="close")
            raise
        except (aiohttp.ClientError, OSError) as exc:
            raise transport_error(exc, url=self._request.url) from exc
        finally:
            attempt.flow = None
            if response is not None:
                response.close()

    async def _post(self) -> aiohttp.ClientResponse:
        return await self._request.session.post(
            self._request.url, json=self._request.body, headers=self._request.headers
        )

    async def _checked(
        self, response: aiohttp.ClientResponse, attempt: Attempt
    ) -> aiohttp.ClientResponse:
        """The response once it is a 200 event stream; a refusal of the progress
        field makes the request again without it (once)."""
        try:
            await self._check(response, attempt)
        except HTTPStatusError as exc:
            if not _refuses_progress(exc, self._request.body):
                raise
            response.close()
            body = {k: v for k, v in self._request.body.items() if k != PROGRESS_FIELD}
            self._request = replace(self._request, body=body)
            logging.getLogger(LOGGER_NAME).info(
                "%s refuses %s: asked again without", exc, PROGRESS_FIELD
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


def _refuses_progress(error: HTTPStatusError, body: dict[str, object]) -> bool:
    """A 400 that names the progress field the request carried (an unknown field)."""
    named = error.error.get("param") == PROGRESS_FIELD or PROGRESS_FIELD in str(error)
    return error.status == 400 and PROGRESS_FIELD in body and named
