"""The KV tiers are read through one interface (``engine/kv/tier.py``): the ledger,
/debug/streams, the tier gauge and the engine's stop see every tier of the one list
(``EngineParts.tiers``), a tier added to it as much as the four built in."""

from __future__ import annotations

from edge_llm.engine import EngineSettings, MemoryLedger, build_engine
from edge_llm.engine.kv.tier import TierReading
from edge_llm.observability.metrics import EngineMetrics

from fakes import FakeBackend


class ExtraTier:
    """A fifth tier, as a new module would add it."""

    closed = False

    def read(self) -> TierReading:
        return TierReading(
            held={"extra": 7},
            lines={"extra": 5},
            ledger={"extra_cap_bytes": 9},
            debug={"kv_extra_bytes": 7},
            reserved_bytes=3,
        )

    def close(self) -> None:
        self.closed = True


def engine_with_extra(metrics: EngineMetrics | None = None):  # type: ignore[no-untyped-def]
    engine = build_engine(FakeBackend(), EngineSettings(), metrics=metrics)  # type: ignore[arg-type]
    extra = ExtraTier()
    engine.tiers = (*engine.tiers, extra)
    return engine, extra


def test_the_four_tiers_are_named_once_and_read_alike() -> None:
    engine = build_engine(FakeBackend(), EngineSettings(host_cache_bytes=1 << 20))  # type: ignore[arg-type]
    assert list(engine.tier_bytes()) == ["device_live", "device_cached", "host", "offload", "disk"]
    lines = engine.ledger_lines()
    assert list(lines)[:5] == [
        "device_live",
        "device_cached",
        "device_free",
        "host_cache",
        "offload",
    ]
    assert lines["device_free"] == engine.device.num_bytes  # nothing live or cached yet
    fields = engine.snapshot()["memory_ledger"]
    assert fields["host_cache_cap_bytes"] == 1 << 20 and fields["device_bytes"] > 0


def test_a_tier_added_to_the_list_is_read_everywhere() -> None:
    engine, _ = engine_with_extra()
    assert engine.tier_bytes()["extra"] == 7
    assert engine.ledger_lines()["extra"] == 5
    document = engine.snapshot()
    assert document["kv_extra_bytes"] == 7
    assert document["memory_ledger"]["extra_cap_bytes"] == 9
    assert document["memory_ledger"]["reserve_bytes"] == 3  # the others reserve nothing yet


def test_the_gauges_name_the_tiers_the_engine_has() -> None:
    metrics = EngineMetrics()
    engine, _ = engine_with_extra(metrics)
    metrics.bind_tiers(engine.tier_bytes)  # as bind_gauges does at start
    metrics.bind_ledger(engine.ledger_lines)
    text = metrics.render().decode()
    assert 'edge_llm_kv_cache_tier_bytes{tier="extra"} 7.0' in text
    assert 'edge_llm_kv_cache_tier_bytes{tier="offload"} 0.0' in text
    assert 'edge_llm_memory_ledger_bytes{line="extra"} 5.0' in text
    metrics.bind_tiers(dict)  # an unloaded model: the same series read zero
    assert 'edge_llm_kv_cache_tier_bytes{tier="extra"} 0.0' in metrics.render().decode()


def test_stop_closes_every_tier() -> None:
    ledger = MemoryLedger(None)
    backend = FakeBackend()
    engine = build_engine(backend, EngineSettings(), ledger=ledger)  # type: ignore[arg-type]
    extra = ExtraTier()
    engine.tiers = (*engine.tiers, extra)
    assert ledger.lines()
    engine.stop()
    assert extra.closed and not ledger.lines()  # device, host cache and offload left
