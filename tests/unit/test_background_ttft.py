"""A request's own TTFT time-out (a background response's, ``background_ttft_timeout_ms``,
none by default): held behind foreground work past the engine's ``ttft_timeout_ms`` it
still answers, while a foreground request beside it still times out; it never gets
the whole batches of a prompt near the engine's time-out (tests/e2e/test_background_e2e.py:
the same with the real model and the official SDK)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_prefill_budget import complete, make_seq, measured

from edge_llm.engine import Engine, EngineSettings
from edge_llm.engine.build import build_parts
from edge_llm.engine.kv.unified import KvCache
from edge_llm.engine.scheduling.scheduler import Scheduler, SchedulerLimits
from edge_llm.engine.sequence import GenerationRequest
from edge_llm.engine.streams.handle import StreamHandle
from edge_llm.errors import TtftTimeout
from edge_llm.protocol.priority import MAX_PRIORITY

from conftest import app_engine
from fakes import FakeBackend, ManualClock, SteppedEngine, text_script

TTFT_S = 5.0


def _one_slot_engine(clock: ManualClock) -> SteppedEngine:
    """One slot, the engine's TTFT time-out ``TTFT_S``, stepped by the test."""
    settings = EngineSettings(ttft_timeout_s=TTFT_S, max_pause_s=None, adaptive_threads=False)
    backend = FakeBackend(tuple(range(10, 60)), max_sequences=1, kv_capacity_tokens=1000)
    return SteppedEngine(build_parts(backend, settings, clock=clock))  # type: ignore[arg-type]


def _step_until_ended(engine: Engine, clock: ManualClock, handles: list[StreamHandle]) -> None:
    """A step a second, each stream's ring read after it, until every stream ended."""
    for _ in range(200):
        if all(h.finished for h in handles):
            return
        clock.now += 1.0
        engine._step()
        for handle in handles:
            engine.consumed(handle, len(handle.ring.peek(100)))
    raise AssertionError([h.outcome for h in handles])


@pytest.mark.parametrize("own_s", [0.0, 60.0])
def test_a_background_request_waits_its_turn_past_the_engines_ttft_time_out(
    own_s: float,
) -> None:
    """One slot, held 30 s by a foreground stream: a foreground request queued behind
    it times out at the engine's 5 s, the background one (own time-out none or 60 s)
    answers once the slot is free."""
    clock = ManualClock()
    engine = _one_slot_engine(clock)
    running = engine.submit(GenerationRequest(list(range(500, 520)), 30))
    background = engine.submit(
        GenerationRequest(list(range(600, 620)), 4, priority=MAX_PRIORITY, ttft_timeout_s=own_s)
    )
    queued = engine.submit(GenerationRequest(list(range(700, 720)), 4))
    _step_until_ended(engine, clock, [running, background, queued])
    assert isinstance(queued.outcome.error, TtftTimeout), queued.outcome
    assert "ttft_timeout_ms (5000 ms)" in str(queued.outcome.error)
    assert running.outcome.error is None and running.seq.n_generated == 30
    assert background.outcome.error is None, background.outcome
    assert background.seq.n_generated == 4
    waited = background.seq.first_token_at - background.seq.created_at
    assert waited > 25.0  # five times the engine's time-out, behind the running stream


def test_a_background_request_times_out_at_its_own_time_out() -> None:
    clock = ManualClock()
    engine = _one_slot_engine(clock)
    running = engine.submit(GenerationRequest(list(range(500, 520)), 40))
    background = engine.submit(
        GenerationRequest(list(range(600, 620)), 4, priority=MAX_PRIORITY, ttft_timeout_s=12.0)
    )
    _step_until_ended(engine, clock, [running, background])
    assert isinstance(background.outcome.error, TtftTimeout), background.outcome
    assert "(12000 ms)" in str(background.outcome.error)
    assert background.seq.finished_at - background.seq.created_at == pytest.approx(12.0, abs=1.0)
    assert running.outcome.error is None and running.seq.n_generated == 40


def test_a_background_prompt_never_goes_first_with_whole_batches() -> None:
    """Past half the engine's time-out a foreground prompt gets whole batches beside
    decoding streams; a background one keeps the ITL target's budget."""
    kv = KvCache(10_000, 10, num_seq_ids=4, share=False)
    limits = SchedulerLimits(3, 2, 512, itl_target_s=0.1, urgent_after_s=TTFT_S / 2)
    scheduler = Scheduler(limits, kv)
    scheduler.prefill_budget.costs = measured(0.01, 0.01, prefill_token_s=0.001)
    decoding = make_seq(10, "decoding")
    scheduler.add(decoding, 0.0)
    complete(scheduler)
    background = make_seq(900, "background", first=1000)
    background.request.ttft_timeout_s = 0.0
    scheduler.add(background, 0.0)
    for now in (1.0, 3.0, 6.0):
        decode, (name, n) = complete(scheduler, now=now)
        assert decode == ("decoding", 1) and name == "background" and n <= 80


# -- over HTTP: the key reaches the request ------------------------------------------------


async def test_over_http_a_queued_background_response_completes_where_a_foreground_one_fails(
    client_of,
) -> None:
    """The one slot busy for >= 2 s with ttft_timeout_ms = 1000: a foreground request
    queued behind it gets 504 ttft_timeout; a background one completes."""
    script = text_script("".join(chr(0x4E00 + i) for i in range(600)))
    backend = FakeBackend(script, max_sequences=1, kv_capacity_tokens=2000)
    backend.step_delay_s = 0.005
    client = await client_of(
        backend, max_sequences=1, ttft_timeout_ms=1000, speculative="off", max_tokens_cap=4096
    )
    engine = app_engine(client.app)
    long = asyncio.create_task(
        client.post("/v1/responses", json={"input": "Long", "max_output_tokens": 400})
    )
    for _ in range(2000):  # until it holds the slot
        if any(h.seq.n_generated for h in engine.streams.live.values()):
            break
        await asyncio.sleep(0.005)
    body: dict[str, Any] = {"input": "Later", "max_output_tokens": 8, "background": True}
    created = await client.post("/v1/responses", json=body)
    assert created.status == 200, await created.text()
    response_id = (await created.json())["id"]
    queued = await client.post("/v1/responses", json={"input": "Now", "max_output_tokens": 8})
    assert queued.status == 504 and (await queued.json())["error"]["code"] == "ttft_timeout"
    assert (await long).status == 200
    for _ in range(2000):
        got = await (await client.get(f"/v1/responses/{response_id}")).json()
        if got["status"] not in ("queued", "in_progress"):
            break
        await asyncio.sleep(0.01)
    assert got["status"] in ("completed", "incomplete"), got
    assert got["usage"]["output_tokens"] > 0
