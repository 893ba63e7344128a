"""The decode-thread governor: fewer threads while the cores are contended, back
once they are free, and the run-queue delay it reads from /proc."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from edge_llm.engine.engine import Engine, EngineSettings
from edge_llm.engine.sequence import GenerationRequest
from edge_llm.engine.threads import (
    DROP_AT,
    FIRST_RETRY_S,
    MAX_RETRY_S,
    RAISE_AT,
    WINDOW_S,
    ProcRunDelay,
    RunDelaySource,
    ThreadGovernor,
)

from fakes import FakeBackend, drain


class Machine:
    """A clock and a run-queue delay the test moves: each window of decode waits
    ``load`` threads' worth."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waited = 0.0
        self.set_to: list[int] = []

    def clock(self) -> float:
        return self.now

    def run_delay(self) -> float:
        return self.waited

    def governor(self, max_threads: int = 2) -> ThreadGovernor:
        return ThreadGovernor(max_threads, self.set_to.append, self.run_delay, self.clock)

    def window(self, governor: ThreadGovernor, load: float, seconds: float = WINDOW_S) -> None:
        self.now += seconds
        self.waited += load * seconds
        governor.observe(seconds)


def test_a_contended_window_drops_a_thread_and_a_quiet_one_keeps_them() -> None:
    machine = Machine()
    governor = machine.governor()
    machine.window(governor, load=RAISE_AT / 2)
    machine.window(governor, load=DROP_AT * 0.9)
    assert machine.set_to == []
    machine.window(governor, load=1.0)
    assert machine.set_to == [1] and governor.threads == 1
    for _ in range(10):  # one thread, still contended: never below one, never back up
        machine.window(governor, load=0.5)
    assert machine.set_to == [1]


def test_short_steps_are_summed_into_a_window_before_the_delay_is_read() -> None:
    machine = Machine()
    governor = machine.governor()
    for _ in range(4):
        machine.window(governor, load=1.0, seconds=WINDOW_S / 5)
    assert machine.set_to == []
    machine.window(governor, load=1.0, seconds=WINDOW_S / 5)
    assert machine.set_to == [1]
    assert governor.last_load == pytest.approx(1.0)


def test_threads_come_back_when_quiet_and_a_failed_try_waits_twice_as_long() -> None:
    machine = Machine()
    governor = machine.governor()
    machine.window(governor, load=1.0)  # dropped to one at t=0.5: may try again at 2.5
    machine.window(governor, load=0.0)
    assert machine.set_to == [1]
    machine.now += FIRST_RETRY_S
    machine.window(governor, load=0.0)
    assert machine.set_to == [1, 2]
    machine.window(governor, load=0.7)  # the try made it worse: back, wait 2 * FIRST_RETRY_S
    assert machine.set_to == [1, 2, 1]
    machine.now += FIRST_RETRY_S
    machine.window(governor, load=0.0)
    assert machine.set_to == [1, 2, 1]
    machine.now += FIRST_RETRY_S
    machine.window(governor, load=0.0)
    assert machine.set_to == [1, 2, 1, 2]
    machine.window(governor, load=0.0)  # this try held: the next wait is the first again
    machine.window(governor, load=1.0)
    assert machine.set_to == [1, 2, 1, 2, 1]
    machine.now += FIRST_RETRY_S
    machine.window(governor, load=0.0)
    assert machine.set_to[-1] == 2


def test_the_wait_between_failed_tries_is_bounded() -> None:
    machine = Machine()
    governor = machine.governor()
    machine.window(governor, load=1.0)
    for _ in range(12):
        machine.now += MAX_RETRY_S
        machine.window(governor, load=0.0)  # try
        machine.window(governor, load=1.0)  # fails
    assert governor.threads == 1
    machine.now += MAX_RETRY_S
    machine.window(governor, load=0.0)
    assert governor.threads == 2


def test_several_threads_are_dropped_one_window_at_a_time() -> None:
    machine = Machine()
    governor = machine.governor(max_threads=4)
    for _ in range(5):
        machine.window(governor, load=1.5)
    assert machine.set_to == [3, 2, 1]


def write_schedstat(tasks: Path, tid: int, delay_ns: int) -> None:
    (tasks / str(tid)).mkdir(exist_ok=True)
    (tasks / str(tid) / "schedstat").write_text(f"123456 {delay_ns} 7\n")


def test_proc_run_delay_counts_this_thread_and_native_workers_but_not_python_threads(
    tmp_path: Path,
) -> None:
    """Read on the engine thread: llama.cpp's workers are native threads Python does
    not know; the event loop's and other Python threads' waits are not the decode's."""
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert other.native_id is not None
        me, worker = threading.get_native_id(), 10**7 + 1
        write_schedstat(tmp_path, me, 1_000_000_000)
        write_schedstat(tmp_path, other.native_id, 5_000_000_000)
        delay = ProcRunDelay(tmp_path)
        assert delay() == pytest.approx(1.0)
        write_schedstat(tmp_path, worker, 250_000_000)  # starts at the first decode
        write_schedstat(tmp_path, other.native_id, 9_000_000_000)
        assert delay() == pytest.approx(1.25)
        write_schedstat(tmp_path, me, 1_500_000_000)
        (tmp_path / str(worker) / "schedstat").unlink()  # the worker ended: its share stays
        assert delay() == pytest.approx(1.75)
        assert delay() == pytest.approx(1.75)
    finally:
        stop.set()
        other.join()


@pytest.mark.skipif(sys.platform != "linux", reason="schedstat is Linux's")
def test_proc_run_delay_reads_this_machine() -> None:
    assert ProcRunDelay.available()
    delay = ProcRunDelay()
    first = delay()
    assert first >= 0.0 and delay() >= first


def waiting(load: float) -> RunDelaySource:
    """Decode threads that wait ``load`` threads' worth for every second from now."""
    began = time.monotonic()
    return lambda: load * (time.monotonic() - began)


async def test_under_contention_the_engine_drops_a_thread_and_the_stream_says_the_same(
    engine_of,
) -> None:
    texts, thread_counts = [], []
    for load in (0.0, 1.0):
        backend = FakeBackend()
        backend.n_threads, backend.step_delay_s = 2, 0.02  # 40 steps: over one window
        engine = engine_of(backend, run_delay=waiting(load))
        request = GenerationRequest(prompt_tokens=[1, 2, 3], max_tokens=40)
        texts.append(await drain(engine, engine.submit(request)))
        thread_counts.append(backend.thread_counts)
    assert thread_counts == [[], [1]]
    assert texts[0] == texts[1]


def test_without_adaptive_threads_or_with_one_thread_nothing_is_governed() -> None:
    backend = FakeBackend()
    assert Engine(backend, EngineSettings(), run_delay=lambda: 0.0).threads is None
    backend.n_threads = 2
    assert Engine(backend, EngineSettings(), run_delay=lambda: 0.0).threads is not None
    off = EngineSettings(adaptive_threads=False)
    assert Engine(backend, off, run_delay=lambda: 0.0).threads is None
