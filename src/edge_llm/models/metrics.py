"""The server's metrics: the models' own, labelled ``model``, and the pool's.

Each model keeps its engine's registry across unloads. When more than one model is
served, every engine series gains a ``model`` label; one model's are unchanged, so a
single-model server scrapes as before. Process-wide series (event log drops, device
memory) are the default model's, unlabelled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from edge_llm.observability.metrics import PREFIX, EngineMetrics


class _Loaded(Protocol):
    @property
    def footprint_bytes(self) -> int: ...


class PoolView(Protocol):
    """What the metrics read of the pool (:class:`~edge_llm.models.pool.ModelPool`),
    which binds them to itself."""

    @property
    def budget_bytes(self) -> int: ...

    @property
    def names(self) -> list[str]: ...

    @property
    def default(self) -> str: ...

    def loaded(self, name: str) -> _Loaded | None: ...

    def metrics_of(self, name: str) -> EngineMetrics: ...


_PROCESS_WIDE = frozenset({PREFIX + "event_log_dropped", PREFIX + "memory_available_bytes"})


class PoolMetrics:
    """``edge_llm_model_*``: loads, unloads, refusals, state and memory per model."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.registry = registry
        self.loads = Counter(PREFIX + "model_loads", "Models loaded, by model", ["model"],
                             registry=r)  # fmt: skip
        self.unloads = Counter(
            PREFIX + "model_unloads",
            "Models unloaded, by model and why (keep_alive, memory, request, shutdown)",
            ["model", "reason"],
            registry=r,
        )
        self.refusals = Counter(
            PREFIX + "model_memory_rejections",
            "Requests refused with model_memory (no idle model to unload), by model",
            ["model"],
            registry=r,
        )
        self.loaded = Gauge(PREFIX + "model_loaded", "1 while the model is loaded", ["model"],
                            registry=r)  # fmt: skip
        self.memory = Gauge(
            PREFIX + "model_memory_bytes",
            "Memory counted for the model against max_model_memory_mb (0: unloaded)",
            ["model"],
            registry=r,
        )
        self.budget = Gauge(
            PREFIX + "model_memory_budget_bytes", "max_model_memory_mb (0: none)", registry=r
        )

    def bind(self, pool: PoolView) -> None:
        self.budget.set(pool.budget_bytes)
        for name in pool.names:
            self.loads.labels(name)
            self.refusals.labels(name)
            self.loaded.labels(name).set_function(_loaded(pool, name))
            self.memory.labels(name).set_function(_memory(pool, name))
        self.registry.register(_PerModel(pool))


def _loaded(pool: PoolView, name: str) -> Callable[[], float]:
    return lambda: float(pool.loaded(name) is not None)


def _memory(pool: PoolView, name: str) -> Callable[[], float]:
    def read() -> float:
        model = pool.loaded(name)
        return float(model.footprint_bytes) if model is not None else 0.0

    return read


class _PerModel(Collector):
    """Every model's engine metrics as one set of families."""

    def __init__(self, pool: PoolView) -> None:
        self._pool = pool

    def collect(self) -> Iterator[Metric]:
        pool = self._pool
        labelled = len(pool.names) > 1
        families: dict[str, Metric] = {}
        for name in pool.names:
            for family in _families(pool.metrics_of(name)):
                shared = family.name in _PROCESS_WIDE
                if shared and name != pool.default:
                    continue
                out = families.get(family.name)
                if out is None:
                    out = Metric(family.name, family.documentation, family.type, family.unit)
                    families[family.name] = out
                for sample in family.samples:
                    labels = sample.labels if shared or not labelled else {
                        "model": name, **sample.labels}  # fmt: skip
                    out.add_sample(sample.name, labels, sample.value, sample.timestamp)
        yield from families.values()


def _families(metrics: EngineMetrics) -> Iterator[Metric]:
    yield from metrics.registry.collect()
