"""The WebSocket stream protocol, fed frames without a network."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from edge_llm.protocol.ws import (
    CancelStream,
    PauseStream,
    ResumeStream,
    StartStream,
    State,
    StreamProtocol,
)

START = json.dumps({"type": "start", "request": {"messages": []}})


def codes(protocol: StreamProtocol) -> list[str]:
    return [f["code"] for f in protocol.frames_to_send() if f["type"] == "error"]


def test_start_pause_resume_cancel_produce_commands() -> None:
    protocol = StreamProtocol()
    assert protocol.receive(START) == [StartStream({"messages": []})]
    assert protocol.state is State.STREAMING
    assert protocol.receive('{"type":"pause"}') == [PauseStream()]
    assert protocol.receive('{"type":"resume"}') == [ResumeStream()]
    assert protocol.receive('{"type":"cancel"}') == [CancelStream()]
    assert codes(protocol) == []


def test_resume_before_start_is_an_error_and_the_socket_stays_usable() -> None:
    protocol = StreamProtocol()
    assert protocol.receive('{"type":"resume"}') == []
    assert codes(protocol) == ["no_active_stream"]
    assert protocol.receive(START) == [StartStream({"messages": []})]


def test_pause_twice_is_an_error() -> None:
    protocol = StreamProtocol()
    protocol.receive(START)
    protocol.receive('{"type":"pause"}')
    assert protocol.receive('{"type":"pause"}') == []
    assert codes(protocol) == ["already_paused"]


def test_resume_without_pause_and_second_start_are_errors() -> None:
    protocol = StreamProtocol()
    protocol.receive(START)
    assert protocol.receive('{"type":"resume"}') == []
    assert protocol.receive(START) == []
    assert codes(protocol) == ["not_paused", "stream_active"]


def test_malformed_frames_get_errors() -> None:
    protocol = StreamProtocol()
    for text in ("not json", "[1,2]", '{"type": 3}', '{"type":"dance"}', '{"type":"start"}'):
        assert protocol.receive(text) == []
    assert codes(protocol) == [
        "invalid_frame", "invalid_frame", "invalid_frame", "unknown_frame_type", "invalid_frame",
    ]  # fmt: skip
    assert protocol.state is State.IDLE


def test_done_frame_ends_the_stream_and_a_new_one_may_start() -> None:
    protocol = StreamProtocol()
    protocol.receive(START)
    protocol.on_started("s1")
    protocol.on_delta("Hi", 1, 0)
    protocol.on_paused("socket_full")
    protocol.on_resumed()
    protocol.on_done("stop", {"completion_tokens": 1}, {"ttft_ms": 5.0})
    frames = protocol.frames_to_send()
    assert [f["type"] for f in frames] == ["started", "delta", "paused", "resumed", "done"]
    assert frames[1] == {"type": "delta", "id": "s1", "seq": 0, "text": "Hi", "n_tokens": 1}
    assert frames[4]["id"] == "s1"
    assert protocol.state is State.IDLE
    assert protocol.receive(START) == [StartStream({"messages": []})]


def test_rejected_start_returns_to_idle() -> None:
    protocol = StreamProtocol()
    protocol.receive(START)
    protocol.on_rejected("prompt_too_long", "too long", n_prompt_tokens=900)
    assert protocol.frames_to_send() == [
        {"type": "error", "code": "prompt_too_long", "message": "too long", "n_prompt_tokens": 900}
    ]
    assert protocol.state is State.IDLE


FRAMES = st.sampled_from(
    [START, '{"type":"pause"}', '{"type":"resume"}', '{"type":"cancel"}', "junk", '{"type":1}']
)


@given(st.lists(FRAMES, max_size=30), st.lists(st.booleans(), max_size=30))
def test_any_frame_sequence_keeps_the_protocol_consistent(
    frames: list[str], finishes: list[bool]
) -> None:
    protocol = StreamProtocol()
    paused_by_commands = False
    for i, text in enumerate(frames):
        for command in protocol.receive(text):
            if isinstance(command, PauseStream):
                assert not paused_by_commands
                paused_by_commands = True
            elif isinstance(command, ResumeStream):
                assert paused_by_commands
                paused_by_commands = False
            elif isinstance(command, StartStream):
                paused_by_commands = False
                protocol.on_started(f"s{i}")
        if protocol.state is State.STREAMING and i < len(finishes) and finishes[i]:
            protocol.on_done("stop", {}, {})
            paused_by_commands = False
        assert protocol.client_paused == (paused_by_commands and protocol.state is State.STREAMING)
        for frame in protocol.frames_to_send():
            assert frame["type"] in {"started", "done", "error"}
