"""The scheduler alone: admission, chunked prefill, pause, finish."""

from __future__ import annotations

import pytest

from edge_llm.engine.kv.book import Truncate
from edge_llm.engine.kv.slots import KvSlots
from edge_llm.engine.kv.unified import KvCache
from edge_llm.engine.scheduling.scheduler import Scheduler, SchedulerLimits, StepPlan
from edge_llm.engine.sequence import GenerationRequest, PauseCause, Sequence
from edge_llm.errors import KvBudgetExceeded, KvBudgetNeverFits, QueueFull
from edge_llm.protocol.stream_rules import StreamState


def make_scheduler(
    max_sequences: int = 2,
    max_queue: int = 2,
    chunk: int = 8,
    kv_tokens: int = 1000,
    share: bool = False,
) -> Scheduler:
    kv = KvCache(kv_tokens, 10, num_seq_ids=2 * max_sequences, share=share)
    return Scheduler(SchedulerLimits(max_sequences, max_queue, chunk), kv)


def make_seq(n_prompt: int, max_tokens: int = 10, name: str = "s", first: int = 0) -> Sequence:
    prompt = list(range(first, first + n_prompt))
    request = GenerationRequest(prompt_tokens=prompt, max_tokens=max_tokens)
    return Sequence(request, name, created_at=0.0)


def run_step(scheduler: Scheduler) -> StepPlan:
    """Complete every scheduled chunk once: prompt chunks (the one that ends the prompt
    samples token 7), and decode chunks that sample token 7 (a draft or pad rows are
    dropped)."""
    plan = scheduler.schedule(0.0)
    for chunk in plan.chunks:
        if chunk.prompt:
            scheduler.complete(chunk)
            if chunk.sample:
                scheduler.record_token(chunk.seq, 7, 0.0)
        else:
            scheduler.record_token(chunk.seq, 7, 0.0)
            scheduler.complete_run(chunk, 1, 1)
    return plan


def test_a_sequence_reserves_prompt_plus_max_tokens_on_admission() -> None:
    scheduler = make_scheduler()
    seq = make_seq(20, max_tokens=30)
    scheduler.add(seq, 0.0)
    plan = scheduler.schedule(0.0)
    assert plan.started == [seq]
    assert seq.state is StreamState.PREFILL
    assert scheduler.kv.num_reserved == 50


def test_a_request_larger_than_the_whole_budget_is_refused_at_once() -> None:
    scheduler = make_scheduler(kv_tokens=100)
    with pytest.raises(KvBudgetNeverFits) as info:
        scheduler.add(make_seq(60, max_tokens=50), 0.0)
    assert info.value.status == 400
    assert info.value.extra["kv_tokens_needed"] == 110


def test_with_per_sequence_kv_a_request_larger_than_one_share_is_refused() -> None:
    kv = KvSlots(1000, 10, 2, 500)
    scheduler = Scheduler(SchedulerLimits(2, 2, 8), kv)
    scheduler.add(make_seq(100, max_tokens=400), 0.0)  # exactly one share
    with pytest.raises(KvBudgetNeverFits) as info:
        scheduler.add(make_seq(100, max_tokens=401), 0.0)
    assert info.value.status == 400
    assert info.value.extra["kv_tokens_budget"] == 500
    assert "kv_unified = false" in str(info.value)


def test_a_request_that_fits_later_waits_in_the_queue() -> None:
    scheduler = make_scheduler(kv_tokens=100)
    first, second = make_seq(50, 40, "a"), make_seq(50, 40, "b")
    scheduler.add(first, 0.0)
    scheduler.add(second, 0.0)
    assert scheduler.schedule(0.0).started == [first]
    assert list(scheduler.waiting) == [second]
    scheduler.finish(first, StreamState.DONE, 1.0, keep=False)
    assert scheduler.schedule(1.0).started == [second]


def test_full_queue_rejects_with_queue_full_when_slots_are_busy() -> None:
    scheduler = make_scheduler(max_sequences=1, max_queue=1)
    scheduler.add(make_seq(5, name="a"), 0.0)
    scheduler.schedule(0.0)
    scheduler.add(make_seq(5, name="b"), 0.0)
    with pytest.raises(QueueFull) as info:
        scheduler.add(make_seq(5, name="c"), 0.0)
    assert info.value.status == 503


def test_full_queue_rejects_with_kv_budget_exceeded_when_kv_is_the_limit() -> None:
    scheduler = make_scheduler(max_sequences=4, max_queue=0, kv_tokens=100)
    scheduler.add(make_seq(50, 40, "a"), 0.0)
    scheduler.schedule(0.0)
    with pytest.raises(KvBudgetExceeded):
        scheduler.add(make_seq(50, 40, "b"), 0.0)


def test_long_prompt_is_prefilled_in_chunks_and_a_short_one_goes_first() -> None:
    scheduler = make_scheduler(chunk=8)
    long_seq, short_seq = make_seq(40, name="long"), make_seq(3, name="short", first=100)
    scheduler.add(long_seq, 0.0)
    run_step(scheduler)
    assert long_seq.n_prefilled == 8
    scheduler.add(short_seq, 0.0)
    plan = scheduler.schedule(0.0)
    by_name = {chunk.seq.id: chunk for chunk in plan.chunks}
    assert by_name["short"].tokens == [100, 101, 102]  # whole: it samples its first token
    assert by_name["short"].sample and by_name["short"].keep_logits is False
    assert len(by_name["long"].tokens) == 5  # the rest of the chunk budget
    assert not by_name["long"].sample


def test_decoding_sequences_get_one_token_each_and_paused_ones_none() -> None:
    scheduler = make_scheduler()
    a, b = make_seq(4, name="a"), make_seq(4, name="b")
    scheduler.add(a, 0.0)
    scheduler.add(b, 0.0)
    run_step(scheduler)  # the prompts, each sampling its first token
    assert a.state is b.state is StreamState.DECODING
    plan = scheduler.schedule(0.0)
    assert [(c.seq.id, c.tokens, c.start_pos) for c in plan.chunks] == [
        ("a", [7], 4),
        ("b", [7], 4),
    ]
    for chunk in plan.chunks:
        scheduler.record_token(chunk.seq, 7, 0.0)
        scheduler.complete_run(chunk, 1, 1)
    a.add_pause(PauseCause.CLIENT, 0.0)
    plan = scheduler.schedule(0.0)
    assert [(c.seq.id, c.tokens, c.start_pos) for c in plan.chunks] == [("b", [7], 5)]


def test_finish_returns_the_reservation_and_frees_the_private_cells_once() -> None:
    scheduler = make_scheduler(chunk=16, share=True)
    seq = make_seq(10)
    scheduler.add(seq, 0.0)
    run_step(scheduler)  # the prompt, sampling the first token
    run_step(scheduler)  # one token fed back
    run_step(scheduler)  # another
    scheduler.take_kv_ops()
    scheduler.finish(seq, StreamState.CANCELLED, 2.0, keep=False)
    assert scheduler.kv.num_reserved == 0
    assert scheduler.num_running == 0
    # The prompt is in the prefix cache: only the cells after it go.
    assert scheduler.take_kv_ops() == [Truncate(seq.slot, 10, 2, "release")]
    assert scheduler.take_kv_ops() == []


def test_kv_cursor_counts_prompt_and_tokens_fed_back() -> None:
    scheduler = make_scheduler(chunk=16)
    seq = make_seq(10)
    scheduler.add(seq, 0.0)
    run_step(scheduler)
    assert seq.kv_tokens == 10  # the sampled token is not in KV until it is fed back
    for _ in range(4):
        run_step(scheduler)
    assert seq.kv_tokens == 14
    assert seq.token_ids == [*range(10), 7, 7, 7, 7, 7]


def test_requests_are_admitted_on_arrival_not_at_the_next_step() -> None:
    """A long decode step must not fill the queue while slots and KV are free."""
    scheduler = make_scheduler(max_sequences=3, max_queue=0)
    seqs = [make_seq(5, name=str(i)) for i in range(3)]
    for seq in seqs:
        scheduler.add(seq, 0.0)
    assert scheduler.num_running == 3
    assert scheduler.num_waiting == 0
    assert scheduler.schedule(0.0).started == seqs
    with pytest.raises(QueueFull):
        scheduler.add(make_seq(5, name="late"), 0.0)


def test_the_lowest_free_slot_is_reused_first() -> None:
    scheduler = make_scheduler(max_sequences=4, max_queue=0)
    seqs = [make_seq(4, name=f"s{i}") for i in range(4)]
    for seq in seqs:
        scheduler.add(seq, 0.0)
    assert [seq.slot for seq in seqs] == [0, 1, 2, 3]
    scheduler.finish(seqs[2], StreamState.DONE, 1.0, keep=False)
    scheduler.finish(seqs[1], StreamState.DONE, 1.0, keep=False)
    again = make_seq(4, name="again")
    scheduler.add(again, 1.0)
    assert again.slot == 1


def test_a_prompt_and_its_first_token_take_one_decode() -> None:
    """The chunk that ends the prompt samples the first token (as llama-server does);
    a request whose prompt is cached but for its last token prefills just that one."""
    scheduler = make_scheduler(chunk=16, share=True)
    first = make_seq(10, name="first")
    scheduler.add(first, 0.0)
    plan = scheduler.schedule(0.0)
    assert [(len(c.tokens), c.prompt, c.sample) for c in plan.chunks] == [(10, True, True)]
    for chunk in plan.chunks:
        scheduler.complete(chunk)
        scheduler.record_token(chunk.seq, 7, 0.0)
    assert first.state is StreamState.DECODING and first.kv_tokens == 10
    scheduler.finish(first, StreamState.DONE, 1.0, keep=True)
    again = make_seq(10, name="again")
    scheduler.add(again, 1.0)
    assert again.num_cached == 9 and again.state is StreamState.PREFILL
    plan = scheduler.schedule(1.0)
    assert [(c.tokens, c.start_pos, c.sample) for c in plan.chunks] == [([9], 9, True)]


def test_a_request_waits_for_the_system_prompt_another_is_prefilling() -> None:
    """Requests arriving together with one system prompt: the second is admitted
    (it keeps its place) but prefills nothing until the first has published those
    cells, then attaches them instead of computing its own copy beside them."""
    scheduler = make_scheduler(max_sequences=4, max_queue=4, chunk=64, share=True)
    system = list(range(1000, 1100))
    first = Sequence(GenerationRequest([*system, 1, 2], 5), "first", created_at=0.0)
    second = Sequence(GenerationRequest([*system, 3, 4], 5), "second", created_at=0.0)
    other = Sequence(GenerationRequest(list(range(5000, 5040)), 5), "other", created_at=0.0)
    scheduler.add(first, 0.0)
    scheduler.add(second, 0.0)
    assert second.state is StreamState.PREFILL and scheduler.num_waiting == 0
    reserved = second.kv_reserved_tokens
    plan = scheduler.schedule(0.0)
    assert [chunk.seq.id for chunk in plan.chunks] == ["first"]  # 64 of its 102 tokens
    for chunk in plan.chunks:
        scheduler.complete(chunk)
    run_step(scheduler)  # the rest of first's prompt, and its first token
    assert second.num_computed == 0
    plan = scheduler.schedule(0.0)
    assert plan.attached == [(second, len(system))]
    assert second.num_cached == second.num_computed == len(system)
    assert second.kv_reserved_tokens == reserved - len(system)
    assert [chunk.tokens for chunk in plan.chunks if chunk.seq is second] == [[3, 4]]
    scheduler.add(other, 0.0)  # nothing shared: prefilled at once
    assert [chunk.seq.id for chunk in scheduler.schedule(0.0).chunks][-1] == "other"


def test_requests_with_one_prompt_arriving_together_all_take_slots() -> None:
    """A burst of one prompt fills the slots as before (only the queue beyond them),
    computes the prompt once, and every one of them gets its first token."""
    scheduler = make_scheduler(max_sequences=4, max_queue=1, chunk=16, share=True)
    prompt = list(range(1000, 1060))
    burst = [Sequence(GenerationRequest(prompt, 5), f"s{i}", created_at=0.0) for i in range(5)]
    for seq in burst:
        scheduler.add(seq, 0.0)
    with pytest.raises(QueueFull):
        scheduler.add(Sequence(GenerationRequest(prompt, 5), "late", created_at=0.0), 0.0)
    assert scheduler.num_running == 4 and scheduler.num_waiting == 1
    computed = 0
    for _ in range(12):
        computed += run_step(scheduler).num_prefill_tokens
    assert all(seq.n_generated for seq in burst[:4])
    # The shared part once; each of the others prefills the last token, its own.
    assert computed == len(prompt) - 1 + 4


def test_a_request_ended_while_it_waits_for_a_prefix_attaches_nothing() -> None:
    scheduler = make_scheduler(max_sequences=4, max_queue=4, chunk=64, share=True)
    system = list(range(1000, 1100))
    first = Sequence(GenerationRequest([*system, 1, 2], 5), "first", created_at=0.0)
    second = Sequence(GenerationRequest([*system, 3, 4], 5), "second", created_at=0.0)
    scheduler.add(first, 0.0)
    scheduler.add(second, 0.0)
    scheduler.finish(second, StreamState.CANCELLED, 0.0, keep=False)
    reserved = scheduler.kv.num_reserved
    for _ in range(3):
        run_step(scheduler)
    assert first.state is StreamState.DECODING
    assert second.num_computed == 0 and scheduler.kv.num_reserved == reserved


def test_a_preempted_stream_due_back_goes_before_its_class_and_is_made_room_for() -> None:
    scheduler = make_scheduler(max_sequences=3, max_queue=4, kv_tokens=100)
    big = make_seq(20, max_tokens=40, name="big")
    scheduler.add(big, 0.0)
    scheduler.add(make_seq(20, max_tokens=10, name="holder"), 0.0)
    run_step(scheduler)
    big.add_pause(PauseCause.PREEMPTED, 0.0)  # as PreemptionPolicy does: pause, then offload
    scheduler.offload(big)
    urgent = Sequence(GenerationRequest(list(range(40)), 10, priority=-1), "urgent", created_at=0.0)
    scheduler.add(urgent, 0.0)  # more urgent: it starts in the room big left (20 cells free)
    assert urgent in scheduler.running
    small = make_seq(5, max_tokens=10, name="small")  # would fit in the 20 free cells
    scheduler.add(small, 0.0)
    assert small in scheduler.waiting  # big, of its class, comes back first
    assert scheduler.preempted_due() == [big]
    assert scheduler.head_blocked  # so the engine offloads paused streams to make its room
