"""The relay's sans-I/O state machine, fed by hand: no network, loop or clock."""

from __future__ import annotations

import json
from typing import Any

import pytest

from edge_llm.errors import Cancelled, UpstreamFailure
from edge_llm.protocol.stream_rules import Outcome, PauseCause
from edge_llm.upstream.relay_state import DONE, RelayState, StreamSettings, UpstreamChunk


def _state(**settings: Any) -> RelayState:
    return RelayState("s1", "ours", StreamSettings(**settings), "up", now=100.0)


def _data(content: str | None = None, finish: str | None = None, **extra: Any) -> str:
    delta = {} if content is None else {"content": content}
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return json.dumps({"id": "theirs", "model": "m", "choices": [choice], **extra})


def _chunk(state: RelayState, data: str) -> UpstreamChunk:
    read = state.read(data)
    assert isinstance(read, UpstreamChunk)
    return read


def test_a_chunk_is_ours_and_its_finish_and_usage_are_kept() -> None:
    state = _state()
    chunk = _chunk(state, _data("Hi", "stop", usage={"completion_tokens": 1}))
    assert (chunk.data["id"], chunk.data["model"], chunk.text) == ("s1", "ours", "Hi")
    assert state.progress.finish_reason == "stop"
    assert state.usage() == {"completion_tokens": 1}
    assert state.read(" [DONE]\n") == DONE
    assert state.read("not json") is None and state.read("[1]") is None


def test_an_error_event_is_the_upstreams_failure_with_its_code() -> None:
    with pytest.raises(UpstreamFailure) as failure:
        _state().read(json.dumps({"error": {"message": "boom", "code": "overloaded"}}))
    assert failure.value.code == "overloaded" and "boom" in failure.value.message


def test_chunks_before_content_wait_for_it_and_a_failover_drops_them() -> None:
    state = _state()
    assert state.state == "queued"
    state.connected()
    assert state.state == "prefill"
    role = _chunk(state, _data())
    assert state.arrived(role, 101.0) == ([], False)
    state.gave_up()  # the first upstream failed before any content
    assert state.state == "queued"
    state.attempt("next")
    state.connected()
    assert state.backend == "next"
    again = _chunk(state, _data())
    assert state.arrived(again, 102.0) == ([], False)
    text = _chunk(state, _data("Hi"))
    assert state.arrived(text, 103.0) == ([again, text], True)
    assert state.ttft_ms() == 3000.0 and state.state == "decoding"
    later = _chunk(state, _data(" there"))
    assert state.arrived(later, 104.0) == ([later], False)


def test_a_pause_lasts_while_any_cause_holds_it() -> None:
    state = _state()
    assert state.pause(PauseCause.SOCKET_FULL, 10.0) is True  # a pause began
    assert state.pause(PauseCause.CLIENT, 11.0) is False  # already paused
    assert state.pause_cause == "client" and state.state == "paused"
    assert state.resume(PauseCause.CLIENT, 12.0) is False  # the buffer still holds it
    assert state.pause_cause == "socket_full"
    assert state.resume(PauseCause.SOCKET_FULL, 14.0) is True
    assert (state.pauses.count, state.paused_ms(20.0), state.pause_cause) == (2, 4000.0, None)


def test_a_full_buffer_reads_again_at_the_resume_threshold() -> None:
    state = _state(buffer_chunks=4, resume_threshold=0.5)
    for n in range(4):
        state.put(_chunk(state, _data(str(n))))
    assert state.full and state.pause(PauseCause.SOCKET_FULL, 1.0)
    state.take()
    assert not state.drained()  # 3 left, the threshold is 2
    state.take()
    assert state.drained()
    assert (state.progress.n_received, state.progress.n_sent, state.progress.n_content) == (4, 2, 4)


def test_the_end_is_told_once_and_closes_a_pause() -> None:
    state = _state()
    state.pause(PauseCause.CLIENT, 10.0)
    assert state.finish(Outcome(None, Cancelled("client")), 12.0) is True
    assert state.finish(Outcome("stop", None), 13.0) is False
    assert (state.state, state.finished_at, state.paused_ms(50.0)) == ("cancelled", 12.0, 2000.0)
    assert state.describe(12.0, "sess")["cancel_reason"] == "client"


def test_a_time_out_falls_due_by_the_rules_and_cancels() -> None:
    state = _state(ttft_timeout_s=2.0, max_pause_s=5.0)
    assert state.next_due() == 102.0
    assert state.expired(101.9) is None
    error = state.expired(102.0)
    assert error is not None and error.code == "ttft_timeout"
    assert error.message == "no first token within ttft_timeout_ms (2000 ms); upstream 'up'"
    assert state.finish(Outcome(None, error), 102.0)
    assert (state.state, state.next_due()) == ("cancelled", None)


def test_a_full_buffer_held_too_long_times_out_as_a_clients_pause_does() -> None:
    state = _state(ttft_timeout_s=None, max_pause_s=5.0)
    state.pause(PauseCause.SOCKET_FULL, 110.0)
    assert state.next_due() == 115.0
    error = state.expired(115.0)
    assert error is not None and error.code == "pause_timeout"
