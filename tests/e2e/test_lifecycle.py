"""The stream lifecycle contract with the real model: cancel frees KV, TTFT
timeout, KV-budget admission, queue limit, regenerate storms."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from typing import Any

import aiohttp
import psutil
import pytest

from helpers import next_frame
from support import STORY, RawSseClient, chat_body, complete, wait_until

pytestmark = pytest.mark.e2e

LONG_PROMPT = "The history of the river and its towns. " * 110  # about 1,000 tokens


def kv_idle(engine) -> bool:
    return engine.debug_streams()["kv_used_bytes"] == 0


def index_of(events: list[dict[str, Any]], event: str, request_id: str) -> int | None:
    """Where the first ``event`` line of ``request_id`` stands in the log, if any."""
    return next(
        (i for i, e in enumerate(events) if (e["event"], e["request_id"]) == (event, request_id)),
        None,
    )


def freed_after(events: list[dict[str, Any]], request_id: str) -> int | None:
    """Where the engine freed ``request_id``'s slot after cancelling it: the first
    ``kv_freed`` of the slot its ``scheduled`` line named, after its ``cancel`` line
    (None while either line is not in the log)."""
    scheduled = index_of(events, "scheduled", request_id)
    cancel = index_of(events, "cancel", request_id)
    if scheduled is None or cancel is None:
        return None
    slot = events[scheduled]["slot"]
    return next(
        (i for i in range(cancel, len(events))
         if events[i]["event"] == "kv_freed" and events[i]["slot"] == slot),
        None,
    )  # fmt: skip


async def test_ws_cancel_frees_kv_before_the_next_step(engine_factory) -> None:
    """While the cancelled stream decodes, another prompt is prefilled 16 tokens a step,
    and each step logs its ``prefill_progress``: between the ``cancel`` line and the
    ``kv_freed`` of the stream's slot there is at most that one step (the one in flight
    when the CANCEL came), and the next step's progress comes after the free."""
    engine = engine_factory("--max-prompt-tokens", "2048", "--prefill-chunk-tokens", "16")
    url = engine.base_url.replace("http", "ws") + "/stream"
    prefilling = None
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        try:
            await ws.send_json({"type": "start", "request": chat_body(STORY, max_tokens=400)})
            stream_id = (await next_frame(ws, "started"))["id"]
            await next_frame(ws, "delta")
            prefilling = RawSseClient(engine.url, chat_body(LONG_PROMPT, max_tokens=4))
            other = prefilling.request_id()
            await wait_until(lambda: engine.events_of("prefill_progress", other), what="prefill")
            assert engine.debug_streams()["kv_used_bytes"] > 0
            await ws.send_json({"type": "cancel"})
            frame = await next_frame(ws, "error")
            assert (frame["code"], frame["reason"]) == ("cancelled", "client")

            def progress_after_the_free() -> list[dict[str, Any]] | None:
                events = engine.events()
                freed = freed_after(events, stream_id)
                if freed is None:
                    return None
                later = [e for e in events[freed:] if e["request_id"] == other]
                return events if any(e["event"] == "prefill_progress" for e in later) else None

            events = await wait_until(progress_after_the_free, what="a step after the free")
            cancel, freed = index_of(events, "cancel", stream_id), freed_after(events, stream_id)
            in_flight = [
                e for e in events[cancel:freed]
                if (e["event"], e["request_id"]) == ("prefill_progress", other)
            ]  # fmt: skip
            assert len(in_flight) <= 1, in_flight
            # The socket stays usable for the next stream.
            await ws.send_json({"type": "start", "request": chat_body("Hi", max_tokens=4)})
            await next_frame(ws, "done")
        finally:
            if prefilling is not None:
                prefilling.close()
    assert engine.metric("edge_llm_cancellations_total", reason="client") == 1


async def test_disconnect_during_prefill_frees_kv(engine_factory) -> None:
    """The stream is paused by its client while its prompt is prefilled (a heartbeat
    showed the first chunks done), so no token will ever come: the engine must notice
    the closed socket by itself, not at the next token as Ollama does. Between the
    PAUSE and the end the engine may finish the step in flight (one prompt chunk),
    nothing more: this once compared the prefill count read after the ``paused``
    frame, which the chunk in flight could still raise (``64 == 32`` under load)."""
    engine = engine_factory(
        "--max-prompt-tokens", "2048", "--prefill-chunk-tokens", "32", "--ttft-timeout-ms", "0",
        "--heartbeat-interval-ms", "50", "--max-pause-ms", "600000",
    )  # fmt: skip
    url = engine.base_url.replace("http", "ws") + "/stream"
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        await ws.send_json({"type": "start", "request": chat_body(LONG_PROMPT, max_tokens=8)})
        stream_id = (await next_frame(ws, "started"))["id"]
        while (await next_frame(ws, "heartbeat"))["prefill_done"] == 0:
            pass
        await ws.send_json({"type": "pause"})
        await next_frame(ws, "paused")
        held = engine.stream(stream_id)
        assert 0 < held["prefill_done"] < held["n_prompt_tokens"]
        assert engine.debug_streams()["kv_used_bytes"] > 0
    stream = await wait_until(
        lambda: (s := engine.stream(stream_id))["state"] == "cancelled" and s,
        what="the stream to be cancelled",
    )
    assert stream["cancel_reason"] == "disconnect"
    assert stream["prefill_done"] >= held["prefill_done"]
    events = await wait_until(
        lambda: (events := engine.events()) and freed_after(events, stream_id) is not None
        and events,
        what="kv_freed after the disconnect",
    )  # fmt: skip
    # Its live cells were released at the next step: the engine's books then held no
    # live KV (the prompt cells it had prefilled may stay as evictable cache).
    assert events[freed_after(events, stream_id)]["kv_used_bytes"] == 0
    assert kv_idle(engine)
    assert engine.metric("edge_llm_cancellations_total", reason="disconnect") == 1
    # Prefilled after the engine took the PAUSE: at most the chunk in flight.
    mine = [e for e in events if e.get("request_id") == stream_id]
    received = next(i for i, e in enumerate(mine) if e["event"] == "pause_received")
    after = [e for e in mine[received:] if e["event"] == "prefill_progress"]
    assert len(after) <= 1, after
    assert stream["prefill_done"] == (after[-1]["prefill_done"] if after else held["prefill_done"])


async def test_ttft_timeout_is_504_before_any_byte_and_an_sse_error_after(engine_factory) -> None:
    engine = engine_factory(
        "--max-prompt-tokens", "2048", "--prefill-chunk-tokens", "16",
        "--ttft-timeout-ms", "300", "--heartbeat-interval-ms", "100",
    )  # fmt: skip
    async with aiohttp.ClientSession() as session:
        body = chat_body(LONG_PROMPT, max_tokens=4, stream=False)
        async with session.post(engine.base_url + "/chat/completions", json=body) as r:
            assert r.status == 504
            assert (await r.json())["error"]["code"] == "ttft_timeout"
        body["stream"] = True
        async with session.post(engine.base_url + "/chat/completions", json=body) as r:
            assert r.status == 200  # heartbeats already went out
            text = (await r.read()).decode()
    assert ": ping" in text
    assert '"code":"ttft_timeout"' in text
    assert "[DONE]" not in text
    await wait_until(lambda: kv_idle(engine), what="KV freed after the timeout")
    assert engine.metric("edge_llm_cancellations_total", reason="ttft_timeout") == 2


async def test_kv_budget_admission_in_the_pool(engine_factory) -> None:
    """In the unified pool one sequence may take most of the budget; admission then
    refuses a second one (the per-slot default gives each slot its share instead)."""
    engine = engine_factory(
        "--kv-unified", "--max-kv-cache-mb", "6", "--max-queue", "0", "--max-sequences", "4"
    )
    budget = engine.debug_streams()["kv_budget_bytes"]
    per_token = engine.debug_streams()["kv_bytes_per_token"]
    assert budget <= 6 * 1024 * 1024 + 256 * per_token
    async with aiohttp.ClientSession() as session:
        url = engine.base_url + "/chat/completions"
        # More than the whole budget: an upper bound, lowered to what fits (stream
        # closed after the headers: the disconnect cancels it).
        async with session.post(url, json=chat_body("Hi", max_tokens=budget // per_token + 1)) as r:
            assert r.status == 200
            granted = int(r.headers["X-Max-Tokens-Clamped"])
        assert 0 < granted < budget // per_token
        await wait_until(lambda: kv_idle(engine), what="the clamped stream cancelled")
        big = budget // per_token - 60  # fits alone, not beside another one
        first = RawSseClient(engine.url, chat_body(STORY, max_tokens=big))
        try:
            first.request_id()
            async with session.post(url, json=chat_body(STORY, max_tokens=big)) as r:
                assert r.status == 503
                assert r.headers["Retry-After"]
                assert (await r.json())["error"]["code"] == "kv_budget_exceeded"
        finally:
            first.close()


async def test_per_sequence_kv_layout_serves_and_caps_one_sequence(engine_factory) -> None:
    engine = engine_factory(
        "--no-kv-unified", "--max-sequences", "4", "--max-kv-cache-mb", "32",
        "--ttft-timeout-ms", "120000",  # four prompts at once on a loaded machine
    )  # fmt: skip
    debug = engine.debug_streams()
    share = debug["kv_budget_bytes"] // debug["kv_bytes_per_token"] // 4
    assert share >= 256
    assert debug["kv_sequence_tokens"] == share
    async with aiohttp.ClientSession() as session:
        url = engine.base_url + "/chat/completions"
        async with session.post(url, json=chat_body("Hi", max_tokens=share)) as r:
            assert r.status == 200  # lowered so that the prompt fits beside it
            assert 0 < int(r.headers["X-Max-Tokens-Clamped"]) < share
        await wait_until(lambda: kv_idle(engine), what="the clamped stream cancelled")
        requests = [
            session.post(url, json=chat_body(STORY, max_tokens=24, stream=False)) for _ in range(4)
        ]
        replies = await asyncio.gather(*requests)
        for reply in replies:
            assert reply.status == 200
            assert (await reply.json())["usage"]["completion_tokens"] == 24
    await wait_until(lambda: kv_idle(engine), what="KV freed")


async def test_full_queue_is_503_and_a_queued_disconnect_leaves_the_queue(
    engine_factory,
) -> None:
    """The only slot is held, one request waits, a third is refused. The waiting one's
    client then goes: it leaves the queue at once, and the freed slot never goes to it
    (no ``scheduled`` line, even after the holder ends)."""
    engine = engine_factory("--max-sequences", "1", "--max-queue", "1")
    running = RawSseClient(engine.url, chat_body(STORY, max_tokens=300))
    queued = None
    try:
        holder = running.request_id()  # it holds the only slot (and stays: nobody reads it)
        queued = RawSseClient(engine.url, chat_body(STORY, max_tokens=4))
        waiting = queued.request_id()
        await wait_until(
            lambda: engine.debug_streams()["requests_waiting"] == 1, what="a queued request"
        )
        async with aiohttp.ClientSession() as session:
            async with session.post(
                engine.base_url + "/chat/completions", json=chat_body("Hi")
            ) as r:
                assert r.status == 503
                assert int(r.headers["Retry-After"]) >= 1
                assert (await r.json())["error"]["code"] == "queue_full"
        queued.close()
        cancel = await wait_until(lambda: engine.events_of("cancel", waiting), what="its cancel")
        assert cancel[0]["reason"] == "disconnect"
        await wait_until(
            lambda: engine.debug_streams()["requests_waiting"] == 0, what="an empty queue"
        )
        assert engine.stream(holder)["state"] not in ("done", "cancelled")  # still in the slot
    finally:
        running.close()
        if queued is not None:
            queued.close()
    # The slot frees and a new request runs in it: a queue still holding the gone
    # request would have given it the slot first. Lines are written in order, so once
    # the new one's end is in the log, any earlier line is too.
    after = await complete(engine.url, chat_body("Hi", max_tokens=2))
    await wait_until(lambda: engine.events_of("end", after["id"]), what="the next request's end")
    assert engine.events_of("admitted", waiting)
    assert not engine.events_of("scheduled", waiting), "the queued request got the slot"
    assert engine.metric("edge_llm_admission_rejections_total", reason="queue_full") == 1


async def test_regenerate_storm_leaves_one_live_sequence(engine_server) -> None:
    """Twenty clicks, each sent once the engine admitted the one before (tasks do not
    reach the server in the order they were created): at most one live sequence of
    the session at any time, and the last click answered. Proven from the event log,
    not only sampled: each click's predecessor had ended (cancelled ``superseded``, or
    finished) before the click's ``scheduled`` line, and a cancelled one's slot was
    freed before it too."""
    session_id = f"storm-{uuid.uuid4().hex[:8]}"
    headers = {"X-Session-Id": session_id}

    def admitted() -> int:
        return sum(1 for e in engine_server.events_of("admitted") if e["session"] == session_id)

    def live() -> list[dict[str, object]]:
        return [
            s for s in engine_server.debug_streams()["streams"]
            if s["session"] == session_id and s["state"] not in ("done", "cancelled")
        ]  # fmt: skip

    async with aiohttp.ClientSession() as session:

        async def click(i: int) -> str:
            body = chat_body(f"{STORY} Version {i}.", max_tokens=24)
            async with session.post(
                engine_server.base_url + "/chat/completions", json=body, headers=headers
            ) as r:
                return (await r.read()).decode()

        tasks = []
        for i in range(20):
            tasks.append(asyncio.create_task(click(i)))
            await wait_until(lambda i=i: admitted() == i + 1, what=f"click {i} admitted")
            assert len(live()) <= 1
        bodies = await asyncio.gather(*tasks)
    completed = [b for b in bodies if b.rstrip().endswith("data: [DONE]")]
    superseded = [b for b in bodies if "superseded" in b and "[DONE]" not in b]
    assert bodies[-1] in completed  # the last click is answered normally
    assert len(completed) + len(superseded) == 20
    assert engine_server.metric("edge_llm_cancellations_total", reason="superseded") >= len(
        superseded
    )
    clicks = [e["request_id"] for e in engine_server.events_of("admitted")
              if e["session"] == session_id]  # fmt: skip
    await wait_until(lambda: engine_server.events_of("end", clicks[-1]), what="the last end")
    assert_each_click_ended_its_predecessor(engine_server.events(), clicks)


def assert_each_click_ended_its_predecessor(
    events: list[dict[str, Any]], clicks: list[str]
) -> None:
    """For each click: its predecessor's ``end`` line (after a ``cancel`` with reason
    ``superseded``, or a normal finish) comes before the click's ``scheduled`` line;
    a cancelled predecessor that had a slot has it freed before then too."""
    n_superseded = 0
    for before, click in itertools.pairwise(clicks):
        scheduled = index_of(events, "scheduled", click)
        ended = index_of(events, "end", before)
        assert scheduled is not None and ended is not None, (before, click)
        assert ended < scheduled, f"{before} still live when {click} was scheduled"
        cancel = index_of(events, "cancel", before)
        if cancel is None:
            continue  # it finished first
        assert events[cancel]["reason"] == "superseded", events[cancel]
        n_superseded += 1
        if index_of(events, "scheduled", before) is not None:  # it had a slot
            freed = freed_after(events, before)
            assert freed is not None and freed < scheduled, f"{before}'s KV not freed first"
    assert n_superseded >= 1  # the storm superseded something


async def test_cancel_cycles_leave_kv_idle_and_memory_flat(engine_factory) -> None:
    engine = engine_factory()
    process = psutil.Process(engine.proc.pid)
    url = engine.base_url.replace("http", "ws") + "/stream"

    async def cycles(n: int) -> None:
        async with aiohttp.ClientSession() as session:
            for i in range(n):
                if i % 2:
                    client = RawSseClient(engine.url, chat_body(STORY, max_tokens=64))
                    client.request_id()
                    client.close()  # disconnect
                    continue
                async with session.ws_connect(url) as ws:
                    await ws.send_json(
                        {"type": "start", "request": chat_body(STORY, max_tokens=64)}
                    )
                    await ws.receive_json()
                    await ws.send_json({"type": "pause"})
                    await ws.send_json({"type": "cancel"})

    await cycles(20)  # warm-up: allocator pools, caches
    await wait_until(lambda: kv_idle(engine), what="KV idle after warm-up")
    rss_before = process.memory_info().rss
    await cycles(60)
    await wait_until(lambda: kv_idle(engine), what="KV idle after the cycles")
    growth = process.memory_info().rss - rss_before
    assert growth < 16 * 1024 * 1024, f"RSS grew by {growth / 1e6:.1f} MB over 60 cycles"
    snapshot = engine.debug_streams()
    assert snapshot["requests_running"] == snapshot["requests_waiting"] == 0
