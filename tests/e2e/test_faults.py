"""Faults against the real engine: a reader that is frozen (SIGSTOP), and the
engine killed with SIGKILL and started again on the same port."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import textwrap
import urllib.request
from typing import Any

import pytest

from edge_llm.client import ClientConfig, ConnectError, RetryConfig, StreamClient

from helpers import free_port
from support import STORY, chat_body, served_model, wait_until

pytestmark = pytest.mark.e2e

QUESTION = [{"role": "user", "content": "Name the capital of France."}]

# A reader in its own process: a small receive buffer, reads until the first
# token, prints the request id, then keeps reading until the test freezes it.
READER = textwrap.dedent(
    """
    import json, socket, sys
    host, port, body = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.connect((host, port))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\\r\\nHost: x\\r\\nContent-Type: application/json\\r\\n"
        + b"Content-Length: %d\\r\\n\\r\\n" % len(body) + body
    )
    seen = b""
    while b"data: {" not in seen:
        seen += sock.recv(4096)
    for line in seen.split(b"\\r\\n"):
        if line.lower().startswith(b"x-request-id:"):
            print(line.split(b":", 1)[1].strip().decode(), flush=True)
    while sock.recv(4096):
        pass
    """
)


def start_reader(host: str, port: str, body: dict[str, Any]) -> subprocess.Popen[str]:
    command = [sys.executable, "-c", READER, host, port, json.dumps(body)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


def post_json(url: str) -> dict[str, Any]:
    body = json.dumps(chat_body("Hi", max_tokens=4, stream=False)).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=240) as response:
        result: dict[str, Any] = json.loads(response.read())
        return result


async def test_a_frozen_reader_is_paused_then_timed_out_and_its_kv_freed(engine_factory) -> None:
    """SIGSTOP a process that reads a stream: its sequence is paused
    (socket_full), cancelled after max_pause_ms (pause_timeout) and its KV freed,
    while another stream is served normally."""
    engine = engine_factory(
        "--max-pause-ms", "3000", "--outbound-buffer-tokens", "4", "--write-buffer-bytes", "1024"
    )
    host, port = engine.url.removeprefix("http://").split(":")
    reader = start_reader(host, port, chat_body(STORY, max_tokens=1000))
    try:
        assert reader.stdout is not None
        stream_id = (await asyncio.to_thread(reader.stdout.readline)).strip()
        assert stream_id
        reader.send_signal(signal.SIGSTOP)

        def stream() -> dict[str, Any]:
            return engine.stream(stream_id)

        paused = await wait_until(
            lambda: stream()["pause_cause"] == "socket_full" and stream(),
            timeout=240,
            what="paused by a full socket",
        )
        assert paused["state"] == "paused"
        other = await asyncio.to_thread(post_json, engine.base_url + "/chat/completions")
        assert other["choices"][0]["message"]["content"]  # others are served meanwhile
        ended = await wait_until(
            lambda: stream()["state"] == "cancelled" and stream(),
            timeout=120,
            what="cancelled after max_pause_ms",
        )
        assert ended["cancel_reason"] == "pause_timeout"
        assert ended["n_generated"] < 1000
        await wait_until(lambda: engine.debug_streams()["kv_used_bytes"] == 0, what="KV freed")
    finally:
        reader.kill()
        reader.wait()
        if reader.stdout is not None:
            reader.stdout.close()
    assert engine.metric("edge_llm_cancellations_total", reason="pause_timeout") == 1


async def test_engine_killed_and_restarted_on_the_same_port(engine_factory) -> None:
    """SIGKILL the engine: the SDK's retry policy ends in a clean ConnectError;
    once an engine listens on the same port again, the same client succeeds."""
    port = str(free_port())
    engine = engine_factory("--port", port)
    retry = RetryConfig(max_attempts=3, backoff_ms=50, retry_on=["connect_error"])
    config = ClientConfig(
        base_url=engine.base_url,
        api_key="",
        model_id=served_model(engine),
        retry=retry,
        ttft_warn_ms=120_000,  # a loaded machine must not turn into a TTFT error
        ttft_hard_timeout_ms=240_000,
    )
    async with StreamClient(config) as client:
        first = await client.complete(QUESTION, max_tokens=4, temperature=0)
        assert first.n_tokens > 0
        engine.proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(engine.proc.wait, 60)
        with pytest.raises(ConnectError):
            await client.complete(QUESTION, max_tokens=4, temperature=0)
        again = await asyncio.to_thread(engine_factory, "--port", port)
        assert again.url == engine.url
        second = await client.complete(QUESTION, max_tokens=4, temperature=0)
        assert second.text == first.text
