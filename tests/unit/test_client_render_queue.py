"""Render queue watermarks, the retry policy and the deadline watchdog (all sans I/O)."""

from __future__ import annotations

import random

import pytest

from edge_llm.client.config import RetryConfig
from edge_llm.client.errors import (
    ConnectError,
    HTTPStatusError,
    OverloadedError,
    ServerStreamError,
    TtftTimeoutError,
)
from edge_llm.client.render_queue import RenderQueue, RenderQueueFullError, Watermark
from edge_llm.client.retry import RetryPolicy
from edge_llm.client.watchdog import Deadline, Watchdog


def test_high_then_low_with_hysteresis() -> None:
    queue: RenderQueue[int] = RenderQueue(10, high_mark=8, low_mark=3)
    marks = [queue.push(i) for i in range(8)]
    assert marks == [None] * 7 + [Watermark.HIGH]
    assert queue.push(8) is None  # already above: no second HIGH
    popped = [queue.pop() for _ in range(6)]
    assert [item for item, _ in popped] == list(range(6))
    assert [mark for _, mark in popped] == [None] * 5 + [Watermark.LOW]
    assert len(queue) == 3
    assert queue.fill == pytest.approx(0.3)
    # Below high again: the next HIGH needs the high mark again.
    assert [queue.push(i) for i in range(5)] == [None] * 4 + [Watermark.HIGH]


def test_queue_is_bounded() -> None:
    queue: RenderQueue[str] = RenderQueue(2, high_mark=2, low_mark=0)
    queue.push("a")
    assert queue.push("b") is Watermark.HIGH
    assert queue.is_full
    with pytest.raises(RenderQueueFullError):
        queue.push("c")
    assert queue.pop() == ("a", None)
    assert queue.pop() == ("b", Watermark.LOW)
    with pytest.raises(IndexError):
        queue.pop()


@pytest.mark.parametrize(("high", "low"), [(5, 5), (11, 2), (3, -1)])
def test_bad_marks_rejected(high: int, low: int) -> None:
    with pytest.raises(ValueError, match="low_mark"):
        RenderQueue(10, high_mark=high, low_mark=low)


def policy(**fields: object) -> RetryPolicy:
    return RetryPolicy(RetryConfig(**fields), random.Random(1))  # type: ignore[arg-type]


def test_retry_only_listed_causes_and_within_attempts() -> None:
    retry = policy(max_attempts=3, backoff_ms=100, retry_on=["ttft_timeout", "connect_error"])
    timeout = TtftTimeoutError("slow", elapsed_ms=1)
    decision = retry.decide(timeout, 1, delivered=False)
    assert decision is not None
    assert (decision.next_attempt, decision.cause) == (2, "ttft_timeout")
    assert retry.decide(ConnectError("refused"), 2, delivered=False) is not None
    assert retry.decide(timeout, 3, delivered=False) is None  # attempts used up
    assert retry.decide(timeout, 1, delivered=True) is None  # text already shown
    assert retry.decide(ServerStreamError("x", server_code="boom"), 1, delivered=False) is None


def test_server_code_matches_retry_on() -> None:
    retry = policy(retry_on=["ttft_timeout"])
    error = ServerStreamError("engine ttft", server_code="ttft_timeout")
    decision = retry.decide(error, 1, delivered=False)
    assert decision is not None
    assert decision.cause == "ttft_timeout"


def test_4xx_never_retried_5xx_when_listed() -> None:
    retry = policy(max_attempts=5, retry_on=["http_status", "overloaded"])
    assert retry.decide(HTTPStatusError("no", status=401), 1, delivered=False) is None
    assert retry.decide(HTTPStatusError("no", status=429), 1, delivered=False) is None
    assert retry.decide(HTTPStatusError("gw", status=502), 1, delivered=False) is not None
    assert retry.decide(OverloadedError("busy"), 1, delivered=False) is not None


def test_backoff_doubles_with_bounded_jitter_and_honours_retry_after() -> None:
    retry = policy(max_attempts=5, backoff_ms=100, jitter=0.2, max_backoff_ms=1000)
    for attempt, base in [(1, 100), (2, 200), (3, 400)]:
        delay = retry.backoff_ms(attempt)
        assert base * 0.8 <= delay <= base * 1.2
    assert retry.backoff_ms(9) == 1000  # capped
    assert retry.backoff_ms(1, OverloadedError("busy", retry_after_s=0.7)) == 700
    delays = {retry.backoff_ms(1) for _ in range(20)}
    assert len(delays) > 1  # jittered


def test_watchdog_warn_then_hard_then_disarmed_by_token() -> None:
    dog = Watchdog(start=0.0, ttft_warn_s=1.0, ttft_hard_s=3.0, dead_after_s=0.5)
    assert dog.seconds_left(0.0) == 1.0
    assert dog.expired(0.5) is None
    assert dog.expired(1.0) is Deadline.TTFT_WARN
    assert dog.seconds_left(1.0) == 2.0  # the warning fires once
    assert dog.expired(3.0) is Deadline.TTFT_HARD
    dog.first_token()
    assert dog.seconds_left(10.0) is None  # not armed, no TTFT limits left


def test_watchdog_dead_only_when_armed_and_touch_restarts() -> None:
    dog = Watchdog(start=0.0, ttft_warn_s=0, ttft_hard_s=0, dead_after_s=3.0)
    assert dog.expired(100.0) is None
    dog.arm()
    dog.bytes_received(100.0)
    assert dog.seconds_left(101.0) == 2.0
    assert dog.expired(103.0) is Deadline.DEAD
    dog.touch(110.0)  # the reader was paused on purpose
    assert dog.expired(112.0) is None
