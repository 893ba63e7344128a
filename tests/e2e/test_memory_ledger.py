"""The memory ledger with the real model: every KV tier filled in one process (kept
slots, the host prefix tier, an offloaded stream, the embeddings context) and the
total never past ``max_kv_cache_mb``; the startup line and ``/metrics`` show it."""

from __future__ import annotations

import asyncio
import threading
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from conftest import EngineProcess, start_engine
from helpers import next_frame
from support import chat_body, complete, wait_until

pytestmark = pytest.mark.e2e

MIB = 1 << 20
CAP_MB = 48  # the KV context gets 36 MiB of it (whole 256-cell slots: 22.5), the rest 25.5
FLAGS = (
    "--max-kv-cache-mb", str(CAP_MB), "--max-pause-ms", "600000",
    "--offload-paused-after-ms", "200", "--ttft-timeout-ms", "120000",
)  # fmt: skip
SLOTS = 4
# About 150 prompt tokens: a kept slot over 128 cells is saved to the host tier when
# another prompt takes its slot (about 4 MiB each: six fill the ledger's room).
TOPIC = (
    "Tell a story about a lighthouse keeper and a storm at sea. The keeper lives alone on a "
    "rock far from the coast, keeps a logbook, feeds a grey cat, repairs the lamp, and "
    "listens to the radio every evening. One night the wind rises, a fishing boat loses "
    "its way, and the keeper must decide what to do. Describe the sea, the sky, the lamp, "
    "the radio voices, the cat and the logbook in detail, then tell how the night ends."
)


def topic() -> str:
    return f"[{uuid.uuid4().hex[:8]}] {TOPIC}"


class LedgerWatch:
    """Reads ``/debug/streams`` in a thread until stopped: the largest total seen and
    every line that ever held bytes."""

    def __init__(self, engine: EngineProcess) -> None:
        self.engine = engine
        self.max_total = 0
        self.seen: dict[str, int] = {}
        self.reads = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LedgerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.record(self.engine.debug_streams()["memory_ledger"])

    def record(self, ledger: dict[str, Any]) -> None:
        self.reads += 1
        self.max_total = max(self.max_total, ledger["total_bytes"])
        for line in ("host_cache", "offload", "embeddings", "device_cached"):
            self.seen[line] = max(self.seen.get(line, 0), ledger[f"{line}_bytes"])
        lines = ("device", "host_cache", "offload", "embeddings")
        assert sum(ledger[f"{line}_bytes"] for line in lines) == ledger["total_bytes"]


async def start_paused(session: aiohttp.ClientSession, engine: EngineProcess) -> tuple[Any, str]:
    """A WebSocket stream paused after its first delta, and its id."""
    ws = await session.ws_connect(engine.base_url.replace("http", "ws") + "/stream")
    await ws.send_json({"type": "start", "request": chat_body(topic(), max_tokens=60)})
    stream_id = (await next_frame(ws, "started", timeout=900))["id"]
    await next_frame(ws, "delta", timeout=900)
    await ws.send_json({"type": "pause"})
    await next_frame(ws, "paused", timeout=900)
    return ws, stream_id


async def embed(engine: EngineProcess, text: str) -> aiohttp.ClientResponse:
    async with aiohttp.ClientSession() as session:
        async with session.post(engine.base_url + "/embeddings", json={"input": text}) as reply:
            await reply.read()
            return reply


async def test_every_tier_filled_stays_within_max_kv_cache_mb(tmp_path: Path) -> None:
    engine = start_engine(tmp_path, *FLAGS)
    try:
        ready = engine.debug_streams()["memory_ledger"]
        assert ready["cap_bytes"] == CAP_MB * MIB
        assert ready["total_bytes"] == ready["device_bytes"] <= 36 * MIB
        banner = engine.wait_for_output(lambda line: "memory ledger:" in line)
        assert f"of {CAP_MB}.0 MiB cap" in banner and "KV context 22.5" in banner
        with LedgerWatch(engine) as watch:
            for _ in range(8):  # one at a time: each takes the slot the last one kept
                await complete(engine.url, chat_body(topic(), max_tokens=24))
            await wait_until(
                lambda: engine.debug_streams()["memory_ledger"]["host_cache_bytes"] > 0,
                what="entries in the host tier",
            )
            assert engine.metric("edge_llm_kv_cache_evictions_total") > 0
            reply = await embed(engine, "the keeper's logbook")
            assert reply.status == 200
            async with aiohttp.ClientSession() as session:
                paused = [await start_paused(session, engine) for _ in range(SLOTS)]
                waiting = asyncio.create_task(
                    complete(engine.url, chat_body(topic(), max_tokens=8))
                )
                await waiting  # it ran: a paused stream was offloaded for it
                assert engine.events_of("offloaded")
                watch.record(engine.debug_streams()["memory_ledger"])
                for ws, _ in paused:
                    await ws.close()
        ledger = engine.debug_streams()["memory_ledger"]
        assert ledger["embeddings_bytes"] == 512 * 23040  # max_embedding_tokens cells
        assert watch.seen["host_cache"] > 0 and watch.seen["offload"] > 0
        assert watch.seen["embeddings"] > 0 and watch.seen["device_cached"] > 0
        assert watch.reads > 10 and watch.max_total <= CAP_MB * MIB
        assert engine.metric("edge_llm_memory_ledger_bytes", line="cap") == CAP_MB * MIB
        assert engine.metric("edge_llm_memory_ledger_bytes", line="total") <= CAP_MB * MIB
    finally:
        engine.stop()
