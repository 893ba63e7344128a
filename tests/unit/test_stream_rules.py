"""A stream's rules, driven directly: events in with a fake clock, answers out."""

from __future__ import annotations

import pytest

from edge_llm.errors import Cancelled, PauseTimeout, TtftTimeout
from edge_llm.protocol.stream_rules import (
    Heartbeats,
    Marks,
    Outcome,
    PauseCause,
    Pauses,
    TimeLimits,
    TimeOut,
)


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def test_the_clients_pause_wins_else_the_first_cause() -> None:
    clock, pauses = Clock(), Pauses()
    assert pauses.add(PauseCause.PREEMPTED, clock.now) is True
    assert pauses.add(PauseCause.SOCKET_FULL, clock.advance(1)) is True
    assert pauses.cause is PauseCause.PREEMPTED  # the first that came
    assert pauses.add(PauseCause.CLIENT, clock.advance(1)) is True
    assert pauses.add(PauseCause.CLIENT, clock.advance(1)) is False  # held already
    assert pauses.cause is PauseCause.CLIENT
    assert (pauses.count, pauses.peak) == (3, 3)


def test_a_pause_ends_when_its_last_cause_goes_and_its_time_adds_up() -> None:
    clock, pauses = Clock(), Pauses()
    pauses.add(PauseCause.SOCKET_FULL, clock.now)
    pauses.add(PauseCause.CLIENT, clock.advance(1))
    assert pauses.remove(PauseCause.CLIENT, clock.advance(2)) == 2.0
    assert pauses.held and pauses.since == 100.0
    assert pauses.remove(PauseCause.CLIENT, clock.now) is None  # not held by it
    assert pauses.remove(PauseCause.SOCKET_FULL, clock.advance(1)) == 4.0
    assert not pauses.held and pauses.cause is None
    assert pauses.held_ms(clock.advance(10)) == 4000.0
    assert pauses.by_cause_s == {PauseCause.CLIENT: 2.0, PauseCause.SOCKET_FULL: 4.0}


def test_no_first_token_in_time_ends_the_stream_with_ttft_timeout() -> None:
    limits, pauses = TimeLimits(ttft_timeout_s=10.0, max_pause_s=60.0), Pauses()
    created = 100.0
    assert limits.next_due(created, None, pauses) == 110.0
    assert limits.expired(created, None, pauses, 109.999) is None
    due = limits.expired(created, None, pauses, 110.0)
    assert due is TimeOut.TTFT
    error = due.error(limits, "; prefilled 3/9 prompt tokens")
    assert isinstance(error, TtftTimeout) and error.extra["reason"] == "ttft_timeout"
    assert error.message == (
        "no first token within ttft_timeout_ms (10000 ms); prefilled 3/9 prompt tokens"
    )
    assert limits.next_due(created, 105.0, pauses) is None  # a first token came


def test_a_readers_pause_is_bounded_and_the_engines_own_are_not() -> None:
    limits, pauses = TimeLimits(ttft_timeout_s=None, max_pause_s=5.0), Pauses()
    pauses.add(PauseCause.PREEMPTED, 100.0)
    pauses.add(PauseCause.DISCONNECTED, 101.0)
    assert limits.next_due(90.0, 95.0, pauses) is None  # bounded elsewhere
    pauses.add(PauseCause.SOCKET_FULL, 102.0)
    pauses.add(PauseCause.CLIENT, 103.0)
    assert limits.next_due(90.0, 95.0, pauses) == 107.0  # the reader's earliest
    assert limits.expired(90.0, 95.0, pauses, 106.9) is None
    due = limits.expired(90.0, 95.0, pauses, 107.0)
    assert due is TimeOut.PAUSE
    error = due.error(limits, backend="up")
    assert isinstance(error, PauseTimeout)
    assert error.message == "paused longer than max_pause_ms (5000 ms)"
    assert error.to_dict()["error"]["backend"] == "up"


def test_the_earliest_time_out_is_the_one_that_fires() -> None:
    limits, pauses = TimeLimits(ttft_timeout_s=10.0, max_pause_s=2.0), Pauses()
    pauses.add(PauseCause.CLIENT, 101.0)
    assert limits.next_due(100.0, None, pauses) == 103.0
    assert limits.expired(100.0, None, pauses, 120.0) is TimeOut.PAUSE


@pytest.mark.parametrize("off", [None, 0.0])
def test_a_time_out_of_none_or_zero_never_falls_due(off: float | None) -> None:
    limits, pauses = TimeLimits(ttft_timeout_s=off, max_pause_s=off), Pauses()
    pauses.add(PauseCause.CLIENT, 0.0)
    assert limits.next_due(0.0, None, pauses) is None
    assert limits.expired(0.0, None, pauses, 1e9) is None


def test_the_buffer_is_full_at_its_high_mark_and_drained_at_its_low_one() -> None:
    marks = Marks(capacity=10, resume_threshold=0.3)
    assert (marks.full(9), marks.full(10)) == (False, True)
    assert (marks.drained(4), marks.drained(3)) == (False, True)
    assert Marks(capacity=4, resume_threshold=0.5).low == 2


def test_a_heartbeat_falls_due_an_interval_after_the_last_send() -> None:
    clock = Clock()
    beats = Heartbeats(interval_s=1.0, last_sent=clock.now)
    assert beats.wait_s(clock.advance(0.25)) == 0.75
    beats.sent(clock.now)
    assert beats.wait_s(clock.advance(1.0)) == 0.0  # due now


def test_an_outcome_says_why_it_was_cut_short() -> None:
    assert Outcome("stop").reason is None
    assert Outcome(None, Cancelled("superseded")).reason == "superseded"
    limits = TimeLimits(ttft_timeout_s=1.0)
    assert Outcome(None, TimeOut.TTFT.error(limits)).reason == "ttft_timeout"
