"""Streaming over the engine's WebSocket protocol: ``GET {base}/stream`` (docs/design.md §6).

The frames are :mod:`edge_llm.protocol.ws`'s, the vocabulary the server's state
machine reads and writes.

The client sends ``start`` with the chat completion body, then ``pause`` /
``resume`` as its render queue crosses the watermarks, and ``cancel`` on a TTFT
hard timeout or when the caller abandons the stream. Heartbeat frames carry the
engine's state and prefill progress; the dead-connection deadline runs from the
start, since this endpoint always heartbeats. Each attempt uses a new socket.

With ``resume_attempts`` the stream is started resumable: the ``started`` frame names
it and every frame carries ``n``. When the socket drops before ``done`` (a read error,
the socket closed, a dead connection), a new socket sends ``resume`` with the stream id
and the last ``n`` taken (at once, then with the retry backoff, up to
``resume_attempts`` tries in a row that bring no frame); a frame at or below that
number is not taken twice. The server starts the new socket unpaused: a pause still
wanted (the render queue above its low watermark) is sent again on it. A refused
resume (``stream_not_found``, ``resume_gap``) ends the stream with that error.
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
from edge_llm.client.resuming import ResumingTransport
from edge_llm.observability.events import Event
from edge_llm.protocol.ws import Frame, control_frame, start_frame

MAX_FRAME_BYTES = 1 << 20
DROP_CLOSE_S = 1.0  # how long a dropped socket's closing handshake may take


class FramePause:
    """WebSocket flow control: PAUSE and RESUME frames, in order, at most one each.
    It keeps what the render queue wants across sockets: a resumed stream's new
    socket is told a pause still in force (:meth:`moved_to`)."""

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
            if self._paused:
                return
            self._paused = True
            await self._send(Frame.PAUSE)

    async def resume(self) -> None:
        async with self._lock:
            if not self._paused:
                return
            self._paused = False
            await self._send(Frame.RESUME)

    async def moved_to(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """The stream goes on on ``ws`` (which the server starts unpaused)."""
        async with self._lock:
            self._ws = ws
            if self._paused:
                await self._send(Frame.PAUSE)

    async def _send(self, kind: Frame) -> None:
        if self._ws.closed:
            return  # a dropped socket: a resume tells the next one what holds then
        # A send on a socket the server just closed fails; the reader reports that.
        with contextlib.suppress(aiohttp.ClientError, ConnectionError):
            await self._ws.send_json(control_frame(kind))
        sent = Event.PAUSE_SENT if kind is Frame.PAUSE else Event.RESUME_SENT
        self._attempt.log.emit(sent, queue_fill=round(self._queue.fill, 3))


class WSTransport(ResumingTransport):
    """Runs attempts over the WebSocket endpoint; one instance per stream."""

    name = "ws"

    _ws: aiohttp.ClientWebSocketResponse | None = None  # the socket read now

    async def run(self, attempt: Attempt) -> None:
        """Open a socket, start the stream and read frames until ``done``, resuming
        it on a new socket after a drop when it is resumable. Raises a
        :class:`~edge_llm.client.errors.ClientError`."""
        self._stream_id, self._last_n = None, 0
        try:
            await self._open(attempt, start_frame(self._request.body))
            attempt.log.emit(
                Event.REQUEST_SENT,
                transport=self.name,
                attempt=attempt.number,
                url=self._request.url,
            )
            attempt.watchdog.arm()
            await self._read_resuming(attempt)
        except TtftTimeoutError:
            await self._cancel(self._ws, attempt, "ttft_timeout")
            raise
        except asyncio.CancelledError:
            await self._cancel(self._ws, attempt, "client")
            raise
        except (aiohttp.ClientError, OSError) as exc:
            raise transport_error(exc, url=self._request.url) from exc
        finally:
            attempt.flow = None
            await self._drop()

    async def _open(self, attempt: Attempt, opening: dict[str, Any]) -> None:
        """A new socket that sends ``opening`` (start, or resume) first."""
        await self._drop()
        self._ws = await attempt.read(self._connect)
        if self._resume_attempts and opening.get("type") == Frame.START:
            opening = {**opening, "resumable": True}
        await self._ws.send_json(opening)
        if isinstance(attempt.flow, FramePause):
            await attempt.flow.moved_to(self._ws)
        else:
            attempt.flow = FramePause(self._ws, attempt, self._request.queue)

    async def _drop(self) -> None:
        """Let the current socket go. After a drop it may be dead without a word: its
        closing handshake is not waited for longer than ``DROP_CLOSE_S``."""
        ws, self._ws = self._ws, None
        if ws is not None:
            with contextlib.suppress(TimeoutError, aiohttp.ClientError, ConnectionError):
                await asyncio.wait_for(ws.close(), DROP_CLOSE_S)

    async def _read(self, attempt: Attempt) -> None:
        await self._read_frames(self._require_ws(), attempt)

    async def _reopen(self, attempt: Attempt) -> None:
        """A new socket that asks for the frames after the last one taken."""
        resume = {"type": Frame.RESUME.value, "stream_id": self._stream_id,
                  "last_event_id": self._last_n}  # fmt: skip
        await self._open(attempt, resume)

    def _require_ws(self) -> aiohttp.ClientWebSocketResponse:
        if self._ws is None:
            raise RuntimeError("no socket to read")
        return self._ws

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
        number = frame.get("n")
        if isinstance(number, int) and not isinstance(number, bool):
            if number <= self._last_n:
                return False  # taken before the drop: a replay never renders twice
            self._last_n = number
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
            stream_id = frame.get("stream_id")
            self._stream_id = stream_id if isinstance(stream_id, str) else None
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
