"""The engine thread with a fake backend: pause, socket-full, cancel, timeouts."""

from __future__ import annotations

import asyncio
import threading

from edge_llm.engine.sequence import GenerationRequest, PauseCause
from edge_llm.engine.streams.handle import StreamHandle
from edge_llm.errors import BackendFailure, Cancelled, TtftTimeout

from fakes import EOG, FakeBackend, drain


def request(
    max_tokens: int = 20, session: str | None = None, n_prompt: int = 4
) -> GenerationRequest:
    return GenerationRequest(
        prompt_tokens=list(range(n_prompt)), max_tokens=max_tokens, session=session
    )


async def wait_for(handle: StreamHandle, predicate: object) -> None:
    while not predicate():  # type: ignore[operator]
        assert await handle.wait_changed(10.0), "engine made no progress"


async def test_stream_runs_to_eog_with_split_utf8_joined(engine_of) -> None:
    engine = engine_of(FakeBackend(script=[1, 2, 11]))
    handle = engine.submit(request())
    text = await drain(engine, handle)
    assert text == "中t11 "
    assert handle.outcome is not None and handle.outcome.finish_reason == "stop"
    assert handle.seq.n_generated == 4  # 1, 2, 11 and the end-of-generation token


async def test_max_tokens_ends_with_length(engine_of) -> None:
    engine = engine_of()
    handle = engine.submit(request(max_tokens=3))
    assert await drain(engine, handle) == "t10 t11 t12 "
    assert handle.outcome is not None and handle.outcome.finish_reason == "length"


async def test_unread_ring_pauses_that_sequence_only(engine_of) -> None:
    engine = engine_of(outbound_buffer_tokens=4, resume_threshold=0.5)
    stalled = engine.submit(request(max_tokens=40))
    reader = engine.submit(request(max_tokens=40))
    await wait_for(stalled, lambda: stalled.seq.paused)
    assert stalled.seq.pause_cause is PauseCause.SOCKET_FULL
    assert stalled.ring.write_cursor == 4
    assert await drain(engine, reader)  # the other stream finishes while this one is paused
    assert stalled.seq.n_generated == 4
    engine.consumed(stalled, 2)  # drained to 0.5: resume
    assert not stalled.seq.paused
    await drain(engine, stalled)
    assert stalled.seq.n_generated == 40
    assert stalled.seq.pauses.count >= 1
    assert engine.backpressure == 0
    assert engine.backpressure_peak >= 1


async def test_client_pause_lets_at_most_the_inflight_token_through(engine_of) -> None:
    backend = FakeBackend()
    backend.gate = threading.Semaphore(0)
    engine = engine_of(backend)
    handle = engine.submit(request(max_tokens=40))
    backend.gate.release(3)  # the prompt (its first token) + two decodes
    await wait_for(handle, lambda: handle.seq.n_generated >= 3)
    engine.pause(handle)  # the fourth decode may already be waiting at the gate
    generated_at_pause = handle.seq.n_generated  # read while the gate is still closed
    backend.gate.release(20)
    other = engine.submit(request(max_tokens=10))
    await drain(engine, other)  # the engine kept stepping for the other stream
    assert handle.seq.n_generated <= generated_at_pause + 1
    assert handle.seq.tokens_while_paused <= 1
    engine.resume(handle)
    backend.gate.release(100)
    await drain(engine, handle)
    assert handle.seq.n_generated == 40


async def test_cancel_frees_kv_before_the_next_decode(engine_of) -> None:
    backend = FakeBackend()
    engine = engine_of(backend)
    handle = engine.submit(request(max_tokens=1000, n_prompt=8))
    await wait_for(handle, lambda: handle.seq.n_generated >= 2)
    engine.cancel(handle, "client")
    other = engine.submit(request(max_tokens=2))
    await drain(engine, other)
    assert handle.seq.slot in backend.released
    assert engine.kv_used_bytes == 0
    assert isinstance(handle.outcome.error, Cancelled)
    assert engine.metrics.cancellations.labels("client")._value.get() == 1


async def next_decode_at_gate(backend: FakeBackend) -> None:
    """Let the decode waiting at the gate run, then wait until the next one waits
    there (its batch fixed, the step before it recorded)."""
    n_calls = len(backend.decode_calls)
    assert backend.gate is not None
    backend.gate.release(1)
    while len(backend.decode_calls) == n_calls or not backend.at_gate.is_set():
        await asyncio.to_thread(backend.at_gate.wait, 0.05)


async def test_cancel_frees_the_kv_before_the_very_next_decode(engine_of) -> None:
    """Step by step: a CANCEL that lands while a decode holding the stream waits at
    the gate leaves that decode alone; before the next one its generated cells are
    gone (the prompt's stay as cache) and that decode does not carry it."""
    backend = FakeBackend()
    backend.gate = threading.Semaphore(0)
    engine = engine_of(backend)
    cancelled = engine.submit(request(max_tokens=1000, n_prompt=8))
    other = engine.submit(request(max_tokens=1000, n_prompt=8))
    await asyncio.to_thread(backend.at_gate.wait, 10)
    while cancelled.seq.n_generated < 3 or other.seq.n_generated < 3:
        await next_decode_at_gate(backend)
    slot = cancelled.seq.slot
    assert backend.cells[slot] > 8  # generated tokens in KV
    engine.cancel(cancelled, "client")  # the decode at the gate carries it still
    await next_decode_at_gate(backend)
    assert backend.cells.get(slot, 0) <= 8  # freed before the decode now at the gate
    assert slot in backend.released
    assert cancelled.outcome is not None and isinstance(cancelled.outcome.error, Cancelled)
    await next_decode_at_gate(backend)
    assert [s for s, _ in backend.decode_calls[-1]] == [other.seq.slot]


async def test_ttft_timeout_interrupts_a_long_prefill_between_chunks(engine_of) -> None:
    backend = FakeBackend()
    backend.step_delay_s = 0.02
    engine = engine_of(backend, ttft_timeout_s=0.1, prefill_chunk_tokens=8)
    handle = engine.submit(request(n_prompt=2000))
    await handle.wait_done()
    assert isinstance(handle.outcome.error, TtftTimeout)
    assert handle.outcome.error.code == "ttft_timeout"
    assert 0 < handle.seq.n_prefilled < 2000  # stopped part-way, not after the whole prompt
    assert engine.metrics.cancellations.labels("ttft_timeout")._value.get() == 1


async def test_a_failing_sequence_ends_alone(engine_of) -> None:
    backend = FakeBackend()
    backend.fail_slots.add(1)  # slots are handed out from 0: the second stream's
    backend.gate = threading.Semaphore(0)  # both are admitted before the first step
    engine = engine_of(backend)
    good = engine.submit(request(max_tokens=5))
    bad = engine.submit(request(max_tokens=5))
    backend.gate.release(100)
    text = await drain(engine, good)
    await bad.wait_done()
    assert text == "t10 t11 t12 t13 t14 "
    assert bad.seq.slot == 1
    assert isinstance(bad.outcome.error, BackendFailure)


async def test_stop_string_is_cut_and_held_text_released(engine_of) -> None:
    from edge_llm.protocol.sampling import SamplingParams

    engine = engine_of(FakeBackend(script=[10, 11, 12, EOG]))
    req = request()
    req.sampling = SamplingParams(stop=("t12",))
    handle = engine.submit(req)
    assert await drain(engine, handle) == "t10 t11 "


async def test_a_cancel_between_the_plan_and_its_decode_leaves_the_engine_running(
    engine_of,
) -> None:
    """A stream cancelled after the step's plan was made (the lock released) but before
    its samplers start: its chunk still samples in that decode, so it must still get
    its sampler. Seen in CI: a 1 ms client time-out's DELETE killed the engine thread."""
    engine = engine_of()
    schedule, apply = engine.scheduler.schedule, engine.runner.apply
    planned: list[object] = []

    def schedule_noting(*args: object) -> object:  # under the lock
        plan = schedule(*args)
        planned.extend(plan.started)
        return plan

    def cancel_then_apply(*args: object) -> object:  # the lock released, the plan made
        if planned:  # another thread's cancel, landing in the window
            planned.clear()
            engine.cancel_all("cancelled between the plan and the decode")
        return apply(*args)

    engine.scheduler.schedule, engine.runner.apply = schedule_noting, cancel_then_apply
    cancelled = engine.submit(request(max_tokens=5))
    await drain(engine, cancelled)
    assert cancelled.outcome is not None and isinstance(cancelled.outcome.error, Cancelled)
    assert engine.crash is None
    engine.scheduler.schedule, engine.runner.apply = schedule, apply
    assert await drain(engine, engine.submit(request(max_tokens=3))) == "t10 t11 t12 "


async def test_without_cancel_release_kv_a_cancelled_streams_cells_stay_as_cache(
    engine_of,
) -> None:
    backend = FakeBackend(max_sequences=1)
    engine = engine_of(backend, cancel_release_kv=False)
    first = engine.submit(request(max_tokens=1000))
    await wait_for(first, lambda: first.seq.n_generated >= 2)
    engine.cancel(first, "client")
    await first.wait_done()
    second = engine.submit(request(max_tokens=2, n_prompt=3))
    await drain(engine, second)
    assert engine.kv_used_bytes == 0
    # All of the cancelled stream's cells stay, as evictable cache: the configuration says so.
    assert backend.cells[first.seq.slot] == first.seq.num_computed
    assert engine.kv_cached_bytes >= first.seq.num_computed * 100


async def test_a_stream_paused_too_long_is_cancelled_and_its_kv_freed(engine_of) -> None:
    engine = engine_of(max_pause_s=0.05, outbound_buffer_tokens=4)
    stalled = engine.submit(request(max_tokens=100))  # nobody reads its ring
    await stalled.wait_done()
    assert stalled.outcome.error.code == "pause_timeout"
    assert stalled.seq.n_generated == 4
    assert engine.kv_used_bytes == 0
    assert engine.metrics.cancellations.labels("pause_timeout")._value.get() == 1


async def test_without_pause_on_socket_full_a_slow_reader_gets_everything(engine_of) -> None:
    """Regression: a full ring used to kill the engine thread (RingOverflow)."""
    engine = engine_of(pause_on_socket_full=False, outbound_buffer_tokens=4)
    handle = engine.submit(request(max_tokens=30))
    await handle.wait_done()  # generated to the end with nobody reading
    assert engine.alive
    assert handle.seq.pauses.count == 0
    assert handle.ring.write_cursor == 30
    assert await drain(engine, handle) == "".join(f"t{t} " for t in range(10, 40))


async def offload_setup(engine_of, *, host_fits_one: bool = False, **settings: object):
    """A KV budget for two running requests; two streams paused, two more waiting."""
    backend = FakeBackend(kv_capacity_tokens=100, max_sequences=4)
    engine = engine_of(backend, **{"offload_paused_after_s": 0.0, **settings})
    paused = [engine.submit(request(max_tokens=40)) for _ in range(2)]
    for handle in paused:
        await wait_for(handle, lambda h=handle: h.seq.n_generated >= 3)
        engine.pause(handle)
    if host_fits_one:  # room for either paused stream's state, not for both
        sizes = [backend.state_size(h.seq.slot) for h in paused]
        engine.host_offload.capacity_bytes = max(sizes) + min(sizes) - 1
    waiting = [engine.submit(request(max_tokens=40)) for _ in range(2)]
    return backend, engine, paused, waiting


async def test_paused_streams_are_offloaded_for_waiting_ones_and_resume_token_exact(
    engine_of,
) -> None:
    _, engine, paused, waiting = await offload_setup(engine_of)
    expected = "".join(f"t{t} " for t in range(10, 50))
    for handle in waiting:
        assert await drain(engine, handle) == expected
    assert all(h.seq.public_state() == "offloaded" for h in paused)
    assert engine.snapshot()["kv_offloaded_bytes"] > 0
    for handle in paused:
        engine.resume(handle)
    for handle in paused:
        assert await drain(engine, handle) == expected  # the sampler came along
    assert engine.metrics.kv_offloads._value.get() == 2
    assert engine.metrics.kv_restores._value.get() == 2
    assert engine.host_offload.num_bytes == 0


async def test_a_full_host_store_cancels_the_oldest_offloaded_stream(engine_of) -> None:
    _, engine, paused, waiting = await offload_setup(engine_of, host_fits_one=True)
    await paused[0].wait_done()
    assert paused[0].outcome.error.code == "pause_timeout"
    assert paused[1].seq.public_state() == "offloaded"
    for handle in waiting:
        await drain(engine, handle)
    engine.resume(paused[1])
    await drain(engine, paused[1])
    assert paused[1].outcome.finish_reason == "length"
    assert engine.metrics.cancellations.labels("pause_timeout")._value.get() == 1


async def test_a_resumed_offloaded_stream_gets_the_kv_of_a_stream_paused_since(engine_of) -> None:
    _, engine, paused, waiting = await offload_setup(engine_of)
    for handle in waiting:  # both run to the end while the paused ones are offloaded
        await drain(engine, handle)
    blockers = [engine.submit(request(max_tokens=40)) for _ in range(2)]  # the KV is theirs
    for blocker in blockers:
        await wait_for(blocker, lambda b=blocker: b.seq.n_generated >= 3)
        engine.pause(blocker)
    engine.resume(paused[1])  # no room: the paused blocker paused first makes it
    assert await drain(engine, paused[1]) == "".join(f"t{t} " for t in range(10, 50))
    assert blockers[0].seq.public_state() == "offloaded"


async def test_the_idle_engine_wakes_when_a_paused_stream_becomes_due_for_offload(
    engine_of,
) -> None:
    """Regression: with nothing to decode the thread slept until the next timeout (5 s
    measured) although the waiting requests could run once a paused stream was offloaded."""
    after = 4.0  # under the engine's 5 s idle wait; long enough not to fall due in the test
    _, engine, _, waiting = await offload_setup(
        engine_of, offload_paused_after_s=after, ttft_timeout_s=None, max_pause_s=None
    )
    with engine._lock:
        assert all(h.seq.public_state() == "queued" for h in waiting)
        assert engine._idle_timeout() <= after
