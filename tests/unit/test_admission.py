"""Deadline-aware admission: the TTFT prediction, and the engine refusing at once."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from edge_llm.engine import Engine
from edge_llm.engine.scheduling.admission import predict_ttft_s, queue_view, retry_after_s
from edge_llm.engine.scheduling.prefill_budget import StepCosts
from edge_llm.engine.sequence import GenerationRequest
from edge_llm.engine.streams.handle import StreamHandle
from edge_llm.errors import QueueFull
from edge_llm.generation.sessions import Sessions

from fakes import FakeBackend


def test_admitted_now_waits_only_for_shorter_prompts() -> None:
    running = [(100, 50), (400, 50), (0, 20)]  # two prefilling, one decoding
    view = queue_view(200, admitted_now=True, running=running, waiting_prompt_tokens=[])
    assert view.prefill_ahead_tokens == 100  # the 400-token prompt goes after it
    assert view.decode_steps_to_wait == 0


def test_queued_waits_for_everything_ahead_and_a_slot() -> None:
    running = [(100, 50), (400, 50), (0, 20)]
    view = queue_view(200, admitted_now=False, running=running, waiting_prompt_tokens=[300, 50])
    assert view.prefill_ahead_tokens == 100 + 400 + 300 + 50
    assert view.decode_steps_to_wait == 20  # the sequence closest to its max_tokens


def test_prediction_uses_the_measured_costs() -> None:
    costs = StepCosts(prompt_token_s=0.004)
    view = queue_view(250, admitted_now=False, running=[(0, 10)], waiting_prompt_tokens=[500])
    decode_step_s = costs.decode_step_s(1)
    assert decode_step_s > 0
    expected = (500 + 250) * 0.004 + 10 * decode_step_s
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


def request(n_prompt: int, session: str | None = None) -> GenerationRequest:
    return GenerationRequest(prompt_tokens=list(range(n_prompt)), max_tokens=8, session=session)


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
