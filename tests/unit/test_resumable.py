"""Resumable streams with the fake backend: the replay log, detach on a dropped
connection, resume by GET and by POST with Last-Event-ID, the errors, the grace
period and the cap (the real model: tests/e2e/test_resumable_e2e.py)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

from drop_proxy import DropProxy
from edge_llm.client import ClientConfig, StreamClient
from edge_llm.engine.sequence import GenerationRequest, PauseCause
from edge_llm.errors import ResumeGap
from edge_llm.generation.resumable import ReplayLog
from edge_llm.observability.events import Event
from edge_llm.protocol.sse import SSEParser, parse_event_id
from edge_llm.server import ws_route

from conftest import app_engine
from fakes import FakeBackend, drain, text_script
from helpers import Recorder

ANSWER = "The quick brown fox jumps over the lazy dog, then naps in the warm sun." * 2
BODY = {
    "messages": [{"role": "user", "content": "Tell me"}],
    "max_tokens": 400,
    "stream": True,
    "stream_options": {"resumable": True},
}

MESSAGES_BODY = {"model": "fake", "max_tokens": 400, "stream": True, "messages": BODY["messages"]}

Served = Callable[..., Any]


def test_replay_log_numbers_frames_and_refuses_what_it_no_longer_holds() -> None:
    log: ReplayLog[bytes] = ReplayLog(3)
    assert [log.add(f"e{i}".encode()) for i in range(1, 6)] == [1, 2, 3, 4, 5]
    assert log.after(2) == [b"e3", b"e4", b"e5"]
    assert log.after(5) == []
    with pytest.raises(ResumeGap):
        log.after(1)  # frame 2 is gone
    with pytest.raises(ResumeGap):
        log.after(6)  # never sent
    small: ReplayLog[bytes] = ReplayLog(100, max_bytes=10)
    for _ in range(5):
        small.add(b"123456")
    assert small.after(4) == [b"123456"]  # the byte bound keeps the newest alone


def test_event_ids_parse() -> None:
    assert parse_event_id("ab12.7") == ("ab12", 7)
    assert parse_event_id(" ab.cd.0 ") == ("ab.cd", 0)
    for bad in ("ab12", "ab12.", ".3", "ab.-1", "ab.x"):
        assert parse_event_id(bad) is None


@pytest.fixture
def served(client_of) -> Served:
    async def make(**config: Any) -> tuple[TestClient, FakeBackend, Recorder]:
        backend = FakeBackend(text_script(ANSWER))
        backend.step_delay_s = 0.005
        recorder = Recorder()
        return await client_of(backend, events=recorder, **config), backend, recorder

    return make


class Reader:
    """Reads a streamed response event by event (the SDK's parser)."""

    def __init__(self, response: ClientResponse) -> None:
        self.response = response
        self.parser = SSEParser()
        self.pending: list[Any] = []

    async def next(self) -> Any:
        while not self.pending:
            data = await self.response.content.readany()
            self.pending += self.parser.feed(data) if data else self.parser.close()
            if not data and not self.pending:
                return None
        return self.pending.pop(0)

    async def all(self) -> list[Any]:
        events = []
        while (event := await self.next()) is not None:
            events.append(event)
        return events


def _text(events: list[Any]) -> str:
    chunks = [json.loads(e.data) for e in events if e.data != "[DONE]"]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


async def _read_then_drop(client: TestClient, n: int) -> tuple[str, list[Any]]:
    response = await client.post("/v1/chat/completions", json=BODY)
    assert response.status == 200
    stream_id = response.headers["X-Stream-Id"]
    reader = Reader(response)
    events = [await reader.next() for _ in range(n)]
    response.close()  # the connection drops
    return stream_id, events


async def test_dropped_stream_detaches_and_resumes_by_get(served: Served) -> None:
    client, _, recorder = await served()
    stream_id, first = await _read_then_drop(client, 10)
    assert len(stream_id) == 32 and int(stream_id, 16) >= 0  # 128 random bits, hex
    assert [parse_event_id(e.id) for e in first] == [(stream_id, n) for n in range(1, 11)]
    await recorder.wait_for(Event.DETACHED)
    engine = app_engine(client.app)
    (live,) = engine.live_handles()
    assert PauseCause.DISCONNECTED in live.seq.pause_causes
    assert engine.snapshot()["streams"][0]["state"] == "detached"
    generated = live.seq.n_generated

    resumed = await client.get(f"/v1/streams/{stream_id}", headers={"Last-Event-ID": first[-1].id})
    assert resumed.status == 200 and resumed.headers["X-Stream-Id"] == stream_id
    rest = await Reader(resumed).all()
    assert parse_event_id(rest[0].id) == (stream_id, 11)
    assert _text(first) + _text(rest) == ANSWER
    (paused,) = [p for p in recorder.of(Event.PAUSED) if p["cause"] == "disconnected"]
    assert paused["n_generated"] <= generated  # nothing generated while detached
    (back,) = [r for r in recorder.of(Event.RESUMED) if r["cause"] == "disconnected"]
    assert back["last_event"] == 10 and back["replayed"] >= 0


async def test_resume_by_post_and_after_the_end(served: Served) -> None:
    client, _, recorder = await served()
    stream_id, first = await _read_then_drop(client, 5)
    await recorder.wait_for(Event.DETACHED)
    again = await client.post(
        "/v1/chat/completions", json=BODY, headers={"Last-Event-ID": first[-1].id}
    )
    rest = await Reader(again).all()
    assert _text(first) + _text(rest) == ANSWER and rest[-1].data == "[DONE]"
    # The stream ended: a resume within the grace still gets what follows an event.
    late = await client.get(f"/v1/streams/{stream_id}", headers={"Last-Event-ID": rest[-3].id})
    tail = await Reader(late).all()
    assert [e.data for e in tail] == [e.data for e in rest[-2:]]
    assert len(app_engine(client.app).live_handles()) == 0


async def test_resume_errors(served: Served) -> None:
    client, _, _ = await served(api_key=["k1", "k2"], resume_buffer_events=4)
    k1 = {"Authorization": "Bearer k1"}
    response = await client.post("/v1/chat/completions", json=BODY, headers=k1)
    stream_id = response.headers["X-Stream-Id"]
    events = await Reader(response).all()
    assert len(events) > 8

    async def status(path: str, last: str | None, key: str = "k1") -> tuple[int, str]:
        headers = {"Authorization": f"Bearer {key}"}
        if last is not None:
            headers["Last-Event-ID"] = last
        got = await client.get(path, headers=headers)
        return got.status, (await got.json())["error"]["code"]

    assert await status(f"/v1/streams/{'0' * 32}", None) == (404, "stream_not_found")
    assert await status(f"/v1/streams/{stream_id}", f"{stream_id}.1") == (409, "resume_gap")
    assert await status(f"/v1/streams/{stream_id}", events[-1].id, key="k2") == (
        404,
        "stream_not_found",
    )
    assert await status(f"/v1/streams/{stream_id}", events[-1].id, key="nope") == (
        401,
        "invalid_api_key",
    )
    assert await status(f"/v1/streams/{stream_id}", "garbage") == (400, "invalid_request")
    ok = await client.get(
        f"/v1/streams/{stream_id}", headers={**k1, "Last-Event-ID": events[-2].id}
    )
    assert [e.data for e in await Reader(ok).all()] == ["[DONE]"]


async def test_not_resumed_in_time_is_cancelled_and_freed(served: Served) -> None:
    client, _, recorder = await served(resume_grace_ms=50)
    await _read_then_drop(client, 3)
    await recorder.wait_for(Event.RESUME_TIMEOUT)
    await recorder.wait_for(Event.KV_FREED)
    engine = app_engine(client.app)
    assert engine.live_handles() == []
    (cancel,) = recorder.of(Event.CANCEL)
    assert cancel["reason"] == "resume_timeout"


async def test_beyond_the_cap_a_drop_cancels(served: Served) -> None:
    client, _, recorder = await served(max_detached_streams=0)
    await _read_then_drop(client, 3)
    await recorder.wait_for(Event.CANCEL)
    assert recorder.of(Event.CANCEL)[0]["reason"] == "disconnect"
    assert Event.DETACHED not in recorder.names()


async def test_without_the_opt_in_nothing_changes(served: Served) -> None:
    client, _, _ = await served()
    body = {**BODY, "stream_options": {"include_usage": True}}
    response = await client.post("/v1/chat/completions", json=body)
    assert "X-Stream-Id" not in response.headers
    assert all(e.id is None for e in await Reader(response).all())
    off, _, _ = await served(resume_grace_ms=0)
    response = await off.post("/v1/chat/completions", json=BODY)
    assert "X-Stream-Id" not in response.headers


async def _frames_until(ws: Any, wanted: str, limit: int = 10_000) -> list[dict[str, Any]]:
    frames = []
    for _ in range(limit):
        frame = await ws.receive_json()
        frames.append(frame)
        if frame["type"] in (wanted, "error"):
            return frames
    raise AssertionError(f"no {wanted} frame")


async def test_websocket_stream_resumes_on_a_new_socket(served: Served) -> None:
    client, _, recorder = await served()
    body = {k: v for k, v in BODY.items() if k not in ("stream", "stream_options")}
    async with client.ws_connect("/v1/stream") as ws:
        await ws.send_json({"type": "start", "request": body, "resumable": True})
        started = await ws.receive_json()
        assert started["type"] == "started" and started["n"] == 1
        stream_id = started["stream_id"]
        first = [await ws.receive_json() for _ in range(8)]
    assert [f["n"] for f in first] == list(range(2, 10))
    await recorder.wait_for(Event.DETACHED)
    async with client.ws_connect("/v1/stream") as ws:
        await ws.send_json({"type": "resume", "stream_id": "0" * 32, "last_event_id": 3})
        assert (await ws.receive_json())["code"] == "stream_not_found"
        resume = {"type": "resume", "stream_id": stream_id, "last_event_id": first[-1]["n"]}
        await ws.send_json(resume)
        rest = await _frames_until(ws, "done")
        assert [f["n"] for f in rest] == list(range(10, 10 + len(rest)))
        frames = first + rest
        text = "".join(f["text"] for f in frames if f["type"] == "delta")
        assert text == ANSWER and rest[-1]["type"] == "done"
        # The socket is free again: a plain stream runs on it.
        await ws.send_json({"type": "start", "request": {**body, "max_tokens": 3}})
        plain = await _frames_until(ws, "done")
        assert all("n" not in f for f in plain)


async def test_a_websocket_resume_after_the_last_frame_is_refused_not_left_silent(
    served: Served,
) -> None:
    """An ended stream resumed after its last frame has nothing to replay; a WebSocket
    has no end of its own to show that, so the resume gets resume_gap at once (it got
    no frame at all before, and a client waited for one until its deadlines ran out)."""
    client, _, _ = await served()
    body = {k: v for k, v in BODY.items() if k not in ("stream", "stream_options")}
    async with client.ws_connect("/v1/stream") as ws:
        start = {"type": "start", "request": {**body, "max_tokens": 5}, "resumable": True}
        await ws.send_json(start)
        frames = await _frames_until(ws, "done")
    stream_id, last = frames[0]["stream_id"], frames[-1]["n"]
    async with client.ws_connect("/v1/stream") as ws:

        async def resumed_after(n: int) -> dict[str, Any]:
            await ws.send_json({"type": "resume", "stream_id": stream_id, "last_event_id": n})
            frame: dict[str, Any] = await asyncio.wait_for(ws.receive_json(), 10.0)
            return frame

        assert await resumed_after(last - 1) == frames[-1]  # the end, once more
        refused = await resumed_after(last)
        assert (refused["type"], refused["code"]) == ("error", "resume_gap")
        assert f"ended with event {last}" in refused["message"]
        assert (await resumed_after(last + 1))["code"] == "resume_gap"  # never sent


@pytest.mark.parametrize("resumable", [True, False])
async def test_a_websocket_stream_that_fails_inside_the_server_ends_with_an_error_frame(
    served: Served, monkeypatch: pytest.MonkeyPatch, resumable: bool
) -> None:
    """A bug in the stream's encoding (here the third event's report raises) ends the
    stream with an internal_error frame: the socket stays open and, without it, its
    client (or the one that resumes a resumable stream) would wait in silence."""
    reported = 0

    def report_then_fail(*args: Any) -> bool:
        nonlocal reported
        reported += 1
        if reported == 3:
            raise RuntimeError("a bug")
        return bool(report(*args))

    report = ws_route._report
    monkeypatch.setattr(ws_route, "_report", report_then_fail)
    client, _, recorder = await served()
    body = {k: v for k, v in BODY.items() if k not in ("stream", "stream_options")}
    async with client.ws_connect("/v1/stream") as ws:
        await ws.send_json({"type": "start", "request": body, "resumable": resumable})
        frames = await asyncio.wait_for(_frames_until(ws, "done"), 30.0)
    assert (frames[-1]["type"], frames[-1]["code"]) == ("error", "internal_error")
    await recorder.wait_for(Event.KV_FREED)  # the failed stream's sequence is freed
    if resumable:  # a resume before the error replays it
        async with client.ws_connect("/v1/stream") as ws:
            resume = {"stream_id": frames[0]["stream_id"], "last_event_id": frames[-2]["n"]}
            await ws.send_json({"type": "resume", **resume})
            assert await asyncio.wait_for(ws.receive_json(), 10.0) == frames[-1]


async def test_a_websocket_resume_lifts_the_old_sockets_pause(served: Served) -> None:
    """The client paused, then its socket dropped (a resume it sent may be lost with
    it): the new socket starts unpaused, as its protocol says, and the stream ends."""
    client, _, recorder = await served()
    body = {k: v for k, v in BODY.items() if k not in ("stream", "stream_options")}
    async with client.ws_connect("/v1/stream") as ws:
        await ws.send_json({"type": "start", "request": body, "resumable": True})
        first = [await ws.receive_json() for _ in range(5)]
        await ws.send_json({"type": "pause"})
        await recorder.wait_for(Event.PAUSE_RECEIVED)
    await recorder.wait_for(Event.DETACHED)
    async with client.ws_connect("/v1/stream") as ws:
        resume = {"type": "resume", "stream_id": first[0]["stream_id"], "last_event_id": 5}
        await ws.send_json(resume)
        rest = await asyncio.wait_for(_frames_until(ws, "done"), 10.0)
        text = "".join(f["text"] for f in first + rest if f["type"] == "delta")
        assert rest[-1]["type"] == "done" and text == ANSWER
        await ws.send_json({"type": "start", "request": {**body, "max_tokens": 3}})
        assert (await _frames_until(ws, "done"))[-1]["type"] == "done"  # the socket is free


@pytest.mark.parametrize("transport", ["sse", "ws"])
async def test_the_sdk_resumes_by_itself_through_drops(served: Served, transport: str) -> None:
    """Through a proxy that resets every connection after 700 to 1,500 bytes (an SSE
    event is some 300, a WebSocket frame some 150), the SDK's stream renders the whole
    answer once: no chunk twice, none lost, one attempt; over SSE and the WebSocket."""
    client, _, recorder = await served()
    proxy = DropProxy(client.server.port or 0, seed=7, cut=(700, 1500))
    url = await proxy.start()
    config = ClientConfig(base_url=url + "/v1", api_key="", resume_attempts=20)
    events = Recorder()
    try:
        async with StreamClient(config, event_log=events) as sdk:
            async with sdk.stream(
                BODY["messages"], max_tokens=400, temperature=0, transport=transport
            ) as stream:
                rendered = [text async for text in stream]
    finally:
        await proxy.close()
    assert proxy.resets >= 10
    assert "".join(rendered) == ANSWER
    assert stream.result.attempts == 1 and stream.result.finish_reason == "stop"
    resumes = [line for line in events.of(Event.RETRY) if line["cause"] == "resume"]
    assert len(resumes) >= proxy.resets - 1
    assert len(recorder.of(Event.ADMITTED)) == 1  # never asked again from the start


@pytest.mark.parametrize("transport", ["sse", "ws"])
async def test_the_sdk_resumes_after_connections_that_went_silent(
    served: Served, transport: str
) -> None:
    """Connections that go quiet without a reset (the proxy passes nothing more and
    reads nothing: the server's writes block once a few KiB are buffered). The SDK
    finds each dead after three missed heartbeats and resumes on a new one, whose
    silence counts from its own start; the server drops the quiet connection the
    stream is taken from, or replayed to, so that no write blocked there holds the
    stream back from the new one."""
    client, _, _ = await served()
    proxy = DropProxy(
        client.server.port or 0, seed=3, cut=(2000, 4000), silent=True, server_side_buffer=2048
    )
    url = await proxy.start()
    config = ClientConfig(
        base_url=url + "/v1", api_key="", heartbeat_interval_ms=100, require_heartbeat=True
    )
    try:
        async with StreamClient(config) as sdk:
            async with sdk.stream(BODY["messages"], max_tokens=400, transport=transport) as stream:
                rendered = await asyncio.wait_for(_all(stream), 30.0)
    finally:
        await proxy.close()
    assert proxy.resets >= 3
    assert "".join(rendered) == ANSWER and stream.result.attempts == 1


async def test_the_sdk_pauses_the_new_socket_while_its_queue_is_still_full(
    served: Served,
) -> None:
    """Dropped while the SDK had paused the WebSocket stream (its render queue past the
    high watermark, the caller not reading): the server starts the new socket
    unpaused, so the SDK pauses it again there; its resume follows once the caller
    drains the queue, and the text is whole."""
    client, _, recorder = await served()
    proxy = DropProxy(client.server.port or 0, seed=1, cut=(1 << 30, 1 << 31))  # no cut
    url = await proxy.start()
    config = ClientConfig(
        base_url=url + "/v1",
        api_key="",
        render_queue_capacity=16,
        render_queue_high_watermark=0.5,
        render_queue_low_watermark=0.1,
    )
    events = Recorder()
    try:
        async with StreamClient(config, event_log=events) as sdk:
            async with sdk.stream(BODY["messages"], max_tokens=400, transport="ws") as stream:
                await recorder.wait_for(Event.PAUSE_RECEIVED, timeout=10.0)
                proxy.reset_all()
                await recorder.wait_for(Event.DETACHED, timeout=10.0)
                await recorder.wait_for_count(Event.PAUSE_RECEIVED, 2, timeout=10.0)
                rendered = await asyncio.wait_for(_all(stream), 10.0)
    finally:
        await proxy.close()
    assert "".join(rendered) == ANSWER and stream.result.attempts == 1
    flow = [e["event"] for e in events.lines if e["event"] in (Event.PAUSE_SENT, Event.RESUME_SENT)]
    assert flow[:3] == [Event.PAUSE_SENT, Event.PAUSE_SENT, Event.RESUME_SENT]


async def _all(stream: Any) -> list[str]:
    return [text async for text in stream]


async def test_the_sdk_gives_up_after_its_resume_attempts(served: Served) -> None:
    client, _, _ = await served()
    proxy = DropProxy(client.server.port or 0, seed=7, cut=(300, 301))
    url = await proxy.start()
    config = ClientConfig(base_url=url + "/v1", api_key="", resume_attempts=0)
    try:
        async with StreamClient(config) as sdk:
            async with sdk.stream(BODY["messages"], max_tokens=400) as stream:
                with pytest.raises(Exception) as failed:
                    _ = [text async for text in stream]
    finally:
        await proxy.close()
    assert getattr(failed.value, "code", None) == "read_error"


def test_an_upstream_is_not_sent_the_resumable_option() -> None:
    from edge_llm.server.openai_routes import _relayable

    body = {"messages": [], "stream_options": {"include_usage": True, "resumable": True}}
    assert _relayable(body)["stream_options"] == {"include_usage": True}
    assert body["stream_options"]["resumable"] is True  # the request itself untouched
    plain = {"messages": []}
    assert _relayable(plain) is plain


@pytest.mark.parametrize(
    ("path", "body", "text_of"),
    [
        (
            "/v1/messages",
            {**MESSAGES_BODY, "resumable": True},
            lambda d: (d.get("delta") or {}).get("text") or "",
        ),
        (
            "/v1/responses",
            {"input": "Tell me", "stream": True, "stream_options": {"resumable": True}},
            lambda d: d.get("delta") or "" if d.get("type") == "response.output_text.delta" else "",
        ),
    ],
)
async def test_messages_and_responses_resume_too(
    served: Served, path: str, body: dict[str, Any], text_of: Callable[[dict[str, Any]], str]
) -> None:
    client, _, recorder = await served()
    response = await client.post(path, json=body)
    stream_id = response.headers["X-Stream-Id"]
    reader = Reader(response)
    first = [await reader.next() for _ in range(8)]
    response.close()
    await recorder.wait_for(Event.DETACHED)
    resumed = await client.get(f"/v1/streams/{stream_id}", headers={"Last-Event-ID": first[-1].id})
    rest = await Reader(resumed).all()
    events = first + rest
    assert [parse_event_id(e.id) for e in events] == [
        (stream_id, n) for n in range(1, len(events) + 1)
    ]
    assert "".join(text_of(json.loads(e.data)) for e in events) == ANSWER


async def test_detached_streams_are_offloaded_for_waiting_ones_and_resume_token_exact(
    engine_of,
) -> None:
    """The engine side alone: a detach is a pause (cause disconnected) that the usual
    idle rules offload while others wait for KV, that max_pause does not end (the
    grace bounds it), and whose resume continues token-exact."""
    backend = FakeBackend(kv_capacity_tokens=100, max_sequences=4)
    # One step at a time until both are detached: free-running, the engine can finish a
    # stream before this coroutine gets to detach it (seen in CI on a loaded machine).
    backend.gate = threading.Semaphore(0)
    # A ring that holds a whole answer: a waiting stream drained after the other never
    # pauses for socket_full, which max_pause would end (flaky on a loaded machine).
    engine = engine_of(
        backend, offload_paused_after_s=0.0, max_pause_s=0.01, outbound_buffer_tokens=64
    )
    detached = [engine.submit(GenerationRequest([1, 2, 3], max_tokens=40)) for _ in range(2)]
    for handle in detached:
        while handle.seq.n_generated < 3:
            backend.gate.release()
            assert await handle.wait_changed(10.0), "engine made no progress"
        engine.pause(handle, PauseCause.DISCONNECTED)
    backend.gate.release(10_000)
    waiting = [engine.submit(GenerationRequest([1, 2, 3], max_tokens=40)) for _ in range(2)]
    expected = "".join(f"t{t} " for t in range(10, 50))
    for handle in waiting:
        assert await drain(engine, handle) == expected
    assert engine.metrics.kv_offloads._value.get() >= 1  # the waiting ones got their KV
    assert all(h.seq.public_state() == "detached" for h in detached)
    assert engine.streams.count_detached() == 2 and not any(h.finished for h in detached)
    for handle in detached:
        engine.resume(handle, PauseCause.DISCONNECTED, replayed=0)
    for handle in detached:
        assert await drain(engine, handle) == expected
    assert engine.metrics.stream_resumes._value.get() == 2


async def test_the_stream_id_comes_at_once_and_delete_cancels_the_stream(served: Served) -> None:
    """Before any token (the model is held), the response headers name the stream;
    ``DELETE /v1/streams/{id}`` cancels it (reason client, KV freed, no detach), and
    only for the key that opened it."""
    client, backend, recorder = await served(api_key=["k1", "k2"])
    backend.gate = threading.Semaphore(0)
    mine, theirs = {"Authorization": "Bearer k1"}, {"Authorization": "Bearer k2"}
    response = await client.post("/v1/chat/completions", json=BODY, headers=mine)
    assert response.status == 200
    stream_id = response.headers["X-Stream-Id"]
    other = await client.delete(f"/v1/streams/{stream_id}", headers=theirs)
    assert other.status == 404
    deleted = await client.delete(f"/v1/streams/{stream_id}", headers=mine)
    assert deleted.status == 200 and (await deleted.json())["deleted"] is True
    backend.gate.release(10_000)
    await recorder.wait_for(Event.END)
    (cancel,) = recorder.of(Event.CANCEL)
    assert cancel["reason"] == "client" and not recorder.of(Event.DETACHED)
    response.close()
    gone = await client.get(f"/v1/streams/{stream_id}", headers=mine)
    assert gone.status == 404


async def test_the_sdk_cancels_a_resumable_stream_it_gives_up(served: Served) -> None:
    """The TTFT hard time-out of a resumable SSE stream: the SDK deletes the stream
    (closing the connection would only detach it and keep its KV)."""
    client, backend, recorder = await served()
    backend.gate = threading.Semaphore(0)
    config = ClientConfig(
        base_url=str(client.make_url("/v1")), api_key="", ttft_hard_timeout_ms=300,
        retry={"max_attempts": 1},
    )  # fmt: skip
    events = Recorder()
    async with StreamClient(config, event_log=events) as sdk:
        with pytest.raises(Exception) as failed:
            await sdk.complete(BODY["messages"], max_tokens=400)
    assert getattr(failed.value, "code", None) == "ttft_timeout"
    (sent,) = events.of(Event.CANCEL_SENT)
    assert (sent["reason"], sent["method"]) == ("ttft_timeout", "delete")
    backend.gate.release(10_000)
    await recorder.wait_for(Event.END)
    assert [c["reason"] for c in recorder.of(Event.CANCEL)] == ["client"]
    assert not recorder.of(Event.DETACHED)
    await recorder.wait_for(Event.KV_FREED)
    assert (await (await client.get("/debug/streams")).json())["kv_used_bytes"] == 0
