"""Device memory pressure: reading the device, and the engine's steps under the floor
(over the fake backend, with an injected memory source)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from edge_llm.engine.pressure.memory import MemoryGuard, MemoryReading, ProcMemory
from edge_llm.engine.sequence import GenerationRequest
from edge_llm.errors import MemoryPressure

from fakes import FakeBackend, drain

MIB = 1 << 20


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_cgroup_limit_wins_over_meminfo_and_pressure_is_read(tmp_path: Path) -> None:
    write(tmp_path, "proc/meminfo", "MemTotal: 8000000 kB\nMemAvailable:    4000000 kB\n")
    write(tmp_path, "proc/pressure/memory", "some avg10=1.50 avg60=0.20 avg300=0.00 total=9\n")
    assert ProcMemory(tmp_path)() == MemoryReading(4_000_000 * 1024, "meminfo", 1.5)
    write(tmp_path, "sys/fs/cgroup/memory.max", "max\n")
    write(tmp_path, "sys/fs/cgroup/memory.current", "100\n")
    assert ProcMemory(tmp_path)().source == "meminfo"  # no limit set
    write(tmp_path, "sys/fs/cgroup/memory.max", str(512 * MIB))
    write(tmp_path, "sys/fs/cgroup/memory.current", str(500 * MIB))
    assert ProcMemory(tmp_path)() == MemoryReading(12 * MIB, "cgroup", 1.5)


def test_the_guard_recovers_only_with_a_margin() -> None:
    available = [90 * MIB]
    guard = MemoryGuard(100 * MIB, lambda: MemoryReading(available[0], "test"), clock=lambda: 0)
    assert guard.check(force=True) and guard.short_by() == 10 * MIB
    available[0] = 105 * MIB  # above the floor, not above floor + 10 %
    assert guard.check(force=True)
    available[0] = 111 * MIB
    assert not guard.check(force=True)
    assert not MemoryGuard(0, lambda: MemoryReading(0, "test"), clock=lambda: 0).check()


class Device:
    """An injected memory source the test moves; each host-cache drop gives back
    what the entry held, as freeing it would."""

    def __init__(self, available: int) -> None:
        self.available = available

    def __call__(self) -> MemoryReading:
        return MemoryReading(self.available, "test")


async def test_under_the_floor_the_engine_refuses_drops_its_cache_and_cancels_paused(
    engine_of,
) -> None:
    device = Device(1000 * MIB)
    backend = FakeBackend(kv_capacity_tokens=4000, max_sequences=4, per_slot=True)
    engine = engine_of(backend, min_available_bytes=100 * MIB, host_cache_bytes=64 * MIB)
    engine.memory.guard.source = device
    prompt = list(range(200, 400))  # long enough for a host-tier entry
    handle = engine.submit(GenerationRequest(prompt, 4))
    await drain(engine, handle)
    for n in range(4):  # the kept slot is reused: its cells go to the host tier
        await drain(engine, engine.submit(GenerationRequest([900 + n, *prompt[1:]], 4)))
    assert len(engine.host_cache) >= 1
    paused = engine.submit(GenerationRequest(list(range(50, 60)), 40))
    await asyncio.wait_for(_first_token(paused), 10)
    engine.pause(paused)

    device.available = 50 * MIB
    with pytest.raises(MemoryPressure) as refused:
        engine.submit(GenerationRequest(prompt, 4))
    assert refused.value.status == 503 and refused.value.retry_after_s >= 1
    await asyncio.wait_for(paused.wait_done(), 10)
    assert len(engine.host_cache) == 0
    assert paused.outcome is not None and paused.outcome.error is not None
    assert paused.outcome.error.code == "memory_pressure"
    assert engine.metrics.cancellations.labels("memory_pressure")._value.get() == 1
    assert engine.snapshot()["memory_pressure"] is True

    device.available = 200 * MIB  # above the floor plus its margin
    engine.memory.guard.check(force=True)
    await drain(engine, engine.submit(GenerationRequest(prompt, 4)))
    assert engine.snapshot()["memory_pressure"] is False


async def test_of_two_paused_streams_the_least_urgent_is_cancelled_first(engine_of) -> None:
    backend = FakeBackend(kv_capacity_tokens=4000, max_sequences=4, per_slot=True)
    engine = engine_of(backend, min_available_bytes=100 * MIB)
    older = engine.submit(GenerationRequest(list(range(50, 60)), 40, priority=0))
    background = engine.submit(GenerationRequest(list(range(70, 80)), 40, priority=5))
    for handle in (older, background):  # the urgent one paused first: the longest
        await asyncio.wait_for(_first_token(handle), 10)
        engine.pause(handle)
    with engine._lock:  # one step of the policy under the floor
        assert engine.memory._cancel_paused(offloaded=False)
    await asyncio.wait_for(background.wait_done(), 10)
    assert background.outcome is not None and background.outcome.error is not None
    assert background.outcome.error.code == "memory_pressure"
    assert not older.finished
    engine.cancel(older, "test")


async def _first_token(handle) -> None:  # type: ignore[no-untyped-def]
    while handle.seq.n_generated == 0:
        assert await handle.wait_changed(10.0)
