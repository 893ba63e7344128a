"""Upstream engines behind the same contract, with real servers: two more
``edge-llm serve`` processes as OpenAI-compatible upstreams of a third."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from edge_llm.doctor.result import Status
from edge_llm.doctor.upstreams import check_upstreams

from conftest import EngineProcess, start_engine
from helpers import next_frame
from support import STORY, chat_body, wait_until

pytestmark = pytest.mark.e2e

UP_MODEL = "up-model"
# More than the front's max_prompt_tokens (200), fine for the upstreams (512).
LONG_PROMPT = "Summarise: " + "the river runs to the sea and back again. " * 30


@pytest.fixture(scope="module")
def upstream_one(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    engine = start_engine(
        tmp_path_factory.mktemp("up1"), "--model-id", UP_MODEL, "--max-pause-ms", "600000"
    )
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def upstream_two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """Killed by the failover test (the last one of the module)."""
    engine = start_engine(
        tmp_path_factory.mktemp("up2"), "--model-id", UP_MODEL, "--max-pause-ms", "600000"
    )
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def front(
    tmp_path_factory: pytest.TempPathFactory,
    upstream_one: EngineProcess,
    upstream_two: EngineProcess,
) -> Iterator[EngineProcess]:
    """Two local slots and no queue, a 200-token prompt limit; ``two`` serves
    up-model first, ``one`` (models learnt from its /v1/models) also takes
    what the device refuses. No periodic health check during the tests: only
    what the requests see marks an upstream down."""
    tmp = tmp_path_factory.mktemp("front")
    config = tmp / "front.toml"
    config.write_text(
        "[engine.backpressure]\nmax_prompt_tokens = 200\n"
        "[engine.scheduler]\nmax_sequences = 2\nmax_queue = 0\n"
        "[server]\nupstream_health_interval_ms = 600000\nupstream_receive_buffer_bytes = 4096\n"
        f'[upstream.two]\nurl = "{upstream_two.url}"\nmodels = ["{UP_MODEL}"]\n'
        f'[upstream.one]\nurl = "{upstream_one.base_url}/"\nfallback = true\n',
        encoding="utf-8",
    )
    engine = start_engine(tmp, "--config", str(config), "--max-pause-ms", "600000")
    yield engine
    engine.stop()


def _ws_url(engine: EngineProcess) -> str:
    return engine.base_url.replace("http", "ws") + "/stream"


def _upstream_of(
    front: EngineProcess, stream_id: str, processes: dict[str, EngineProcess]
) -> EngineProcess:
    return processes[front.stream(stream_id)["backend"]]


def _by_session(engine: EngineProcess, session: str) -> dict[str, Any] | None:
    for stream in engine.debug_streams()["streams"]:
        if stream["session"] == session:
            return dict(stream)
    return None


async def _sse(url: str, body: dict[str, Any]) -> tuple[str, list[dict[str, Any]], str]:
    """(X-Request-Id, the chunk objects, the raw body) of one streamed request."""
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/chat/completions", json=body) as response:
            assert response.status == 200, await response.text()
            raw = (await response.read()).decode()
            request_id = response.headers["X-Request-Id"]
    chunks = [
        json.loads(line[6:])
        for line in raw.split("\n")
        if line.startswith("data: {")
    ]  # fmt: skip
    return request_id, chunks, raw


def _content(chunks: list[dict[str, Any]]) -> str:
    return "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices")
    )


def _routed(front: EngineProcess, request_id: str) -> dict[str, Any]:
    return next(
        e for e in front.events() if e["event"] == "routed" and e["request_id"] == request_id
    )


def test_models_lists_local_and_upstream(front: EngineProcess) -> None:
    listing = front.get_json("/v1/models")["data"]
    owners = {model["id"]: model["owned_by"] for model in listing}
    assert owners == {"SmolLM2-135M-Instruct": "edge-llm", UP_MODEL: "two"}


async def test_routes_by_model_name(front: EngineProcess, upstream_two: EngineProcess) -> None:
    session = uuid.uuid4().hex
    body = chat_body("Name the capital of France.", max_tokens=16, model=UP_MODEL, user=session)
    request_id, chunks, raw = await _sse(front.url, body)
    assert "Paris" in _content(chunks)
    assert raw.endswith("data: [DONE]\n\n")
    assert {c["model"] for c in chunks} == {UP_MODEL}
    assert {c["id"] for c in chunks} == {request_id}
    assert front.stream(request_id)["backend"] == "two"
    upstream_side = _by_session(upstream_two, session)
    assert upstream_side is not None and upstream_side["state"] == "done"
    assert _routed(front, request_id)["route"] == "model"
    local_id, local_chunks, _ = await _sse(front.url, chat_body("Say hello.", max_tokens=8))
    assert front.stream(local_id)["backend"] == "local"
    assert _content(local_chunks)


async def test_non_streaming_over_an_upstream(front: EngineProcess) -> None:
    body = chat_body("Name the capital of France.", max_tokens=16, model=UP_MODEL, stream=False)
    async with aiohttp.ClientSession() as session:
        async with session.post(front.base_url + "/chat/completions", json=body) as response:
            assert response.status == 200
            completion = await response.json()
    assert completion["object"] == "chat.completion"
    assert completion["model"] == UP_MODEL
    assert "Paris" in completion["choices"][0]["message"]["content"]
    assert completion["usage"]["completion_tokens"] > 0


async def test_unknown_model_is_404_listing_all(front: EngineProcess) -> None:
    async with aiohttp.ClientSession() as session:
        body = chat_body("hi", model="no-such-model")
        async with session.post(front.base_url + "/chat/completions", json=body) as response:
            assert response.status == 404
            error = (await response.json())["error"]
    assert error["code"] == "model_not_found"
    assert set(error["available"]) == {"SmolLM2-135M-Instruct", UP_MODEL}


async def test_fallback_on_prompt_too_long(
    front: EngineProcess, upstream_one: EngineProcess
) -> None:
    session = uuid.uuid4().hex
    request_id, chunks, _ = await _sse(
        front.url, chat_body(LONG_PROMPT, max_tokens=8, user=session)
    )
    assert _content(chunks)
    assert {c["model"] for c in chunks} == {"SmolLM2-135M-Instruct"}  # what the client asked
    assert front.stream(request_id)["backend"] == "one"
    assert _routed(front, request_id)["route"] == "fallback_prompt_too_long"
    upstream_side = _by_session(upstream_one, session)
    assert upstream_side is not None and upstream_side["n_prompt_tokens"] > 200


async def test_fallback_on_full_queue(front: EngineProcess) -> None:
    """Both local slots held by paused streams and no queue: the next request
    for the local model is served by the fallback upstream."""
    async with aiohttp.ClientSession() as session:
        sockets = [await session.ws_connect(_ws_url(front)) for _ in range(2)]
        try:
            for ws in sockets:
                await ws.send_json({"type": "start", "request": chat_body(STORY, max_tokens=400)})
                await next_frame(ws, "delta")
                await ws.send_json({"type": "pause"})
                await next_frame(ws, "paused")
            request_id, chunks, _ = await _sse(front.url, chat_body("Say hello.", max_tokens=8))
        finally:
            for ws in sockets:
                await ws.close()
    assert _content(chunks)
    assert front.stream(request_id)["backend"] == "one"
    assert _routed(front, request_id)["route"] == "fallback_queue_full"


@pytest.mark.timeout(600)  # the upstream must generate its way into full buffers first
async def test_cancel_closes_the_upstream_request_while_it_sends_nothing(
    front: EngineProcess, upstream_one: EngineProcess, upstream_two: EngineProcess
) -> None:
    """CANCEL closes the upstream connection at once, not at the upstream's next
    write: the client pauses, the upstream's stream fills the buffers and is paused
    (it writes nothing more), and the cancel still reaches it, with no token
    generated in between."""
    session = uuid.uuid4().hex
    cancels_before = front.metric("edge_llm_backend_cancellations_total", absent=0.0)
    body = chat_body(STORY, max_tokens=1000, model=UP_MODEL, user=session)
    async with aiohttp.ClientSession() as client, client.ws_connect(_ws_url(front)) as ws:
        await ws.send_json({"type": "start", "request": body})
        stream_id = (await next_frame(ws, "started"))["id"]
        await next_frame(ws, "delta")
        upstream = _upstream_of(front, stream_id, {"one": upstream_one, "two": upstream_two})
        await ws.send_json({"type": "pause"})
        await next_frame(ws, "paused")
        stalled = await wait_until(
            lambda: (s := _by_session(upstream, session)) and s["state"] == "paused" and s,
            timeout=400.0,
            what="the upstream to pause the unread stream",
        )
        await ws.send_json({"type": "cancel"})
        error = await next_frame(ws, "error")
    gone = await wait_until(
        lambda: (s := _by_session(upstream, session)) and s["state"] == "cancelled" and s,
        what="the upstream to cancel the request",
    )
    assert gone["cancel_reason"] == "disconnect"  # the connection was closed
    assert gone["n_generated"] == stalled["n_generated"]
    assert error["code"] == "cancelled"
    assert front.stream(stream_id)["cancel_reason"] == "client"
    assert front.metric("edge_llm_backend_cancellations_total") == cancels_before + 1


# -- Responses and Messages over an upstream (relayed as chat completions) ----------------


async def _post_events(
    url: str, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """(X-Request-Id, [(event name, data)]) of one streamed Responses or Messages request."""
    async with aiohttp.ClientSession() as session:
        async with session.post(url + path, json=body, headers=headers) as response:
            assert response.status == 200, await response.text()
            raw = (await response.read()).decode()
            request_id = response.headers["X-Request-Id"]
    events = []
    for block in raw.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line)
        if "event" in fields:
            events.append((fields["event"], json.loads(fields["data"])))
    return request_id, events


async def _upstream_chat_text(engine: EngineProcess, content: str, max_tokens: int) -> str:
    """What the upstream answers when asked directly (greedy)."""
    body = chat_body(content, max_tokens=max_tokens, model=UP_MODEL, stream=False)
    async with aiohttp.ClientSession() as session:
        async with session.post(engine.base_url + "/chat/completions", json=body) as response:
            assert response.status == 200
            return str((await response.json())["choices"][0]["message"]["content"])


def _folded(names: list[str]) -> list[str]:
    return [name for n, name in enumerate(names) if n == 0 or names[n - 1] != name]


async def test_responses_stream_over_an_upstream_is_what_it_generated(
    front: EngineProcess, upstream_one: EngineProcess, upstream_two: EngineProcess
) -> None:
    body = {"model": UP_MODEL, "input": STORY, "max_output_tokens": 24, "temperature": 0,
            "stream": True}  # fmt: skip
    request_id, events = await _post_events(front.base_url, "/responses", body)
    names = [name for name, _ in events]
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert _folded(names) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",  # max_output_tokens reached
    ]
    text = "".join(d["delta"] for name, d in events if name == "response.output_text.delta")
    final = events[-1][1]["response"]
    assert final["model"] == UP_MODEL and final["output"][0]["content"][0]["text"] == text
    assert final["usage"]["output_tokens"] == 24 and final["usage"]["input_tokens"] > 0
    upstream = _upstream_of(front, request_id, {"one": upstream_one, "two": upstream_two})
    assert text == await _upstream_chat_text(upstream, STORY, 24)
    assert _routed(front, request_id)["route"] == "model"


async def test_messages_stream_over_an_upstream_is_what_it_generated(
    front: EngineProcess, upstream_one: EngineProcess, upstream_two: EngineProcess
) -> None:
    body = {"model": UP_MODEL, "max_tokens": 24, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": STORY}]}  # fmt: skip
    request_id, events = await _post_events(front.base_url, "/messages", body)
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "ping"]  # later pings: heartbeats of a slow stream
    assert _folded([name for name in names if name != "ping"]) == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[0][1]["message"]["model"] == UP_MODEL
    text = "".join(d["delta"]["text"] for name, d in events if name == "content_block_delta")
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] == "max_tokens" and delta["usage"]["output_tokens"] == 24
    upstream = _upstream_of(front, request_id, {"one": upstream_one, "two": upstream_two})
    assert text == await _upstream_chat_text(upstream, STORY, 24)


@pytest.mark.parametrize("path", ["/responses", "/messages"])
async def test_responses_and_messages_not_streamed_over_an_upstream(
    front: EngineProcess, path: str
) -> None:
    question = [{"role": "user", "content": "Name the capital of France."}]
    body = {"model": UP_MODEL, "temperature": 0, "max_output_tokens": 16, "input": question}
    if path == "/messages":
        body = {"model": UP_MODEL, "temperature": 0, "max_tokens": 16, "messages": question}
    async with aiohttp.ClientSession() as session:
        async with session.post(front.base_url + path, json=body) as response:
            assert response.status == 200, await response.text()
            answer = await response.json()
            request_id = response.headers["X-Request-Id"]
    blocks = answer["output"][0]["content"] if path == "/responses" else answer["content"]
    assert answer["model"] == UP_MODEL and "Paris" in blocks[0]["text"]
    assert front.stream(request_id)["backend"] in ("one", "two")


@pytest.mark.parametrize("path", ["/responses", "/messages"])
async def test_responses_and_messages_fall_back_on_prompt_too_long(
    front: EngineProcess, upstream_one: EngineProcess, path: str
) -> None:
    session = uuid.uuid4().hex
    turns = [{"role": "user", "content": LONG_PROMPT}]
    body: dict[str, Any] = {"input": turns, "max_output_tokens": 8, "user": session}
    if path == "/messages":
        body = {"model": "SmolLM2-135M-Instruct", "max_tokens": 8, "messages": turns}
    headers = {"X-Session-Id": session}
    request_id, events = await _post_events(front.base_url, path, {**body, "stream": True}, headers)
    assert events[-1][0] in ("response.incomplete", "response.completed", "message_stop")
    assert front.stream(request_id)["backend"] == "one"
    assert _routed(front, request_id)["route"] == "fallback_prompt_too_long"
    upstream_side = _by_session(upstream_one, session)
    assert upstream_side is not None and upstream_side["n_prompt_tokens"] > 200


@pytest.mark.parametrize(
    ("path", "marker"),
    [("/responses", b"response.output_text.delta"), ("/messages", b"content_block_delta")],
)
async def test_disconnect_from_responses_or_messages_cancels_the_upstream_request(
    front: EngineProcess,
    upstream_one: EngineProcess,
    upstream_two: EngineProcess,
    path: str,
    marker: bytes,
) -> None:
    session = uuid.uuid4().hex
    turns = [{"role": "user", "content": STORY}]
    body: dict[str, Any] = {"input": turns, "max_output_tokens": 400, "user": session}
    if path == "/messages":
        body = {"max_tokens": 400, "messages": turns}
    async with aiohttp.ClientSession() as client:
        response = await client.post(
            front.base_url + path,
            json={**body, "model": UP_MODEL, "stream": True},
            headers={"X-Session-Id": session},
        )
        request_id = response.headers["X-Request-Id"]
        await asyncio.wait_for(response.content.readuntil(marker), 120)
        upstream = _upstream_of(front, request_id, {"one": upstream_one, "two": upstream_two})
        response.close()  # the client goes away mid-answer
    gone = await wait_until(
        lambda: (s := _by_session(upstream, session)) and s["state"] == "cancelled" and s,
        timeout=30.0,
        what="the upstream to cancel the request",
    )
    assert gone["cancel_reason"] == "disconnect" and gone["n_generated"] < 400
    assert front.stream(request_id)["cancel_reason"] == "disconnect"


async def test_text_completions_over_an_upstream(front: EngineProcess) -> None:
    body = {"model": UP_MODEL, "prompt": "The capital of France is", "max_tokens": 8,
            "temperature": 0, "stream": True}  # fmt: skip
    async with aiohttp.ClientSession() as session:
        async with session.post(front.base_url + "/completions", json=body) as response:
            assert response.status == 200
            raw = (await response.read()).decode()
            request_id = response.headers["X-Request-Id"]
    chunks = [json.loads(line[6:]) for line in raw.split("\n") if line.startswith("data: {")]
    assert "Paris" in "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert {c["model"] for c in chunks} == {UP_MODEL} and raw.endswith("data: [DONE]\n\n")
    assert front.stream(request_id)["backend"] in ("one", "two")


@pytest.mark.timeout(600)  # the upstream must generate its way into full buffers first
async def test_pause_stops_reading_the_upstream_while_local_streams_run(
    front: EngineProcess, upstream_one: EngineProcess, upstream_two: EngineProcess
) -> None:
    """PAUSE stops reading: TCP backpressure reaches the upstream (an edge-llm
    pauses the sequence, socket_full) and nothing more is read meanwhile; the
    local streams run to their end; RESUME lets the upstream go on."""
    session = uuid.uuid4().hex
    body = chat_body(STORY, max_tokens=1000, model=UP_MODEL, user=session)
    async with aiohttp.ClientSession() as client, client.ws_connect(_ws_url(front)) as ws:
        await ws.send_json({"type": "start", "request": body})
        stream_id = (await next_frame(ws, "started"))["id"]
        await next_frame(ws, "delta")
        await ws.send_json({"type": "pause"})
        assert (await next_frame(ws, "paused"))["cause"] == "client"
        upstream = _upstream_of(front, stream_id, {"one": upstream_one, "two": upstream_two})
        stalled = await wait_until(
            lambda: (s := _by_session(upstream, session)) and s["state"] == "paused" and s,
            timeout=400.0,
            what="the upstream to pause the unread stream",
        )
        assert stalled["pause_cause"] == "socket_full"
        assert stalled["n_generated"] < 1000
        read_before = front.stream(stream_id)["ring_write"]
        local = await asyncio.gather(
            *(_sse(front.url, chat_body(f"Count to {n}.", max_tokens=24)) for n in (5, 9))
        )
        assert all(_content(chunks) for _, chunks, _ in local)
        assert all(front.stream(request_id)["backend"] == "local" for request_id, _, _ in local)
        assert front.stream(stream_id)["ring_write"] == read_before
        assert front.stream(stream_id)["state"] == "paused"
        still = _by_session(upstream, session)
        assert still is not None and still["n_generated"] == stalled["n_generated"]
        await ws.send_json({"type": "resume"})
        await next_frame(ws, "resumed")
        await wait_until(
            lambda: (
                (s := _by_session(upstream, session)) and s["n_generated"] > still["n_generated"]
            ),
            timeout=120.0,
            what="the upstream to generate again",
        )
        await ws.send_json({"type": "cancel"})


async def test_failover_when_an_upstream_is_killed(
    front: EngineProcess, upstream_one: EngineProcess, upstream_two: EngineProcess
) -> None:
    """Killed mid-stream: the client gets an error after what it had, nothing
    replayed. The next request goes to the other upstream."""
    async with aiohttp.ClientSession() as session:
        body = chat_body(STORY, max_tokens=600, model=UP_MODEL)
        async with session.post(front.base_url + "/chat/completions", json=body) as response:
            request_id = response.headers["X-Request-Id"]
            assert front.stream(request_id)["backend"] == "two"
            await response.content.readuntil(b'"content":"')  # content flows
            upstream_two.proc.kill()
            upstream_two.proc.wait()
            rest = (await response.read()).decode()
    assert '"code":"upstream_error"' in rest
    assert "[DONE]" not in rest
    assert front.stream(request_id)["error"] == "upstream_error"
    retried_id, chunks, _ = await _sse(
        front.url, chat_body("Name the capital of France.", max_tokens=12, model=UP_MODEL)
    )
    assert "Paris" in _content(chunks)
    assert front.stream(retried_id)["backend"] == "one"
    health = {u["name"]: u["healthy"] for u in front.debug_streams()["upstreams"]}
    assert health == {"one": True, "two": False}
    async with aiohttp.ClientSession() as session:
        doctor = await check_upstreams(session, front.base_url, "")
    assert doctor is not None and doctor.status is Status.WARN
    assert "upstream unreachable: two" in doctor.summary
