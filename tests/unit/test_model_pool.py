"""The model pool over fake backends: single-flight loads, the memory budget (least
recently used idle model first, else model_memory), keep-alive, unload."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from edge_llm.config.tree import load_config
from edge_llm.engine.engine import Engine
from edge_llm.errors import Cancelled, InvalidRequest, ModelMemory, ModelNotFound
from edge_llm.generation.job import GenerationJob, Priority, TextPrompt
from edge_llm.models.metrics import PoolMetrics
from edge_llm.models.pool import LoadedModel, ModelPool, ModelState
from edge_llm.models.spec import MIB, ModelSpec
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
        engine = Engine(backend, engine_settings(config), metrics=metrics)
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
