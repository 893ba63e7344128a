"""Priorities and progress through the HTTP and WebSocket server, over the fake backend."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import threading
from typing import Any

import openai
from aiohttp.test_utils import TestClient

from edge_llm.protocol import sse

from fakes import FakeBackend, text_script
from helpers import sse_events

CHAT: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
ROUTES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": {"prompt": "hi", "max_tokens": 3},
    "/v1/responses": {"input": "hi", "max_output_tokens": 3},
    "/v1/messages": {**CHAT, "model": "claude-x"},
}
LONG_PROMPT = "a long question " * 6  # about a hundred tokens of the fake's


async def priority_of(client: TestClient, request_id: str) -> int:
    debug = await client.get("/debug/streams", headers={"x-api-key": "k2"})  # when keys are on
    document = await debug.json()
    (stream,) = [s for s in document["streams"] if s["id"] == request_id]
    return int(stream["priority"])


async def post(client: TestClient, path: str, body: dict[str, Any], **headers: str) -> str:
    """The request id of a request that must succeed."""
    response = await client.post(path, json=body, headers=headers)
    assert response.status == 200, await response.text()
    await response.read()
    return response.headers["X-Request-Id"]


async def ws_start(
    client: TestClient, body: dict[str, Any], **headers: str
) -> list[dict[str, Any]]:
    """The frames of one stream over ``/v1/stream``, until done or error."""
    frames = []
    async with client.ws_connect("/v1/stream", headers=headers) as ws:
        await ws.send_json({"type": "start", "request": body})
        while not frames or frames[-1]["type"] not in ("done", "error"):
            frames.append(await ws.receive_json(timeout=10))
    return frames


async def test_every_route_gives_the_engine_the_class_asked_for(client_of) -> None:
    client = await client_of()
    for path, body in ROUTES.items():
        request_id = await post(client, path, {**body, "priority": 7})
        assert await priority_of(client, request_id) == 7, path
    frames = await ws_start(client, {**CHAT, "priority": -4})
    assert frames[0]["type"] == "started"
    assert await priority_of(client, frames[0]["id"]) == -4


async def test_body_then_header_then_key_then_route_then_zero(client_of) -> None:
    client = await client_of(
        api_key=["k1", "k2"],
        key_priority=["k1=4"],
        route_priority=["/v1/chat/completions=6", "/v1/stream=-6"],
    )
    k1, k2 = {"Authorization": "Bearer k1"}, {"x-api-key": "k2"}
    path = "/v1/chat/completions"
    cases: list[tuple[dict[str, Any], dict[str, str], int]] = [
        ({}, k2, 6),  # the route's default
        ({}, k1, 4),  # the key's beats the route's
        ({}, {**k1, "X-Priority": "2"}, 2),  # the header beats the key's
        ({"service_tier": "flex"}, {**k1, "X-Priority": "2"}, 1),  # the body beats the header
        ({"service_tier": "flex", "priority": -5}, {**k1, "X-Priority": "2"}, -5),
    ]
    for fields, headers, expected in cases:
        request_id = await post(client, path, {**CHAT, **fields}, **headers)
        assert await priority_of(client, request_id) == expected, (fields, headers)
    assert (
        await priority_of(
            client, await post(client, "/v1/completions", ROUTES["/v1/completions"], **k2)
        )
        == 0
    )
    frames = await ws_start(client, CHAT, **k2)
    assert await priority_of(client, frames[0]["id"]) == -6
    frames = await ws_start(client, CHAT, **k1, **{"X-Priority": "3"})
    assert await priority_of(client, frames[0]["id"]) == 3


async def test_without_keys_required_a_presented_key_still_has_its_default(client_of) -> None:
    client = await client_of(key_priority=["team-batch=8"])
    path, body = "/v1/chat/completions", ROUTES["/v1/chat/completions"]
    request_id = await post(client, path, body, Authorization="Bearer team-batch")
    assert await priority_of(client, request_id) == 8
    assert await priority_of(client, await post(client, path, body)) == 0


async def test_bad_priorities_are_400s_naming_the_field(client_of) -> None:
    client = await client_of()
    for path, body in ROUTES.items():
        response = await client.post(path, json={**body, "priority": 42})
        assert response.status == 400, path
        text = await response.text()
        assert "priority" in text, path
        response = await client.post(path, json=body, headers={"X-Priority": "urgent"})
        assert response.status == 400, path
        assert "X-Priority" in await response.text(), path
    response = await client.post(
        "/v1/messages", json={**ROUTES["/v1/messages"], "service_tier": "flex"}
    )
    error = (await response.json())["error"]
    assert (response.status, error["type"]) == (400, "invalid_request_error")  # Anthropic's shape
    assert "service_tier" in error["message"]
    upgrade = await client.get("/v1/stream", headers={"X-Priority": "99"})
    assert upgrade.status == 400
    assert (await upgrade.json())["error"]["param"] == "X-Priority"
    frames = await ws_start(client, {**CHAT, "service_tier": "rush"})
    assert frames[-1]["type"] == "error"
    assert frames[-1]["param"] == "service_tier"


# -- progress on SSE ------------------------------------------------------------------------


def normalised(body: bytes) -> bytes:
    """A stream's bytes with its random id and its clock removed."""
    body = re.sub(rb'"id":"[^"]+"', b'"id":"ID"', body)
    return re.sub(rb'"created":\d+', b'"created":0', body)


async def test_without_opt_in_the_stream_is_byte_for_byte_as_before(client_of) -> None:
    client = await client_of(FakeBackend(text_script("ok")))
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    response = await client.post("/v1/chat/completions", json=body)
    chunk = (
        '{"id":"ID","object":"chat.completion.chunk","created":0,"model":"fake",'
        '"choices":[{"index":0,"delta":%s,"finish_reason":%s}]}'
    )
    usage = (
        '{"id":"ID","object":"chat.completion.chunk","created":0,"model":"fake","choices":[],'
        '"usage":{"prompt_tokens":19,"completion_tokens":3,"total_tokens":22,'
        '"prompt_tokens_details":{"cached_tokens":0}}}'
    )
    events = [
        chunk % ('{"role":"assistant","content":""}', "null"),
        chunk % ('{"content":"o"}', "null"),
        chunk % ('{"content":"k"}', "null"),
        chunk % ('{"content":""}', '"stop"'),
        usage,
        "[DONE]",
    ]
    expected = "".join(f"data: {e}\n\n" for e in events).encode()
    assert normalised(await response.read()) == expected


async def test_without_opt_in_a_waiting_stream_sends_only_pings(client_of) -> None:
    backend = FakeBackend(text_script("ok"))
    backend.gate = threading.Semaphore(0)
    client = await client_of(backend, heartbeat_interval_ms=10)
    response = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    waited = await response.content.readexactly(3 * len(sse.PING))
    assert waited == 3 * sse.PING
    backend.gate.release(1000)
    rest = await response.read()
    assert b"progress" not in rest


async def test_progress_comes_in_order_queued_prefill_then_tokens(client_of) -> None:
    backend = FakeBackend(text_script("answer"), max_sequences=1)
    backend.gate = threading.Semaphore(0)
    # No heartbeat in the test's time: every progress chunk is a change.
    client = await client_of(
        backend, max_sequences=1, prefill_chunk_tokens=8, heartbeat_interval_ms=600_000
    )
    holder = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
    assert await asyncio.to_thread(backend.at_gate.wait, 10)  # the only slot is taken
    body = {"messages": [{"role": "user", "content": LONG_PROMPT}], "stream": True}
    response = await client.post("/v1/chat/completions", json={**body, "return_progress": True})
    first = json.loads((await response.content.readuntil(b"\n\n"))[len(b"data: ") :])
    assert first["choices"] == []
    progress = first["progress"]
    assert (progress["state"], progress["queue_position"], progress["prefill_done"]) == (
        "queued",
        1,
        0,
    )
    assert progress["prefill_total"] > 8 * 3
    assert isinstance(progress["predicted_wait_ms"], int)
    backend.step_delay_s = 0.05  # each prefill chunk is seen before the next
    backend.gate.release(10_000)
    events = [data for _, data in sse_events(await response.read()) if data is not None]
    await (await holder).read()
    kinds = [
        e["progress"]["state"] if "progress" in e else "token"
        for e in events
        if e["choices"] or "progress" in e
    ]
    first_token = kinds.index("token")
    assert "prefill" in kinds[:first_token]
    order = ["queued", "prefill", "decoding"].index  # decoding: prefilled, no token yet
    assert kinds[:first_token] == sorted(kinds[:first_token], key=order)
    assert set(kinds[first_token:]) == {"token"}  # nothing changed once tokens flowed
    steps = [
        (e["progress"]["state"], e["progress"]["prefill_done"]) for e in events if "progress" in e
    ]
    assert [n for _, n in steps] == sorted(n for _, n in steps)
    assert all(a != b for a, b in itertools.pairwise([("queued", 0), *steps]))  # no repeats
    content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert content == "answer"


async def test_the_openai_sdk_reads_a_stream_with_progress_chunks(client_of) -> None:
    backend = FakeBackend(text_script("fine"))
    backend.gate = threading.Semaphore(0)
    client = await client_of(backend, heartbeat_interval_ms=10)
    sdk = openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="none", max_retries=0)
    stream = await sdk.chat.completions.create(
        model="fake",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        extra_body={"return_progress": True},
    )
    chunks = []
    async for chunk in stream:
        chunks.append(chunk)
        if len(chunks) == 3:
            backend.gate.release(1000)  # three progress chunks came while it was held
    progress = [c for c in chunks if not c.choices]
    assert len(progress) >= 3
    assert (progress[0].model_extra or {})["progress"]["state"] in ("queued", "prefill")
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "fine"
    completions = await sdk.completions.create(
        model="fake",
        prompt="hi",
        stream=True,
        extra_body={"stream_options": {"include_progress": True}},
    )
    pieces = [c async for c in completions]
    assert "progress" in (pieces[0].model_extra or {})
    assert "".join(c.choices[0].text for c in pieces if c.choices) == "fine"
    await sdk.close()


async def test_websocket_heartbeats_carry_the_queue_position_and_wait(client_of) -> None:
    backend = FakeBackend(text_script("ok"), max_sequences=1)
    backend.gate = threading.Semaphore(0)
    client = await client_of(backend, max_sequences=1, heartbeat_interval_ms=10)
    holder = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
    assert await asyncio.to_thread(backend.at_gate.wait, 10)
    async with client.ws_connect("/v1/stream") as ws:
        await ws.send_json({"type": "start", "request": CHAT})
        assert (await ws.receive_json(timeout=10))["type"] == "started"
        beat = await ws.receive_json(timeout=10)
        backend.gate.release(10_000)
        while (await ws.receive_json(timeout=10))["type"] != "done":
            pass
    await (await holder).read()
    assert beat["type"] == "heartbeat"
    assert (beat["state"], beat["queue_position"]) == ("queued", 1)
    assert isinstance(beat["predicted_wait_ms"], int)
    assert (beat["prefill_done"], beat["prefill_total"]) == (0, 19)
