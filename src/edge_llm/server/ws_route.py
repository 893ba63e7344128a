"""``GET /v1/stream``: the WebSocket adapter around :class:`StreamProtocol`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any
from urllib.parse import urlsplit

from aiohttp import WSCloseCode, WSMsgType, web

from edge_llm.errors import EdgeLLMError, ForbiddenOrigin, InvalidRequest
from edge_llm.generation.dispatch import Answer
from edge_llm.generation.events import AnswerEvent, Ended, Produced
from edge_llm.generation.job import ChatPrompt, GenerationJob, Relay
from edge_llm.generation.resumable import Detachable, StreamGone
from edge_llm.protocol import openai
from edge_llm.protocol.stream_events import Heartbeat, PauseChanged
from edge_llm.protocol.ws import (
    CancelStream,
    Command,
    PauseStream,
    ResumeDetached,
    ResumeStream,
    StartStream,
    StreamProtocol,
)
from edge_llm.server import access_log
from edge_llm.server.context import ServerContext, context_of, dispatch
from edge_llm.server.http import presented_key, tune_connection
from edge_llm.server.openai_routes import openai_job
from edge_llm.upstream.translate import CHAT_PATH

_log = logging.getLogger("edge_llm.server")

SUBPROTOCOL = "edge-llm"
WS = "ws"


class _Connection:
    """One WebSocket: reads frames while at most one stream pumps its events."""

    def __init__(self, ctx: ServerContext, request: web.Request) -> None:
        self.ctx = ctx
        self.request = request
        server = ctx.config.server
        self.ws = web.WebSocketResponse(
            max_msg_size=server.max_ws_frame_bytes,
            writer_limit=max(1024, server.write_buffer_bytes),
            # Echoed when offered (browsers send the key beside it, see app._auth).
            protocols=(SUBPROTOCOL,),
            # Pongs must reach serve(): they are the idle watchdog's proof of life.
            autoping=False,
        )
        self.protocol = StreamProtocol()
        self.answer: Answer | None = None
        self.pump_task: asyncio.Task[None] | None = None
        # A resumable stream writing to this socket, and this socket as its sink.
        self.detachable: Detachable[str] | None = None
        self.sink: WsSink | None = None
        self.heard = asyncio.Event()  # set by every complete frame the client sends
        self.serving = True

    async def serve(self) -> web.WebSocketResponse:
        await self.ws.prepare(self.request)
        tune_connection(self.request, self.ctx.connection)
        watchdog = asyncio.create_task(self._watch_idle())
        try:
            async for message in self.ws:
                self.heard.set()
                if message.type is WSMsgType.TEXT:
                    await self._on_text(message.data)
                elif message.type is WSMsgType.BINARY:
                    self.protocol.on_rejected("invalid_frame", "binary frames are not supported")
                    await self._flush()
                elif message.type is WSMsgType.PING:
                    await self.ws.pong(message.data)
        finally:
            # Python 3.11's wait_for can swallow a cancel that races a frame just
            # heard: the flag ends the watchdog's loop whatever the race.
            self.serving = False
            watchdog.cancel()
            self._abandon()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog
        return self.ws

    async def _watch_idle(self) -> None:
        """Close a socket whose client stopped mid-frame or vanished between streams.

        aiohttp waits for a frame's last byte without limit, so half a frame would
        hold the socket forever. After ``body_timeout_ms`` without a complete frame
        and with no stream running, the server pings; a live client's pong (any
        frame) keeps the socket, silence for as long again closes it. While a
        stream runs, a silent reader is the pump's business: its stream pauses and
        times out by ``max_pause_ms``, as on any socket.
        """
        patience = self.ctx.config.server.body_timeout_ms / 1000
        while self.serving:
            heard = await self._heard_within(patience)
            if heard or not self.serving or self.answer is not None:
                continue
            self.heard.clear()
            with contextlib.suppress(ConnectionError, TimeoutError):
                await asyncio.wait_for(self.ws.ping(), patience)
            if not await self._heard_within(patience, clear=False):
                await self._close_silent(patience)
                return

    async def _heard_within(self, seconds: float, *, clear: bool = True) -> bool:
        if clear:
            self.heard.clear()
        try:
            await asyncio.wait_for(self.heard.wait(), seconds)
        except TimeoutError:
            return False
        return True

    async def _close_silent(self, patience: float) -> None:
        reason = f"no complete frame within {patience * 1000:.0f} ms".encode()
        with contextlib.suppress(ConnectionError, TimeoutError):
            # A client that does not read cannot take the close frame either:
            # the time-out makes aiohttp drop the transport.
            await asyncio.wait_for(
                self.ws.close(code=WSCloseCode.POLICY_VIOLATION, message=reason), patience
            )

    async def _on_text(self, text: str) -> None:
        for command in self.protocol.receive(text):
            await self._execute(command)
        await self._flush()

    async def _execute(self, command: Command) -> None:
        if isinstance(command, StartStream):
            await self._start(command.request, command.resumable)
        elif isinstance(command, ResumeDetached):
            await self._take_up(command.stream_id, command.after)
        elif self.answer is None:
            return
        elif isinstance(command, PauseStream | ResumeStream):
            self._client_pause(isinstance(command, PauseStream))
        elif isinstance(command, CancelStream):
            self.answer.cancel("client")

    async def _start(self, body: dict[str, Any], resumable: bool) -> None:
        try:  # with OpenTelemetry on, the stream's span starts now (not at the upgrade)
            answer, _ = await dispatch(self.request, self._job(body), start_ns=time.time_ns())
        except EdgeLLMError as exc:
            self.protocol.on_rejected(exc.code, exc.message, **_details(exc))
            access_log.refused(self.request, exc)
            return
        self.answer = answer
        if resumable and self.ctx.resumable.enabled:
            return await self._start_resumable(answer)
        self.protocol.on_started(answer.id)
        self.pump_task = asyncio.create_task(self._pump(answer))

    async def _start_resumable(self, answer: Answer) -> None:
        """The stream's frames come from an encoder of its own, numbered, through the
        stream (``generation/resumable.py``): it outlives this socket."""
        book = self.ctx.resumable
        stream = book.open(answer, presented_key(self.request), book.new_text_log(), WS)
        encoder = StreamProtocol()
        encoder.on_started(answer.id, stream.id)
        self.detachable = stream
        self.sink = WsSink(self)
        await stream.attach(self.sink, 0, resume=False)
        stream.start(self._produce(answer, stream, encoder))

    async def _produce(
        self, answer: Answer, stream: Detachable[str], encoder: StreamProtocol
    ) -> None:
        await _send_numbered(stream, encoder)
        with access_log.answering(self.request, answer):
            try:
                async for event in answer.events(openai.new_call_id):
                    _report(encoder, answer, event)
                    await _send_numbered(stream, encoder)
            except StreamGone:
                raise
            except Exception:
                # The stream logs it; a socket, resumed or not, must not wait in silence.
                _report_crash(encoder)
                with contextlib.suppress(StreamGone):  # no one to tell: still logged
                    await _send_numbered(stream, encoder)
                raise

    def _client_pause(self, paused: bool) -> None:
        """The client's ``pause`` (True) or ``resume``; a resumable stream remembers it."""
        if self.answer is None:
            return
        if paused:
            self.answer.pause()
        else:
            self.answer.resume()
        if self.detachable is not None:
            self.detachable.client_paused = paused

    async def _take_up(self, stream_id: str, after: int) -> None:
        """``resume`` with a stream id: the frames after ``after``, then the stream live.
        The new socket starts unpaused (as its protocol does): a pause the client asked
        for on the old socket is lifted, since its ``resume`` may have been lost with it."""
        try:
            stream = self.ctx.resumable.find(stream_id, presented_key(self.request), WS)
            self.protocol.on_taken_up(stream.answer.id)
            self.answer, self.detachable, self.sink = stream.answer, stream, WsSink(self)
            await stream.attach(self.sink, after, end_in_band=True)
        except EdgeLLMError as exc:
            self.clear_stream()
            self.protocol.on_rejected(exc.code, exc.message, **_details(exc))
        except ConnectionError:
            self.clear_stream()  # this socket closed while the frames were replayed
        else:
            if stream.client_paused:
                self._client_pause(False)

    def stream_ended(self) -> None:
        """The resumable stream writing here sent its last frame."""
        self.clear_stream()
        self.protocol.on_ended_elsewhere()

    def clear_stream(self) -> None:
        self.answer, self.detachable, self.sink = None, None, None

    def _job(self, body: dict[str, Any]) -> GenerationJob:
        req = openai.parse_request(openai.ChatCompletionRequest, body)
        _no_tools(req)
        if req.logprobs:
            raise InvalidRequest(
                "logprobs are not sent on the WebSocket stream (use SSE)", param="logprobs"
            )
        return openai_job(
            self.request,
            req,
            Relay(CHAT_PATH, body),
            lambda: ChatPrompt(req.chat_messages()),
            progress=req.include_progress,
            streamed=True,
        )

    async def _pump(self, answer: Answer) -> None:
        with answer, access_log.answering(self.request, answer):
            try:
                async for event in answer.events(openai.new_call_id):
                    if _report(self.protocol, answer, event):
                        self.answer = None
                    await self._flush()
            except Exception:
                _log.exception("the WebSocket stream of %s failed", answer.id)
                _report_crash(self.protocol)
                self.answer = None
                await self._flush()

    async def _flush(self) -> None:
        for frame in self.protocol.frames_to_send():
            if self.ws.closed:
                return
            await self.ws.send_json(frame)

    def _abandon(self) -> None:
        """The socket closed: cancel the stream (reason: disconnect), or detach a
        resumable one."""
        if self.detachable is not None and self.sink is not None:
            self.detachable.lost(self.sink)
            return
        if self.answer is not None:
            self.answer.close()
        if self.pump_task is not None:
            self.pump_task.cancel()


class WsSink:
    """A WebSocket a resumable stream writes its numbered frames to."""

    def __init__(self, connection: _Connection) -> None:
        self.connection = connection

    async def write(self, frames: list[str]) -> None:
        ws = self.connection.ws
        for frame in frames:
            if ws.closed:
                raise ConnectionResetError("the WebSocket is closed")
            await ws.send_str(frame)

    async def open(self) -> None:
        """Nothing to start: the socket is open."""

    async def end(self) -> None:
        if self.connection.sink is self:
            self.connection.stream_ended()

    def gone(self) -> None:
        if self.connection.sink is self:
            self.connection.clear_stream()

    def abort(self) -> None:
        if (transport := self.connection.request.transport) is not None:
            transport.abort()

    def refuse(self, error: EdgeLLMError) -> bool:
        return False  # the error goes as the stream's own frame


async def _send_numbered(stream: Detachable[str], encoder: StreamProtocol) -> None:
    """The encoder's frames, each with its number ``n``, through the stream."""
    first = stream.log.last_n + 1
    frames = [{**frame, "n": first + i} for i, frame in enumerate(encoder.frames_to_send())]
    if frames:
        await stream.send([json.dumps(frame, ensure_ascii=False) for frame in frames])


def _report(protocol: StreamProtocol, answer: Answer, event: AnswerEvent) -> bool:
    """``event`` as ``protocol``'s frames; True when it ends the stream."""
    if isinstance(event, Produced):
        if event.text:  # text only: the request offered no tools
            protocol.on_delta(event.text, event.n_tokens, event.seq)
    elif isinstance(event, Heartbeat):
        protocol.on_heartbeat(event)
    elif isinstance(event, PauseChanged):
        if event.cause is None:
            protocol.on_resumed()
        else:
            protocol.on_paused(event.cause)
    elif isinstance(event, Ended):
        protocol.on_done(event.finish_reason, answer.usage(), answer.stats())
        return True
    else:
        error = event.error
        protocol.on_failed(error.code, error.message, **_details(error))
        return True
    return False


def _report_crash(protocol: StreamProtocol) -> None:
    """A bug ended the stream inside the server: its client gets the error frame that
    ends it (without it the socket, which stays open, would never say so)."""
    error = EdgeLLMError("the stream failed inside the server (its log says why)")
    protocol.on_failed(error.code, error.message)


def _details(error: EdgeLLMError) -> dict[str, Any]:
    details = {k: v for k, v in error.extra.items() if k not in ("code", "message", "type")}
    if error.param:
        details["param"] = error.param
    return details


def _check_origin(request: web.Request, ctx: ServerContext) -> None:
    """CORS does not cover WebSockets: a page of another site could drive the
    engine through the user's browser. Only this server's own page (the
    playground) and the configured ``cors_allow_origin`` may; clients that are
    not browsers send no Origin."""
    origin = request.headers.get("Origin")
    allowed = ctx.config.server.cors_allow_origin
    if origin is None or origin in allowed or "*" in allowed:
        return
    if urlsplit(origin).netloc != request.host:
        raise ForbiddenOrigin(f"WebSocket from origin {origin!r} is not allowed")


async def stream_socket(request: web.Request) -> web.WebSocketResponse:
    ctx = context_of(request)
    _check_origin(request, ctx)
    ctx.priorities.resolve(request, None)  # a bad X-Priority is a 400 before the upgrade
    connection = _Connection(ctx, request)
    try:
        with contextlib.suppress(ConnectionResetError):
            return await connection.serve()
    except Exception:
        if not connection.ws.prepared:
            raise  # before the upgrade an HTTP error answer is still possible
        # After it, an HTTP 500 would be written onto the WebSocket's byte stream.
        _log.exception("unexpected error on the WebSocket of %s", request.remote)
        await connection.ws.close(code=WSCloseCode.INTERNAL_ERROR, message=b"internal error")
    return connection.ws


def _no_tools(req: openai.ChatCompletionRequest) -> None:
    """Frames carry text only: a request that could answer with a call is refused."""
    setup = req.tool_setup()
    if setup is not None and setup.active:
        raise InvalidRequest(
            "tools are not supported over /v1/stream (its deltas are text): "
            "use POST /v1/chat/completions or /v1/responses",
            param="tools",
        )
