"""Streaming over the engine's WebSocket protocol: ``GET {base}/stream`` (docs/design.md §6).

The frames are :mod:`edge_llm.protocol.ws`'s, the vocabulary the server's state
machine reads and writes.

The client sends ``start`` with the chat completion body, then ``pause`` /
``resume`` as its render queue crosses the watermarks, and ``cancel`` on a TTFT
hard timeout or when the caller abandons the stream. Heartbeat frames carry the
engine's state and prefill progress; the dead-connection deadline runs from the
start, since this endpoint always heartbeats. Each attempt uses a new socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import aiohttp

from edge_llm.client.attempt import Attempt
from edge_llm.client.connection import transport_error
from edge_llm.client.errors import (
    MalformedChunkError,
    ReadError,
    ServerStreamError,
    TtftTimeoutError,
)
from edge_llm.client.render_queue import RenderQueue
from edge_llm.client.result import Heartbeat
from edge_llm.client.stream_request import StreamRequest
from edge_llm.observability.events import Event
from edge_llm.protocol.ws import Frame, control_frame, start_frame

MAX_FRAME_BYTES = 1 << 20


class FramePause:
    """WebSocket flow control: PAUSE and RESUME frames, in order, at most one each."""

    def __init__(
        self, ws: aiohttp.ClientWebSocketResponse, attempt: Attempt, queue: RenderQueue[str]
    ) -> None:
        self._ws = ws
        self._attempt = attempt
        self._queue = queue
        self._lock = asyncio.Lock()
        self._paused = False

    async def pause(self) -> None:
        async with self._lock:
            if self._paused or self._ws.closed:
                return
            self._paused = True
            await self._send(control_frame(Frame.PAUSE))
            self._attempt.log.emit(Event.PAUSE_SENT, queue_fill=round(self._queue.fill, 3))

    async def resume(self) -> None:
        async with self._lock:
            if not self._paused or self._ws.closed:
                return
            self._paused = False
            await self._send(control_frame(Frame.RESUME))
            self._attempt.log.emit(Event.RESUME_SENT, queue_fill=round(self._queue.fill, 3))

    async def _send(self, frame: dict[str, str]) -> None:
        # A send on a socket the server just closed fails; the reader reports that.
        with contextlib.suppress(aiohttp.ClientError, ConnectionError):
            await self._ws.send_json(frame)


class WSTransport:
    """Runs attempts over the WebSocket endpoint; one instance per stream."""

    name = "ws"

    def __init__(self, request: StreamRequest) -> None:
        self._request = request

    async def run(self, attempt: Attempt) -> None:
        """Open a socket, start the stream and read frames until ``done``.
        Raises a :class:`~edge_llm.client.errors.ClientError`."""
        ws = None
        try:
            ws = await attempt.read(self._connect)
            await ws.send_json(start_frame(self._request.body))
            attempt.log.emit(
                Event.REQUEST_SENT,
                transport=self.name,
                attempt=attempt.number,
                url=self._request.url,
            )
            attempt.watchdog.arm()
            attempt.flow = FramePause(ws, attempt, self._request.queue)
            await self._read_frames(ws, attempt)
        except TtftTimeoutError:
            await self._cancel(ws, attempt, "ttft_timeout")
            raise
        except asyncio.CancelledError:
            await self._cancel(ws, attempt, "client")
            raise
        except (aiohttp.ClientError, OSError) as exc:
            raise transport_error(exc, url=self._request.url) from exc
        finally:
            attempt.flow = None
            if ws is not None:
                await ws.close()

    async def _connect(self) -> aiohttp.ClientWebSocketResponse:
        return await self._request.session.ws_connect(
            self._request.url,
            headers=self._request.headers,
            autoping=True,
            max_msg_size=MAX_FRAME_BYTES,
        )

    async def _cancel(
        self, ws: aiohttp.ClientWebSocketResponse | None, attempt: Attempt, reason: str
    ) -> None:
        if ws is None or ws.closed:
            attempt.cancelled(reason, method="close")
            return
        with contextlib.suppress(aiohttp.ClientError, ConnectionError):
            await ws.send_json(control_frame(Frame.CANCEL))
        attempt.cancelled(reason, method="frame")

    async def _read_frames(self, ws: aiohttp.ClientWebSocketResponse, attempt: Attempt) -> None:
        while True:
            message = await attempt.read(ws.receive)
            if message.type is not aiohttp.WSMsgType.TEXT:
                if message.type is aiohttp.WSMsgType.BINARY:
                    raise MalformedChunkError("unexpected binary WebSocket frame")
                raise ReadError(
                    f"the server closed the WebSocket before done ({message.type.name})"
                )
            attempt.on_bytes()
            if await self._on_frame(_decode_frame(message.data), attempt):
                return

    async def _on_frame(self, frame: dict[str, Any], attempt: Attempt) -> bool:
        """Handle one server frame; True when the stream is done."""
        kind = frame.get("type")
        if kind == Frame.DELTA:
            attempt.set_request_id(frame.get("id"))
            n_tokens = frame.get("n_tokens")
            await attempt.on_content(str(frame.get("text") or ""), _int(n_tokens))
        elif kind == Frame.HEARTBEAT:
            attempt.on_heartbeat(Heartbeat.of(frame))
        elif kind == Frame.STARTED:
            attempt.on_data()
            attempt.set_request_id(frame.get("id"))
        elif kind == Frame.PAUSED:
            cause = str(frame.get("cause") or "unknown")
            attempt.on_server_paused(cause)
            if cause == "preempted":
                attempt.on_heartbeat(Heartbeat(state=cause))
        elif kind == Frame.DONE:
            _finish(frame, attempt)
            return True
        elif kind == Frame.ERROR:
            raise ServerStreamError.from_payload(frame)
        return False


def _decode_frame(data: str) -> dict[str, Any]:
    try:
        frame = json.loads(data)
    except json.JSONDecodeError as exc:
        raise MalformedChunkError(f"WebSocket frame is not JSON: {data[:80]!r}") from exc
    if not isinstance(frame, dict):
        raise MalformedChunkError(f"WebSocket frame is not a JSON object: {data[:80]!r}")
    return frame


def _finish(frame: dict[str, Any], attempt: Attempt) -> None:
    attempt.set_request_id(frame.get("id"))
    reason = frame.get("finish_reason")
    attempt.on_finish(reason if isinstance(reason, str) else None)
    usage = frame.get("usage")
    attempt.on_usage(usage if isinstance(usage, dict) else None)
    stats = frame.get("stats")
    attempt.server_stats = stats if isinstance(stats, dict) else None


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
