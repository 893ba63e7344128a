"""Storm users against a scripted in-process server: regenerate, abandon, retry, read."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from edge_llm.bench.storm.load import StormSettings
from edge_llm.bench.storm.run import StormConfig, run_storm
from edge_llm.bench.storm.user import OUTCOMES
from edge_llm.bench.targets import Target

N_TOKENS = 6


class Script:
    """Per session: what each successive request gets (``hang``, ``busy`` or ``answer``)."""

    def __init__(self, plans: dict[int, list[str]]) -> None:
        self.plans = plans
        self.seen: dict[str, int] = defaultdict(int)
        self.sessions: list[str] = []

    def next_for(self, session: str) -> str:
        user = int(session.rsplit("-", 1)[1])
        attempt = self.seen[session]
        self.seen[session] += 1
        self.sessions.append(session)
        plan = self.plans.get(user, ["answer"])
        return plan[min(attempt, len(plan) - 1)]


SCRIPT = web.AppKey("script", Script)


def chunk(content: str | None = None, finish: str | None = None) -> bytes:
    delta = {"content": content} if content is not None else {"role": "assistant"}
    body = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def completions(request: web.Request) -> web.StreamResponse:
    script = request.app[SCRIPT]
    await request.read()
    action = script.next_for(request.headers["X-Session-Id"])
    if action == "busy":
        return web.json_response(
            {"error": {"message": "busy", "type": "x", "code": "queue_full"}},
            status=503,
            headers={"Retry-After": "0"},
        )
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    if action == "hang":
        with pytest.raises((asyncio.CancelledError, ConnectionError)):
            while True:  # heartbeats, never a token, until the client goes away
                await response.write(b": ping\n\n")
                await asyncio.sleep(0.05)
        return response
    await response.write(chunk())
    for i in range(N_TOKENS):
        await response.write(chunk(f"t{i} "))
        await asyncio.sleep(0.01)
    await response.write(chunk("", "stop") + b"data: [DONE]\n\n")
    return response


@pytest.fixture
async def scripted() -> AsyncIterator[tuple[Script, str]]:
    script = Script({})
    app = web.Application()
    app[SCRIPT] = script
    app.router.add_post("/v1/chat/completions", completions)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield script, str(server.make_url("")).rstrip("/")
    await server.close()


def settings(**change: object) -> StormSettings:
    base = StormSettings(
        users=3, duration_s=0.2, think_s=(0.3, 0.3), patience_s=(1.0, 1.0), max_regenerates=2,
        abandon_share=0.0, slow_share=0.0, timeout_s=5.0, prompt_tokens=(20, 30), max_tokens=8,
        ttft_slo_ms=2000.0,
    )  # fmt: skip
    return StormSettings(**{**base.to_json(), **change})  # type: ignore[arg-type]


async def storm(url: str, load: StormSettings) -> list[dict[str, object]]:
    target = Target("fake", url, model="m")
    result = await run_storm(StormConfig((target,), load, sample_interval_s=0.1))
    summary = result.summaries[0]
    assert sum(summary.outcomes.values()) == summary.n_requests == len(result.records)
    assert all(r.outcome in OUTCOMES for r in result.records)
    return [r.to_json() for r in result.records]


async def test_a_user_without_a_first_token_regenerates_with_the_same_prompt_and_session(
    scripted: tuple[Script, str],
) -> None:
    script, url = scripted
    script.plans = {0: ["hang", "hang", "answer"], 2: ["busy", "answer"]}
    records = await storm(url, settings())
    by_user = {u: [r for r in records if r["user"] == u] for u in range(3)}
    assert [r["outcome"] for r in by_user[0]] == ["superseded", "superseded", "completed"]
    assert [r["attempt"] for r in by_user[0]] == [0, 1, 2]
    assert len({r["turn"] for r in by_user[0]}) == 1
    regenerate = by_user[0][1]["started_at"] - by_user[0][0]["started_at"]  # type: ignore[operator]
    assert 0.95 < regenerate < 5.0  # after the user's 1 s patience
    assert [r["outcome"] for r in by_user[1]] == ["completed"]
    assert by_user[1][0]["tokens_read"] == N_TOKENS
    # a 503 with Retry-After is failed, then retried as the next attempt
    assert [r["outcome"] for r in by_user[2]] == ["failed", "completed"]
    assert by_user[2][0]["error_kind"] == "503 queue_full"
    assert sorted(script.seen.values()) == [1, 2, 3]  # one session per user


async def test_the_last_attempt_waits_until_the_timeout_and_fails(
    scripted: tuple[Script, str],
) -> None:
    script, url = scripted
    script.plans = {0: ["hang"]}
    records = await storm(url, settings(users=1, max_regenerates=1, timeout_s=1.5))
    assert [r["outcome"] for r in records] == ["superseded", "failed"]
    assert records[1]["error_kind"] == "timeout"


async def test_abandoning_and_slow_users_read_what_they_read(scripted: tuple[Script, str]) -> None:
    _, url = scripted
    records = await storm(url, settings(users=2, abandon_share=1.0, abandon_after_tokens=(2, 2)))
    assert [r["outcome"] for r in records] == ["abandoned", "abandoned"]
    assert all(r["tokens_read"] == 2 for r in records)
    slow = await storm(url, settings(users=1, slow_share=1.0, slow_tokens_per_s=20.0))
    assert slow[0]["outcome"] == "completed" and slow[0]["slow"]
    # 6 tokens rendered at 20 tokens/s take 0.3 s after the first token came
    first_token_at = slow[0]["started_at"] + slow[0]["ttft"]  # type: ignore[operator]
    assert slow[0]["user_done_at"] - first_token_at >= 0.29  # type: ignore[operator]
