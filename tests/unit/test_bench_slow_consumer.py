"""The slow-consumer analysis, fed with synthetic records and samples (no network)."""

from __future__ import annotations

from typing import Any

import pytest

from edge_llm.bench.inspector import StreamSample, metric_value, slot_progress
from edge_llm.bench.record import RequestRecord
from edge_llm.bench.slow_consumer import (
    Samples,
    SlowConsumerResult,
    SlowConsumerSettings,
    analyse,
)

PACE = 0.01  # 100 tokens/s before the stall
STALL = (1.0, 3.0)


def result(
    times: list[float], *, introspection: bool, samples: Samples | None = None
) -> SlowConsumerResult:
    record = RequestRecord("t", 1, 0, "slow", chunk_times=times, done=True, ended_at=times[-1])
    found = SlowConsumerResult("t", record, SlowConsumerSettings(stall_s=2.0), introspection)
    found.stall_start, found.stall_end = STALL
    found.samples = samples or Samples()
    return found


def paced(start: float, n: int, pace: float = PACE) -> list[float]:
    return [start + i * pace for i in range(n)]


def burst(at: float, n: int) -> list[float]:
    return [at + i * 0.0001 for i in range(n)]


def test_a_server_that_kept_generating_is_inferred_from_the_burst() -> None:
    # 180 chunks waiting after a 2 s stall at 100 tokens/s: generated through the stall.
    times = paced(0.92, 9) + burst(3.0, 180) + paced(3.03, 20)
    found = result(times, introspection=False)
    analyse(found, None)
    assert found.pace_s == pytest.approx(PACE)
    assert found.burst_chunks == 180
    assert found.server_paused is False
    assert found.verdict_source == "inferred"
    assert "kept generating" in found.verdict


def test_a_server_that_stopped_is_inferred_from_a_small_burst() -> None:
    # 40 chunks (0.4 s of generation) waiting after a 2 s stall, then the normal pace.
    times = paced(0.92, 9) + burst(3.0, 40) + paced(3.02, 50)
    found = result(times, introspection=False)
    analyse(found, None)
    assert found.burst_chunks == 40
    assert found.generated_during_stall_s == pytest.approx(0.4)
    assert found.server_paused is True
    assert "stopped generating about 0.40 s" in found.verdict


def test_stream_that_ended_inside_the_burst_kept_generating() -> None:
    times = paced(0.92, 9) + burst(3.0, 30)
    found = result(times, introspection=False)
    analyse(found, None)
    assert found.finished_in_burst
    assert found.server_paused is False
    assert "end of the stream" in found.verdict


def test_receive_queue_shows_when_the_stream_stopped_arriving() -> None:
    samples = Samples(queue=[(1.0, 0), (1.2, 1500), (1.4, 2304), (1.6, 2304), (3.1, 0)])
    found = result(
        paced(0.92, 9) + burst(3.0, 30) + paced(3.01, 9), introspection=False, samples=samples
    )
    analyse(found, None)
    assert found.queue_peak_bytes == 2304
    assert found.arrival_stopped_at == 1.4
    assert found.arrival_resumed_at == 3.0
    assert found.arrival_gap_s == pytest.approx(1.6)


def entry(state: str, n_generated: int, **fields: Any) -> dict[str, Any]:
    return {
        "id": "s1",
        "state": state,
        "pause_cause": "socket_full" if state == "paused" else None,
        "n_generated": n_generated,
        "ring_write": n_generated,
        "ring_read": max(n_generated - 8, 0),
        **fields,
    }


def test_engine_pause_and_resume_come_from_debug_streams() -> None:
    server = [
        StreamSample.of(1.0, entry("decoding", 9)),
        StreamSample.of(1.5, entry("paused", 60, pauses=1)),
        StreamSample.of(2.5, entry("paused", 61, pauses=1)),
        StreamSample.of(3.1, entry("decoding", 70, pauses=1)),
    ]
    found = result(
        paced(0.92, 9) + burst(3.0, 50) + paced(3.01, 40),
        introspection=True,
        samples=Samples(server=server, kv=[(1.5, 2e6)]),
    )
    found.kv_before_bytes = 0.0
    final = entry(
        "done", 100, pauses=1, paused_ms=1580.0, tokens_while_paused=1, backpressure_peak=1
    )
    analyse(found, final)
    assert found.verdict_source == "debug_streams"
    assert found.server_paused is True
    assert (found.paused_at, found.resumed_at, found.pause_cause) == (1.5, 3.1, "socket_full")
    assert found.n_generated_at_pause == 60
    assert (found.server_pauses, found.server_paused_ms, found.tokens_while_paused) == (
        1,
        1580.0,
        1,
    )
    assert found.kv_growth_bytes == 2e6
    assert "paused 1.58 s in all" in found.verdict


def test_engine_that_never_paused_says_so() -> None:
    server = [
        StreamSample.of(1.0, entry("decoding", 9)),
        StreamSample.of(2.0, entry("decoding", 30)),
    ]
    found = result(
        paced(0.92, 9) + burst(3.0, 20), introspection=True, samples=Samples(server=server)
    )
    analyse(found, entry("done", 30, pauses=0, paused_ms=0.0))
    assert found.server_paused is False
    assert "no pause" in found.verdict


def test_memory_not_measurable_without_the_metric() -> None:
    found = result(paced(0.92, 9) + burst(3.0, 20), introspection=False)
    analyse(found, None)
    assert found.kv_growth_bytes is None
    assert found.memory_note.startswith("not measurable")


def test_stream_that_ended_before_the_stall() -> None:
    record = RequestRecord("t", 1, 0, "slow", chunk_times=[0.1, 0.2], done=True)
    found = SlowConsumerResult("t", record, SlowConsumerSettings(), introspection=False)
    analyse(found, None)
    assert "before the stall" in found.verdict
    assert found.server_paused is None


def test_metric_value_reads_unlabelled_samples_only() -> None:
    text = (
        "# HELP edge_llm_kv_cache_used_bytes KV\n"
        "edge_llm_kv_cache_used_bytes_total 9\n"
        "edge_llm_kv_cache_used_bytes 4096.0\n"
    )
    assert metric_value(text, "edge_llm_kv_cache_used_bytes") == 4096.0
    assert metric_value(text, "missing") is None


def slots_result(decoded: list[tuple[float, int]], times: list[float]) -> SlowConsumerResult:
    found = result(times, introspection=False, samples=Samples(decoded=decoded))
    found.slots = True
    return found


def test_llama_slots_show_generation_kept_going() -> None:
    decoded = [(1.0 + 0.1 * i, 9 + 10 * i) for i in range(21)]  # rising until 3.0
    found = slots_result(decoded, paced(0.92, 9) + burst(3.0, 150) + paced(3.02, 20))
    analyse(found, None)
    assert found.verdict_source == "llama.cpp /slots"
    assert found.server_paused is False
    assert "n_decoded 9 -> 209" in found.verdict


def test_llama_slots_show_generation_stopped() -> None:
    decoded = [(1.0 + 0.1 * i, min(9 + 10 * i, 60)) for i in range(21)]  # flat from 1.6 s
    found = slots_result(decoded, paced(0.92, 9) + burst(3.0, 50) + paced(3.02, 20))
    analyse(found, None)
    assert found.server_paused is True
    assert found.generation_stopped_at == pytest.approx(1.6)
    assert "stopped generating 0.60 s into the stall at n_decoded 60" in found.verdict


def test_too_few_slot_samples_fall_back_to_inference() -> None:
    found = slots_result([(1.0, 9)], paced(0.92, 9) + burst(3.0, 30))
    analyse(found, None)
    assert found.verdict_source == "inferred"


def test_trickle_after_the_window_closed_and_gaps_after_the_stall() -> None:
    samples = Samples(queue=[(1.0, 0), (1.1, 982), (1.2, 982), (2.0, 1310), (2.9, 1637)])
    times = paced(0.92, 9) + burst(3.0, 12) + [4.0, 6.3, 6.31]
    found = result(times, introspection=False, samples=samples)
    analyse(found, None)
    assert found.arrival_stopped_at == 1.1
    assert found.trickle_bytes == 1637 - 982
    assert found.longest_gap_after_stall_s == pytest.approx(2.3)


def test_slot_progress_needs_exactly_one_busy_slot() -> None:
    idle = {"id": 0, "is_processing": False}
    busy = {"id": 1, "is_processing": True, "next_token": [{"n_decoded": 42}]}
    assert slot_progress([idle, busy]) == 42
    assert slot_progress([idle]) is None
    assert slot_progress([busy, {**busy, "id": 2}]) is None
    assert slot_progress([{"is_processing": True, "next_token": {"n_decoded": 7}}]) == 7


def test_metric_value_sums_the_series_of_several_models() -> None:
    text = (
        'edge_llm_kv_cache_used_bytes{model="a"} 1024.0\n'
        'edge_llm_kv_cache_used_bytes{model="b"} 2048.0\n'
        "edge_llm_generated_tokens_total 7.0\n"
    )
    assert metric_value(text, "edge_llm_kv_cache_used_bytes") == 3072.0
    assert metric_value(text, "edge_llm_generated_tokens_total") == 7.0
    assert metric_value(text, "edge_llm_streams_paused") is None
