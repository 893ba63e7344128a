"""Priorities with the real model: a more urgent request preempts the least urgent of the
streams holding both slots, which resumes token-exact; the same class waits its turn;
progress events tell a waiting client where it stands, in order."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from conftest import EngineProcess, start_engine
from support import (
    STORY,
    chat_body,
    complete,
    logged_through,
    read_sse,
    text_of,
    wait_until,
)

pytestmark = pytest.mark.e2e

# Two slots, deterministic (a stream's greedy text depends neither on its neighbour nor
# on a preemption: docs/architecture.md): a third request runs only if a stream leaves
# one. (One slot is the unified pool, where a preemption cannot make room today: see the
# report of this branch.) Small prefill chunks make a long prompt's prefill take several
# steps a progress event can show.
TWO_SLOTS = (
    "--max-sequences", "2", "--ttft-timeout-ms", "0", "--max-pause-ms", "600000",
    "--prefill-chunk-tokens", "32", "--heartbeat-interval-ms", "200", "--deterministic",
)  # fmt: skip
LOW_MAX_TOKENS = 320  # near-ties show only after a few hundred tokens (support.STORY)
# The neighbour holding the other slot outlasts the test's stream (no end of
# generation: ignore_eos; a poem can repeat itself, and prompt-lookup drafts then run it
# several tokens a step: at twice the stream's length it once ended first); the tests
# cancel it.
FILLER_MAX_TOKENS = 6 * LOW_MAX_TOKENS
URGENT = "Name three colours."
URGENT_MAX_TOKENS = 24  # long enough a preemption that a loaded machine still sees it
LONG_QUESTION = (
    "Here is a passage. The harbour town woke slowly, its boats rocking against the quay "
    "while gulls argued over the nets. A baker opened his shutters, a ferry sounded its "
    "horn, and the fishermen counted the night's catch under a grey sky. "
) * 5 + "Summarise the passage in one sentence."


def tagged(text: str) -> str:
    return f"[{uuid.uuid4().hex[:8]}] {text}"


async def occupy(engine: EngineProcess, priority: int) -> asyncio.Task[dict[str, Any]]:
    """A request of class ``priority`` decoding in one slot (its text, once it ends)."""
    body = chat_body(
        tagged("Write a long poem about the sea."), max_tokens=FILLER_MAX_TOKENS, ignore_eos=True
    )
    task = asyncio.create_task(complete(engine.url, {**body, "priority": priority}))
    streams = engine.debug_streams
    await wait_until(
        lambda: any(
            s["state"] == "decoding" and s["priority"] == priority for s in streams()["streams"]
        ),
        what="the neighbour decoding",
    )
    return task


async def leave(neighbour: asyncio.Task[dict[str, Any]]) -> None:
    """The neighbour's client goes away (its stream is cancelled, its slot freed)."""
    neighbour.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await neighbour


def content(event: dict[str, Any] | str) -> str:
    """The text a data event carries ("" for a ping, a progress or usage chunk)."""
    if isinstance(event, str):
        return ""
    choices = event.get("choices") or [{}]
    return str(choices[0].get("delta", {}).get("content") or "")


async def test_a_more_urgent_request_preempts_and_the_stream_resumes_token_exact(
    tmp_path: Path,
) -> None:
    engine = start_engine(tmp_path, *TWO_SLOTS)
    try:
        low = chat_body(tagged(STORY), max_tokens=LOW_MAX_TOKENS)
        # The uninterrupted run first: the preempted ones are then regenerates of it.
        reference = text_of(await complete(engine.url, low))
        async with aiohttp.ClientSession() as session:
            await _preempted_over_websocket(session, engine, low, reference)
            await _preempted_over_sse(session, engine, low, reference)
        metrics = engine.metrics_text()
        assert 'edge_llm_preemptions_total{priority="5"} 1.0' in metrics
        assert 'edge_llm_preemptions_total{priority="1"} 1.0' in metrics
        assert 'edge_llm_backpressure_pauses_total{cause="preempted"} 2.0' in metrics
    finally:
        engine.stop()


async def _preempted_over_websocket(
    session: aiohttp.ClientSession, engine: EngineProcess, low: dict[str, Any], reference: str
) -> None:
    """priority 5 over the WebSocket beside a neighbour of class 3, preempted by a request
    of the default class 0 (the least urgent class is the one preempted)."""
    neighbour = await occupy(engine, 3)
    async with session.ws_connect(engine.base_url.replace("http", "ws") + "/stream") as ws:
        await ws.send_json({"type": "start", "request": {**low, "priority": 5}})
        frames: list[dict[str, Any]] = []

        async def until(kind: str) -> dict[str, Any]:
            while True:
                frames.append(await asyncio.wait_for(ws.receive_json(), 600))
                if frames[-1]["type"] in (kind, "error", "done"):
                    return frames[-1]

        stream_id = (await until("started"))["id"]
        await until("delta")  # it runs, in the only slot
        urgent = asyncio.create_task(
            complete(engine.url, chat_body(URGENT, max_tokens=URGENT_MAX_TOKENS))
        )
        assert (await until("paused")).get("cause") == "preempted", frames[-1]
        assert (await until("resumed"))["type"] == "resumed"
        done = await until("done")
        assert await urgent
    text = "".join(f["text"] for f in frames if f["type"] == "delta")
    assert done["finish_reason"] == "length"
    assert text == reference  # token-exact after its KV went to host memory and back
    assert [f["type"] for f in frames].count("paused") == 1
    await leave(neighbour)
    entry = engine.stream(stream_id)
    assert (entry["priority"], entry["preemptions"]) == (5, 1)
    events = [(e["event"], e["request_id"]) for e in await logged_through(engine, stream_id)]
    assert events.index(("offloaded", stream_id)) < events.index(("restored", stream_id))


async def _preempted_over_sse(
    session: aiohttp.ClientSession, engine: EngineProcess, low: dict[str, Any], reference: str
) -> None:
    """service_tier flex (class 1) over SSE with progress beside a neighbour of the default
    class 0, preempted by X-Priority: -2."""
    neighbour = await occupy(engine, 0)
    body = {**low, "service_tier": "flex", "return_progress": True}
    async with session.post(engine.base_url + "/chat/completions", json=body) as response:
        assert response.status == 200
        kinds: list[str] = []
        text = []
        urgent = None
        async for event in read_sse(response):
            if isinstance(event, str):
                continue
            if "progress" in event:
                kinds.append(event["progress"]["state"])
            elif piece := content(event):
                kinds.append("token")
                text.append(piece)
                if urgent is None:
                    headers = {"X-Priority": "-2"}
                    urgent = asyncio.create_task(
                        complete(
                            engine.url, chat_body(URGENT, max_tokens=URGENT_MAX_TOKENS), **headers
                        )
                    )
        stream_id = response.headers["X-Request-Id"]
    assert urgent is not None and await urgent
    await leave(neighbour)
    assert "".join(text) == reference
    preempted = kinds.index("preempted")
    assert "token" in kinds[:preempted] and "token" in kinds[preempted:]
    assert engine.stream(stream_id)["preemptions"] == 1


async def test_the_same_class_waits_its_turn_and_progress_comes_in_order(
    tmp_path: Path,
) -> None:
    # A stream whose reader falls a second behind (a loaded machine) is paused and, with
    # requests waiting, offloaded: its slot would go to the second request without an
    # end. No offload of paused streams here; preemption stays on.
    engine = start_engine(tmp_path, *TWO_SLOTS, "--offload-paused-after-ms", "600000")
    try:
        neighbour = await occupy(engine, 3)
        async with aiohttp.ClientSession() as session:
            first = chat_body(tagged(STORY), max_tokens=LOW_MAX_TOKENS, priority=3)
            async with session.post(engine.base_url + "/chat/completions", json=first) as running:
                first_id = running.headers["X-Request-Id"]
                events = read_sse(running)
                while not content(await anext(events)):
                    pass
                waiting = asyncio.create_task(_progress_of_a_waiting_request(session, engine))
                first_text = [e async for e in events if not isinstance(e, str)]
            kinds, second_id = await waiting
        assert "".join(content(e) for e in first_text)
        await leave(neighbour)
        assert kinds[0] == ("queued", 1)
        first_token = kinds.index(("token", None))
        states = [state for state, _ in kinds[:first_token]]
        assert "prefill" in states
        order = ["queued", "prefill", "decoding"].index
        assert states == sorted(states, key=order)
        prefilled = [n for state, n in kinds[:first_token] if state == "prefill"]
        assert prefilled == sorted(prefilled) and len(set(prefilled)) > 1  # chunk by chunk
        # then tokens, with a heartbeat's "decoding" where no token came for 200 ms
        assert {state for state, _ in kinds[first_token:]} <= {"token", "decoding"}
        await logged_through(engine, second_id)
        order_of = [(e["event"], e["request_id"]) for e in await logged_through(engine, first_id)]
        first_end = next(i for i, (event, _) in enumerate(order_of) if event == "end")
        assert first_end < order_of.index(("scheduled", second_id))  # a slot freed by an end
        metrics = engine.metrics_text()  # the same class: nobody was preempted
        assert "edge_llm_preemptions_total{" not in metrics
        assert 'edge_llm_backpressure_pauses_total{cause="preempted"} 0.0' in metrics
    finally:
        engine.stop()


async def _progress_of_a_waiting_request(
    session: aiohttp.ClientSession, engine: EngineProcess
) -> tuple[list[tuple[str, int | None]], str]:
    """(state, queue position or prefill count) of each progress event, ("token", None)
    for each content chunk, of a long-prompt request of the same class 3."""
    body = chat_body(tagged(LONG_QUESTION), max_tokens=16, priority=3)
    body["stream_options"] = {"include_progress": True}
    kinds: list[tuple[str, int | None]] = []
    async with session.post(engine.base_url + "/chat/completions", json=body) as response:
        assert response.status == 200
        async for event in read_sse(response):
            if isinstance(event, str):
                continue
            if "progress" in event:
                progress = event["progress"]
                detail = progress["queue_position"] or progress["prefill_done"]
                kinds.append((progress["state"], detail))
            elif content(event):
                kinds.append(("token", None))
        return kinds, response.headers["X-Request-Id"]
