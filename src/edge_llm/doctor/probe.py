"""HTTP probes of an OpenAI-compatible server, every read bounded.

:class:`StreamTally` is sans I/O: it counts what a stream's events contain
(content chunks, ``[DONE]``, non-JSON ``data:`` lines, chunks without
``choices``, in-stream errors). :func:`get` and :func:`probe_stream` do the I/O
with a caller's :class:`aiohttp.ClientSession`; they raise aiohttp's errors,
``OSError`` and ``TimeoutError`` for the caller to describe.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from edge_llm.client.errors import MalformedChunkError, ServerStreamError
from edge_llm.client.sse import parse_chunk
from edge_llm.protocol.sse import DONE_SENTINEL, EventTooLarge, SSEEvent, SSEParser

MAX_BODY_BYTES = 64 * 1024
MAX_STREAM_BYTES = 1024 * 1024
MAX_SAMPLES = 3
SAMPLE_CHARS = 80


@dataclass(frozen=True)
class Reply:
    status: int
    content_type: str
    body: bytes  # at most MAX_BODY_BYTES

    def json(self) -> Any:
        """The decoded body, or None when it is not JSON."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    def error_message(self) -> str:
        """The server's error message, or the start of the body."""
        data = self.json()
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        text = self.body[:SAMPLE_CHARS].decode("utf-8", "replace").strip()
        return text or "(empty body)"

    def error_code(self) -> str | None:
        data = self.json()
        error = data.get("error") if isinstance(data, dict) else None
        code = error.get("code") if isinstance(error, dict) else None
        return str(code) if code is not None else None


@dataclass
class StreamTally:
    """What the events of one stream contained."""

    started: float
    n_events: int = 0
    n_content: int = 0
    done: bool = False
    n_non_json: int = 0
    n_no_choices_key: int = 0
    n_empty_choices: int = 0
    samples: list[str] = field(default_factory=list)  # non-JSON data, at most MAX_SAMPLES
    error: str | None = None
    first_content_at: float | None = None
    prompt_tokens: int | None = None  # from a usage chunk, when the server sends one
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens

    def add(self, event: SSEEvent, now: float) -> None:
        self.n_events += 1
        if event.data.strip() == DONE_SENTINEL:
            self.done = True
            return
        try:
            chunk = parse_chunk(event)
        except MalformedChunkError:
            self.n_non_json += 1
            if len(self.samples) < MAX_SAMPLES:
                self.samples.append(event.data[:SAMPLE_CHARS])
            return
        except ServerStreamError as exc:
            self.error = self.error or exc.message
            return
        if chunk is None:
            return
        if chunk.usage is not None:
            self._read_usage(chunk.usage)
        self._count_choices(chunk.raw)
        if chunk.content:
            self.n_content += 1
            if self.first_content_at is None:
                self.first_content_at = now

    def _read_usage(self, usage: dict[str, Any]) -> None:
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        prompt = usage.get("prompt_tokens")
        self.prompt_tokens = prompt if isinstance(prompt, int) else self.prompt_tokens
        self.cached_tokens = cached if isinstance(cached, int) else self.cached_tokens

    def _count_choices(self, raw: dict[str, Any]) -> None:
        if "choices" not in raw:
            self.n_no_choices_key += 1
        elif not isinstance(raw["choices"], list) or not raw["choices"]:
            self.n_empty_choices += 1

    @property
    def ttft_ms(self) -> float | None:
        if self.first_content_at is None:
            return None
        return (self.first_content_at - self.started) * 1000.0


@dataclass(frozen=True)
class StreamProbe:
    reply: Reply  # status, content type and (for errors or non-SSE bodies) the body's start
    tally: StreamTally
    truncated: bool  # stopped at MAX_STREAM_BYTES

    @property
    def is_event_stream(self) -> bool:
        return self.reply.content_type.split(";")[0].strip().lower() == "text/event-stream"


def auth_headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


async def get(session: aiohttp.ClientSession, url: str, key: str) -> Reply:
    async with session.get(url, headers=auth_headers(key)) as response:
        body = await _read_bounded(response, MAX_BODY_BYTES)
        return Reply(response.status, response.headers.get("Content-Type", ""), body)


async def probe_stream(
    session: aiohttp.ClientSession,
    url: str,
    key: str,
    body: dict[str, Any],
) -> StreamProbe:
    """POST ``body`` and read the answer as SSE (whatever its Content-Type)."""
    tally = StreamTally(started=time.perf_counter())
    async with session.post(url, json=body, headers=auth_headers(key)) as response:
        content_type = response.headers.get("Content-Type", "")
        if response.status != 200:
            head = await _read_bounded(response, MAX_BODY_BYTES)
            return StreamProbe(Reply(response.status, content_type, head), tally, False)
        head, truncated = await _read_events(response, tally)
        return StreamProbe(Reply(response.status, content_type, head), tally, truncated)


async def _read_events(response: aiohttp.ClientResponse, tally: StreamTally) -> tuple[bytes, bool]:
    parser = SSEParser(max_line_bytes=MAX_BODY_BYTES, max_event_bytes=4 * MAX_BODY_BYTES)
    head = bytearray()
    total = 0
    try:
        async for data in response.content.iter_any():
            total += len(data)
            head += data[: max(0, MAX_BODY_BYTES - len(head))]
            _feed(tally, parser.feed(data))
            if total >= MAX_STREAM_BYTES or tally.done:
                return bytes(head), not tally.done
        _feed(tally, parser.close())
    except EventTooLarge as exc:
        tally.error = tally.error or str(exc)
    return bytes(head), False


def _feed(tally: StreamTally, events: list[SSEEvent]) -> None:
    now = time.perf_counter()
    for event in events:
        tally.add(event, now)


async def _read_bounded(response: aiohttp.ClientResponse, limit: int) -> bytes:
    body = bytearray()
    async for data in response.content.iter_chunked(16 * 1024):
        body += data[: limit - len(body)]
        if len(body) >= limit:
            break
    return bytes(body)
