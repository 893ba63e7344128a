"""Resumable SSE streams on aiohttp (the stream itself: ``generation/resumable.py``).

A route whose request opted in (``stream_options.resumable``, or ``resumable`` on
``/v1/messages``) hands its encoder to :func:`stream_resumable`: every event gets
``id: <stream_id>.<n>``, the response ``X-Stream-Id``, and the encoder runs in a task
of its own that a dropped connection leaves waiting. ``GET /v1/streams/{stream_id}``
(:func:`resume_stream`) or the same POST, each with ``Last-Event-ID``, attaches a new
connection: the events after ``n`` are replayed, then the stream goes on live.
``DELETE /v1/streams/{stream_id}`` (:func:`cancel_stream`) cancels it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

from edge_llm.errors import EdgeLLMError, InvalidRequest
from edge_llm.generation.dispatch import Answer
from edge_llm.generation.resumable import STREAM_ID_HEADER, Detachable
from edge_llm.protocol import sse
from edge_llm.server.context import ServerContext, context_of
from edge_llm.server.http import error_response, presented_key
from edge_llm.server.sse_writer import EventWriter, SseWriter

LAST_EVENT_ID_HEADER = "Last-Event-ID"
SSE = "sse"

Produce = Callable[[EventWriter], Awaitable[web.StreamResponse]]


class SseSink:
    """One HTTP connection of a resumable stream; its handler waits in :meth:`served`."""

    def __init__(self, writer: SseWriter, path: str) -> None:
        self.writer = writer
        self.path = path
        self.done: asyncio.Future[web.StreamResponse] = asyncio.get_running_loop().create_future()

    async def write(self, frames: list[bytes]) -> None:
        await self.writer.send(b"".join(frames))

    async def open(self) -> None:
        await self.writer.open()

    async def end(self) -> None:
        if self.done.done():
            return
        try:
            await self.writer.open()
            await self.writer.finish()
        finally:
            self._return(self.writer.response)

    def gone(self) -> None:
        self._return(self.writer.response)

    def abort(self) -> None:
        if (transport := self.writer.request.transport) is not None:
            transport.abort()

    def refuse(self, error: EdgeLLMError) -> bool:
        if self.writer.started:
            return False
        self._return(error_response(error, self.path))
        return True

    def _return(self, response: web.StreamResponse) -> None:
        if not self.done.done():
            self.done.set_result(response)

    async def served(self, stream: Detachable[bytes]) -> web.StreamResponse:
        """Wait while the stream writes here; a cancelled handler (the client went
        away) detaches the stream."""
        try:
            return await self.done
        except asyncio.CancelledError:
            stream.lost(self)
            raise


class ResumableSseWriter:
    """The encoder's writer: numbers each event and sends it through the stream."""

    def __init__(
        self, stream: Detachable[bytes], opening: bytes, response: web.StreamResponse
    ) -> None:
        self.stream = stream
        self._opening = opening
        self._response = response  # returned to the encoder, which runs apart from it

    @property
    def started(self) -> bool:
        return self.stream.log.last_n > 0

    async def send(self, data: bytes) -> None:
        data, self._opening = self._opening + data, b""
        events = [e for e in sse.split_events(data) if not sse.is_comment(e)]
        first = self.stream.log.last_n + 1
        numbered = [
            sse.with_id(event, sse.event_id(self.stream.id, first + i))
            for i, event in enumerate(events)
        ]
        if numbered:
            await self.stream.send(numbered)

    async def beat(self, ping: bytes) -> None:
        if self._opening or not sse.is_comment(ping):
            await self.send(ping)
        else:
            await self.stream.send_unlogged(ping)

    async def finish(self) -> web.StreamResponse:
        await self.stream.end()
        return self._response

    async def fail(self, error: EdgeLLMError, event: bytes) -> web.StreamResponse:
        if not self.started and self.stream.refuse(error):
            return self._response
        await self.send(event)
        return await self.finish()


def wants_resumable(ctx: ServerContext, asked: bool) -> bool:
    """The request asked for a resumable stream and the server resumes
    (``resume_grace_ms`` > 0); otherwise a drop cancels it, as always."""
    return asked and ctx.resumable.enabled


async def send_answer(
    request: web.Request,
    answer: Answer,
    headers: Mapping[str, str],
    *,
    stream: bool,
    resumable: bool,
    produce: Produce,
    whole: Callable[[], Awaitable[web.StreamResponse]],
    opening: bytes = b"",
) -> web.StreamResponse:
    """The one branch every streaming route takes: a resumable SSE stream (asked
    for, and the server resumes), a plain SSE stream, or one JSON object (``whole``).
    ``produce`` is the route's encoder, written to either stream's writer;
    ``opening`` what that stream starts with."""
    if not stream:
        return await whole()
    ctx = context_of(request)
    if wants_resumable(ctx, resumable):
        return await stream_resumable(request, answer, headers, produce, opening=opening)
    return await produce(SseWriter(request, ctx, answer.id, headers, opening=opening))


async def stream_resumable(
    request: web.Request,
    answer: Answer,
    headers: Mapping[str, str],
    produce: Produce,
    *,
    opening: bytes = b"",
) -> web.StreamResponse:
    """Stream ``answer`` through ``produce`` (the route's encoder) as a resumable stream."""
    ctx = context_of(request)
    book = ctx.resumable
    stream = book.open(answer, presented_key(request), book.new_log(), SSE)
    writer = SseWriter(request, ctx, answer.id, {**headers, STREAM_ID_HEADER: stream.id})
    sink = SseSink(writer, request.path)
    # The headers go out now: a client that gives up before the first token knows
    # the stream's id, to cancel it (DELETE /v1/streams/{id}) rather than leave it
    # detached. A failure after admission is then an error event, not a status.
    await stream.attach(sink, 0, resume=True)
    stream.start(produce(ResumableSseWriter(stream, opening, writer.response)))
    return await sink.served(stream)


async def resume_stream(request: web.Request) -> web.StreamResponse:
    """``GET /v1/streams/{stream_id}``: the events after ``Last-Event-ID`` (from the
    first without it, as ``EventSource`` connects), then the stream live."""
    stream_id = request.match_info["stream_id"]
    return await _resume(request, stream_id, _after(request, stream_id))


async def cancel_stream(request: web.Request) -> web.Response:
    """``DELETE /v1/streams/{stream_id}``: the client gives the stream up (its TTFT
    time-out, an abort): cancelled now (reason ``client``, its KV freed at the
    engine's next step) and forgotten, whether a connection is attached or not."""
    ctx = context_of(request)
    stream = ctx.resumable.find_any(request.match_info["stream_id"], presented_key(request))
    stream.drop("client")
    return web.json_response({"id": stream.id, "object": "stream.deleted", "deleted": True})


async def resume_posted(request: web.Request) -> web.StreamResponse | None:
    """A generation POST carrying ``Last-Event-ID`` resumes that stream instead of
    starting a new one (None: the header is absent, the POST runs as usual)."""
    last = request.headers.get(LAST_EVENT_ID_HEADER)
    if last is None:
        return None
    parsed = sse.parse_event_id(last)
    if parsed is None:
        raise InvalidRequest(_BAD_ID.format(last=last[:100]), param=LAST_EVENT_ID_HEADER)
    return await _resume(request, *parsed)


_BAD_ID = "Last-Event-ID {last!r} is not an id this server sent (<stream_id>.<n>)"


def _after(request: web.Request, stream_id: str) -> int:
    last = request.headers.get(LAST_EVENT_ID_HEADER)
    if last is None:
        return 0
    parsed = sse.parse_event_id(last)
    if parsed is None or parsed[0] != stream_id:
        raise InvalidRequest(_BAD_ID.format(last=last[:100]), param=LAST_EVENT_ID_HEADER)
    return parsed[1]


async def _resume(request: web.Request, stream_id: str, after: int) -> web.StreamResponse:
    ctx = context_of(request)
    stream: Detachable[bytes] = ctx.resumable.find(stream_id, presented_key(request), SSE)
    headers = {**stream.answer.headers, STREAM_ID_HEADER: stream.id}
    sink = SseSink(SseWriter(request, ctx, stream.answer.id, headers), request.path)
    await stream.attach(sink, after)
    return await sink.served(stream)
