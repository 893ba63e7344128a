"""Resumable streams with the real model: resume by GET and POST with Last-Event-ID,
after the end, the errors, the grace expiry freeing KV, and a TCP proxy that resets
the connection at random points many times in one answer."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from drop_proxy import DropProxy
from e2e.support import STORY, chat_body, logged_since, logged_through, wait_until
from edge_llm.client import ClientConfig, StreamClient
from edge_llm.protocol.sse import SSEEvent, SSEParser, parse_event_id

from conftest import EngineProcess, start_engine

KEY = {"Authorization": "Bearer k1"}
ANSWER_TOKENS = 300  # the drop proxy's answer
SHORT = 120  # the others'


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """Two API keys (a stream is its opener's), the deterministic kernels (a paused and
    restored stream's text is the uninterrupted one's at any length)."""
    engine = start_engine(
        tmp_path_factory.mktemp("resumable"),
        *("--api-key", "k1", "--api-key", "k2", "--no-protect-debug"),
        *("--deterministic", "--ttft-timeout-ms", "0"),
    )
    yield engine
    engine.stop()


def story(max_tokens: int = SHORT, prompt: str = STORY) -> dict[str, Any]:
    body = chat_body(prompt, max_tokens=max_tokens, ignore_eos=True)
    return {**body, "stream_options": {"resumable": True}}


@dataclass
class Received:
    """What a client made of a resumable stream: the numbers of the events it
    processed, in order, and the text."""

    stream_id: str | None = None
    numbers: list[int] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    connections: int = 0
    done: bool = False

    @property
    def last_id(self) -> str:
        return f"{self.stream_id}.{self.numbers[-1] if self.numbers else 0}"

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def take(self, event: SSEEvent) -> None:
        assert event.id is not None, event
        stream_id, n = parse_event_id(event.id) or ("", -1)
        assert stream_id == self.stream_id
        self.numbers.append(n)
        if event.data == "[DONE]":
            self.done = True
            return
        for choice in json.loads(event.data)["choices"]:
            self.pieces.append(choice["delta"].get("content") or "")


async def read_events(
    response: aiohttp.ClientResponse, received: Received, stop_after: int | None = None
) -> None:
    """Take the response's complete events; stop after ``stop_after`` (then drop)."""
    assert response.status == 200, await response.text()
    received.stream_id = response.headers["X-Stream-Id"]
    received.connections += 1
    parser = SSEParser()
    taken = 0
    async for data in response.content.iter_any():
        for event in parser.feed(data):
            received.take(event)
            taken += 1
            if received.done:
                return
            if taken == stop_after:
                return response.close()  # the connection drops


async def open_stream(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], received: Received
) -> aiohttp.ClientResponse:
    if received.stream_id is None:
        return await session.post(url + "/v1/chat/completions", json=body, headers=KEY)
    headers = {**KEY, "Last-Event-ID": received.last_id}
    return await session.get(f"{url}/v1/streams/{received.stream_id}", headers=headers)


async def uninterrupted(engine: EngineProcess, body: dict[str, Any] | None = None) -> str:
    received = Received()
    async with aiohttp.ClientSession() as session:
        async with await open_stream(session, engine.url, body or story(), received) as response:
            await read_events(response, received)
    assert received.numbers == list(range(1, len(received.numbers) + 1))
    return received.text


def new_session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))


def live(engine: EngineProcess) -> list[dict[str, Any]]:
    """Streams not ended (/debug/streams lists those that ended within a minute too)."""
    ended = ("done", "cancelled")
    return [s for s in engine.debug_streams()["streams"] if s["state"] not in ended]


def detached(engine: EngineProcess) -> list[dict[str, Any]]:
    return [s for s in engine.debug_streams()["streams"] if s["state"] == "detached"]


async def test_resume_by_get_and_by_post_continue_the_text(engine: EngineProcess) -> None:
    whole = await uninterrupted(engine)
    for resume_by_post in (False, True):
        received = Received()
        async with new_session() as session:
            async with await open_stream(session, engine.url, story(), received) as response:
                await read_events(response, received, stop_after=20)
            (stream,) = await wait_until(lambda: detached(engine), what="the stream detached")
            assert stream["pause_cause"] == "disconnected"
            async with await resume(session, engine.url, received, post=resume_by_post) as r:
                await read_events(r, received)
        assert received.done and received.numbers == list(range(1, len(received.numbers) + 1))
        assert received.text == whole


async def resume(
    session: aiohttp.ClientSession, url: str, received: Received, *, post: bool
) -> aiohttp.ClientResponse:
    """The stream resumed by GET /v1/streams/{id}, or by the same POST, with Last-Event-ID."""
    if not post:
        return await open_stream(session, url, story(), received)
    headers = {**KEY, "Last-Event-ID": received.last_id}
    return await session.post(url + "/v1/chat/completions", json=story(), headers=headers)


async def test_websocket_resume_continues_the_text(engine: EngineProcess) -> None:
    whole = await uninterrupted(engine)
    request = {k: v for k, v in story().items() if k not in ("stream", "stream_options")}
    async with new_session() as session:
        async with session.ws_connect(engine.url + "/v1/stream", headers=KEY) as ws:
            await ws.send_json({"type": "start", "request": request, "resumable": True})
            frames = [await ws.receive_json() for _ in range(15)]
        stream_id = frames[0]["stream_id"]
        await wait_until(lambda: detached(engine), what="the stream detached")
        async with session.ws_connect(engine.url + "/v1/stream", headers=KEY) as ws:
            last = frames[-1]["n"]
            await ws.send_json({"type": "resume", "stream_id": stream_id, "last_event_id": last})
            while frames[-1]["type"] not in ("done", "error"):
                frames.append(await ws.receive_json())
    assert [f["n"] for f in frames] == list(range(1, len(frames) + 1))
    assert frames[-1]["type"] == "done"
    assert "".join(f["text"] for f in frames if f["type"] == "delta") == whole


async def test_resume_after_the_end_and_the_errors(engine: EngineProcess) -> None:
    received = Received()
    async with new_session() as session:
        async with await open_stream(session, engine.url, story(max_tokens=20), received) as r:
            await read_events(r, received)
        stream_id = received.stream_id
        url = f"{engine.url}/v1/streams/{stream_id}"
        # The end was delivered, yet within the grace the events after 3 come again.
        async with session.get(url, headers={**KEY, "Last-Event-ID": f"{stream_id}.3"}) as r:
            again = Received(stream_id=stream_id, numbers=[1, 2, 3])
            await read_events(r, again)
        assert again.numbers == received.numbers and again.done

        async def error(path: str, key: str = "k1", last: str | None = None) -> tuple[int, str]:
            headers = {"Authorization": f"Bearer {key}"}
            if last:
                headers["Last-Event-ID"] = last
            async with session.get(engine.url + path, headers=headers) as got:
                return got.status, (await got.json())["error"]["code"]

        assert await error(f"/v1/streams/{'f' * 32}") == (404, "stream_not_found")
        assert await error(f"/v1/streams/{stream_id}", "k2") == (404, "stream_not_found")
        assert await error(f"/v1/streams/{stream_id}", "k3") == (401, "invalid_api_key")
        last = received.numbers[-1]
        assert await error(f"/v1/streams/{stream_id}", last=f"{stream_id}.{last + 5}") == (
            409,
            "resume_gap",
        )


async def test_not_resumed_within_the_grace_frees_its_kv(tmp_path: Any) -> None:
    engine = start_engine(tmp_path, "--resume-grace-ms", "500", "--resume-buffer-events", "4")
    try:
        received = Received()
        async with new_session() as session:
            body = story()
            async with session.post(engine.url + "/v1/chat/completions", json=body) as r:
                await read_events(r, received, stop_after=10)
            # The log holds the last 4 events: a resume from the first is a gap.
            headers = {"Last-Event-ID": f"{received.stream_id}.1"}
            await wait_until(lambda: detached(engine), what="the stream detached")
            async with session.get(
                f"{engine.url}/v1/streams/{received.stream_id}", headers=headers
            ) as gap:
                assert gap.status == 409 and (await gap.json())["error"]["code"] == "resume_gap"
        await wait_until(lambda: engine.events_of("resume_timeout"), what="resume_timeout")
        await wait_until(lambda: not live(engine), what="the stream ended")
        assert engine.debug_streams()["kv_used_bytes"] == 0
        (cancel,) = engine.events_of("cancel")
        assert cancel["reason"] == "resume_timeout"
        lines = await logged_through(engine, cancel["request_id"])
        assert any(line["event"] == "kv_freed" for line in lines)
        assert engine.metric("edge_llm_cancellations_total", reason="resume_timeout") == 1
    finally:
        engine.stop()


# -- the drop proxy -------------------------------------------------------------------------


async def test_many_forced_drops_lose_and_repeat_nothing(engine: EngineProcess) -> None:
    """Drops at random points (seeded): the concatenated text is the uninterrupted
    run's, every event number is taken once in order, the request is admitted once (its
    prompt never prefilled again) and no token is generated twice. A cut every 500 to
    1,500 bytes gives some 140 drops in 300 tokens (about 25 s here)."""
    body = story(ANSWER_TOKENS, STORY + " It ends well.")  # a prompt no other test sends
    whole = await uninterrupted(engine, body)
    prompt_before = engine.metric("edge_llm_prompt_tokens_total")
    generated_before = engine.metric("edge_llm_generated_tokens_total")
    resumes_before = engine.metric("edge_llm_stream_resumes_total")
    lines_before = len(engine.events())
    proxy = DropProxy(int(engine.url.rsplit(":", 1)[1]), seed=44, cut=(500, 1500))
    url = await proxy.start()
    received = Received()
    try:
        async with new_session() as session:
            while not received.done:
                assert received.connections < 1000, "no end after 1000 connections"
                with contextlib.suppress(aiohttp.ClientError, ConnectionError):
                    async with await open_stream(session, url, body, received) as response:
                        await read_events(response, received)
    finally:
        await proxy.close()
    assert proxy.resets >= 100, f"only {proxy.resets} drops"
    assert received.numbers == list(range(1, len(received.numbers) + 1))  # none lost or twice
    assert received.text == whole
    generated = engine.metric("edge_llm_generated_tokens_total") - generated_before
    assert generated == ANSWER_TOKENS  # no token generated twice
    resumes = engine.metric("edge_llm_stream_resumes_total") - resumes_before
    assert resumes >= 1
    prefilled = engine.metric("edge_llm_prompt_tokens_total") - prompt_before
    assert prefilled <= 1  # the prompt was cached by the uninterrupted run: read, not computed
    lines = await logged_since(engine, lines_before)
    assert [line["event"] for line in lines].count("admitted") == 1  # never sent again
    print(f"{proxy.resets} drops, {received.connections} connections, {resumes} resumes")


async def test_the_sdk_over_the_websocket_resumes_through_drops(engine: EngineProcess) -> None:
    """The client SDK's WebSocket transport through the drop proxy (a reset every 500
    to 1,500 bytes: a dozen drops in 120 tokens): the text is the uninterrupted run's,
    in one attempt, and the request was admitted once."""
    whole = await uninterrupted(engine)
    lines_before = len(engine.events())
    proxy = DropProxy(int(engine.url.rsplit(":", 1)[1]), seed=45, cut=(500, 1500))
    url = await proxy.start()
    config = ClientConfig(base_url=url + "/v1", api_key="k1", resume_attempts=10)
    try:
        async with StreamClient(config) as sdk:
            messages = story()["messages"]
            async with sdk.stream(
                messages, transport="ws", max_tokens=SHORT, temperature=0,
                extra_body={"ignore_eos": True},
            ) as stream:  # fmt: skip
                text = "".join([piece async for piece in stream])
    finally:
        await proxy.close()
    assert proxy.resets >= 5, f"only {proxy.resets} drops"
    assert text == whole and stream.result.attempts == 1
    lines = await logged_since(engine, lines_before)
    assert [line["event"] for line in lines].count("admitted") == 1
