"""The pump from ring to connection: chunking, flushing, heartbeats."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest

from edge_llm.engine import Engine, EngineSettings, build_engine
from edge_llm.engine.sequence import GenerationRequest, PauseCause
from edge_llm.generation.pump import PumpSettings, pump
from edge_llm.protocol.stream_events import Delta, Finished, Heartbeat, PauseChanged

from fakes import FakeBackend


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    engine = build_engine(FakeBackend(script=[10, 1, 2, 11, 12, 13, 14]), EngineSettings())
    engine.start(asyncio.get_running_loop())
    yield engine
    await asyncio.to_thread(engine.stop)


async def events_of(engine: Engine, settings: PumpSettings) -> list[object]:
    handle = engine.submit(GenerationRequest(prompt_tokens=[1, 2, 3], max_tokens=50))
    return [event async for event in pump(engine, handle, settings)]


async def test_chunks_hold_chunk_size_tokens_and_a_split_character_travels_whole(engine) -> None:
    events = await events_of(engine, PumpSettings(chunk_tokens=3, flush_interval_s=5.0))
    deltas = [e for e in events if isinstance(e, Delta)]
    assert [d.text for d in deltas] == ["t10 中", "t11 t12 t13 ", "t14 "]
    assert [d.n_tokens for d in deltas] == [3, 3, 1]  # the last chunk is flushed at the end
    assert [d.seq for d in deltas] == [0, 1, 2]
    assert isinstance(events[-1], Finished)


async def test_a_character_split_over_two_tokens_is_one_delta_of_two_tokens(engine) -> None:
    events = await events_of(engine, PumpSettings(chunk_tokens=1))
    deltas = [e for e in events if isinstance(e, Delta)]
    assert deltas[1].text == "中"
    assert deltas[1].n_tokens == 2
    assert sum(d.n_tokens for d in deltas) == 7


async def test_heartbeat_while_no_token_flows(engine) -> None:
    engine.backend.gate = threading.Semaphore(0)  # type: ignore[attr-defined]
    handle = engine.submit(GenerationRequest(prompt_tokens=[1, 2, 3], max_tokens=5))
    stream = pump(engine, handle, PumpSettings(heartbeat_interval_s=0.01))
    first = await anext(stream)
    while not isinstance(first, Heartbeat):
        first = await anext(stream)
    assert first.state in ("queued", "prefill")  # the decode is held: no token yet
    assert (first.prefill_done, first.prefill_total) == (0, 3)
    engine.backend.gate.release(100)  # type: ignore[attr-defined]
    await stream.aclose()


async def test_a_pause_is_reported_after_the_tokens_generated_before_it(engine) -> None:
    """SPEC section 25: after the ``paused`` event at most the token in flight; two
    tokens that waited unsent in the ring when the pause landed go out first, then
    the pause and (with progress) its heartbeat, and nothing more while it lasts."""
    gate = engine.backend.gate = threading.Semaphore(0)  # type: ignore[attr-defined]
    handle = engine.submit(GenerationRequest(prompt_tokens=[1, 2, 3], max_tokens=50))
    while len(handle.ring.peek(3)) < 3:  # three tokens wait, unsent, when the pause lands
        gate.release()
        await handle.wait_changed(None)
    assert engine.pause(handle, PauseCause.PREEMPTED)
    settings = PumpSettings(chunk_tokens=4, flush_interval_s=60.0, heartbeat_interval_s=60.0)
    stream = pump(engine, handle, settings, progress=True)
    events = [await anext(stream) for _ in range(3)]
    assert [type(e) for e in events] == [Delta, PauseChanged, Heartbeat]
    assert events[0] == Delta("t10 中", 3, 0)  # a partial chunk, not held back
    assert events[1] == PauseChanged("preempted")
    assert isinstance(events[2], Heartbeat) and events[2].state == "preempted"
    gate.release(100)
    await stream.aclose()


async def test_a_pause_that_ended_while_its_tokens_went_out_is_still_reported(engine) -> None:
    gate = engine.backend.gate = threading.Semaphore(0)  # type: ignore[attr-defined]
    handle = engine.submit(GenerationRequest(prompt_tokens=[1, 2, 3], max_tokens=4))
    while len(handle.ring.peek(1)) < 1:
        gate.release()
        await handle.wait_changed(None)
    assert engine.pause(handle)
    stream = pump(engine, handle, PumpSettings(heartbeat_interval_s=60.0))
    first = await anext(stream)
    assert isinstance(first, Delta)  # the token generated before the pause
    assert engine.resume(handle)  # while the pump had not reported the pause yet
    gate.release(100)
    rest = [event async for event in stream]
    assert rest[:2] == [PauseChanged("client"), PauseChanged(None)]
    assert isinstance(rest[-1], Finished)
