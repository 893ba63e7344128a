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
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edge_llm.engine.backend import Backend

log = logging.getLogger(__name__)

WINDOW_S = 0.5  # seconds of decode between two readings
DROP_AT = 0.3  # threads' worth of waiting per second of decode: contended
RAISE_AT = 0.05  # below this a thread may be added back
FIRST_RETRY_S = 2.0  # after a failed try with one thread more, doubled up to MAX_RETRY_S
MAX_RETRY_S = 60.0

RunDelaySource = Callable[[], float]  # cumulative seconds the decode threads waited


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


class ThreadGovernor:
    """Called after each decode with its duration; sets the backend's thread count."""

    def __init__(
        self,
        max_threads: int,
        set_threads: Callable[[int], None],
        run_delay: RunDelaySource,
        clock: Callable[[], float],
    ) -> None:
        self.max_threads = max_threads
        self.threads = max_threads
        self._set_threads = set_threads
        self._run_delay = run_delay
        self._clock = clock
        self._busy_s = 0.0
        self._waited_s = 0.0
        self._retry_s = FIRST_RETRY_S
        self._raise_after = 0.0
        self._trying = False
        self.last_load = 0.0

    def observe(self, decode_s: float) -> None:
        self._busy_s += decode_s
        if self._busy_s < WINDOW_S:
            return
        waited = self._run_delay()
        self.last_load = (waited - self._waited_s) / self._busy_s
        self._waited_s, self._busy_s = waited, 0.0
        self._adjust(self.last_load, self._clock())

    def _adjust(self, load: float, now: float) -> None:
        trying, self._trying = self._trying, False
        if load > DROP_AT and self.threads > 1:
            if trying:  # the thread added back made it worse: wait longer next time
                self._retry_s = min(MAX_RETRY_S, self._retry_s * 2)
            self._raise_after = now + self._retry_s
            self._set(self.threads - 1, load)
            return
        if trying:
            self._retry_s = FIRST_RETRY_S
        if load < RAISE_AT and self.threads < self.max_threads and now >= self._raise_after:
            self._trying = True
            self._set(self.threads + 1, load)

    def _set(self, threads: int, load: float) -> None:
        log.info(
            "decode threads %d -> %d (run-queue delay %.2f per second)", self.threads, threads, load
        )
        self.threads = threads
        self._set_threads(threads)


def thread_governor(
    backend: Backend, adaptive: bool, clock: Callable[[], float], run_delay: RunDelaySource | None
) -> ThreadGovernor | None:
    """A governor for ``backend``'s threads, or None where there is nothing to govern
    (one thread, turned off, or no schedstat to read)."""
    if not adaptive or backend.n_threads <= 1:
        return None
    if run_delay is None:
        if not ProcRunDelay.available():
            return None
        run_delay = ProcRunDelay()
    return ThreadGovernor(backend.n_threads, backend.set_threads, run_delay, clock)
