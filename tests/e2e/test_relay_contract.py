"""The contract on the relay path and for resumable streams before their first token
(issue 59, item 4), with real servers: a front ``edge-llm serve`` relaying
``up-model`` to a second one on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest

from conftest import EngineProcess, start_engine
from helpers import next_frame
from support import STORY, chat_body, wait_until

pytestmark = pytest.mark.e2e

UP_MODEL = "up-model"
FRONT_TTFT_MS = 4000


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """One slot, so that a paused stream keeps every other request queued; it waits
    two minutes for a first token (the front's time-out is the one under test)."""
    engine = start_engine(
        tmp_path_factory.mktemp("up"), "--model-id", UP_MODEL, "--max-sequences", "1",
        "--ttft-timeout-ms", "120000", "--max-pause-ms", "600000",
    )  # fmt: skip
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def front(
    tmp_path_factory: pytest.TempPathFactory, upstream: EngineProcess
) -> Iterator[EngineProcess]:
    engine = start_engine(
        tmp_path_factory.mktemp("front"), "--upstream", f"up={upstream.url}",
        "--max-sequences", "1", "--ttft-timeout-ms", str(FRONT_TTFT_MS),
        "--max-pause-ms", "600000",
    )  # fmt: skip
    yield engine
    engine.stop()


@asynccontextmanager
async def slot_held(engine: EngineProcess) -> AsyncIterator[None]:
    """``engine``'s only slot held by a WebSocket stream its client paused (a paused
    stream keeps its slot); the stream is cancelled on leaving."""
    url = engine.base_url.replace("http", "ws") + "/stream"
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        await ws.send_json({"type": "start", "request": chat_body(STORY, max_tokens=400)})
        await next_frame(ws, "delta")
        await ws.send_json({"type": "pause"})
        await next_frame(ws, "paused")
        try:
            yield
        finally:
            await ws.send_json({"type": "cancel"})
            await next_frame(ws, "error", "done")


async def dropped_before_its_first_token(
    front: EngineProcess, body: dict[str, Any]
) -> tuple[str, str]:
    """A resumable stream whose connection is closed once its headers came (it is
    queued: no token yet); returns its stream and request ids once the front logged
    it detached."""
    async with aiohttp.ClientSession() as session:
        response = await session.post(front.base_url + "/chat/completions", json=body)
        assert response.status == 200, await response.text()
        stream_id, request_id = response.headers["X-Stream-Id"], response.headers["X-Request-Id"]
        response.close()
    await wait_until(lambda: front.events_of("detached", request_id), what="the detach")
    return stream_id, request_id


async def resumed_text(front: EngineProcess, stream_id: str) -> str:
    """The stream read from its first event (GET /v1/streams/{id}) to [DONE]."""
    text = ""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{front.base_url}/streams/{stream_id}") as response,
    ):
        assert response.status == 200, await response.text()
        async for raw in response.content:
            line = raw.decode().strip()
            if line == "data: [DONE]":
                return text
            if line.startswith("data: "):
                data = json.loads(line.removeprefix("data: "))
                assert "error" not in data, data
                if data.get("choices"):
                    text += data["choices"][0]["delta"].get("content") or ""
    raise AssertionError(f"the resumed stream ended without [DONE] after {text!r}")


@pytest.mark.parametrize("where", ["local", "relayed"])
async def test_a_stream_detached_before_its_first_token_keeps_its_resume_grace(
    front: EngineProcess, upstream: EngineProcess, where: str
) -> None:
    """Detached while queued (the slot that would serve it held by a paused stream),
    it waits past the front's TTFT time-out and is then resumed: its client held it
    back, so that time is not the server's. Before the fix the TTFT clock ran on
    while it was detached: it ended ``ttft_timeout`` 4 s in, inside its 30 s grace,
    and the resume got that error instead of the answer."""
    holder = front if where == "local" else upstream
    body = chat_body(f"[{uuid.uuid4().hex[:8]}] Name three rivers.", max_tokens=8,
                     stream_options={"resumable": True})  # fmt: skip
    if where == "relayed":
        body["model"] = UP_MODEL
    async with slot_held(holder):
        stream_id, request_id = await dropped_before_its_first_token(front, body)
        # The condition under test is time passing: past the TTFT time-out, detached.
        await asyncio.sleep(FRONT_TTFT_MS / 1000 + 1.0)
        assert not front.events_of("end", request_id), front.events_of("end", request_id)
        reading = asyncio.create_task(resumed_text(front, stream_id))
        await wait_until(lambda: front.events_of("resumed", request_id), what="the resume")
    assert await reading  # the holder gave its slot back: the stream answered


@pytest.fixture(scope="module")
def narrow_front(
    tmp_path_factory: pytest.TempPathFactory, upstream: EngineProcess
) -> Iterator[EngineProcess]:
    """A front that may keep two streams open to the upstream at once."""
    tmp = tmp_path_factory.mktemp("narrow")
    config = tmp / "front.toml"
    config.write_text(
        f'[upstream.up]\nurl = "{upstream.url}"\nmax_concurrency = 2\n', encoding="utf-8"
    )
    engine = start_engine(tmp, "--config", str(config), "--max-pause-ms", "600000")
    yield engine
    engine.stop()


async def relayed_status(front: EngineProcess, body: dict[str, Any]) -> tuple[int, str]:
    """The status of a streamed chat through ``front`` and its text or error code."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(front.base_url + "/chat/completions", json=body) as response,
    ):
        if response.status != 200:
            return response.status, (await response.json())["error"]["code"]
        return 200, (await response.read()).decode()


async def test_identical_requests_arriving_together_keep_the_upstreams_max_concurrency(
    narrow_front: EngineProcess, upstream: EngineProcess
) -> None:
    """Four identical requests at once to an upstream with ``max_concurrency = 2``
    (its one slot held, so that none ends early): two are relayed, two get 503
    ``upstream_unavailable`` at once. Before the fix the room was read when a request
    was routed and counted only when its connection was opened, after an await:
    requests arriving together all saw room, and all four were sent."""
    body = chat_body(f"[{uuid.uuid4().hex[:8]}] Name three rivers.", max_tokens=4)
    body["model"] = UP_MODEL
    async with slot_held(upstream):
        before = len(upstream.events_of("admitted"))
        sent = [asyncio.create_task(relayed_status(narrow_front, body)) for _ in range(4)]

        def settled() -> bool:  # each refused at the front or queued at the upstream
            queued = len(upstream.events_of("admitted")) - before
            return queued + sum(task.done() for task in sent) >= 4

        await wait_until(settled, what="four requests refused or queued")
        assert len(upstream.events_of("admitted")) - before == 2
    results = sorted(await asyncio.gather(*sent))
    assert [status for status, _ in results] == [200, 200, 503, 503], results
    assert [text for _, text in results[2:]] == ["upstream_unavailable"] * 2
    assert all("[DONE]" in text for _, text in results[:2]), results
