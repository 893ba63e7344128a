"""The KV tiers (``engine/kv/tier.py``): one list names them (``EngineParts.tiers``,
built in ``engine/build.py``); the ledger, /debug/streams, the tier gauge, the serve
banner's line and the engine's stop read every tier of it, a tier added to it as much
as the four built in; the three tiers holding states as bytes move them through one
protocol (reserve, store, load, evict), and the applier finds them by name."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from edge_llm.engine import EngineSettings, MemoryLedger, build_engine, ledger_summary
from edge_llm.engine.build import build_parts
from edge_llm.engine.engine import Engine
from edge_llm.engine.kv.apply import KvApplier
from edge_llm.engine.kv.book import LoadState, SaveState
from edge_llm.engine.kv.disk_cache import DiskCache, DiskTier
from edge_llm.engine.kv.host_cache import HostCache
from edge_llm.engine.kv.host_offload import HostOffload
from edge_llm.engine.kv.tier import (
    SavedKv,
    StateTier,
    SummaryPart,
    TierReading,
    prompt_key,
)
from edge_llm.observability.events import null_sink
from edge_llm.observability.metrics import EngineMetrics

from fakes import FakeBackend

MIB = 1 << 20


class ToyTier:
    """A fifth tier, as its own module would add it: a state tier in a dict."""

    name = "toy"

    def __init__(self) -> None:
        self.closed = False
        self.states: dict[str, bytes] = {}
        self.sizes: dict[str, int] = {}

    def read(self) -> TierReading:
        held = sum(self.sizes.values())
        return TierReading(
            held={"toy": held},
            lines={"toy": held},
            ledger={"toy_cap_bytes": 9 * MIB},
            debug={"kv_toy_bytes": held},
            reserved_bytes=sum(n for k, n in self.sizes.items() if k not in self.states),
            summary=SummaryPart("toy", held, {"cap": 9 * MIB}),
        )

    def reserve(self, key: str, num_bytes: int) -> bool:
        self.sizes[key] = num_bytes
        return True

    def store(self, key: str, saved: SavedKv) -> bool:
        self.states[key], self.sizes[key] = saved.state, len(saved.state)
        return True

    def load(self, key: str) -> SavedKv | None:
        state = self.states.get(key)
        return SavedKv(state) if state is not None else None

    def evict(self, key: str) -> int:
        self.states.pop(key, None)
        return self.sizes.pop(key, 0)

    def close(self) -> None:
        self.closed = True


def engine_with_toy(
    metrics: EngineMetrics | None = None, ledger: MemoryLedger | None = None
) -> tuple[Engine, ToyTier]:
    """An engine whose list holds the toy tier too, as build.py's one line would add it."""
    parts = build_parts(FakeBackend(), EngineSettings(), metrics=metrics, ledger=ledger)  # type: ignore[arg-type]
    toy = ToyTier()
    toy.reserve("a", 3 * MIB)
    toy.reserve("b", 4 * MIB)
    toy.store("b", SavedKv(b"x" * (4 * MIB)))
    return Engine(dataclasses.replace(parts, tiers=(*parts.tiers, toy))), toy


def test_the_four_tiers_are_named_once_and_read_alike() -> None:
    engine = build_engine(FakeBackend(), EngineSettings(host_cache_bytes=MIB))  # type: ignore[arg-type]
    assert [t.name for t in engine.tiers] == ["device", "host_cache", "offload", "disk"]
    assert list(engine.tier_bytes()) == ["device_live", "device_cached", "host", "offload", "disk"]
    lines = engine.ledger_lines()
    assert list(lines)[:5] == [
        "device_live",
        "device_cached",
        "device_free",
        "host_cache",
        "offload",
    ]
    assert lines["device_free"] == engine.device.account.num_bytes  # nothing live or cached yet
    fields = engine.snapshot()["memory_ledger"]
    assert fields["host_cache_cap_bytes"] == MIB and fields["device_bytes"] > 0
    context = fields["device_bytes"] / MIB
    assert ledger_summary(fields).startswith(
        f"memory ledger: KV context {context:.1f} (live 0.0, cached 0.0) + host cache 0.0 "
        "(cap 1.0) + offload 0.0 (cap 512.0) + embeddings 0.0 + reserve 0.0 = "
    )


def test_a_tier_added_to_the_list_is_read_everywhere() -> None:
    metrics = EngineMetrics()
    engine, _ = engine_with_toy(metrics)
    assert engine.tier_bytes()["toy"] == 7 * MIB
    assert engine.ledger_lines()["toy"] == 7 * MIB
    document = engine.snapshot()
    assert document["kv_toy_bytes"] == 7 * MIB
    fields = document["memory_ledger"]
    assert fields["toy_cap_bytes"] == 9 * MIB and fields["toy_bytes"] == 7 * MIB
    assert fields["reserve_bytes"] == 3 * MIB  # the others reserve nothing yet
    assert "+ offload 0.0 (cap 512.0) + toy 7.0 (cap 9.0) + embeddings" in ledger_summary(fields)
    text = metrics.render().decode()  # the gauges the engine bound when it was made
    assert 'edge_llm_kv_cache_tier_bytes{tier="toy"} 7.340032e+06' in text
    assert 'edge_llm_kv_cache_tier_bytes{tier="offload"} 0.0' in text
    assert 'edge_llm_memory_ledger_bytes{line="toy"} 7.340032e+06' in text
    metrics.bind_tiers(dict)  # an unloaded model: the same series read zero
    assert 'edge_llm_kv_cache_tier_bytes{tier="toy"} 0.0' in metrics.render().decode()


def test_stop_closes_every_tier() -> None:
    ledger = MemoryLedger(None)
    engine, toy = engine_with_toy(ledger=ledger)
    assert ledger.lines()
    engine.stop()
    assert toy.closed and not ledger.lines()  # device, host cache and offload left


# -- the state tiers -------------------------------------------------------------------


def state_tier(kind: str, directory: Path) -> StateTier:
    ledger = MemoryLedger(None)
    if kind == "host_cache":
        return HostCache(MIB, 1, ledger)
    if kind == "offload":
        return HostOffload(MIB, ledger)
    if kind == "disk":
        return DiskTier(DiskCache(directory, MIB, "model-a"))
    return ToyTier()


def held(tier: StateTier) -> int:
    return sum(tier.read().held.values())


def settle(tier: StateTier) -> None:
    """The disk's writes are queued: closed, they are on disk."""
    if isinstance(tier, DiskTier):
        tier.close()


@pytest.mark.parametrize("kind", ["host_cache", "offload", "disk", "toy"])
def test_every_state_tier_reserves_stores_loads_and_evicts(kind: str, tmp_path: Path) -> None:
    tier = state_tier(kind, tmp_path)
    assert isinstance(tier, StateTier) and tier.name == kind
    saved = SavedKv(b"s" * 1000, tuple(range(50)), 40)
    key = prompt_key(saved.tokens)
    assert tier.reserve(key, 2000) and tier.store(key, saved)
    settle(tier)
    assert held(tier) >= 1000
    loaded = tier.load(key)
    assert loaded is not None and loaded.state == saved.state
    if kind in ("host_cache", "disk"):  # found by their prompt: they keep it
        assert (loaded.tokens, loaded.n_prompt) == (saved.tokens, saved.n_prompt)
    before = held(tier)
    freed = tier.evict(key)
    assert held(tier) == before - freed and tier.load(key) is None
    assert tier.evict(key) == 0


@pytest.mark.parametrize("kind", ["host_cache", "offload", "disk"])
def test_a_state_tier_reserves_nothing_past_its_cap(kind: str, tmp_path: Path) -> None:
    tier = state_tier(kind, tmp_path)
    assert not tier.reserve("big", MIB + 1)
    assert held(tier) == 0 and tier.read().reserved_bytes == 0
    settle(tier)


def test_the_applier_moves_states_through_the_tier_an_operation_names() -> None:
    backend = FakeBackend()
    toy = ToyTier()
    toy.name = "offload"
    applier = KvApplier(
        backend, [toy], metrics=EngineMetrics(), events=null_sink, used_bytes=lambda: 0
    )
    backend.load_state(0, backend.save_state(0))
    applier.apply([SaveState(0, "stream")])
    assert "stream" in toy.states
    assert applier.apply([LoadState(1, "stream")]) == []
    assert applier.apply([LoadState(1, "gone")])[0][0] == "gone"  # its stream must end
