"""Background responses (Responses API ``background: true``) over the fake backend:
created queued, read and streamed back from any event, cancelled, forgotten after
the retention period, another key's invisible, the lowest class by default (the real
model and the official SDK: tests/e2e/test_background_e2e.py)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from edge_llm.engine.sequence import PauseCause
from edge_llm.protocol.priority import MAX_PRIORITY

from conftest import app_engine
from fakes import FakeBackend, text_script
from helpers import sse_events

ANSWER = "The quick brown fox jumps over the lazy dog, then naps in the warm sun."
BODY: dict[str, Any] = {"input": "Tell me", "max_output_tokens": 200, "background": True}
TERMINAL = ("completed", "incomplete", "failed", "cancelled")

Served = Callable[..., Any]


@pytest.fixture
def served(client_of) -> Served:
    async def make(**config: Any) -> tuple[TestClient, FakeBackend]:
        backend = FakeBackend(text_script(ANSWER), **config.pop("backend", {}))
        backend.step_delay_s = 0.002
        return await client_of(backend, **config), backend

    return make


async def create(client: TestClient, body: dict[str, Any] = BODY, **headers: str) -> Any:
    response = await client.post("/v1/responses", json=body, headers=headers)
    assert response.status == 200, await response.text()
    return await response.json()


async def until_ended(client: TestClient, response_id: str, **headers: str) -> Any:
    """Poll ``GET /v1/responses/{id}`` until its status is terminal (as the SDK's
    users do), within a bound."""
    for _ in range(2000):
        got = await client.get(f"/v1/responses/{response_id}", headers=headers)
        assert got.status == 200, await got.text()
        body = await got.json()
        if body["status"] in TERMINAL:
            return body
        await asyncio.sleep(0.01)
    raise AssertionError(f"{response_id} did not end: {body}")


def text_of(response: dict[str, Any]) -> str:
    parts = [p for item in response["output"] for p in item.get("content", [])]
    return "".join(part["text"] for part in parts)


async def stream_events(client: TestClient, path: str, **headers: str) -> list[dict[str, Any]]:
    response = await client.get(path, headers=headers)
    assert response.status == 200, await response.text()
    return [data for _, data in sse_events(await response.read())]


async def test_create_returns_queued_at_once_and_polling_reads_it_complete(served) -> None:
    client, backend = await served()
    backend.gate = threading.Semaphore(0)  # nothing is decoded until the test says so
    created = await create(client)
    assert created["status"] == "queued" and created["background"] is True
    assert created["id"].startswith("resp_") and created["output"] == []
    backend.gate.release(10_000)
    done = await until_ended(client, created["id"])
    assert done["status"] == "completed"
    assert text_of(done) == ANSWER
    assert done["usage"]["output_tokens"] > 0
    # Stored like any response: the conversation continues from it.
    follow_up = await client.post(
        "/v1/responses",
        json={"input": "More", "previous_response_id": created["id"], "max_output_tokens": 4},
    )
    assert follow_up.status == 200


async def test_a_stream_dropped_resumes_after_any_sequence_number(served) -> None:
    client, _ = await served()
    response = await client.post("/v1/responses", json={**BODY, "stream": True})
    assert response.status == 200
    first: list[dict[str, Any]] = []
    while len(first) < 6:  # a few events, then the connection drops
        first += [data for _, data in sse_events(await response.content.readuntil(b"\n\n"))]
    response.close()
    response_id = first[0]["response"]["id"]
    assert [e["type"] for e in first[:2]] == ["response.created", "response.queued"]
    assert first[0]["response"]["status"] == "queued"
    last = first[-1]["sequence_number"]
    rest = await stream_events(
        client, f"/v1/responses/{response_id}?stream=true&starting_after={last}"
    )
    events = first + rest
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.completed"
    kinds = [e["type"] for e in events]
    assert kinds.index("response.in_progress") < kinds.index("response.output_text.delta")
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == ANSWER == text_of(events[-1]["response"])
    # Without starting_after: every event from the first, the same bytes of meaning.
    again = await stream_events(client, f"/v1/responses/{response_id}?stream=true")
    assert again == events


async def test_cancel_frees_the_kv_and_says_cancelled_for_good(served) -> None:
    client, backend = await served()
    backend.gate = threading.Semaphore(0)
    created = await create(client)
    backend.gate.release(3)  # prefill and a couple of tokens, then it waits
    engine = app_engine(client.app)
    cancelled = await client.post(f"/v1/responses/{created['id']}/cancel")
    assert cancelled.status == 200
    body = await cancelled.json()
    assert body["status"] == "cancelled"
    backend.gate.release(10_000)
    for _ in range(1000):
        debug = await (await client.get("/debug/streams")).json()
        if debug["kv_used_bytes"] == 0 and not debug["requests_running"]:
            break
        await asyncio.sleep(0.01)
    assert debug["kv_used_bytes"] == 0
    (stream,) = [s for s in debug["streams"] if "resp_" + s["id"].rsplit("-", 1)[-1] == body["id"]]
    assert stream["state"] == "cancelled" and stream["cancel_reason"] == "client"
    assert engine.metrics.cancellations.labels("client")._value.get() == 1
    assert (await until_ended(client, created["id"]))["status"] == "cancelled"
    again = await client.post(f"/v1/responses/{created['id']}/cancel")  # idempotent
    assert (await again.json())["status"] == "cancelled"


async def test_cancel_after_the_end_returns_it_as_it_ended(served) -> None:
    client, _ = await served()
    created = await create(client, {**BODY, "max_output_tokens": 3})
    await until_ended(client, created["id"])
    body = await (await client.post(f"/v1/responses/{created['id']}/cancel")).json()
    assert body["status"] == "incomplete"


async def test_forgotten_after_the_retention_period_with_a_clear_404(served) -> None:
    client, _ = await served(background_retention_ms=50)
    created = await create(client, {**BODY, "max_output_tokens": 3})
    await until_ended(client, created["id"])
    for _ in range(1000):
        got = await client.get(f"/v1/responses/{created['id']}")
        if got.status == 404:
            break
        await asyncio.sleep(0.01)
    assert got.status == 404
    error = (await got.json())["error"]
    assert error["code"] == "not_found" and "background_retention_ms" in error["message"]


async def test_another_key_never_sees_it(served) -> None:
    client, _ = await served(api_key=["k1", "k2"])
    created = await create(client, **{"Authorization": "Bearer k1"})
    for method, path in (
        ("GET", f"/v1/responses/{created['id']}"),
        ("GET", f"/v1/responses/{created['id']}?stream=true"),
        ("POST", f"/v1/responses/{created['id']}/cancel"),
        ("DELETE", f"/v1/responses/{created['id']}"),
    ):
        other = await client.request(method, path, headers={"Authorization": "Bearer k2"})
        assert other.status == 404, (method, path)
    anonymous = await client.get(f"/v1/responses/{created['id']}")
    assert anonymous.status == 401
    mine = await until_ended(client, created["id"], Authorization="Bearer k1")
    assert mine["status"] == "completed"


async def test_the_lowest_class_unless_one_is_named_and_a_foreground_request_preempts_it(
    served,
) -> None:
    client, _ = await served(
        max_sequences=1,
        backend={"max_sequences": 1, "per_slot": True, "kv_capacity_tokens": 1000},
    )
    engine = app_engine(client.app)
    background = await create(client, {**BODY, "max_output_tokens": 600})
    named = await create(client, {**BODY, "priority": 2, "max_output_tokens": 2})
    priorities = {h.id: h.seq.request.priority for h in engine.streams.live.values()}
    assert sorted(priorities.values()) == [2, MAX_PRIORITY]
    foreground = await client.post("/v1/responses", json={"input": "Now", "max_output_tokens": 4})
    assert foreground.status == 200
    assert (await foreground.json())["status"] in ("completed", "incomplete")
    assert engine.metrics.pauses.labels(PauseCause.PREEMPTED.value)._value.get() >= 1
    for response in (background, named):
        assert (await until_ended(client, response["id"]))["status"] in ("completed", "incomplete")


async def test_bad_requests_are_refused_with_the_field_named(served) -> None:
    client, backend = await served(max_background_responses=1)
    refused = await client.post("/v1/responses", json={**BODY, "store": False})
    assert refused.status == 400 and (await refused.json())["error"]["param"] == "store"
    backend.gate = threading.Semaphore(0)
    created = await create(client)
    for query, param in (
        ("stream=yes", "stream"),
        ("stream=true&starting_after=-2", "starting_after"),
    ):
        got = await client.get(f"/v1/responses/{created['id']}?{query}")
        assert got.status == 400 and (await got.json())["error"]["param"] == param
    gap = await client.get(f"/v1/responses/{created['id']}?stream=true&starting_after=99")
    assert gap.status == 409 and (await gap.json())["error"]["code"] == "resume_gap"
    full = await client.post("/v1/responses", json=BODY)  # the one place is taken
    assert full.status == 503 and (await full.json())["error"]["code"] == "queue_full"
    assert "Retry-After" in full.headers
    backend.gate.release(10_000)
    await until_ended(client, created["id"])
    await create(client)  # an ended one makes room
    missing = await client.get("/v1/responses/resp_nothing")
    assert missing.status == 404
