"""Offload of paused streams with the real model, in the default configuration (four
slots): their KV goes to host memory so that waiting requests run, and they come back
token-exact; the host bound is enforced.

Every slot is held by a paused stream before a request waits, and a waiting request
that got its slot is paused in turn, so each waiting request can only run once a
paused stream was offloaded for it (never in a slot another one left): the order of
offloads is the order of the pauses, whatever the machine's speed."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from conftest import EngineProcess, start_engine
from helpers import delta_text, next_frame
from support import STORY, chat_body, complete, text_of, wait_until

pytestmark = pytest.mark.e2e

# Time-outs only; deterministic: a restored stream's text is compared (docs/architecture.md).
FLAGS = ("--max-pause-ms", "600000", "--offload-paused-after-ms", "200", "--deterministic")
SLOTS = 4  # the default max_sequences
TOLD_BEFORE_PAUSE = 16  # tokens a checked story streams before its pause
STORY_TOKENS = 300  # enough for a wrong restore to show in the text
TOPIC = (
    "Tell a story about a lighthouse keeper and a storm at sea. The keeper lives alone on a "
    "rock far from the coast, keeps a logbook, feeds a grey cat, repairs the lamp, and "
    "listens to the radio every evening. One night the wind rises, a fishing boat loses "
    "its way, and the keeper must decide what to do."
)


def prompt(text: str) -> str:
    return f"[{uuid.uuid4().hex[:8]}] {text}"


class WsStream:
    """A WebSocket stream, the frames it received and the engine's id for it."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, stream_id: str) -> None:
        self.ws = ws
        self.id = stream_id
        self.frames: list[dict[str, Any]] = []

    @property
    def text(self) -> str:
        return delta_text(self.frames)

    async def frame(self, *kinds: str) -> dict[str, Any]:
        frame = await next_frame(self.ws, *kinds, seen=self.frames, timeout=900)
        self.frames.append(frame)
        return frame

    async def finish(self) -> dict[str, Any]:
        """Resume and read to the end; the last frame."""
        await self.ws.send_json({"type": "resume"})
        return await self.frame("done", "error")


async def start_paused(
    session: aiohttp.ClientSession,
    engine: EngineProcess,
    text: str,
    max_tokens: int = STORY_TOKENS,
    deltas: int = 1,
) -> WsStream:
    """A WebSocket stream paused after its first ``deltas`` deltas."""
    ws = await session.ws_connect(engine.base_url.replace("http", "ws") + "/stream")
    await ws.send_json({"type": "start", "request": chat_body(text, max_tokens=max_tokens)})
    stream = WsStream(ws, (await next_frame(ws, "started", timeout=900))["id"])
    for _ in range(deltas):
        await stream.frame("delta")
    await ws.send_json({"type": "pause"})
    await stream.frame("paused")
    return stream


def order(engine: EngineProcess) -> list[tuple[str, str]]:
    return [(e["event"], e["request_id"]) for e in engine.events()]


async def test_paused_streams_are_offloaded_and_resume_token_exact(tmp_path: Path) -> None:
    """Two stories paused mid-way (and two more streams paused to fill the slots) are
    offloaded, one for each waiting request, in the order they paused, and come back
    with the text of an uninterrupted run."""
    engine = start_engine(tmp_path, *FLAGS)
    try:
        stories = [prompt(STORY), prompt(STORY)]
        references = [
            text_of(await complete(engine.url, chat_body(s, max_tokens=STORY_TOKENS)))
            for s in stories
        ]
        async with aiohttp.ClientSession() as session:
            told = [
                await start_paused(session, engine, s, deltas=TOLD_BEFORE_PAUSE) for s in stories
            ]
            fillers = [
                await start_paused(session, engine, prompt(TOPIC)) for _ in range(SLOTS - len(told))
            ]
            # The first waiting request runs once the oldest pause is offloaded; paused
            # in turn, it keeps its slot, so the second needs the next oldest offloaded.
            first = await start_paused(session, engine, prompt(TOPIC))
            second = await complete(engine.url, chat_body(prompt(TOPIC), max_tokens=20))
            await wait_until(
                lambda: ("end", second["id"]) in order(engine), what="the second's end event"
            )
            seen = order(engine)
            assert seen.index(("offloaded", told[0].id)) < seen.index(("scheduled", first.id))
            assert seen.index(("offloaded", told[1].id)) < seen.index(("scheduled", second["id"]))
            assert [rid for event, rid in seen if event == "offloaded"] == [s.id for s in told]
            assert {engine.stream(s.id)["state"] for s in told} == {"offloaded"}
            await first.ws.send_json({"type": "cancel"})  # two slots free: restores fit
            await first.frame("error")
            ends = [await stream.finish() for stream in told]  # one at a time, alone
            for stream in [first, *told, *fillers]:
                await stream.ws.close()
        for stream, end, reference in zip(told, ends, references, strict=True):
            assert end["type"] == "done", end
            assert stream.text == reference
        restored = [rid for event, rid in order(engine) if event == "restored"]
        assert restored == [s.id for s in told]
    finally:
        engine.stop()


async def test_the_host_bound_cancels_the_oldest_offloaded_stream(tmp_path: Path) -> None:
    # One paused stream's state (about 100 cells of 23 KB) fits in 3 MiB, two do not.
    engine = start_engine(tmp_path, *FLAGS, "--host-offload-mb", "3")
    try:
        async with aiohttp.ClientSession() as session:
            paused = [
                await start_paused(session, engine, prompt(TOPIC), max_tokens=20, deltas=10)
                for _ in range(SLOTS)
            ]
            first = await start_paused(session, engine, prompt(TOPIC))
            waiting = asyncio.create_task(
                complete(engine.url, chat_body(prompt(TOPIC), max_tokens=20))
            )
            error = await paused[0].frame("error")
            assert error["code"] == "pause_timeout"
            await waiting
            assert (await paused[1].finish())["type"] == "done"
            for stream in [first, *paused]:
                await stream.ws.close()
        assert [rid for event, rid in order(engine) if event == "offloaded"][:2] == [
            paused[0].id,
            paused[1].id,
        ]
        streams = engine.debug_streams()
        assert streams["engine_alive"]
        await wait_until(
            lambda: engine.debug_streams()["kv_offloaded_bytes"] == 0, what="host memory freed"
        )
    finally:
        engine.stop()
