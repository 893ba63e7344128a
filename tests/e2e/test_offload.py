"""Offload of paused streams with the real model: their KV goes to host memory so that
waiting requests run, and they come back token-exact; the host bound is enforced."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from conftest import EngineProcess, start_engine
from support import STORY, chat_body, wait_until

pytestmark = pytest.mark.e2e

# Two slots of 256 cells (12 MiB): two paused streams hold both, so each waiting
# request needs one of them offloaded. Long prompts and short answers keep the test
# quick: prefill is batched, decode is one token per step.
BUDGET = (
    "--max-kv-cache-mb", "12", "--max-sequences", "2", "--ttft-timeout-ms", "0",
    "--offload-paused-after-ms", "200", "--max-pause-ms", "600000",
)  # fmt: skip
PAUSED_MAX_TOKENS = 20
WAITING_MAX_TOKENS = PAUSED_MAX_TOKENS  # equal sizes: each waiting one needs a paused one out
TOPIC = (
    "Tell a story about a lighthouse keeper and a storm at sea. The keeper lives alone on a "
    "rock far from the coast, keeps a logbook, feeds a grey cat, repairs the lamp, and "
    "listens to the radio every evening. One night the wind rises, a fishing boat loses "
    "its way, and the keeper must decide what to do."
)


def prompt(n: int, topic: str = TOPIC) -> str:
    return f"[{uuid.uuid4().hex[:8]}-{n}] {topic}"


class WsStream:
    """A WebSocket stream and the text it received."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.text: list[str] = []

    async def frame_of(self, *kinds: str) -> dict[str, Any]:
        while True:
            frame: dict[str, Any] = await asyncio.wait_for(self.ws.receive_json(), 900)
            if frame["type"] == "delta":
                self.text.append(frame["text"])
            if frame["type"] in kinds:
                return frame

    async def finish(self) -> tuple[str, dict[str, Any]]:
        """Resume and read to the end: (the whole text, the final frame)."""
        await self.ws.send_json({"type": "resume"})
        frame = await self.frame_of("done", "error")
        return "".join(self.text), frame


async def start_paused(
    session: aiohttp.ClientSession, engine: EngineProcess, text: str
) -> WsStream:
    """A WebSocket stream paused after its first tokens, alone on the engine."""
    ws = await session.ws_connect(engine.base_url.replace("http", "ws") + "/stream")
    body = chat_body(text, max_tokens=PAUSED_MAX_TOKENS)
    await ws.send_json({"type": "start", "request": body})
    stream = WsStream(ws)
    await stream.frame_of("delta")
    await ws.send_json({"type": "pause"})
    await stream.frame_of("paused")
    return stream


async def complete(url: str, text: str, max_tokens: int) -> tuple[str, str]:
    """(request id, text) of a non-streamed request."""
    body = chat_body(text, max_tokens=max_tokens, stream=False)
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/chat/completions", json=body) as response:
            assert response.status == 200, await response.text()
            result = await response.json()
            return str(result["id"]), str(result["choices"][0]["message"]["content"])


def logged(events: list[dict[str, Any]], event: str, request_id: str) -> bool:
    return any(e["event"] == event and e["request_id"] == request_id for e in events)


def ran_at_once(events: list[dict[str, Any]], waiting: list[str], paused: list[str]) -> bool:
    """Both waiting requests were scheduled, and both paused streams offloaded, before
    either waiting request ended."""
    order = [(e["event"], e["request_id"]) for e in events]
    first_end = min(order.index(("end", rid)) for rid in waiting)
    scheduled = all(order.index(("scheduled", rid)) < first_end for rid in waiting)
    return scheduled and all(order.index(("offloaded", rid)) < first_end for rid in paused)


async def test_paused_streams_are_offloaded_and_resume_token_exact(tmp_path: Path) -> None:
    engine = start_engine(tmp_path, *BUDGET)
    try:
        texts = [prompt(1, STORY), prompt(2, STORY)]
        # The uninterrupted runs first. The paused streams below are then regenerates
        # (token-identical, see test_prefix_cache.py): a cold run of the same prompt
        # after the cache was evicted could be computed in other batch shapes.
        references = [(await complete(engine.url, t, PAUSED_MAX_TOKENS))[1] for t in texts]
        async with aiohttp.ClientSession() as session:
            paused = [await start_paused(session, engine, text) for text in texts]
            paused_ids = [
                s["id"] for s in engine.debug_streams()["streams"] if s["state"] == "paused"
            ]
            waiting = [
                asyncio.create_task(complete(engine.url, prompt(n), WAITING_MAX_TOKENS))
                for n in (3, 4)
            ]
            await wait_until(
                lambda: engine.debug_streams()["kv_offloaded_bytes"] > 0, what="an offload"
            )
            waiting_ids = [rid for rid, _ in await asyncio.gather(*waiting)]
            # The event log is written by its own thread: wait for both "end" lines.
            await wait_until(
                lambda: all(logged(engine.events(), "end", rid) for rid in waiting_ids),
                what="the waiting requests' end events",
            )
            # Both waiting requests ran at once while both paused streams were offloaded.
            assert ran_at_once(engine.events(), waiting_ids, paused_ids)
            results = [await stream.finish() for stream in paused]  # one at a time
            for stream in paused:
                await stream.ws.close()
        for (text, frame), reference in zip(results, references, strict=True):
            assert frame["type"] == "done", frame
            assert text == reference
        for rid in paused_ids:  # the end line comes after the restore: all are written
            await wait_until(lambda rid=rid: logged(engine.events(), "end", rid), what="end")
        events = [e["event"] for e in engine.events()]
        assert events.count("offloaded") == 2
        assert events.count("restored") == 2
    finally:
        engine.stop()


async def test_the_host_bound_cancels_the_oldest_offloaded_stream(tmp_path: Path) -> None:
    # One paused stream's state (about 100 cells of 23 KB) fits in 3 MiB, two do not.
    engine = start_engine(tmp_path, *BUDGET, "--host-offload-mb", "3")
    try:
        async with aiohttp.ClientSession() as session:
            oldest = await start_paused(session, engine, prompt(1))
            newer = await start_paused(session, engine, prompt(2))
            waiting = [
                asyncio.create_task(complete(engine.url, prompt(n), WAITING_MAX_TOKENS))
                for n in (3, 4)
            ]
            error = await oldest.frame_of("error")
            assert error["code"] == "pause_timeout"
            await asyncio.gather(*waiting)
            text, done = await newer.finish()
            assert done["type"] == "done" and text, done
            await oldest.ws.close()
            await newer.ws.close()
        streams = engine.debug_streams()
        assert streams["kv_offloaded_bytes"] == 0
        assert streams["engine_alive"]
    finally:
        engine.stop()
