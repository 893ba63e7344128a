"""What else the machine did during a benchmark: CPU seconds used by other processes.

Two snapshots (start and end) of the system's busy CPU time and of every process's
CPU time. Others' share = (system busy time - this harness and its children) over
(wall time x cores). This harness's children are those alive at the end plus those it
has already waited for (servers a benchmark started and stopped between the
snapshots). Processes that lived only between the snapshots are in the total but not
in the per-process list.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass, field

import psutil

TOP_PROCESSES = 5
MIN_CPU_S = 0.5


@dataclass
class Snapshot:
    at: float
    busy_s: float
    loadavg: tuple[float, float, float]
    per_process: dict[int, tuple[float, str]] = field(default_factory=dict)
    waited_children_s: float = 0.0  # CPU of children this process has reaped


def _busy_seconds() -> float:
    times = psutil.cpu_times()
    idle = times.idle + getattr(times, "iowait", 0.0)
    return float(sum(times) - idle)


def _describe(process: psutil.Process) -> str:
    cmdline = " ".join(process.cmdline() or []) or process.name()
    return f"pid {process.pid}: {cmdline[:90]}"


def _waited_children_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def snapshot() -> Snapshot:
    shot = Snapshot(
        time.monotonic(), _busy_seconds(), os.getloadavg(), {}, _waited_children_seconds()
    )
    for process in psutil.process_iter():
        try:
            cpu = process.cpu_times()
            shot.per_process[process.pid] = (cpu.user + cpu.system, _describe(process))
        except psutil.Error:
            continue
    return shot


def own_pids() -> set[int]:
    """This process and all its children (the servers it started)."""
    me = psutil.Process()
    return {me.pid, *(child.pid for child in me.children(recursive=True))}


@dataclass
class Noise:
    wall_s: float
    cores: int
    others_cpu_s: float
    loadavg_start: tuple[float, float, float]
    loadavg_end: tuple[float, float, float]
    busiest: list[str]

    @property
    def others_share(self) -> float:
        """Fraction of the machine's CPU capacity used by other processes."""
        return self.others_cpu_s / (self.wall_s * self.cores) if self.wall_s > 0 else 0.0

    def lines(self) -> list[str]:
        head = (
            f"other processes used {self.others_cpu_s:.0f} CPU-s in {self.wall_s:.0f} s "
            f"({self.others_share:.0%} of {self.cores} cores); load average "
            f"{self.loadavg_start[0]:.2f} at start, {self.loadavg_end[0]:.2f} at end"
        )
        return [head, *(f"  {line}" for line in self.busiest)]


def noise(start: Snapshot, end: Snapshot, own: set[int]) -> Noise:
    own_cpu = sum(end.per_process.get(pid, (0.0, ""))[0] - start.per_process.get(pid, (0.0, ""))[0]
                  for pid in own)  # fmt: skip
    own_cpu += end.waited_children_s - start.waited_children_s
    others = []
    for pid, (cpu, description) in end.per_process.items():
        if pid in own:
            continue
        used = cpu - start.per_process.get(pid, (0.0, ""))[0]
        if used >= MIN_CPU_S:
            others.append((used, description))
    others.sort(reverse=True)
    return Noise(
        wall_s=end.at - start.at,
        cores=psutil.cpu_count() or 1,
        others_cpu_s=max(end.busy_s - start.busy_s - own_cpu, 0.0),
        loadavg_start=start.loadavg,
        loadavg_end=end.loadavg,
        busiest=[f"{used:.1f} CPU-s {desc}" for used, desc in others[:TOP_PROCESSES]],
    )
