"""The client: holds the HTTP session and opens :class:`ChatStream` objects.

Usage (inside a running event loop)::

    async with StreamClient(load_client_config("client.json")) as client:
        async with client.stream([{"role": "user", "content": "Hi"}]) as stream:
            async for text in stream:
                print(text, end="", flush=True)
        print(stream.result.ttft_ms)

``transport="ws"`` uses the engine's WebSocket protocol (PAUSE/RESUME frames,
prefill progress); the default ``"sse"`` works with any OpenAI-compatible server.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Literal

import aiohttp

from edge_llm.client.attempt import Clock, HeartbeatCallback
from edge_llm.client.config import ClientConfig
from edge_llm.client.connection import open_session, request_headers
from edge_llm.client.render_queue import RenderQueue
from edge_llm.client.request_log import RequestLog
from edge_llm.client.result import StreamResult
from edge_llm.client.retry import RetryPolicy
from edge_llm.client.sse_transport import SSETransport
from edge_llm.client.stream import ChatStream, Transport
from edge_llm.client.stream_request import StreamRequest
from edge_llm.client.tracing import ClientSpan
from edge_llm.client.ws_transport import WSTransport
from edge_llm.observability.events import EventSink, null_sink

TransportName = Literal["sse", "ws"]
Message = Mapping[str, Any]


class StreamClient:
    """Streams chat completions with the configured policies.

    ``event_log`` is an event sink such as ``EventLog(path, source="client").emit``;
    ``send_pause=False`` keeps the watermarks (and their log lines) but never
    pauses the server, to reproduce a client that renders slowly without PAUSE.
    The caller must close the client (``async with`` or :meth:`aclose`).
    """

    def __init__(
        self,
        config: ClientConfig,
        *,
        event_log: EventSink | None = None,
        send_pause: bool = True,
        rng: random.Random | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.config = config
        self.send_pause = send_pause
        self._event_log = event_log
        self._policy = RetryPolicy(config.retry, rng)
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> StreamClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP session (streams still open are cut off)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def stream(
        self,
        messages: Sequence[Message],
        *,
        transport: TransportName = "sse",
        max_tokens: int | None = None,
        temperature: float | None = None,
        session_id: str | None = None,
        on_heartbeat: HeartbeatCallback | None = None,
        extra_body: Mapping[str, Any] | None = None,
        priority: int | None = None,
        progress: bool = False,
    ) -> ChatStream:
        """A stream for ``messages``; it starts on ``async with`` or first iteration.

        ``on_heartbeat`` is called with each :class:`~edge_llm.client.result.Heartbeat`:
        progress events (state, queue position, predicted wait, prefill) while no
        token flows. Over SSE they need ``progress`` (the body's ``return_progress``;
        a server that refuses the field is asked again without it); WebSocket
        heartbeats always carry them. ``priority`` is the request's class (lower runs
        first, -10..10). Must be called inside a running loop.
        """
        span = ClientSpan.start(self.config.model_id)  # None unless the application traces
        log = RequestLog(span.sink(self._event_log or null_sink) if span else self._event_log)
        body = self._body(messages, max_tokens, temperature, extra_body)
        if priority is not None:
            body["priority"] = priority
        if progress:
            body["return_progress"] = True
        headers = request_headers(
            self.config, client_request_id=log.client_request_id, session_id=session_id
        )
        if span is not None:
            headers.update(span.headers)  # traceparent: the engine's span is its child
        queue: RenderQueue[str] = RenderQueue(
            self.config.render_queue_capacity,
            high_mark=self.config.high_mark,
            low_mark=self.config.low_mark,
        )
        return ChatStream(
            config=self.config,
            transport=self._transport(transport, body, headers, queue),
            queue=queue,
            log=log,
            policy=self._policy,
            send_pause=self.send_pause,
            on_heartbeat=on_heartbeat,
            clock=self._clock,
        )

    async def complete(self, messages: Sequence[Message], **options: Any) -> StreamResult:
        """Stream ``messages`` to the end and return the result (text included).
        ``options`` are those of :meth:`stream`. Raises the stream's ClientError."""
        async with self.stream(messages, **options) as chat:
            async for _ in chat:
                pass
        return chat.result

    def _transport(
        self,
        name: TransportName,
        body: dict[str, Any],
        headers: dict[str, str],
        queue: RenderQueue[str],
    ) -> Transport:
        url = self.config.ws_url if name == "ws" else self.config.chat_url
        request = StreamRequest(self._get_session(), url, body, headers, queue)
        resumes = self.config.resume_attempts if self.config.resumable else 0
        if name == "ws":
            return WSTransport(request, resume_attempts=resumes, backoff=self._resume_backoff)
        return SSETransport(request, resume_attempts=resumes, backoff=self._resume_backoff)

    def _resume_backoff(self, tries: int) -> float:
        """Seconds before resume try ``tries``: the first at once (a drop is over when
        the new connection is up), then the retry backoff."""
        return 0.0 if tries <= 1 else self._policy.backoff_ms(tries - 1) / 1000

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = open_session(self.config)
        return self._session

    def _body(
        self,
        messages: Sequence[Message],
        max_tokens: int | None,
        temperature: float | None,
        extra_body: Mapping[str, Any] | None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "messages": [dict(m) for m in messages],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.config.resumable:
            body["stream_options"]["resumable"] = True
        if self.config.model_id is not None:  # else the server's default model answers
            body["model"] = self.config.model_id
        max_tokens = max_tokens or self.config.max_tokens
        temperature = self.config.temperature if temperature is None else temperature
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if temperature is not None:
            body["temperature"] = temperature
        body.update(extra_body or {})
        return body
