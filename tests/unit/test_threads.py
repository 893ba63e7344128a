"""The decode-thread governor: fewer threads while the cores are contended, back
once they are free, a first step after idle on the cores free then, and what it reads
from /proc."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from edge_llm.engine import EngineSettings, build_engine
from edge_llm.engine.runtime.threads import (
    APART_S,
    DROP_AT,
    FIRST_RETRY_S,
    IDLE_S,
    MAX_RETRY_S,
    MIN_LIFE_S,
    RAISE_AT,
    SAMPLES,
    WINDOW_S,
    ProcCores,
    ProcRunDelay,
    ProcRunQueue,
    ThreadGovernor,
)
from edge_llm.engine.sequence import GenerationRequest
from edge_llm.observability.events import Event

from fakes import FakeBackend, drain


class Machine:
    """A clock, a run-queue delay and busy cores the test moves: each window of decode
    waits ``load`` threads' worth."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waited = 0.0
        self.busy = 0.0
        self.busy_reads = 0
        self.set_to: list[int] = []
        self.events: list[tuple[Event, dict[str, object]]] = []

    def clock(self) -> float:
        return self.now

    def run_delay(self) -> float:
        return self.waited

    def busy_cores(self) -> float:
        self.busy_reads += 1
        return self.busy

    def governor(self, max_threads: int = 2, cpus: int = 2) -> ThreadGovernor:
        return ThreadGovernor(
            max_threads, self.set_to.append, self, self.clock, cpus, events=self.emit
        )

    def emit(self, event: Event, request_id: str | None = None, /, **fields: object) -> None:
        self.events.append((event, fields))

    def window(self, governor: ThreadGovernor, load: float, seconds: float = WINDOW_S) -> None:
        self.now += seconds
        self.waited += load * seconds
        governor.observe(seconds)


def test_a_contended_window_drops_a_thread_and_a_quiet_one_keeps_them() -> None:
    machine = Machine()
    machine.busy = 1.0  # the neighbour that makes the decode threads wait
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
    machine.busy = 1.0  # a neighbour still there: no thread comes back before a try
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
    machine.busy = 1.0
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


def test_a_fresh_engine_starts_on_the_cores_other_processes_leave_free() -> None:
    """One step on too many threads can stall past a TTFT time-out before any window
    of decode is measured, so the first step does not wait for one."""
    for busy, threads in ((0.0, []), (0.4, []), (1.0, [1]), (2.0, [1])):
        machine = Machine()
        machine.busy = busy
        machine.governor().before_step()
        assert machine.set_to == threads, busy


def test_busy_cores_our_threads_do_not_use_leave_them_alone() -> None:
    for busy, threads in ((2.0, []), (3.0, [1]), (5.0, [1])):
        machine = Machine()
        machine.busy = busy
        machine.governor(max_threads=2, cpus=4).before_step()
        assert machine.set_to == threads, busy
    machine = Machine()
    machine.busy = 2.0
    machine.governor(max_threads=6, cpus=4).before_step()  # oversubscribed by choice
    assert machine.set_to == [4]


def test_the_cores_are_counted_again_only_after_an_idle_spell() -> None:
    machine = Machine()
    machine.busy = 2.0
    governor = machine.governor()
    governor.before_step()
    for _ in range(20):  # busy steps: the windows govern, at no extra reading
        machine.window(governor, load=0.5, seconds=0.1)
        governor.before_step()
    assert machine.busy_reads == 1 and machine.set_to == [1]
    machine.busy = 0.0
    machine.now += IDLE_S
    governor.before_step()  # the busy loops ended while the engine was idle
    assert machine.busy_reads == 2 and machine.set_to == [1, 2]


def test_a_start_on_fewer_threads_waits_before_trying_one_more() -> None:
    """As after a contended window: a quiet window on one thread beside one busy core
    is no reason to try two at once."""
    machine = Machine()
    machine.busy = 1.0
    governor = machine.governor()
    governor.before_step()
    machine.window(governor, load=0.0)
    assert machine.set_to == [1]
    machine.now += FIRST_RETRY_S
    machine.window(governor, load=0.0)
    assert machine.set_to == [1, 2]


HZ, UPTIME_S = 100, 1000.0


def write_task(
    task: Path, state: str, cpu_s: float = 0.0, life_s: float = 10.0, nice: int = 0
) -> None:
    """A task's stat line: ``cpu_s`` of CPU (utime + stime) over ``life_s``, at ``nice``."""
    task.mkdir(parents=True, exist_ok=True)
    name = "(edge llm) R)"  # a thread may name itself anything, ")" included
    utime = round(cpu_s * HZ / 2)
    start = round((UPTIME_S - life_s) * HZ)
    cpu = [str(utime), str(round(cpu_s * HZ) - utime)]
    fields = [state, *["0"] * 10, *cpu, "0", "0", "0", str(nice), "0", "0"]
    (task / "stat").write_text(f"{task.name} {name} {' '.join([*fields, str(start), '0'])}\n")


def write_proc(
    proc: Path,
    running: int,
    machine_cpus: int,
    states: dict[int, str],
    others: dict[int, list[tuple[str, float, float] | tuple[str, float, float, int]]] | None = None,
) -> None:
    """A /proc: ``states`` of this process's threads; ``others``: per process id, its
    threads' (state, CPU seconds, life seconds[, nice])."""
    cpus = "".join(f"cpu{n} 1 2 3\n" for n in range(machine_cpus))
    proc.mkdir(parents=True, exist_ok=True)
    (proc / "stat").write_text(f"cpu 4 5 6\n{cpus}intr 7\nprocs_running {running}\n")
    (proc / "uptime").write_text(f"{UPTIME_S} 1.0\n")
    for tid, state in states.items():
        write_task(proc / "self" / "task" / str(tid), state)
    for pid, tasks in (others or {}).items():
        for n, task in enumerate(tasks):
            write_task(proc / str(pid) / "task" / str(pid + n), *task)


def run_queue(proc: Path, cpus: int = 2, nice: int = 0) -> float:
    return ProcRunQueue(proc, cpus=cpus, ticks_per_s=HZ, nice=nice)()


BUSY_LOOP = ("R", 60.0, 60.0)  # a core's worth for all its life
LIGHT_CLIENT = ("R", 0.5, 60.0)  # a client waiting on its sockets, running right now


def test_proc_run_queue_weighs_other_runnable_tasks_by_their_cpu_share(tmp_path: Path) -> None:
    write_proc(
        tmp_path, running=5, machine_cpus=2, states={1: "R", 2: "S"},
        others={100: [BUSY_LOOP, ("S", 60.0, 60.0)], 200: [BUSY_LOOP, ("D", 60.0, 60.0)]},
    )  # fmt: skip
    assert run_queue(tmp_path) == pytest.approx(2.0)  # two busy loops; ours and sleepers not
    write_proc(tmp_path / "light", running=3, machine_cpus=2, states={1: "R"},
               others={300: [LIGHT_CLIENT, LIGHT_CLIENT]})  # fmt: skip
    assert run_queue(tmp_path / "light") == pytest.approx(2 * 0.5 / 60)
    write_proc(tmp_path / "young", running=2, machine_cpus=2, states={1: "R"},
               others={400: [("R", 0.05, 0.01)]})  # fmt: skip
    assert run_queue(tmp_path / "young") == pytest.approx(0.05 / MIN_LIFE_S)
    write_proc(tmp_path / "eight", running=5, machine_cpus=8, states={1: "S"},
               others={500: [BUSY_LOOP] * 5})  # fmt: skip
    assert run_queue(tmp_path / "eight") == pytest.approx(5 * 2 / 8)  # our 2 of the 8 CPUs


def test_proc_run_queue_counts_niced_work_by_the_share_it_would_get(tmp_path: Path) -> None:
    """A busy loop at nice 10 (a test suite, a build run in the background) yields the
    core to us: it counts as its CFS weight beside ours, not as a core."""
    write_proc(tmp_path, running=3, machine_cpus=2, states={1: "R"},
               others={100: [(*BUSY_LOOP, 10)], 200: [(*BUSY_LOOP, -5)]})  # fmt: skip
    assert run_queue(tmp_path) == pytest.approx(1.25**-10 + 1.0)  # a more urgent one: a core
    assert run_queue(tmp_path, nice=10) == pytest.approx(2.0)  # both at or above our priority


def test_proc_run_queue_scans_nothing_when_only_our_threads_run(tmp_path: Path) -> None:
    write_proc(tmp_path, running=2, machine_cpus=2, states={1: "R", 2: "R"},
               others={100: [BUSY_LOOP]})  # fmt: skip
    assert run_queue(tmp_path) == 0  # the busy loop's R is stale: procs_running says 2


def test_proc_run_queue_reads_a_broken_proc_as_no_busy_core(tmp_path: Path) -> None:
    write_proc(tmp_path, running=3, machine_cpus=2, states={}, others={100: [BUSY_LOOP]})
    (tmp_path / "stat").write_text("cpu 4 5 6\nprocs_running\n")
    assert run_queue(tmp_path) == 0  # unreadable: never an error on the step
    write_proc(tmp_path, running=3, machine_cpus=2, states={})
    (tmp_path / "self" / "task" / "1").mkdir(parents=True)
    (tmp_path / "self" / "task" / "1" / "stat").write_text("1 no name field\n")
    assert run_queue(tmp_path) == pytest.approx(1.0)  # the busy loop still counts
    (tmp_path / "100" / "task" / "100" / "stat").write_text("100 (short) R 1 2\n")
    assert run_queue(tmp_path) == 0  # a stat line without the CPU fields counts as none
    (tmp_path / "uptime").unlink()
    write_task(tmp_path / "100" / "task" / "100", *BUSY_LOOP)
    assert run_queue(tmp_path) == 0


def test_a_light_client_beside_the_engine_leaves_it_every_thread(tmp_path: Path) -> None:
    """Issue 49: four streams from a client on the same machine started on one thread,
    its threads runnable in the run-queue snapshot; weighed by its CPU share it is no
    busy core. Two busy loops still are."""
    write_proc(tmp_path, running=4, machine_cpus=2, states={1: "R"},
               others={300: [LIGHT_CLIENT] * 3})  # fmt: skip
    machine = Machine()
    cores = ProcCores(run_delay=machine.run_delay, run_queue=lambda: run_queue(tmp_path))
    governor = ThreadGovernor(
        2, machine.set_to.append, cores, machine.clock, 2, events=machine.emit
    )
    governor.before_step()
    assert machine.set_to == [] and governor.threads == 2
    write_proc(tmp_path, running=3, machine_cpus=2, states={1: "R"},
               others={300: [LIGHT_CLIENT], 400: [BUSY_LOOP], 500: [BUSY_LOOP]})  # fmt: skip
    machine.now += IDLE_S
    governor.before_step()
    assert machine.set_to == [1]


def test_threads_come_back_at_once_when_the_busy_cores_are_gone() -> None:
    machine = Machine()
    machine.busy = 2.0
    governor = machine.governor()
    governor.before_step()
    machine.window(governor, load=0.0)  # one thread beside two busy loops: no wait
    assert machine.set_to == [1]
    machine.busy = 0.0  # they ended: no back-off to wait out
    machine.window(governor, load=0.0)
    assert machine.set_to == [1, 2]
    assert machine.now < FIRST_RETRY_S


def test_a_wrong_reading_of_gone_busy_cores_costs_one_try_then_waits() -> None:
    """A neighbour the busy-core reading misses (a long idle process turned busy):
    the quick way back fails once and then the back-off governs."""
    machine = Machine()
    governor = machine.governor()
    machine.window(governor, load=1.0)
    machine.window(governor, load=0.0)  # reads no busy core: back at once ...
    machine.window(governor, load=1.0)  # ... which fails
    assert machine.set_to == [1, 2, 1]
    for _ in range(3):
        machine.window(governor, load=0.0)  # no quick try after a failed one
    assert machine.set_to == [1, 2, 1]
    machine.now += 2 * FIRST_RETRY_S
    machine.window(governor, load=0.0)
    assert machine.set_to == [1, 2, 1, 2]


def test_every_change_is_an_event_with_the_reading_that_caused_it() -> None:
    machine = Machine()
    machine.busy = 2.0
    governor = machine.governor()
    governor.before_step()
    machine.busy = 0.0
    machine.window(governor, load=0.0)
    assert machine.events == [
        (Event.DECODE_THREADS, {"threads": 1, "before": 2, "reason": "busy cores after idle",
                                "reading": 2.0}),
        (Event.DECODE_THREADS, {"threads": 2, "before": 1, "reason": "busy cores gone",
                                "reading": 0.0}),
    ]  # fmt: skip


def test_busy_cores_are_the_least_of_a_few_readings_a_moment_apart() -> None:
    readings, slept = iter([3.0, 1.0, 2.0, 0.0]), []
    cores = ProcCores(run_delay=lambda: 0.0, run_queue=lambda: next(readings), sleep=slept.append)
    assert cores.busy_cores() == 1.0  # the first SAMPLES readings
    assert slept == [APART_S] * (SAMPLES - 1)
    readings, slept = iter([0.0, 5.0]), []
    assert cores.busy_cores() == 0.0  # none busy: no reason to wait and read again
    assert slept == []


@pytest.mark.skipif(sys.platform != "linux", reason="/proc is Linux's")
def test_proc_cores_read_this_machine() -> None:
    assert ProcCores.available()
    cores = ProcCores()
    assert cores.busy_cores() >= 0.0
    assert cores.run_delay() >= 0.0


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


class Waiting:
    """Decode threads that wait ``load`` threads' worth for every second from now,
    beside ``busy`` cores of other processes."""

    def __init__(self, load: float, busy: float = 0.0) -> None:
        self.load, self.busy = load, busy
        self.began = time.monotonic()

    def run_delay(self) -> float:
        return self.load * (time.monotonic() - self.began)

    def busy_cores(self) -> float:
        return self.busy


async def test_under_contention_the_engine_drops_a_thread_and_the_stream_says_the_same(
    engine_of,
) -> None:
    texts, thread_counts, first_steps = [], [], []
    for cores in (Waiting(load=0.0), Waiting(load=1.0), Waiting(load=1.0, busy=2.0)):
        backend = FakeBackend()
        backend.n_threads, backend.step_delay_s = 2, 0.02  # 40 steps: over one window
        engine = engine_of(backend, cores=cores)
        request = GenerationRequest(prompt_tokens=[1, 2, 3], max_tokens=40)
        texts.append(await drain(engine, engine.submit(request)))
        thread_counts.append(backend.thread_counts)
        first_steps.append(backend.decode_threads[0])
    assert thread_counts == [[], [1], [1]]
    assert first_steps == [2, 2, 1]  # beside busy cores, not even the first step on two
    assert texts[0] == texts[1] == texts[2]


def test_without_adaptive_threads_or_with_one_thread_nothing_is_governed() -> None:
    backend = FakeBackend()
    quiet = Waiting(load=0.0)
    assert build_engine(backend, EngineSettings(), cores=quiet).threads is None
    backend.n_threads = 2
    assert build_engine(backend, EngineSettings(), cores=quiet).threads is not None
    off = EngineSettings(adaptive_threads=False)
    assert build_engine(backend, off, cores=quiet).threads is None
