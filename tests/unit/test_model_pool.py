"""The model pool over fake backends: single-flight loads, the memory budget (least
recently used idle model first, else model_memory), keep-alive, unload, and every
model's KV in one memory ledger (else kv_budget_exceeded)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from edge_llm.config.tree import EngineConfig, load_config
from edge_llm.engine import build_engine
from edge_llm.engine.kv.ledger import MemoryLedger
from edge_llm.errors import (
    BackendError,
    Cancelled,
    InvalidRequest,
    KvBudgetExceeded,
    ModelMemory,
    ModelNotFound,
)
from edge_llm.generation.job import GenerationJob, Priority, TextPrompt
from edge_llm.models.metrics import PoolMetrics
from edge_llm.models.pool import KvGate, LoadedModel, ModelPool, ModelState
from edge_llm.models.spec import MIB, ModelSpec, check_kv_shares, kv_share_bytes, named_specs
from edge_llm.observability.events import Event
from edge_llm.observability.metrics import EngineMetrics
from edge_llm.protocol.sampling import SamplingParams
from edge_llm.server.runtime import engine_settings, loaded_model

from fakes import FakeBackend

# 128 MiB of weights and no KV: each model counts 192 MiB (64 MiB reserve).
SIZE = 128 * MIB
EACH = SIZE + 64 * MIB


class Loads:
    """A loader that counts its loads; ``gate`` holds them until the test opens it."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.started = threading.Event()
        self.gate = threading.Event()
        self.gate.set()
        self.backends: dict[str, FakeBackend] = {}

    def __call__(self, spec: ModelSpec, metrics: EngineMetrics, events: Any) -> LoadedModel:
        self.names.append(spec.name)
        self.started.set()
        assert self.gate.wait(30), "the test never opened the gate"
        config = load_config(None, env={})
        backend = FakeBackend(script=list(range(10, 10_000)))
        self.backends[spec.name] = backend
        engine = build_engine(backend, engine_settings(config), metrics=metrics)
        return loaded_model(config, spec, engine, backend, events)


class Recorder:
    """The pool's events; ``unloaded(name)`` waits for that model's unload."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []
        self._changed = asyncio.Event()

    def __call__(self, event: Event, request_id: str | None = None, /, **fields: Any) -> None:
        self.lines.append((event, fields))
        self._changed.set()

    async def unloaded(self, name: str) -> dict[str, Any]:
        while True:
            for event, fields in self.lines:
                if event == Event.MODEL_UNLOADED and fields["model"] == name:
                    return fields
            self._changed.clear()
            await asyncio.wait_for(self._changed.wait(), 30)


PoolFactory = Callable[..., ModelPool]


@pytest.fixture
async def pool_of() -> AsyncIterator[PoolFactory]:
    made: list[ModelPool] = []

    def make(
        names: str = "abc",
        *,
        budget_mb: int = 0,
        loads: Loads | None = None,
        events: Recorder | None = None,
        keep_alive_s: float | None = None,
    ) -> ModelPool:
        specs = [ModelSpec(n, f"{n}.gguf", SIZE, 0, keep_alive_s=keep_alive_s) for n in names]
        pool = ModelPool(
            specs,
            loads or Loads(),
            budget_bytes=budget_mb * MIB,
            metrics=PoolMetrics(CollectorRegistry()),
            events=events or Recorder(),
        )
        made.append(pool)
        return pool

    yield make
    for pool in made:
        await pool.drain(0)
        await pool.unload_all()


async def test_concurrent_first_requests_load_the_model_once(pool_of) -> None:
    loads = Loads()
    loads.gate.clear()
    pool = pool_of(loads=loads)
    waiting = [asyncio.create_task(pool.acquire("b")) for _ in range(6)]
    assert await asyncio.to_thread(loads.started.wait, 30)  # the gate holds it
    assert pool.state("b") is ModelState.LOADING
    loads.gate.set()
    leases = await asyncio.gather(*waiting)
    assert loads.names == ["b"]
    assert {id(lease.model) for lease in leases} == {id(leases[0].model)}
    assert pool.state("b") is ModelState.LOADED
    for lease in leases:
        lease.release()


async def test_the_least_recently_used_idle_model_makes_room(pool_of) -> None:
    events = Recorder()
    pool = pool_of(budget_mb=(2 * EACH + EACH // 2) // MIB, events=events)
    for name in ("a", "b", "a"):  # a used last
        (await pool.acquire(name)).release()
    (await pool.acquire("c")).release()
    assert (await events.unloaded("b"))["reason"] == "memory"
    assert [pool.state(n) for n in "abc"] == [
        ModelState.LOADED,
        ModelState.UNLOADED,
        ModelState.LOADED,
    ]
    assert pool.used_bytes() <= pool.budget_bytes


async def test_a_busy_model_is_not_unloaded_and_the_request_gets_model_memory(pool_of) -> None:
    pool = pool_of(budget_mb=(EACH + EACH // 2) // MIB)
    held = await pool.acquire("a")
    with pytest.raises(ModelMemory) as refused:
        await pool.acquire("b")
    assert refused.value.status == 503
    assert refused.value.retry_after_s >= 1
    assert pool.state("a") is ModelState.LOADED
    held.release()
    (await pool.acquire("b")).release()  # a is idle now: it makes room
    assert pool.state("a") is ModelState.UNLOADED


async def test_a_model_larger_than_the_budget_is_refused_without_unloading(pool_of) -> None:
    pool = pool_of(budget_mb=EACH // MIB - 1)
    with pytest.raises(ModelMemory, match="more than max_model_memory_mb"):
        await pool.acquire("a")
    assert pool.state("a") is ModelState.UNLOADED


async def test_an_idle_model_unloads_after_its_keep_alive(pool_of) -> None:
    events, loads = Recorder(), Loads()
    pool = pool_of(events=events, loads=loads, keep_alive_s=0.05)
    lease = await pool.acquire("a")
    lease.release()
    assert (await events.unloaded("a"))["reason"] == "keep_alive"
    assert pool.state("a") is ModelState.UNLOADED
    (await pool.acquire("a")).release()  # asked again: loaded again
    assert loads.names == ["a", "a"]


async def test_a_request_keep_alive_overrides_the_models(pool_of) -> None:
    events = Recorder()
    pool = pool_of(events=events)  # configured: stays loaded
    pool.set_keep_alive("a", 0.0)
    (await pool.acquire("a")).release()
    assert (await events.unloaded("a"))["reason"] == "keep_alive"


async def test_unload_cancels_running_streams_and_waits_for_their_requests(pool_of) -> None:
    loads = Loads()
    pool = pool_of(loads=loads)
    lease = await pool.acquire("a")
    loads.backends["a"].gate = threading.Semaphore(0)  # decoding waits for the test
    service = lease.model.service
    job = GenerationJob(
        "a",
        None,
        Priority(),
        prompt=lambda: TextPrompt("hello"),
        sampling=lambda _: SamplingParams(),
        relay=InvalidRequest("local only"),
        max_tokens=50,
    )
    prepared = await service.prepare(job)
    handle = service.submit(prepared)
    unloading = asyncio.create_task(pool.unload("a"))
    await handle.wait_done()
    assert isinstance(handle.outcome.error, Cancelled)
    assert handle.outcome.error.reason == "unloaded"
    assert not unloading.done()  # the request still holds the model
    loads.backends["a"].gate.release(10_000)
    lease.release()
    assert await unloading is True
    assert pool.state("a") is ModelState.UNLOADED


async def test_unknown_names_are_404_naming_the_served_ones(pool_of) -> None:
    pool = pool_of("ab")
    assert pool.resolve(None) == "a"
    with pytest.raises(ModelNotFound, match="available: a, b"):
        pool.resolve("z")


# The store's names of one pulled file: its canonical name, two spellings of it, and a
# name another pull (``--name mine``) gave the same bytes.
BLOB = "blobs/sha256-ab.gguf"
CANONICAL = "hf.co/o/r-GGUF:Q4_K_M"
SPELLINGS = {"o/r-GGUF:q4_k_m": CANONICAL, "hf.co/o/r-GGUF:q4_K_M": CANONICAL, CANONICAL: CANONICAL,
             "mine": "mine"}  # fmt: skip


def find_pulled(name: str) -> ModelSpec | None:
    """As the daemon's ``find``: the stored model ``name`` spells, under its own name."""
    stored = SPELLINGS.get(name)
    return None if stored is None else ModelSpec(stored, BLOB, SIZE, 0)


async def test_every_name_of_one_pulled_file_is_one_served_model() -> None:
    loads = Loads()
    default = ModelSpec("a", "a.gguf", SIZE, 0)
    pool = ModelPool(
        [default], loads, budget_bytes=0, metrics=PoolMetrics(CollectorRegistry()),
        events=Recorder(), find=find_pulled,
    )  # fmt: skip
    try:
        for name in SPELLINGS:
            with await pool.acquire(pool.resolve(name)) as lease:
                assert lease.name == CANONICAL
        assert loads.names == [CANONICAL]  # loaded once
        assert pool.names == ["a", CANONICAL]  # listed once
        assert pool.spec("mine").name == CANONICAL
        assert await pool.forget("o/r-GGUF:q4_k_m") is True  # any spelling deletes it
        assert pool.names == ["a"] and not pool.discover("z")
    finally:
        await pool.drain(0)
        await pool.unload_all()


async def test_a_pulled_name_of_the_default_models_file_is_the_default_model() -> None:
    loads = Loads()
    pool = ModelPool(  # --model hf.co/o/r-GGUF:Q4_K_M --model-id mine2
        [ModelSpec("mine2", BLOB, SIZE, 0)], loads, budget_bytes=0,
        metrics=PoolMetrics(CollectorRegistry()), events=Recorder(), find=find_pulled,
    )  # fmt: skip
    try:
        assert pool.resolve("o/r-GGUF:q4_k_m") == "mine2"
        assert pool.names == ["mine2"]
        with pytest.raises(InvalidRequest, match="default model"):
            await pool.forget(CANONICAL)
    finally:
        await pool.drain(0)
        await pool.unload_all()


async def test_a_file_deleted_by_a_new_pull_of_its_name_loads_the_names_file_now(
    tmp_path: Path,
) -> None:
    """``edge-llm pull`` gave a served name other bytes (deleting the old ones) while the
    server ran: its next load takes the file the name has now."""
    old, new = tmp_path / "old.gguf", tmp_path / "new.gguf"
    new.write_bytes(b"GGUF")
    loads = Loads()
    pool = ModelPool(
        [ModelSpec("a", "a.gguf", SIZE, 0), ModelSpec(CANONICAL, str(old), SIZE, 0)], loads,
        budget_bytes=0, metrics=PoolMetrics(CollectorRegistry()), events=Recorder(),
        find=lambda name: ModelSpec(name, str(new), 4, 0) if name == CANONICAL else None,
    )  # fmt: skip
    try:
        with await pool.acquire(CANONICAL) as lease:
            assert lease.model.spec.path == str(new)
            assert lease.model.spec.size_bytes == 4
    finally:
        await pool.drain(0)
        await pool.unload_all()


# -- every model's KV in one memory ledger -------------------------------------------------

KV_CONTEXT = 1024 * 10  # the fake's KV context: 1,024 cells of 10 bytes


class LedgerLoads(Loads):
    """Loads engines whose lines are in one memory ledger, as the daemon's are."""

    def __init__(self, ledger: MemoryLedger) -> None:
        super().__init__()
        self.ledger = ledger

    def __call__(self, spec: ModelSpec, metrics: EngineMetrics, events: Any) -> LoadedModel:
        self.names.append(spec.name)
        config = load_config(None, env={})
        backend = FakeBackend(kv_capacity_tokens=1024, kv_bytes_per_token=10)
        backend.info = dataclasses.replace(backend.info, model_id=spec.name)
        engine = build_engine(backend, engine_settings(config), metrics=metrics, ledger=self.ledger)
        return loaded_model(config, spec, engine, backend, events)


async def kv_pool(cap: int, events: Recorder) -> tuple[ModelPool, LedgerLoads]:
    ledger = MemoryLedger(cap)
    loads = LedgerLoads(ledger)
    specs = [ModelSpec(n, f"{n}.gguf", SIZE, 0) for n in "ab"]
    pool = ModelPool(
        specs, loads, budget_bytes=0, metrics=PoolMetrics(CollectorRegistry()),
        events=events, kv=KvGate(ledger, lambda spec: KV_CONTEXT + 2_000),
    )  # fmt: skip
    return pool, loads


async def test_a_models_kv_context_is_reserved_in_the_ledger_before_it_loads() -> None:
    events = Recorder()
    pool, loads = await kv_pool(2 * KV_CONTEXT + 4_000, events)  # both fit together
    try:
        (await pool.acquire("a")).release()
        (await pool.acquire("b")).release()
        ledger = loads.ledger
        assert ledger.by_model() == {"a": KV_CONTEXT, "b": KV_CONTEXT}  # as allocated
        assert pool.state("a") is ModelState.LOADED
    finally:
        await pool.unload_all()
    assert loads.ledger.used_bytes == 0


async def test_kv_that_does_not_fit_unloads_an_idle_model_or_gets_503() -> None:
    events = Recorder()
    pool, loads = await kv_pool(KV_CONTEXT + 4_000, events)  # one model's KV at a time
    ledger = loads.ledger
    try:
        (await pool.acquire("a")).release()
        held = await pool.acquire("b")  # a is idle: unloaded for b's KV context
        assert (await events.unloaded("a"))["reason"] == "memory"
        assert ledger.by_model() == {"b": KV_CONTEXT}
        with pytest.raises(KvBudgetExceeded, match="are busy") as refused:
            await pool.acquire("a")  # b is busy: nothing can be unloaded for a
        assert refused.value.status == 503 and refused.value.retry_after_s >= 1
        assert loads.names == ["a", "b"]  # a was not loaded again
        assert pool.state("a") is ModelState.UNLOADED
        assert ledger.by_model() == {"b": KV_CONTEXT}  # a's reservation left
        held.release()
        (await pool.acquire("a")).release()  # b is idle now: it makes room
        assert pool.state("b") is ModelState.UNLOADED
        assert ledger.used_bytes <= ledger.cap_bytes
    finally:
        await pool.unload_all()


async def test_a_load_that_fails_leaves_no_line_in_the_ledger() -> None:
    events = Recorder()
    pool, loads = await kv_pool(2 * KV_CONTEXT, events)

    def fail(spec: ModelSpec, metrics: EngineMetrics, events: Any) -> LoadedModel:
        raise BackendError("model file not found")

    pool._loader = fail  # type: ignore[assignment]
    with pytest.raises(BackendError):
        await pool.acquire("b")
    assert loads.ledger.used_bytes == 0 and loads.ledger.lines() == []


def test_models_without_their_own_kv_budget_share_the_cap(tmp_path: Path) -> None:
    def config_of(b_mb: int | None) -> EngineConfig:
        toml = tmp_path / "engine.toml"
        b_own = f"max_kv_cache_mb = {b_mb}\n" if b_mb else ""
        toml.write_text("[engine.backpressure]\nmax_kv_cache_mb = 256\n"
                        '[models.a]\npath = "/m/a.gguf"\n'
                        f'[models.b]\npath = "/m/b.gguf"\n{b_own}')  # fmt: skip
        return load_config(toml, env={})

    assert kv_share_bytes(load_config(None, env={}), None) == 256 * MIB  # one model: all
    config = config_of(None)
    assert kv_share_bytes(config, None) == 256 * MIB // 3  # three models, one cap
    assert [s.kv_budget_bytes for s in named_specs(config)] == [256 * MIB // 3] * 2
    config = config_of(128)  # b's own budget: the others share the rest
    assert kv_share_bytes(config, None) == 64 * MIB
    assert [s.kv_budget_bytes for s in named_specs(config)] == [64 * MIB, 128 * MIB]
    check_kv_shares(config)
    config = config_of(256)  # b's takes the whole cap: they cannot all be loaded at once
    assert kv_share_bytes(config, None) == 256 * MIB // 3
    check_kv_shares(config)
    with pytest.raises(BackendError, match=r"\[models\.b\] max_kv_cache_mb = 300 is more"):
        check_kv_shares(config_of(300))  # could never load
