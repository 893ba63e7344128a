"""Deadline-aware admission: the TTFT prediction, and the engine refusing at once."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from edge_llm.engine import Engine, EngineSettings, build_engine
from edge_llm.engine import engine as engine_module
from edge_llm.engine.scheduling.admission import (
    predict_ttft_s,
    queue_view,
    retry_after_s,
    slot_wait_steps,
)
from edge_llm.engine.scheduling.prefill_budget import StepCosts
from edge_llm.engine.sequence import GenerationRequest
from edge_llm.engine.streams.handle import StreamHandle
from edge_llm.errors import QueueFull
from edge_llm.generation.sessions import Sessions

from fakes import FakeBackend, drain
from helpers import Recorder


def test_admitted_now_waits_only_for_shorter_prompts() -> None:
    running = [(100, 50), (400, 50), (0, 20)]  # two prefilling, one decoding
    view = queue_view(200, admitted_now=True, running=running)
    assert view.prefill_ahead_tokens == 100  # the 400-token prompt goes after it
    assert view.decode_steps_to_wait == 0


def test_queued_waits_for_everything_ahead_and_a_slot() -> None:
    running = [(100, 50), (400, 50), (0, 20)]
    view = queue_view(200, admitted_now=False, running=running, ahead=[(300, 8), (50, 8)])
    assert view.prefill_ahead_tokens == 100 + 400 + 300 + 50
    # the two ahead take the slot that frees first in turn (20, then 28), then it is free
    assert view.decode_steps_to_wait == 20 + 8 + 8


def test_queued_waits_for_the_slot_its_turn_frees_not_the_first() -> None:
    """Behind k queued requests a request needs the (k+1)-th slot to free: 4 slots
    decoding 20, 30, 40 and 50 more tokens, 3 requests of 8 tokens ahead: they take 20
    (to 28), 28 (to 36) and 30 (to 38); its slot frees at 36 (only the first, 20,
    was counted before)."""
    assert slot_wait_steps([20, 30, 40, 50], 0, [8, 8, 8]) == 36
    assert slot_wait_steps([20, 30, 40, 50], 0, []) == 20
    assert slot_wait_steps([20], 3, [8, 8]) == 0  # slots free (a queue for KV)
    assert slot_wait_steps([20], 1, [8, 8]) == 16  # the free slot twice, then at 16
    assert slot_wait_steps([], 0, [8]) == 0  # every slot held by a paused stream


def test_a_paused_stream_frees_no_slot_for_the_queue() -> None:
    running = [(0, 0), (0, 10)]  # one paused by its client (0 left to decode), one decoding
    view = queue_view(50, admitted_now=False, running=running, ahead=[(40, 30)])
    assert view.decode_steps_to_wait == 10 + 30  # the one ahead takes the decoding one's slot
    assert view.num_decoding == 1


def test_prediction_uses_the_measured_costs() -> None:
    costs = StepCosts(prompt_token_s=0.004)
    view = queue_view(250, admitted_now=False, running=[(0, 10)], ahead=[(500, 5)])
    decode_step_s = costs.decode_step_s(1)
    assert decode_step_s > 0
    expected = (500 + 250) * 0.004 + (10 + 5) * decode_step_s
    assert predict_ttft_s(view, costs) == pytest.approx(expected)


def test_the_prompt_token_rate_follows_what_steps_take() -> None:
    costs = StepCosts(prompt_token_s=0.001)
    costs.observe(n_prefill=100, n_decode=3, seconds=0.5)  # 5 ms per prompt token
    assert costs.prompt_token_s == pytest.approx(0.001 + 0.2 * (0.005 - 0.001))
    costs.observe(n_prefill=0, n_decode=4, seconds=0.03)  # a decode step: not a prompt rate
    costs.observe(n_prefill=0, n_decode=0, seconds=0.0)  # nothing learnt
    assert costs.prompt_token_s == pytest.approx(0.0018)
    for _ in range(60):
        costs.observe(128, 0, 128 * 0.010)
    assert costs.prompt_token_s == pytest.approx(0.010, rel=1e-3)


def test_retry_after_is_bounded() -> None:
    assert retry_after_s(12.2, 10.0) == 3
    assert retry_after_s(10.01, 10.0) == 1
    assert retry_after_s(500.0, 10.0) == 30


def request(n_prompt: int, session: str | None = None, max_tokens: int = 8) -> GenerationRequest:
    return GenerationRequest(
        prompt_tokens=list(range(n_prompt)), max_tokens=max_tokens, session=session
    )


@pytest.fixture
def gated_engine(engine_of) -> Callable[..., Engine]:
    """An engine that decodes nothing until released, costing 100 prompt tokens a second."""

    def make(**settings: object) -> Engine:
        backend = FakeBackend()
        backend.gate = threading.Semaphore(0)
        engine: Engine = engine_of(backend, StepCosts(prompt_token_s=0.01), **settings)
        return engine

    return make


async def test_a_request_that_would_miss_the_deadline_is_refused_at_once(gated_engine) -> None:
    engine = gated_engine(deadline_admission=True, ttft_timeout_s=5.0, prefill_chunk_tokens=128)
    first = engine.submit(request(300))  # 3 s: admitted
    with pytest.raises(QueueFull) as refused:
        engine.submit(request(400))  # after the shorter 300: 7 s > 5 s
    assert refused.value.retry_after_s == 2
    assert refused.value.extra["predicted_ttft_ms"] == 7000
    assert engine.metrics.rejections.labels("queue_full")._value.get() == 1
    short = engine.submit(request(100))  # shortest first: 1 s, admitted
    assert engine.num_live == 2
    assert first.outcome is None and short.outcome is None


async def test_a_request_behind_a_queue_is_refused_when_its_slot_frees_too_late() -> None:
    """One slot, decoding 150 tokens at 10 ms a step; one request queued behind it. A
    third needs the slot the queued one frees after its own 150 tokens: 3 s of
    prompts + 3 s of decode > 5 s. Counting only the first slot to free (4.5 s), it
    was admitted, queued and would have ended 504 ``ttft_timeout``. The ``admitted``
    line logs the prediction, with deadline admission or without."""
    backend = FakeBackend(max_sequences=1)
    backend.gate = threading.Semaphore(0)
    events = Recorder()
    settings = EngineSettings(deadline_admission=True, ttft_timeout_s=5.0)
    engine = build_engine(backend, settings, events=events)  # type: ignore[arg-type]
    engine.scheduler.prefill_budget.costs = StepCosts(prompt_token_s=0.01)
    engine.start(asyncio.get_running_loop())
    try:
        engine.submit(request(100, max_tokens=150))  # admitted: 1 s of prompt
        engine.submit(request(100, max_tokens=150))  # queued: 2 s of prompts + 1.5 s
        with pytest.raises(QueueFull) as refused:
            engine.submit(request(100, max_tokens=150))
    finally:
        backend.gate.release(10_000)
        await asyncio.to_thread(engine.stop)
    assert refused.value.extra["predicted_ttft_ms"] == pytest.approx(6000, abs=50)
    assert "300 decode steps until a slot frees" in str(refused.value)
    predicted = [line["predicted_ttft_ms"] for line in events.of("admitted")]
    assert predicted == [pytest.approx(1000, abs=50), pytest.approx(3500, abs=50)]


async def test_a_queued_request_overtaken_by_an_urgent_one_is_refused_before_its_prefill(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Queued with a predicted 4 s of a 6 s TTFT time-out (one slot, decoding 200 tokens
    at 10 ms a step), a request of priority 0 is overtaken by an urgent one (-1) that
    takes the slot first for 400 tokens: its prediction moves to 8 s. At the next step
    it is refused, 503 ``queue_full`` with ``Retry-After``, before any prefill is spent
    on it, instead of ending 504 ``ttft_timeout`` at 6 s; the others go on."""
    monkeypatch.setattr(engine_module, "RECHECK_S", 0.0)  # the test's clock stands still
    backend = FakeBackend(max_sequences=1)
    backend.gate = threading.Semaphore(0)
    events = Recorder()
    settings = EngineSettings(deadline_admission=True, ttft_timeout_s=6.0)
    engine = build_engine(backend, settings, events=events, clock=lambda: 100.0)  # type: ignore[arg-type]
    engine.scheduler.prefill_budget.costs = StepCosts(prompt_token_s=0.01)
    engine.start(asyncio.get_running_loop())
    try:
        running = engine.submit(urgent(1, 100, max_tokens=200))
        await asyncio.to_thread(backend.at_gate.wait)  # its prefill waits at the gate
        background = engine.submit(request(100, max_tokens=150))  # 2 s + 2 s: queued
        ahead = engine.submit(urgent(2, 100, max_tokens=400))  # 4 s, before it in the queue
        assert background.outcome is None and engine.scheduler.num_waiting == 2
        # The next step asks the queue again; its end wakes the refused one's connection.
        backend.gate.release(2)
        await asyncio.wait_for(drain(engine, background), 10)
        refused = background.outcome.error if background.outcome else None
        assert isinstance(refused, QueueFull), refused
        assert refused.retry_after_s >= 1
        assert refused.extra["predicted_ttft_ms"] == pytest.approx(7990, abs=50)
        assert running.outcome is None and ahead.outcome is None
        assert background.seq.n_prefilled == 0
    finally:
        backend.gate.release(10_000)
        await asyncio.to_thread(engine.stop)
    (end,) = [line for line in events.of("end") if line["request_id"] == background.id]
    assert end["error"] == "queue_full"


def urgent(first: int, n_prompt: int, max_tokens: int) -> GenerationRequest:
    """A priority -1 request whose prompt starts with ``first`` (no shared prefix)."""
    prompt = [1000 + first, *range(n_prompt - 1)]
    return GenerationRequest(prompt_tokens=prompt, max_tokens=max_tokens, priority=-1)


async def test_off_by_default_and_without_a_ttft_timeout(gated_engine) -> None:
    engine = gated_engine(ttft_timeout_s=5.0)
    for _ in range(3):
        engine.submit(request(400))
    unlimited = gated_engine(deadline_admission=True, ttft_timeout_s=None)
    for _ in range(3):
        unlimited.submit(request(400))
    assert engine.num_live == unlimited.num_live == 3


class _Live:
    """A local stream as the session book holds it (the dispatcher's answer)."""

    def __init__(self, engine: Engine, handle: StreamHandle) -> None:
        self.engine, self.handle = engine, handle

    @property
    def finished(self) -> bool:
        return self.handle.finished

    def cancel(self, reason: str) -> None:
        self.engine.cancel(self.handle, reason)


async def test_a_regenerate_does_not_count_the_request_it_supersedes(gated_engine) -> None:
    engine = gated_engine(deadline_admission=True, ttft_timeout_s=5.0)
    sessions = Sessions()
    sessions.started("s", _Live(engine, engine.submit(request(400, session="s"))))
    sessions.starting("s")  # as the dispatcher does: the old one ends before the submit
    again = engine.submit(request(400, session="s"))
    assert again.outcome is None and engine.num_live == 1
