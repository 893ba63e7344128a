"""Priority classes: the queue's order, aging and per-session turns, and preemption of a
less urgent running stream (paused, offloaded, resumed token-exact) over the fake
backend."""

from __future__ import annotations

import asyncio

from edge_llm.engine import Engine, EngineSettings, build_engine
from edge_llm.engine.scheduling.priorities import AGING_S, next_in_line, prefill_order
from edge_llm.engine.sequence import GenerationRequest, PauseCause, Sequence
from edge_llm.engine.streams.handle import StreamHandle

from fakes import FakeBackend, drain
from helpers import Recorder


def seq(name: str, priority: int = 0, session: str | None = None, at: float = 0.0) -> Sequence:
    request = GenerationRequest(list(range(20)), 8, session=session, priority=priority)
    return Sequence(request, name, created_at=at)


def test_the_more_urgent_class_first_then_the_oldest() -> None:
    background, chat = seq("bg", priority=5, at=0.0), seq("chat", priority=0, at=1.0)
    assert next_in_line([background, chat], [], now=2.0) is chat
    # Waiting ages a request toward the front, one class per AGING_S: after five, the
    # background request goes before a chat message that has just arrived.
    fresh = seq("fresh", priority=0, at=5 * AGING_S)
    assert next_in_line([fresh, background], [], now=5 * AGING_S + 0.5) is background


def test_within_a_class_the_session_with_less_running_goes_first() -> None:
    busy = [seq("a1", session="a"), seq("a2", session="a")]
    mine, theirs = seq("a3", session="a", at=0.0), seq("b1", session="b", at=1.0)
    assert next_in_line([mine, theirs], busy, now=2.0) is theirs
    assert next_in_line([mine, theirs], [], now=2.0) is mine


def test_prompts_share_prefill_turns_per_session() -> None:
    a1, a2 = seq("a1", session="a", at=0.0), seq("a2", session="a", at=1.0)
    b1 = seq("b1", session="b", at=2.0)
    urgent = seq("u", priority=-1, at=3.0)
    assert prefill_order([a1, a2, b1, urgent]) == [urgent, a1, b1, a2]


def backend() -> FakeBackend:
    script = tuple(range(10, 70))
    return FakeBackend(script, kv_capacity_tokens=2 * 500, max_sequences=2, per_slot=True)


async def first_token(handle: StreamHandle) -> None:
    while handle.seq.n_generated == 0:
        assert await handle.wait_changed(10.0), "engine made no progress"


def request(priority: int, max_tokens: int = 40) -> GenerationRequest:
    return GenerationRequest(list(range(100, 120)), max_tokens, priority=priority)


async def test_an_urgent_request_preempts_the_least_urgent_stream_which_resumes_exact(
    engine_of,
) -> None:
    engine: Engine = engine_of(backend(), max_queue=4, max_preemptions=3)
    reference = await drain(engine, engine.submit(request(5)))
    background = [engine.submit(request(5)), engine.submit(request(5))]
    await asyncio.gather(*(first_token(h) for h in background))
    urgent = engine.submit(request(0, max_tokens=8))
    assert engine.progress(urgent)["queue_position"] == 1
    urgent_text = await drain(engine, urgent)
    assert urgent_text and urgent.outcome is not None and urgent.outcome.error is None
    preempted = [h for h in background if h.seq.preemptions]
    assert len(preempted) == 1  # one slot was enough
    texts = await asyncio.gather(*(drain(engine, h) for h in background))
    assert texts == [reference, reference]  # token-exact after the restore
    assert engine.metrics.preemptions.labels("5")._value.get() == 1
    assert engine.metrics.pauses.labels(PauseCause.PREEMPTED.value)._value.get() == 1


async def test_the_same_class_never_preempts_and_the_bound_holds(engine_of) -> None:
    engine: Engine = engine_of(backend(), max_queue=4, max_preemptions=0)
    running = [engine.submit(request(0)), engine.submit(request(5))]
    await asyncio.gather(*(first_token(h) for h in running))
    waiting = engine.submit(request(0, max_tokens=4))
    assert engine.progress(waiting)["state"] == "queued"
    await drain(engine, waiting)
    assert all(h.seq.preemptions == 0 for h in running)  # max_preemptions 0: it waited
    same = engine_of(backend(), max_queue=4)
    running = [same.submit(request(3)), same.submit(request(3))]
    await asyncio.gather(*(first_token(h) for h in running))
    await drain(same, same.submit(request(3, max_tokens=4)))
    assert all(h.seq.preemptions == 0 for h in running)


async def test_a_preempted_stream_stays_preempted_until_it_runs_again_and_keeps_its_place(
    engine_of,
) -> None:
    """Its resume is reported when it can come back (the urgent request has ended), not
    when the urgent one starts; a request of its class arriving meanwhile waits."""
    events = Recorder()
    slow = FakeBackend(range(10, 1010), kv_capacity_tokens=2 * 1200, max_sequences=2, per_slot=True)
    slow.step_delay_s = 0.001  # the streams around the urgent one outlast it many times over
    engine = build_engine(slow, EngineSettings(max_queue=4), events=events)
    engine.start(asyncio.get_running_loop())
    try:
        neighbour = engine.submit(request(3, max_tokens=1000))
        background = engine.submit(request(5, max_tokens=500))
        readers = [asyncio.create_task(drain(engine, h)) for h in (neighbour, background)]
        await asyncio.gather(first_token(neighbour), first_token(background))
        urgent = engine.submit(request(0, max_tokens=8))
        await events.wait_for("offloaded")  # the background stream, preempted
        same_class = engine.submit(request(5, max_tokens=4))
        await asyncio.gather(drain(engine, urgent), drain(engine, same_class))
    finally:
        await asyncio.to_thread(engine.stop)
        await asyncio.gather(*readers)
    order = [(line["event"], line["request_id"]) for line in events.lines]
    assert order.index(("end", urgent.id)) < order.index(("resumed", background.id))
    assert order.index(("restored", background.id)) < order.index(("scheduled", same_class.id))
