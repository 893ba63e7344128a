"""Helpers for end-to-end tests against a real engine process."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable
from typing import Any

import aiohttp

POLL_S = 0.02

# A prose prompt with near-ties between next tokens (top two log-probabilities 0.001
# apart, measured): a stream computed any other way (another batch shape, cells placed
# elsewhere, a wrong restore) takes another turn within a few hundred tokens. Tests that
# compare a paused, restored, cached or batched stream's text with a lone uninterrupted
# run use it (engine/kv_slots.py says why the texts are equal).
STORY = "Write a very long story about a dragon and a knight."


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


async def complete(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """The non-streamed chat completion of ``body`` from the engine at ``url`` (its
    root); fails unless the answer is a 200."""
    async with aiohttp.ClientSession() as session:
        async with session.post(
            url + "/v1/chat/completions", json={**body, "stream": False}
        ) as response:
            assert response.status == 200, await response.text()
            result: dict[str, Any] = await response.json()
            return result


def text_of(result: dict[str, Any]) -> str:
    """The message text of a non-streamed chat completion."""
    return str(result["choices"][0]["message"]["content"])


def cached(result: dict[str, Any]) -> int:
    """Prompt tokens a chat completion reports as read from the cache."""
    return int(result["usage"]["prompt_tokens_details"]["cached_tokens"])


class RawSseClient:
    """An SSE request over a plain socket with a small receive buffer, so that
    not reading really fills the TCP buffers (see NOTES.md)."""

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
