"""The loop waker: what the inference thread wakes for reaches the loop, merged, and
waking keeps the GIL (the loop's turn waits until the caller gives it up)."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from edge_llm.engine.streams.waker import LoopWaker


@pytest.fixture
def long_gil_turns() -> Iterator[None]:
    """A thread that holds the GIL keeps it until it blocks: no forced switch."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


async def test_items_woken_for_from_another_thread_reach_the_loop_merged(
    long_gil_turns: None,
) -> None:
    loop = asyncio.get_running_loop()
    delivered: list[set[str]] = []
    delivered_on: set[int] = set()
    arrived = asyncio.Event()

    def deliver(items: set[str]) -> None:
        delivered_on.add(threading.get_ident())  # asserted below: the loop swallows errors
        delivered.append(items)
        if set().union(*delivered) == {"a", "b", "c"}:
            arrived.set()

    waker = LoopWaker(loop, deliver)

    def inference_thread() -> None:
        # Both in one GIL turn: the waker's thread cannot take the first before the second.
        waker.wake({"a", "b"})
        waker.wake({"b", "c"})

    await asyncio.to_thread(inference_thread)
    await arrived.wait()
    waker.close()
    assert delivered == [{"a", "b", "c"}]
    assert delivered_on == {threading.get_ident()}  # the loop's thread


async def test_waking_keeps_the_gil_so_the_loop_runs_only_once_the_caller_blocks(
    long_gil_turns: None,
) -> None:
    arrived = threading.Event()
    waker = LoopWaker(asyncio.get_running_loop(), lambda items: arrived.set())
    seen_while_holding: list[bool] = []

    def inference_thread() -> None:
        for token in range(5):
            arrived.clear()
            waker.wake({token})
            # Python work after the wake, as the step's next plan: a GIL release in
            # wake() would let the loop's thread run ``deliver`` meanwhile.
            until = time.perf_counter() + 0.01
            while time.perf_counter() < until:
                pass
            seen_while_holding.append(arrived.is_set())
            assert arrived.wait(timeout=30)  # blocks: the GIL goes, the loop delivers

    await asyncio.to_thread(inference_thread)
    waker.close()
    assert seen_while_holding == [False] * 5


def test_close_delivers_what_is_pending_and_a_closed_loop_is_not_an_error() -> None:
    delivered: list[set[int]] = []
    other = asyncio.new_event_loop()
    waker = LoopWaker(other, delivered.append)
    waker.wake({1})
    waker.close()  # the call reached the other loop's queue before the thread ended
    other.run_until_complete(asyncio.sleep(0))
    assert delivered == [{1}]
    other.close()
    closed = LoopWaker(other, delivered.append)
    closed.wake({2})
    closed.close()
    assert delivered == [{1}]
