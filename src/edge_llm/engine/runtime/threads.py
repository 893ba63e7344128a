"""Decode threads under CPU contention: fewer llama.cpp threads while other processes
hold the cores, all of them again once the cores are free.

llama.cpp's threads meet at a barrier after every graph node (about 900 per step for
SmolLM2), and libgomp waits at a barrier by spinning. When another process keeps a
core busy, the scheduler runs our threads in turns: one spins on its core while the
other waits for a core, and every barrier costs a time slice. Beside two busy loops
on two cores, steps then took 3 s instead of 0.1 s, for minutes at a time. One
thread has no barrier to wait at. llama.cpp's logits do not depend on the thread
count (each output row is computed by one thread), so the text does not change.

The measure is run-queue delay: the seconds the engine thread and llama.cpp's worker
threads spent runnable but waiting for a core (``/proc/self/task/*/schedstat``, second
field), per second of decode. On a quiet machine it stays near 0; each competing
busy thread on a fully used machine adds to it. Over ``DROP_AT`` the governor drops a
thread; under ``RAISE_AT`` it tries one more, backing off while such tries fail.

That measure needs a window of decode, and one step on too many threads can itself
stall for seconds. So the first step after an idle spell (and a fresh engine's first)
starts on the threads the cores have room for now: the other processes' runnable
tasks count as busy cores, each weighted by the share of a core it has used over its
life. A busy loop weighs about 1; a client that mostly sleeps on its sockets (the
one that just sent the request, on the same device) weighs a few hundredths, so it
does not cost the engine a thread (issue 49: four streams from a light client ran on
one thread for their first 2 s, 0.80x llama-server). While below full width, each
window also reads the busy cores, and the thread comes back at once when none is.
Every change is an event (``decode_threads``) with the reading that caused it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from edge_llm.observability.events import Event, EventSink, null_sink

if TYPE_CHECKING:
    from edge_llm.engine.runtime.backend import Backend

log = logging.getLogger(__name__)
T = TypeVar("T")

WINDOW_S = 0.5  # seconds of decode between two readings
DROP_AT = 0.3  # threads' worth of waiting per second of decode: contended
RAISE_AT = 0.05  # below this a thread may be added back
FIRST_RETRY_S = 2.0  # after a failed try with one thread more, doubled up to MAX_RETRY_S
MAX_RETRY_S = 60.0
IDLE_S = 1.0  # a step after this long without one counts the busy cores first
SAMPLES, APART_S = 3, 0.002  # readings of the run queue and the time between them
MIN_LIFE_S = 0.1  # a younger task's share of a core is counted over this long
# Linux's CFS weighs each nice level about 1.25x the next (sched_prio_to_weight).
NICE_WEIGHT_STEP = 1.25


class CoreReadings(Protocol):
    """What the governor reads about the cores."""

    def run_delay(self) -> float:
        """Cumulative seconds the decode threads were runnable but waiting for a core."""
        ...

    def busy_cores(self) -> float:
        """Cores the other processes' runnable tasks hold now."""
        ...


class ProcRunDelay:
    """Cumulative run-queue delay of the calling thread and every native thread that is
    not a Python thread (llama.cpp's OpenMP workers), from Linux's schedstat."""

    def __init__(self, tasks: Path = Path("/proc/self/task")) -> None:
        self.tasks = tasks
        self._last: dict[int, int] = {}
        self._total_ns = 0

    @classmethod
    def available(cls, tasks: Path = Path("/proc/self/task")) -> bool:
        return (tasks / str(threading.get_native_id()) / "schedstat").exists()

    def __call__(self) -> float:
        others = {t.native_id for t in threading.enumerate()} - {threading.get_native_id()}
        seen: dict[int, int] = {}
        for task in self.tasks.iterdir():
            tid = int(task.name)
            if tid in others:
                continue
            try:
                seen[tid] = int((task / "schedstat").read_text().split()[1])
            except (OSError, ValueError, IndexError):
                continue  # the thread ended while we read
        # A thread seen for the first time (llama.cpp's workers start at the first decode)
        # adds all its delay so far; an ended thread keeps its share.
        self._total_ns += sum(max(0, ns - self._last.get(tid, 0)) for tid, ns in seen.items())
        self._last.update(seen)
        return self._total_ns / 1e9


class ProcRunQueue:
    """Cores the other processes' runnable tasks hold right now, on this process's
    cores: each task in state R outside this process counts as the share of a core it
    has used over its life (a busy loop about 1, a client waiting on sockets nearly
    0), scaled by the share of the machine's CPUs this process may use. A task niced
    below this process counts by the CPU time the scheduler would give it beside us
    (its weight over ours: at nice +10, about a tenth), since it yields the core. The
    scan of every task runs only when ``/proc/stat``'s ``procs_running`` shows more
    runnable tasks than this process's own."""

    def __init__(
        self,
        proc: Path = Path("/proc"),
        cpus: int | None = None,
        ticks_per_s: int = 0,
        nice: int | None = None,
    ) -> None:
        self.proc = proc
        self.cpus = cpus or usable_cpus()
        self.ticks_per_s = ticks_per_s or os.sysconf("SC_CLK_TCK")
        self.nice = os.getpriority(os.PRIO_PROCESS, 0) if nice is None else nice

    @classmethod
    def available(cls, proc: Path = Path("/proc")) -> bool:
        return (proc / "stat").exists() and (proc / "self" / "task").exists()

    def __call__(self) -> float:
        try:
            lines = (self.proc / "stat").read_text().splitlines()
            running = sum(int(line.split()[1]) for line in lines if line[:14] == "procs_running ")
            if running <= self._own_running():
                return 0.0  # the usual quiet case: no scan
            busy = self._others_busy()
        except (OSError, ValueError, IndexError):
            return 0.0  # unreadable: the windows of decode still govern
        machine_cpus = sum(1 for line in lines if line[:3] == "cpu" and line[3:4].isdigit())
        return busy * min(1.0, self.cpus / max(1, machine_cpus))

    def _own_running(self) -> int:
        return sum(_fields(task / "stat")[:1] == ["R"] for task in self._tasks(self.proc / "self"))

    def _others_busy(self) -> float:
        """The runnable tasks of other processes, each weighted by its life's CPU share."""
        now_s = float((self.proc / "uptime").read_text().split()[0])
        own = (self.proc / "self").resolve().name
        busy = 0.0
        for process in self.proc.iterdir():
            if not process.name.isdigit() or process.name == own:
                continue
            for task in self._tasks(process):
                fields = _fields(task / "stat")
                if fields[:1] == ["R"] and len(fields) > 19:
                    busy += self._share(fields, now_s)
        return busy

    def _share(self, fields: list[str], now_s: float) -> float:
        """A task's CPU seconds (utime + stime) over its life, at most one core, times
        its scheduling weight beside ours when it is niced below us."""
        cpu_s = (int(fields[11]) + int(fields[12])) / self.ticks_per_s
        life_s = max(MIN_LIFE_S, now_s - int(fields[19]) / self.ticks_per_s)
        below_us = max(0, int(fields[16]) - self.nice)
        return min(1.0, cpu_s / life_s) * NICE_WEIGHT_STEP**-below_us

    @staticmethod
    def _tasks(process: Path) -> Iterator[Path]:
        try:
            yield from (process / "task").iterdir()
        except OSError:
            return  # the process ended while we read


def _fields(stat: Path) -> list[str]:
    """A task's stat fields from its state letter on (after its name, which may hold
    spaces); none when the task ended while we read or the line is not a stat line."""
    try:
        text = stat.read_text()
        return text[text.rindex(")") + 2 :].split()
    except (OSError, ValueError):
        return []


def usable_cpus() -> int:
    affinity = getattr(os, "sched_getaffinity", None)  # Linux's; elsewhere all CPUs
    return len(affinity(0)) if affinity else os.cpu_count() or 1


class ProcCores:
    """The governor's readings from Linux's /proc."""

    def __init__(
        self,
        run_delay: Callable[[], float] | None = None,
        run_queue: Callable[[], float] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._run_delay = run_delay or ProcRunDelay()
        self._run_queue = run_queue or ProcRunQueue()
        self._sleep = sleep

    @classmethod
    def available(cls) -> bool:
        return ProcRunDelay.available() and ProcRunQueue.available()

    def run_delay(self) -> float:
        return self._run_delay()

    def busy_cores(self) -> float:
        """The least of a few readings a moment apart: a task that runs for an instant
        (a shell, the client that sent the request) does not hold a core."""
        least = self._run_queue()
        for _ in range(SAMPLES - 1):
            if least == 0:  # the usual quiet case: no wait before the step
                break
            self._sleep(APART_S)
            least = min(least, self._run_queue())
        return least


class ThreadGovernor:
    """Called before and after each decode; sets the backend's thread count."""

    def __init__(
        self,
        max_threads: int,
        set_threads: Callable[[int], None],
        cores: CoreReadings,
        clock: Callable[[], float],
        cpus: int,
        *,
        events: EventSink = null_sink,
    ) -> None:
        self.max_threads = max_threads
        self.threads = max_threads
        self._set_threads = set_threads
        self._cores = cores
        self._clock = clock
        self._events = events
        self._spare_cpus = max(0, cpus - max_threads)  # cores our threads never use
        self._last_step_at: float | None = None
        self._busy_s = 0.0
        self._waited_s = 0.0
        self._retry_s = FIRST_RETRY_S
        self._raise_after = 0.0
        self._trying = False
        self.last_load = 0.0

    def before_step(self) -> None:
        """After an idle spell, start on the threads the busy cores leave room for; the
        windows of decode that follow correct it either way."""
        now, last = self._clock(), self._last_step_at
        if last is not None and now - last < IDLE_S:
            return
        busy, fits = self._room()
        self._trying = False
        if fits < self.threads:  # as after a contended window: no try at once
            self._raise_after = now + self._retry_s
        if fits != self.threads:
            self._set(fits, "busy cores after idle", busy)

    def _room(self) -> tuple[float, int]:
        """The busy cores now, and the threads they leave room for (at least one)."""
        busy = self._cores.busy_cores()
        return busy, max(1, self.max_threads - max(0, round(busy - self._spare_cpus)))

    def observe(self, decode_s: float) -> None:
        """After each decode, with its duration."""
        self._last_step_at = self._clock()
        self._busy_s += decode_s
        if self._busy_s < WINDOW_S:
            return
        waited = self._cores.run_delay()
        self.last_load = (waited - self._waited_s) / self._busy_s
        self._waited_s, self._busy_s = waited, 0.0
        self._adjust(self.last_load, self._last_step_at)

    def _adjust(self, load: float, now: float) -> None:
        trying, self._trying = self._trying, False
        if load > DROP_AT and self.threads > 1:
            if trying:  # the thread added back made it worse: wait longer next time
                self._retry_s = min(MAX_RETRY_S, self._retry_s * 2)
            self._raise_after = now + self._retry_s
            self._set(self.threads - 1, "run-queue delay", load)
            return
        if trying:
            self._retry_s = FIRST_RETRY_S
        if load >= RAISE_AT or self.threads >= self.max_threads:
            return
        if self._retry_s == FIRST_RETRY_S:  # no try has failed since the last success
            busy, fits = self._room()
            if fits > self.threads:  # the busy cores are gone: all of them back at once
                self._trying = True
                self._set(fits, "busy cores gone", busy)
                return
        if now >= self._raise_after:
            self._trying = True
            self._set(self.threads + 1, "run-queue delay", load)

    def _set(self, threads: int, why: str, reading: float) -> None:
        log.info("decode threads %d -> %d (%s %.2f)", self.threads, threads, why, reading)
        self._events(
            Event.DECODE_THREADS, None,
            threads=threads, before=self.threads, reason=why, reading=round(reading, 3),
        )  # fmt: skip
        self.threads = threads
        self._set_threads(threads)


def thread_governor(
    backend: Backend,
    adaptive: bool,
    clock: Callable[[], float],
    cores: CoreReadings | None,
    events: EventSink = null_sink,
) -> ThreadGovernor | None:
    """A governor for ``backend``'s threads, or None where there is nothing to govern
    (one thread, turned off, or no /proc to read)."""
    if not adaptive or backend.n_threads <= 1:
        return None
    if cores is None:
        if not ProcCores.available():
            return None
        cores = ProcCores()
    return ThreadGovernor(
        backend.n_threads, backend.set_threads, cores, clock, usable_cpus(), events=events
    )


async def in_passing_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a thread of its own that ends with it: llama.cpp work outside the
    engine thread (the prefill probe at start, embeddings) runs here, never in asyncio's
    executor, whose threads live on. llama.cpp's CPU backend runs on OpenMP (libgomp),
    which keeps a pool of workers for each thread that computed, as long as that thread
    lives, and an idle pool slows every other thread's graphs: with the prefill probe's
    pool left in an executor thread, the engine thread decoded Qwen2.5-Coder-1.5B at
    8.5-12.5 tok/s against 15.2-17.2 (2 cores, 2026-12-08)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if done.cancelled():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(cast(T, result))

    def run() -> None:
        try:
            result = fn(*args)
        except BaseException as error:  # handed to the awaiting task
            loop.call_soon_threadsafe(settle, None, error)
        else:
            loop.call_soon_threadsafe(settle, result, None)

    thread = threading.Thread(target=run, name="edge-llm-passing", daemon=True)
    thread.start()
    try:
        return await done
    finally:
        await asyncio.to_thread(thread.join)
