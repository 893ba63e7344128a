"""Device memory pressure: how much memory the device has left, and what the engine
does when it falls below ``min_available_mb``.

Available memory is the cgroup's room (``memory.max`` - ``memory.current``, cgroup v2)
where a limit is set, else ``MemAvailable`` from ``/proc/meminfo``; the kernel's
pressure stall figure (``/proc/pressure/memory``, ``some avg10``) is reported beside
it where present. Under the floor, in order, each step only while still under it:

1. admission stops: new requests get 503 ``memory_pressure`` with ``Retry-After``;
2. the prefix cache's host tier is dropped, least recently used entry first;
3. offloaded streams are cancelled (their saved KV is host memory), with the error
   ``memory_pressure``;
4. last, paused streams are cancelled, one per check.

Of several, the least urgent priority class goes first, then the longest paused.

Running streams are never cancelled for it, and paused ones are not offloaded: on a
CPU the KV context is allocated once at start, so freeing cells returns no memory
(and a saved copy takes more). Admission comes back once memory is above the floor
plus a tenth of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edge_llm.errors import MemoryPressure
from edge_llm.observability.events import Event
from edge_llm.protocol.stream_rules import StreamState

if TYPE_CHECKING:
    from edge_llm.engine.kv.host_cache import HostCache
    from edge_llm.engine.streams.live import Streams

RECOVERY_MARGIN = 1.1  # admission resumes above the floor plus a tenth of it
CHECK_EVERY_S = 0.25  # reading /proc costs tens of microseconds: a few times a second


@dataclass(frozen=True)
class MemoryReading:
    available_bytes: int
    source: str  # "cgroup", "meminfo" or what a test injected
    pressure_avg10: float | None = None  # PSI "some avg10", percent


MemorySource = Callable[[], MemoryReading]


class ProcMemory:
    """Reads the device's available memory from cgroup v2 or /proc/meminfo."""

    def __init__(self, root: Path = Path("/")) -> None:
        self.root = root

    def __call__(self) -> MemoryReading:
        pressure = self._pressure()
        limited = self._cgroup()
        if limited is not None:
            return MemoryReading(limited, "cgroup", pressure)
        return MemoryReading(self._meminfo(), "meminfo", pressure)

    def _cgroup(self) -> int | None:
        cgroup = self.root / "sys/fs/cgroup"
        try:
            limit = (cgroup / "memory.max").read_text().strip()
            used = int((cgroup / "memory.current").read_text())
        except (OSError, ValueError):
            return None
        if limit == "max":
            return None
        return max(0, int(limit) - used)

    def _meminfo(self) -> int:
        for line in (self.root / "proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
        raise OSError("MemAvailable missing from /proc/meminfo")

    def _pressure(self) -> float | None:
        try:
            first = (self.root / "proc/pressure/memory").read_text().splitlines()[0]
        except (OSError, IndexError):
            return None
        fields = dict(part.split("=", 1) for part in first.split()[1:])
        try:
            return float(fields["avg10"])
        except (KeyError, ValueError):
            return None


def machine_memory_bytes(root: Path = Path("/")) -> int | None:
    """All the memory the device gives this process: the cgroup's limit (v2) where
    one is set, else ``MemTotal``; None when neither can be read."""
    try:
        limit = (root / "sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            return int(limit)
    except (OSError, ValueError):
        pass
    try:
        for line in (root / "proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class MemoryGuard:
    """Whether the device is under memory pressure, with hysteresis."""

    def __init__(self, floor_bytes: int, source: MemorySource, clock: Callable[[], float]) -> None:
        self.floor_bytes = floor_bytes
        self.source = source
        self.clock = clock
        self.under_pressure = False
        self.last: MemoryReading | None = None
        self._checked_at: float | None = None

    @property
    def enabled(self) -> bool:
        return self.floor_bytes > 0

    def check(self, force: bool = False) -> bool:
        """Read the source (at most every ``CHECK_EVERY_S`` unless ``force``); returns
        whether memory is under the floor now."""
        if not self.enabled:
            return False
        now = self.clock()
        due = self._checked_at is None or now - self._checked_at >= CHECK_EVERY_S
        if force or due:
            self._checked_at = now
            self.last = self.source()
            self.under_pressure = self._still_short(self.last.available_bytes)
        return self.under_pressure

    def short_by(self) -> int:
        """Bytes missing to the floor at the last reading (0: none)."""
        if self.last is None:
            return 0
        return max(0, self.floor_bytes - self.last.available_bytes)

    def _still_short(self, available: int) -> bool:
        if self.under_pressure:  # recover only with a margin: no flapping at the floor
            return available < self.floor_bytes * RECOVERY_MARGIN
        return available < self.floor_bytes


class MemoryPolicy:
    """The steps above, run each engine step with the lock held."""

    def __init__(self, guard: MemoryGuard, host_cache: HostCache, streams: Streams) -> None:
        self.guard = guard
        self.host_cache = host_cache
        self.streams = streams
        self._reported_short = False

    def next_check(self, now: float) -> float | None:
        """When the idle engine should look at memory again (None: not watched)."""
        return now + CHECK_EVERY_S if self.guard.enabled else None

    def refuse_if_short(self) -> None:
        """Raise 503 ``memory_pressure`` while the device is under the floor (a fresh
        reading: tens of microseconds)."""
        if self.guard.check(force=True):
            available = self.guard.last.available_bytes if self.guard.last else 0
            raise MemoryPressure(
                f"device memory is short: {available >> 20} MiB available, "
                f"min_available_mb is {self.guard.floor_bytes >> 20}",
                retry_after_s=2,
            )

    def relieve(self) -> None:
        short = self.guard.check()
        if short != self._reported_short:
            self._reported_short = short
            self._report(Event.MEMORY_PRESSURE if short else Event.MEMORY_RECOVERED)
        if not short:
            return
        self._drop_host_cache()
        if self.guard.check(force=True):
            self._cancel_paused(offloaded=True) or self._cancel_paused(offloaded=False)

    def _drop_host_cache(self) -> None:
        dropped = 0
        while self.guard.check(force=True) and self.host_cache.give_back():
            dropped += 1
        if dropped:
            self.streams.metrics.memory_actions.labels("host_cache_dropped").inc(dropped)

    def _cancel_paused(self, offloaded: bool) -> bool:
        """Cancel a paused (offloaded) stream, of the least urgent class first, then
        the longest paused; whether there was one."""
        paused = [
            h for h in self.streams.live.values()
            if h.seq.paused_since is not None and h.seq.offloaded == offloaded
        ]  # fmt: skip
        if not paused:
            return False
        handle = min(paused, key=lambda h: (-h.seq.request.priority, h.seq.paused_since or 0.0))
        error = MemoryPressure("cancelled: device memory is short", reason="memory_pressure")
        self.streams.metrics.memory_actions.labels("stream_cancelled").inc()
        self.streams.finish(handle, error, StreamState.CANCELLED)
        return True

    def _report(self, event: Event) -> None:
        last = self.guard.last
        self.streams.events(
            event, None, available_bytes=last.available_bytes if last else None,
            floor_bytes=self.guard.floor_bytes, source=last.source if last else None,
        )  # fmt: skip
