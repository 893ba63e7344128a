"""Writing a stream (server-sent events, or Ollama's NDJSON) so that a stalled
reader stalls only its stream."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from aiohttp import web

from edge_llm.errors import EdgeLLMError
from edge_llm.server.context import ServerContext
from edge_llm.server.http import error_response, tune_connection


class EventWriter(Protocol):
    """What a route's stream encoder writes through: :class:`SseWriter`, or a
    resumable stream's writer (``resumable_sse.py``), which outlives the connection."""

    @property
    def started(self) -> bool: ...

    async def send(self, data: bytes) -> None: ...

    async def beat(self, ping: bytes) -> None: ...

    async def finish(self) -> web.StreamResponse: ...

    async def fail(self, error: EdgeLLMError, event: bytes) -> web.StreamResponse: ...


class SseWriter:
    """Prepares the response on the first write, so an error before any byte
    can still be a plain HTTP error. ``opening`` (a stream's first events) is held
    until then and goes with the first write."""

    def __init__(
        self,
        request: web.Request,
        ctx: ServerContext,
        request_id: str,
        headers: Mapping[str, str] | None = None,
        *,
        content_type: str = "text/event-stream; charset=utf-8",
        opening: bytes = b"",
    ) -> None:
        self.request = request
        self._opening = opening
        self.ctx = ctx
        self.response = web.StreamResponse(
            headers={
                "Content-Type": content_type,
                "Cache-Control": "no-cache",
                "X-Request-Id": request_id,
                "X-Accel-Buffering": "no",
                **(headers or {}),
            }
        )

    @property
    def started(self) -> bool:
        return self.response.prepared

    async def send(self, data: bytes) -> None:
        """Write ``data`` after the opening, if that is still held (nothing to write:
        no write)."""
        data, self._opening = self._opening + data, b""
        if not data:
            return
        await self.open()
        await self.response.write(data)
        # aiohttp drains only every 64 KiB; wait whenever the transport is above
        # its (small) high-water mark so a stalled reader stops this stream now.
        await self.request.writer.drain()

    async def open(self) -> None:
        """Send the status and headers now (nothing else), if not sent yet."""
        if not self.response.prepared:
            tune_connection(self.request, self.ctx.connection)
            await self.response.prepare(self.request)

    async def beat(self, ping: bytes) -> None:
        """A sign of life while no event flows: the opening if still held, else ``ping``."""
        await self.send(b"" if self._opening else ping)

    async def finish(self) -> web.StreamResponse:
        await self.response.write_eof()
        return self.response

    async def fail(self, error: EdgeLLMError, event: bytes) -> web.StreamResponse:
        """The stream ended with ``error``: a plain HTTP error (in the shape of the
        request's API) if nothing was sent yet, else ``event`` and the end."""
        if not self.started:
            return error_response(error, self.request.path)
        await self.send(event)
        return await self.finish()
