"""The TTFT time-out counts the server's time only (issue 59, item 4): while the
client holds a stream back before its first token (its PAUSE, its dropped resumable
connection) the clock stops; a preemption, the server's own decision, does not stop it."""

from __future__ import annotations

import pytest

from edge_llm.engine import EngineSettings
from edge_llm.engine.build import build_parts
from edge_llm.engine.sequence import GenerationRequest
from edge_llm.protocol.stream_rules import PauseCause, Pauses, TimeLimits, TimeOut

from fakes import FakeBackend, ManualClock, SteppedEngine

LIMITS = TimeLimits(ttft_timeout_s=10.0, max_pause_s=None)


@pytest.mark.parametrize("cause", [PauseCause.CLIENT, PauseCause.DISCONNECTED])
def test_a_stream_held_by_its_client_has_no_ttft_deadline_and_later_one_after(
    cause: PauseCause,
) -> None:
    pauses = Pauses()
    pauses.add(cause, 1.0)
    assert LIMITS.next_due(0.0, None, pauses) is None
    assert LIMITS.expired(0.0, None, pauses, 25.0) is None  # held past the time-out
    pauses.remove(cause, 21.0)
    assert LIMITS.next_due(0.0, None, pauses) == 30.0  # 10 s of the server's, plus 20 held
    assert LIMITS.expired(0.0, None, pauses, 29.9) is None
    assert LIMITS.expired(0.0, None, pauses, 30.0) is TimeOut.TTFT


def test_overlapping_client_holds_count_once() -> None:
    pauses = Pauses()
    pauses.add(PauseCause.CLIENT, 1.0)
    pauses.add(PauseCause.DISCONNECTED, 2.0)
    pauses.remove(PauseCause.CLIENT, 3.0)
    assert LIMITS.next_due(0.0, None, pauses) is None  # still detached
    pauses.remove(PauseCause.DISCONNECTED, 5.0)
    assert LIMITS.next_due(0.0, None, pauses) == 14.0  # held 1.0 to 5.0: 4 s


@pytest.mark.parametrize("cause", [PauseCause.PREEMPTED, PauseCause.SOCKET_FULL])
def test_a_hold_of_the_servers_own_keeps_the_ttft_clock_running(cause: PauseCause) -> None:
    pauses = Pauses()
    pauses.add(cause, 1.0)
    assert LIMITS.next_due(0.0, None, pauses) == 10.0
    assert LIMITS.expired(0.0, None, pauses, 10.0) is TimeOut.TTFT


def test_a_client_hold_after_the_first_token_changes_nothing() -> None:
    pauses = Pauses()
    pauses.add(PauseCause.CLIENT, 5.0)
    assert LIMITS.next_due(0.0, 2.0, pauses) is None


@pytest.mark.parametrize("cause", [PauseCause.CLIENT, PauseCause.DISCONNECTED])
def test_a_stream_held_before_its_first_step_past_the_ttft_time_out_still_answers(
    cause: PauseCause,
) -> None:
    """The engine's side (deadlines.py asks the rules at every step): held by its
    client for 20 s before its first step, with a 5 s TTFT time-out, then resumed."""
    clock = ManualClock()
    settings = EngineSettings(ttft_timeout_s=5.0, max_pause_s=None, adaptive_threads=False)
    engine = SteppedEngine(build_parts(FakeBackend(), settings, clock=clock))  # type: ignore[arg-type]
    handle = engine.submit(GenerationRequest(list(range(500, 540)), 4))
    assert engine.pause(handle, cause)
    for _ in range(4):  # held: steps go by, 20 s in all
        clock.now += 5.0
        engine._step()
    assert not handle.finished, handle.outcome
    assert engine.resume(handle, cause)
    for _ in range(50):
        if handle.finished:
            break
        engine.consumed(handle, len(handle.ring.peek(100)))
        engine._step()
    assert handle.outcome is not None and handle.outcome.error is None, handle.outcome
    assert handle.seq.n_generated == 4
