"""``edge-llm blame`` on real log pairs and ``edge-llm top --once`` against the real engine."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from edge_llm.cli import blame as blame_cli
from edge_llm.cli import top as top_cli
from edge_llm.client import ClientConfig, StreamClient
from edge_llm.observability.events import Event, EventLog, read_events

from helpers import next_frame
from support import chat_body, served_model, wait_until

pytestmark = pytest.mark.e2e

STORY = [{"role": "user", "content": "Write a long story about a dragon who learns to bake."}]
QUEUE_CAPACITY = 8  # high watermark at 7 chunks, low at 2


class ClientEvents:
    """The client's event sink: writes its JSONL log and lets the test await an event."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.log = EventLog(path, source="client")
        self._seen: dict[str, asyncio.Event] = {}

    def __call__(self, event: str, request_id: str | None = None, **fields: Any) -> None:
        self.log.emit(event, request_id, **fields)
        self._flag(event).set()

    def _flag(self, event: str) -> asyncio.Event:
        return self._seen.setdefault(event, asyncio.Event())

    async def wait_for(self, event: str) -> None:
        await asyncio.wait_for(self._flag(event).wait(), 120)


def client_config(engine: Any) -> ClientConfig:
    return ClientConfig(
        base_url=engine.base_url,
        api_key="",
        model_id=served_model(engine),
        render_queue_capacity=QUEUE_CAPACITY,
        retry={"max_attempts": 1},  # one request per stream: blame judges each once
    )


def kv_freed_after_end(events: list[dict[str, Any]], request_id: str) -> bool:
    """The engine logged the end of ``request_id`` and then freed its slot."""
    mine = [i for i, e in enumerate(events) if e.get("request_id") == request_id]
    slots = [events[i]["slot"] for i in mine if events[i]["event"] == "scheduled"]
    ends = [i for i in mine if events[i]["event"] == "end"]
    if not slots or not ends:
        return False
    after = events[ends[-1] :]
    return any(e["event"] == "kv_freed" and e["slot"] == slots[-1] for e in after)


async def slow_render(engine: Any, events: ClientEvents, *, send_pause: bool, wait: str) -> str:
    """Stream over WebSocket, render nothing until the client logged ``wait``, then
    render everything; returns the server's request id once the engine freed its KV."""
    async with StreamClient(client_config(engine), event_log=events, send_pause=send_pause) as c:
        async with c.stream(STORY, transport="ws", max_tokens=48, temperature=0) as stream:
            await events.wait_for(wait)
            async for _ in stream:
                pass
        request_id = stream.result.request_id
    events.log.close()
    assert request_id is not None
    await wait_until(
        lambda: kv_freed_after_end(engine.events(), request_id), what="kv_freed after the end"
    )
    return request_id


def blame_report(
    engine: Any, client_log: Path, request_id: str, capsys: pytest.CaptureFixture[str]
) -> dict[str, Any]:
    """blame's JSON for one request. The grace periods are made long so that a loaded
    machine cannot turn a slow reaction into a verdict: only the evidence decides."""
    parser = argparse.ArgumentParser()
    blame_cli.register(parser.add_subparsers())
    argv = [str(engine.event_log), str(client_log), "--json", "--request", request_id]
    argv += ["--grace-ms", "60000", "--lag-ms", "60000"]
    assert blame_cli.run(parser.parse_args(["blame", *argv])) == 0
    (report,) = json.loads(capsys.readouterr().out)["requests"]
    assert isinstance(report, dict)
    return report


async def test_blame_says_ok_when_the_client_paused_and_the_engine_obeyed(
    engine_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = ClientEvents(tmp_path / "client.jsonl")
    request_id = await slow_render(engine_server, events, send_pause=True, wait="pause_sent")
    report = blame_report(engine_server, events.path, request_id, capsys)
    assert report["verdict"] == "ok", report["findings"]
    assert report["pauses"] >= 1
    assert report["backpressure_peak"] >= 1
    assert report["client_request_ids"]
    assert report["cannot_tell"] == []
    written = [e["event"] for e in [*engine_server.events(), *read_events(events.path)]]
    assert {"pause_sent", "pause_received", "scheduled", "kv_freed"} <= set(written)
    assert set(written) <= set(Event), "names missing from Event"


async def test_blame_says_client_when_it_rendered_slowly_without_pause(
    engine_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = ClientEvents(tmp_path / "client.jsonl")
    request_id = await slow_render(engine_server, events, send_pause=False, wait="watermark_high")
    report = blame_report(engine_server, events.path, request_id, capsys)
    assert report["verdict"] == "client"
    finding = report["findings"][0]
    assert finding["rule"] == "no_pause"
    assert finding["evidence"][0]["event"] == "watermark_high"
    assert finding["evidence"][0]["pause_enabled"] is False


async def test_top_once_shows_a_paused_stream(
    engine_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    url = engine_server.base_url.replace("http", "ws") + "/stream"
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        await ws.send_json({"type": "start", "request": chat_body("Tell a story.", max_tokens=64)})
        stream_id = (await next_frame(ws, "started"))["id"]
        await next_frame(ws, "delta")
        await ws.send_json({"type": "pause"})
        await next_frame(ws, "paused")
        parser = argparse.ArgumentParser()
        top_cli.register(parser.add_subparsers())
        args = parser.parse_args(["top", "--base-url", engine_server.url, "--once"])
        assert await asyncio.to_thread(top_cli.run, args) == 0
        await ws.send_json({"type": "cancel"})
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith(stream_id[:17]))
    assert row.split()[2:5] == ["0", "paused", "client"]  # PRIO, STATE, WHY
    assert "engine alive" in out
    assert "pauses client" in out
