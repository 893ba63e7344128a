"""Several models in one memory budget.

Each served model is a slot: unloaded, loading or loaded. A request leases the model
it names (:meth:`ModelPool.acquire`); an unloaded model is loaded then, once however
many requests ask at the same time (single flight: they await the same load). Loads
run one at a time, so the memory they need is known: before a load, the least
recently used idle models are unloaded until the new one fits ``max_model_memory_mb``;
if no idle model is left to unload, the request gets 503 ``model_memory`` with
``Retry-After``. A model no lease holds is idle; after its keep-alive it is unloaded.

Every model's KV is in one memory ledger (``engine/kv/ledger.py``: ``max_kv_cache_mb``
bounds them together). Before a load the model's KV context is reserved in it: host
tiers give back room first, then idle models are unloaded, least recently used
first; if it still does not fit, the request gets 503 ``kv_budget_exceeded`` with
``Retry-After`` and nothing is loaded.

Each loaded model has its own :class:`~edge_llm.engine.engine.Engine` (thread, KV
budget, contract) and service; its metrics survive unloads (one registry per slot).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from edge_llm.engine import MemoryLedger
from edge_llm.errors import (
    EngineUnavailable,
    InvalidRequest,
    KvBudgetExceeded,
    ModelBusy,
    ModelMemory,
    ModelNotFound,
)
from edge_llm.models.gguf import GgufError, read_metadata
from edge_llm.models.metrics import PoolMetrics
from edge_llm.models.pulling import PullFlight, PullFlights
from edge_llm.models.spec import MIB, ModelSpec
from edge_llm.observability.events import Event, EventSink
from edge_llm.observability.metrics import EngineMetrics

if TYPE_CHECKING:
    from edge_llm.engine import Engine
    from edge_llm.models.embeddings import Embeddings

_RETRY_AFTER_S = 2
_UNLOAD_WAIT_S = 30.0  # an unload asked while streams run waits this long for them


class ModelState(StrEnum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"


@dataclass
class LoadedModel:
    """One loaded model: its engine and its embeddings (an embeddings context of
    its own, made on first use). The generation layer's ServedModel adds the
    service that admits requests to it."""

    spec: ModelSpec
    engine: Engine
    embeddings: Embeddings
    footprint_bytes: int

    def close(self) -> None:
        """Blocking: stop the engine and free the model (embeddings context first);
        its lines leave the memory ledger."""
        self.embeddings.close()
        self.engine.stop()
        self.engine.ledger.close_model()


@dataclass(frozen=True)
class KvGate:
    """The memory ledger every model's KV shares, and the bytes of the KV context a
    model's load makes (known before it loads; at least what llama.cpp allocates)."""

    ledger: MemoryLedger
    context_bytes: Callable[[ModelSpec], int]


# Blocking (run in a thread): load ``spec`` with these metrics and events; the pool
# starts the engine's thread.
# What the pool serves: a loaded model, with what the layers above keep beside it
# (the generation layer's service).
M = TypeVar("M", bound=LoadedModel)
Loader = Callable[[ModelSpec, EngineMetrics, EventSink], M]


@dataclass
class _Slot(Generic[M]):
    spec: ModelSpec
    metrics: EngineMetrics
    loaded: M | None = None
    loading: asyncio.Task[M] | None = None
    closing: asyncio.Task[None] | None = None
    leases: int = 0
    waiting: int = 0  # requests waiting for its load: it is not idle meanwhile
    last_used: float = 0.0
    keep_alive_s: float | None = None
    expiry: asyncio.TimerHandle | None = None
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    metadata: dict[str, Any] | None = None  # its GGUF's, read once

    @property
    def state(self) -> ModelState:
        if self.loading is not None:
            return ModelState.LOADING
        return ModelState.LOADED if self.loaded is not None else ModelState.UNLOADED

    @property
    def is_idle(self) -> bool:
        return self.loaded is not None and self.leases == 0 and self.waiting == 0

    @property
    def held_bytes(self) -> int:
        """Memory counted against the budget: loaded, loading or still closing."""
        if self.loaded is not None:
            return self.loaded.footprint_bytes
        busy = self.loading is not None or self.closing is not None
        return self.spec.estimate_bytes if busy else 0


class Lease(Generic[M]):
    """A request's hold on a loaded model: it is not unloaded until released."""

    def __init__(self, pool: ModelPool[M], slot: _Slot[M], model: M) -> None:
        self._pool = pool
        self._slot = slot
        self.model = model
        self._released = False

    @property
    def name(self) -> str:
        return self._slot.spec.name

    def release(self) -> None:
        """Releasing again does nothing."""
        if not self._released:
            self._released = True
            self._pool._release(self._slot)

    def __enter__(self) -> Lease[M]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class ModelPool(Generic[M]):
    """The served models: which are loaded, who holds a lease on each, and loading,
    unloading and idle expiry within the weights budget and the one KV ledger. Longer
    than most classes (about 320 lines) because a load, an unload for room and an
    expiry all change the same slots and leases; what a model is lives elsewhere."""

    def __init__(
        self,
        specs: list[ModelSpec],
        loader: Loader[M],
        *,
        budget_bytes: int,
        metrics: PoolMetrics,
        events: EventSink,
        slot_metrics: dict[str, EngineMetrics] | None = None,
        clock: Callable[[], float] = time.monotonic,
        kv: KvGate | None = None,
        find: Callable[[str], ModelSpec | None] | None = None,
        pulls: PullFlights | None = None,
    ) -> None:
        """``specs[0]`` is the default model (a request that names none gets it);
        ``slot_metrics``: registries already made for some models (the default's);
        ``kv``: the memory ledger a load reserves its KV context in (None: none);
        ``find``: a model by a name not served yet (a pulled one), or None;
        ``pulls``: pulls a model by such a name on first use (``pull = "missing"``)."""
        given = slot_metrics or {}
        self._slots: dict[str, _Slot[M]] = {
            s.name: _Slot(s, given.get(s.name) or EngineMetrics(), keep_alive_s=s.keep_alive_s)
            for s in specs
        }
        # The served names, default first: one list kept current in place, so that
        # holders of it (the upstream router's local models) see models added later.
        self._names = list(self._slots)
        # Other names of a served file (another pulled name of the same blob, the
        # pulled name of a file served under its model_id): one slot, one load.
        self._aliases: dict[str, str] = {}
        self._find = find
        self._pulls = pulls
        self.default = specs[0].name
        self.budget_bytes = budget_bytes
        self._loader = loader
        self._metrics = metrics
        self._events = events
        self._clock = clock
        self._kv = kv
        self._load_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._draining = False
        metrics.bind(self)

    # -- what is served -------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        """The served names, default first (a live list: read it, do not change it)."""
        return self._names

    def discover(self, model: str | None) -> bool:
        """Serve ``model`` if it is not served yet but ``find`` knows it (a model pulled
        since the start); True when it is served now."""
        return self.served_name(model) is not None

    def served_name(self, model: str | None) -> str | None:
        """The served name ``model`` is (itself, an alias, or any spelling ``find``
        knows of a pulled file: ``o/r:q4_k_m`` is ``hf.co/o/r:Q4_K_M``); a model pulled
        since the start is served from now on. None: not served."""
        if model is None or model in self._slots:
            return model
        if model in self._aliases:
            return self._aliases[model]
        spec = self._find(model) if self._find is not None else None
        return None if spec is None else self.add(spec)

    async def discover_or_pull(self, model: str | None) -> str | None:
        """As :meth:`served_name`, and a model that may be pulled on first use is
        pulled now (once, however many requests ask for it meanwhile)."""
        served = self.served_name(model)
        if served is not None or model is None:
            return served
        flight = self.pulling(model)
        return None if flight is None else await self.pulled(flight)

    def pulling(self, model: str) -> PullFlight | None:
        """The pull of ``model`` (not served) under way, started now if needed; None
        when it may not be pulled (not a Hub source, or pulling on use is off)."""
        return None if self._pulls is None else self._pulls.start(model)

    async def pulled(self, flight: PullFlight) -> str | None:
        """The served name of the model ``flight`` pulls, once pulled (raises why not)."""
        spec = await flight.result()
        return None if spec is None else self.add(spec)

    def add(self, spec: ModelSpec) -> str:
        """Serve one more model (unloaded until asked for) and return its served name.
        A file served already keeps its slot and ``spec.name`` becomes an alias of it,
        so a GGUF is loaded once and holds one KV share whatever it is called. A name
        served already keeps its slot."""
        served = self._serving(spec)
        if served is None:
            self._slots[spec.name] = _Slot(spec, EngineMetrics(), keep_alive_s=spec.keep_alive_s)
            self._names.append(spec.name)
            return spec.name
        if served != spec.name:
            self._aliases[spec.name] = served
        return served

    def _serving(self, spec: ModelSpec) -> str | None:
        """The slot serving ``spec``'s name, else its file."""
        if spec.name in self._slots:
            return spec.name
        if spec.name in self._aliases:
            return self._aliases[spec.name]
        if spec.path is None:  # the embedded model is never pulled
            return None
        return next((n for n, s in self._slots.items() if s.spec.path == spec.path), None)

    async def replace(self, spec: ModelSpec) -> str:
        """Serve ``spec.name`` from ``spec``'s file from now on (a name pulled again
        with other bytes): a slot of that name serving another file is unloaded (its
        streams end) and forgotten, an alias of that name dropped; then it is added."""
        self._aliases.pop(spec.name, None)
        slot = self._slots.get(spec.name)
        if slot is not None and slot.spec.path != spec.path:
            await self.forget(spec.name)
        return self.add(spec)

    async def forget(self, name: str) -> bool:
        """Stop serving the model ``name`` names (any of its names; unloaded first: its
        streams end; its aliases go too); False when it is not served. The default
        model stays."""
        served = self.served_name(name)
        if served is None:
            return False
        name = served
        if name == self.default:
            raise InvalidRequest(f"{name!r} is the default model of this server", param="model")
        await self.unload(name)
        self._slots.pop(name)
        self._names.remove(name)
        for alias in [a for a, target in self._aliases.items() if target == name]:
            del self._aliases[alias]
        return True

    def _slot(self, name: str) -> _Slot[M]:
        """The slot of a served name or alias (KeyError: neither)."""
        return self._slots[self._aliases.get(name, name)]

    def spec(self, name: str) -> ModelSpec:
        return self._slot(name).spec

    def state(self, name: str) -> ModelState:
        return self._slot(name).state

    def loaded(self, name: str) -> M | None:
        return self._slot(name).loaded

    def loaded_models(self) -> list[M]:
        return [s.loaded for s in self._slots.values() if s.loaded is not None]

    def metrics_of(self, name: str) -> EngineMetrics:
        return self._slot(name).metrics

    def used_bytes(self) -> int:
        return sum(slot.held_bytes for slot in self._slots.values())

    def expires_in(self, name: str) -> float | None:
        """Seconds until an idle model's keep-alive unloads it (None: not scheduled)."""
        slot = self._slot(name)
        if slot.expiry is None or not slot.is_idle:
            return None
        return max(0.0, slot.expiry.when() - asyncio.get_running_loop().time())

    async def metadata(self, name: str) -> dict[str, Any]:
        """The model's GGUF metadata (scalars and strings), read once, in a thread;
        empty when the file cannot be read."""
        slot = self._slot(name)
        if slot.metadata is None:
            path = slot.spec.path
            try:
                slot.metadata = await asyncio.to_thread(read_metadata, path) if path else {}
            except (OSError, GgufError):
                slot.metadata = {}
        return slot.metadata

    def describe(self, name: str) -> dict[str, Any]:
        """Model ``name`` as /debug/streams shows it in its ``models`` section."""
        slot = self._slot(name)
        return {
            "state": slot.state.value,
            "default": name == self.default,
            "path": slot.spec.path,
            "memory_bytes": slot.held_bytes,
            "estimate_bytes": slot.spec.estimate_bytes,
            "weights_bytes": slot.spec.size_bytes,
            "keep_alive_s": slot.keep_alive_s,
            "expires_in_s": self.expires_in(name),
            "requests": slot.leases,
        }

    def resolve(self, model: str | None) -> str:
        """The served name ``model`` asks for (None: the default model)."""
        served = self.default if model is None else self.served_name(model)
        if served is None:
            raise ModelNotFound(
                f"model {model!r} is not served here; available: {', '.join(self._slots)}",
                param="model",
                available=list(self._slots),
            )
        return served

    def adopt(self, model: M) -> None:
        """Serve ``model``, loaded already (the default model, loaded at start)."""
        slot = self._slots[model.spec.name]
        self._metrics.loads.labels(model.spec.name).inc()
        slot.loaded = model
        slot.last_used = self._clock()
        self._schedule_expiry(slot)

    # -- leases -----------------------------------------------------------------------

    def set_keep_alive(self, name: str, seconds: float | None) -> None:
        """How long model ``name`` stays loaded once idle, from now on (each Ollama
        request's ``keep_alive`` sets it; None: always)."""
        self._slot(name).keep_alive_s = seconds

    async def acquire(self, name: str) -> Lease[M]:
        """Lease model ``name``, loading it first if needed (raises ModelMemory when it
        cannot fit, BackendError when it cannot load)."""
        slot = self._slot(name)
        if self._draining and slot.loaded is None:
            raise EngineUnavailable("engine unavailable: shutting down", retry_after_s=5)
        slot.waiting += 1
        try:
            model = await self._ensure_loaded(slot)
        finally:
            slot.waiting -= 1
        slot.leases += 1
        slot.idle.clear()
        slot.last_used = self._clock()
        self._cancel_expiry(slot)
        return Lease(self, slot, model)

    def _release(self, slot: _Slot[M]) -> None:
        slot.leases -= 1
        slot.last_used = self._clock()
        if slot.leases == 0:
            slot.idle.set()
            self._schedule_expiry(slot)

    # -- loading ----------------------------------------------------------------------

    async def load(self, name: str) -> M:
        """Load model ``name`` (if it is not) without holding it."""
        with await self.acquire(name) as lease:
            return lease.model

    async def _ensure_loaded(self, slot: _Slot[M]) -> M:
        while slot.closing is not None:  # an unload under way finishes first
            await asyncio.shield(slot.closing)
        if slot.loaded is not None:
            return slot.loaded
        if slot.loading is None:
            slot.loading = asyncio.create_task(self._load(slot))
        return await asyncio.shield(slot.loading)

    async def _load(self, slot: _Slot[M]) -> M:
        self._refresh(slot)
        spec = slot.spec
        try:
            async with self._load_lock:
                await self._make_room(slot)
                await self._make_kv_room(slot)
                self._metrics.loads.labels(spec.name).inc()
                self._events(Event.MODEL_LOADING, None, model=spec.name,
                             estimate_bytes=spec.estimate_bytes)  # fmt: skip
                began = time.monotonic()
                try:
                    model = await asyncio.to_thread(self._loader, spec, slot.metrics, self._events)
                except BaseException as exc:
                    self._close_kv_lines(slot)
                    self._events(Event.MODEL_LOAD_FAILED, None, model=spec.name, error=str(exc))
                    raise
                model.engine.start(asyncio.get_running_loop())
                slot.loaded = model
                slot.last_used = self._clock()
                self._events(Event.MODEL_LOADED, None, model=spec.name,
                             load_ms=round((time.monotonic() - began) * 1000.0, 1),
                             footprint_bytes=model.footprint_bytes)  # fmt: skip
                return model
        finally:
            slot.loading = None

    def _refresh(self, slot: _Slot[M]) -> None:
        """Before a load: a pulled file deleted since it was served (``edge-llm pull``
        gave its name other bytes while this server ran, and deleted the old ones) is
        replaced by the file the name has now; the slot's other settings stay."""
        path = slot.spec.path
        if path is None or self._find is None or os.path.exists(path):
            return
        now = self._find(slot.spec.name)
        if now is not None and now.path != path:
            slot.spec = dataclasses.replace(
                slot.spec, path=now.path, size_bytes=now.size_bytes, modified_at=now.modified_at
            )
            slot.metadata = None

    async def _make_room(self, slot: _Slot[M]) -> None:
        """Lock held: unload idle models, least recently used first, until ``slot``'s
        model fits the budget; raise ModelMemory when it cannot."""
        need = slot.spec.estimate_bytes
        budget = self.budget_bytes
        if not budget:
            return
        if need > budget:
            self._metrics.refusals.labels(slot.spec.name).inc()
            raise ModelMemory(
                f"model {slot.spec.name!r} needs about {need // MIB} MiB, more than "
                f"max_model_memory_mb ({budget // MIB})",
                retry_after_s=_RETRY_AFTER_S,
            )
        while self.used_bytes() - slot.held_bytes + need > budget:
            idle = [s for s in self._slots.values() if s.is_idle and s is not slot]
            if not idle:
                self._metrics.refusals.labels(slot.spec.name).inc()
                raise ModelMemory(
                    f"model {slot.spec.name!r} needs about {need // MIB} MiB; "
                    f"{self.used_bytes() // MIB} of max_model_memory_mb ({budget // MIB}) "
                    "are held by models that are busy",
                    retry_after_s=_RETRY_AFTER_S,
                )
            victim = min(idle, key=lambda s: s.last_used)
            await self._unload(victim, "memory")

    async def _make_kv_room(self, slot: _Slot[M]) -> None:
        """Lock held: reserve the KV context ``slot``'s model will make in the memory
        ledger (host tiers give back room for it first), unloading idle models, least
        recently used first, while it does not fit; raise KvBudgetExceeded when no
        idle model is left, with nothing reserved."""
        if self._kv is None:
            return
        ledger = self._kv.ledger.for_model(slot.spec.name)
        need = self._kv.context_bytes(slot.spec)
        line = ledger.line("device") or ledger.account("device", "device")
        while not await asyncio.to_thread(line.resize, need):
            idle = [s for s in self._slots.values() if s.is_idle and s is not slot]
            if not idle:
                ledger.close_model()
                self._metrics.refusals.labels(slot.spec.name).inc()
                raise KvBudgetExceeded(
                    f"model {slot.spec.name!r} needs {need >> 20} MiB of KV; the memory "
                    f"ledger has {ledger.free_bytes >> 20} MiB free of max_kv_cache_mb "
                    f"({(ledger.cap_bytes or 0) >> 20}) and the models holding the rest "
                    "are busy",
                    retry_after_s=_RETRY_AFTER_S,
                )
            await self._unload(min(idle, key=lambda s: s.last_used), "memory")

    def _close_kv_lines(self, slot: _Slot[M]) -> None:
        """A load that failed leaves no line in the memory ledger."""
        if self._kv is not None:
            self._kv.ledger.for_model(slot.spec.name).close_model()

    # -- unloading ----------------------------------------------------------------------

    async def unload(self, name: str, reason: str = "request") -> bool:
        """Unload model ``name``: its running streams are cancelled (reason
        ``unloaded``) and it goes once their requests end (ModelBusy if they do not
        within 30 s). False if it was not loaded."""
        slot = self._slot(name)
        if slot.loading is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(slot.loading)
        if slot.loaded is None:
            return False
        deadline = time.monotonic() + _UNLOAD_WAIT_S
        while slot.loaded is not None and slot.leases:
            slot.loaded.engine.cancel_all("unloaded")
            try:
                await asyncio.wait_for(slot.idle.wait(), deadline - time.monotonic())
            except TimeoutError:
                raise ModelBusy(
                    f"model {name!r} still has requests running", retry_after_s=_RETRY_AFTER_S
                ) from None
        await self._unload(slot, reason)
        return True

    async def _unload(self, slot: _Slot[M], reason: str) -> None:
        """Unload an idle model (a model leased again meanwhile stays)."""
        model = slot.loaded
        if model is None or slot.closing is not None or slot.leases or slot.waiting:
            return
        self._cancel_expiry(slot)
        slot.loaded = None
        slot.closing = asyncio.create_task(asyncio.to_thread(_close, model))
        try:
            await asyncio.shield(slot.closing)
        finally:
            slot.closing = None
        self._close_kv_lines(slot)  # all gone already, unless its engine had a ledger apart
        _zero_gauges(slot.metrics)
        self._metrics.unloads.labels(slot.spec.name, reason).inc()
        self._events(Event.MODEL_UNLOADED, None, model=slot.spec.name, reason=reason)

    def _schedule_expiry(self, slot: _Slot[M]) -> None:
        self._cancel_expiry(slot)
        if slot.keep_alive_s is None or slot.loaded is None:
            return
        loop = asyncio.get_running_loop()
        slot.expiry = loop.call_later(slot.keep_alive_s, self._expire, slot)

    def _cancel_expiry(self, slot: _Slot[M]) -> None:
        if slot.expiry is not None:
            slot.expiry.cancel()
            slot.expiry = None

    def _expire(self, slot: _Slot[M]) -> None:
        slot.expiry = None
        if slot.is_idle:
            task = asyncio.create_task(self._unload(slot, "keep_alive"))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def drain(self, grace_s: float) -> None:
        """Shutdown, first half: stop admitting, give running streams ``grace_s``,
        cancel the rest. Nothing is loaded from now on."""
        self._draining = True
        models = self.loaded_models()
        for model in models:
            model.engine.begin_drain()
        running = [h.wait_done() for m in models for h in m.engine.live_handles()]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*running), grace_s)
        for model in models:
            model.engine.cancel_all("shutdown")

    async def unload_all(self) -> None:
        """Shutdown, second half (no request is left): unload every model."""
        for slot in self._slots.values():
            slot.leases = slot.waiting = 0
            await self._unload(slot, "shutdown")


def _close(model: LoadedModel) -> None:
    model.close()
    _trim_heap()


def _trim_heap() -> None:
    """Give the freed model's memory back to the system now: glibc keeps freed heap
    pages otherwise (measured: about 80 MiB of 300 kept after unloading Gemma 3 270M)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _zero_gauges(metrics: EngineMetrics) -> None:
    """An unloaded model's gauges read zero (not its stopped engine's last state)."""
    metrics.bind_gauges(*[lambda: 0.0] * 5)
    metrics.bind_tiers(dict)  # the tiers its engine named
    metrics.bind_ledger(dict)
    metrics.memory_available.set_function(lambda: float("nan"))
