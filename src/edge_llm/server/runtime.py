"""Assembling and running the daemon: models, engines, HTTP server, shutdown.

The default model is loaded at start (as with one model); the other served models
when first asked for (see :mod:`edge_llm.models.pool`). Each loaded model gets a
backend, an :class:`Engine` and a :class:`GenerationService` of its own.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
from aiohttp import web
from prometheus_client import CollectorRegistry

from edge_llm import __version__
from edge_llm.config.tree import EngineConfig
from edge_llm.engine import (
    Backend,
    Engine,
    EngineSettings,
    MemoryLedger,
    build_engine,
    context_cells,
    context_tokens,
    device_share_bytes,
    in_passing_thread,
    kv_bytes_per_token,
    scheduler_limits,
)
from edge_llm.errors import BackendError
from edge_llm.generation.background import BackgroundResponses
from edge_llm.generation.dispatch import Dispatcher
from edge_llm.generation.pump import PumpSettings
from edge_llm.generation.resumable import ResumableStreams
from edge_llm.generation.service import GenerationService, Limits, ServedModel
from edge_llm.generation.sessions import Sessions
from edge_llm.models.catalog import Catalog
from edge_llm.models.embeddings import EmbeddingLimits, Embeddings
from edge_llm.models.gguf import GgufError, read_metadata
from edge_llm.models.metrics import PoolMetrics
from edge_llm.models.pool import KvGate, Loader, ModelPool
from edge_llm.models.pulling import PullFlights
from edge_llm.models.sizing import Fit, fit_config, fit_ttft
from edge_llm.models.spec import (
    MIB,
    ModelSpec,
    check_kv_shares,
    default_spec,
    kv_share_bytes,
    named_specs,
    pulled_spec,
    serves_several,
)
from edge_llm.observability.events import Event, EventLog, EventSink, null_sink
from edge_llm.observability.metrics import EngineMetrics
from edge_llm.protocol.sampling import SamplingDefaults
from edge_llm.server.app import create_app
from edge_llm.server.context import ServerContext
from edge_llm.server.http import ConnectionSettings
from edge_llm.server.priority import PriorityDefaults
from edge_llm.server.telemetry import start_otel, tee
from edge_llm.upstream.metrics import BackendMetrics
from edge_llm.upstream.registry import Upstream, UpstreamRegistry
from edge_llm.upstream.router import LOCAL, UpstreamRouter
from edge_llm.upstream.stream import StreamSettings

if TYPE_CHECKING:  # imported only when OpenTelemetry is on
    from edge_llm.observability.otel.sdk import Telemetry

_log = logging.getLogger("edge_llm.server")


def engine_settings(config: EngineConfig) -> EngineSettings:
    bp, sched, cache = config.backpressure, config.scheduler, config.cache
    return EngineSettings(
        max_queue=sched.max_queue,
        prefill_chunk_tokens=sched.prefill_chunk_tokens,
        itl_target_s=sched.itl_target_ms / 1000.0 if sched.itl_target_ms else None,
        speculative=config.speculative.speculative == "prompt_lookup",
        max_draft_tokens=config.speculative.max_draft_tokens,
        outbound_buffer_tokens=bp.outbound_buffer_tokens,
        pause_on_socket_full=bp.pause_on_socket_full,
        resume_threshold=bp.resume_threshold,
        cancel_release_kv=bp.cancel_release_kv,
        ttft_timeout_s=bp.ttft_timeout_ms / 1000.0 if bp.ttft_timeout_ms else None,
        max_pause_s=bp.max_pause_ms / 1000.0 if bp.max_pause_ms else None,
        prefix_cache=cache.prefix_cache,
        host_offload_bytes=cache.host_offload_mb * 1024 * 1024,
        host_cache_bytes=cache.host_cache_mb * 1024 * 1024,
        memory_cap_bytes=bp.max_kv_cache_mb * MIB,  # a CPU device: one ledger (ledger.py)
        cache_dir=cache.cache_dir,
        cache_dir_bytes=cache.cache_dir_mb * 1024 * 1024,
        offload_paused_after_s=cache.offload_paused_after_ms / 1000.0,
        deadline_admission=sched.deadline_admission,
        max_preemptions=sched.max_preemptions,
        min_available_bytes=config.model.min_available_mb * 1024 * 1024,
        adaptive_threads=config.model.adaptive_threads,
    )


def load_backend(config: EngineConfig, spec: ModelSpec | None = None) -> Backend:
    """The model ``spec`` names (None: the default model, ``model_path`` or the
    embedded one) loaded with the engine's settings."""
    from edge_llm.engine.runtime.llama_backend import (  # noqa: PLC0415 (loads llama.cpp)
        LlamaBackend,
        default_model_path,
    )

    sched = config.scheduler
    kv_bytes = kv_share_bytes(config, None)  # the default model's share of the ledger
    path, model_id = config.model.model_path, config.model.model_id
    if spec is not None:
        path, model_id, kv_bytes = spec.path, spec.name, spec.kv_budget_bytes
    return LlamaBackend(
        path,
        kv_budget_bytes=kv_context_bytes(config, path or default_model_path(), kv_bytes),
        max_sequences=sched.max_sequences,
        max_batch_tokens=scheduler_limits(
            sched.max_sequences, engine_settings(config)
        ).max_batch_tokens,
        n_threads=config.model.n_threads,
        kv_unified=sched.kv_unified,
        kv_cache_type=config.cache.kv_cache_type,
        model_id=model_id,
        verbose=config.model.verbose,
        invariant_kernels=sched.deterministic,
    )


def kv_context_bytes(config: EngineConfig, path: str | Path, share_bytes: int) -> int:
    """On a CPU a model's KV context is one line of the memory ledger: its share of the
    cap less the other tiers' room (engine/kv/ledger.py): the budget its load is given."""
    cache = config.cache
    per_token = kv_bytes_per_token(_metadata(path), cache.kv_cache_type) or 0
    return device_share_bytes(
        share_bytes, cache.host_cache_mb * MIB, cache.host_offload_mb * MIB,
        context_cells(config.model.max_embedding_tokens) * per_token,  # embeddings
    )  # fmt: skip


def kv_allocated_bytes(config: EngineConfig, spec: ModelSpec) -> int:
    """The KV context a model's load allocates (llama.cpp's whole blocks of cells in
    its budget), from its GGUF's metadata before it loads: what the pool reserves in
    the memory ledger. The budget when the file cannot tell (its load says why)."""
    path = spec.path or ""
    budget = kv_context_bytes(config, path, spec.kv_budget_bytes)
    metadata = _metadata(path)
    per_token = kv_bytes_per_token(metadata, config.cache.kv_cache_type)
    if not per_token:
        return budget
    trained = metadata.get(f"{metadata.get('general.architecture')}.context_length")
    sched = config.scheduler
    cells = context_tokens(
        budget, per_token, trained if isinstance(trained, int) else 0,
        sched.max_sequences, sched.kv_unified,
    )  # fmt: skip
    return cells * per_token


def _metadata(path: str | Path) -> dict[str, Any]:
    """A GGUF's metadata; empty when the file cannot be read (its load says why)."""
    try:
        return read_metadata(str(path))
    except (OSError, GgufError):
        return {}


def model_loader(config: EngineConfig, ledger: MemoryLedger | None = None) -> Loader[ServedModel]:
    """Loads a served model on demand (in a thread): backend, engine (the pool starts
    it), service. Its footprint is the estimate, or the resident memory the load
    added if more. ``ledger``: the memory ledger every model's KV shares (where the
    pool reserved the model's KV context before the load)."""

    def load(spec: ModelSpec, metrics: EngineMetrics, events: EventSink) -> ServedModel:
        before = _rss()
        backend = load_backend(config, spec)
        try:
            settings = model_settings(config, spec)
            engine = build_engine(backend, settings, metrics=metrics, events=events, ledger=ledger)
            model = loaded_model(config, spec, engine, backend, events)
        except BaseException:
            backend.close()  # the model's memory goes back at once
            raise
        model.footprint_bytes = max(spec.estimate_bytes, _rss() - before)
        return model

    return load


def model_settings(config: EngineConfig, spec: ModelSpec) -> EngineSettings:
    """A named model's engine settings: the engine's, with a disk tier of its own
    (``cache_dir/models/NAME``) so that models do not evict each other's entries."""
    settings = replace(engine_settings(config), memory_cap_bytes=spec.kv_budget_bytes)
    if not settings.cache_dir:
        return settings
    return replace(settings, cache_dir=str(Path(settings.cache_dir) / "models" / spec.name))


def loaded_model(
    config: EngineConfig, spec: ModelSpec, engine: Engine, backend: Backend, events: EventSink
) -> ServedModel:
    service = generation_service(config, engine, backend, events, spec)
    return ServedModel(
        spec=spec,
        engine=engine,
        service=service,
        embeddings=Embeddings(
            backend, backend.info.n_vocab, embedding_limits(config), engine.ledger
        ),
        footprint_bytes=spec.estimate_bytes,
    )


def embedding_limits(config: EngineConfig) -> EmbeddingLimits:
    return EmbeddingLimits(
        max_inputs=config.model.max_embedding_inputs,
        max_tokens=config.model.max_embedding_tokens,
        max_waiting=config.scheduler.max_queue,
        threads=config.model.embedding_threads,
    )


def _rss() -> int:
    return int(psutil.Process().memory_info().rss)


class ListenError(Exception):
    """The address could not be bound (in use, not this host's, a privileged port)."""

    def __init__(self, host: str, port: int, cause: OSError) -> None:
        super().__init__(f"cannot listen on {host}:{port}: {cause.strerror or cause}")
        self.host, self.port, self.errno = host, port, cause.errno


@dataclass
class RunningServer:
    ctx: ServerContext
    runner: web.AppRunner
    event_log: EventLog | None
    host: str
    port: int
    sized: Fit = field(default_factory=Fit)  # the keys sized for the model, and why
    telemetry: Telemetry | None = None  # OpenTelemetry's providers, when it is on

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def shutdown(self, grace_s: float) -> None:
        """Stop admitting, let running streams finish for ``grace_s``, cancel the
        rest (their clients get a final ``cancelled``/``shutdown`` event), stop."""
        self.ctx.draining = True
        self.ctx.resumable.close()  # nobody may come back for a detached stream now
        self.ctx.background.close()  # a background response does not outlive the server
        await self.ctx.pool.drain(grace_s)
        self.ctx.router.cancel_all("shutdown")
        await self.runner.cleanup()
        await self.ctx.router.registry.close()
        await self.ctx.pool.unload_all()
        if self.event_log is not None:
            self.event_log.close()
        if self.telemetry is not None:
            await asyncio.to_thread(self.telemetry.shutdown)  # exports what is held


async def start_server(config: EngineConfig, backend: Backend | None = None) -> RunningServer:
    """Listen, load the model (unless given a backend), start the engine. Raises
    :class:`ListenError` before loading anything when the address cannot be bound."""
    server = config.server
    # A bad OTEL_* value (OtelConfigError) is refused before anything starts.
    otel = start_otel(os.environ, __version__, {n: u.url for n, u in config.upstream.items()})
    # Bound first (a taken port fails before the model loads); listens once ready.
    sock = _bound_socket(server.host, server.port, server.socket_send_buffer_bytes)
    metrics = EngineMetrics()
    event_log = None
    if server.event_log:
        event_log = EventLog(
            server.event_log, source="engine", on_drop=metrics.count_event_log_drop
        )
    events: EventSink = event_log.emit if event_log else null_sink
    if otel is not None:
        events = tee(events, otel[1])
    sized = Fit()
    if backend is None:  # defaults that fit the model: before its load, then its prefill rate
        available = psutil.virtual_memory().available
        config, sized = await asyncio.to_thread(fit_config, config, available)
        backend = await asyncio.to_thread(load_backend, config)
        config = await in_passing_thread(fit_ttft, config, backend, sized)
    engine_events = model_events(config, backend.info.model_id, events)
    engine = build_engine(backend, engine_settings(config), metrics=metrics, events=engine_events)
    engine.start(asyncio.get_running_loop())
    ctx = build_context(config, engine, backend, events)
    ctx.tracing = otel[1] if otel is not None else None
    await ctx.router.registry.start()
    runner = web.AppRunner(
        create_app(ctx),
        handler_cancellation=True,
        access_log=None,
        # A connection that sends no complete request head (nothing, half the
        # headers) or idles between requests is closed after the body timeout.
        keepalive_timeout=ctx.connection.body_timeout_s,
    )
    await runner.setup()
    aiohttp_server = runner.server
    if aiohttp_server is not None:
        ctx.count_connections = lambda: len(aiohttp_server.connections)
    sock.listen(1024)
    sock.setblocking(False)
    await web.SockSite(runner, sock).start()
    host, port = sock.getsockname()[:2]
    _warn_if_exposed(config)
    telemetry = otel[0] if otel is not None else None
    return RunningServer(ctx, runner, event_log, host, port, sized, telemetry)


def model_events(config: EngineConfig, name: str, events: EventSink) -> EventSink:
    """A model's engine events; with several models served each line names its model."""
    if not serves_several(config):
        return events

    def emit(event: Event, request_id: str | None = None, /, **fields: Any) -> None:
        events(event, request_id, model=name, **fields)

    return emit


def generation_service(
    config: EngineConfig,
    engine: Engine,
    backend: Backend,
    events: EventSink,
    spec: ModelSpec | None = None,
) -> GenerationService:
    bp, sched, server = config.backpressure, config.scheduler, config.server
    limits = Limits(
        max_prompt_tokens=bp.max_prompt_tokens,
        default_max_tokens=sched.default_max_tokens,
        max_tokens_cap=sched.max_tokens_cap,
        max_messages=server.max_messages,
        context_tokens=spec.context_tokens if spec else None,
    )
    defaults = SamplingDefaults(temperature=sched.default_temperature, top_p=sched.default_top_p)
    service = GenerationService(
        engine,
        backend,
        limits,
        events=events,
        log_prompts=server.log_prompts,
        sampling_defaults=defaults,
    )
    if spec is not None:  # the model's own keys over the GGUF's and the engine's
        service.sampling_defaults = service.sampling_defaults.overridden(spec.sampling)
    return service


def build_pool(
    config: EngineConfig,
    engine: Engine,
    backend: Backend,
    events: EventSink,
    *,
    registry: CollectorRegistry,
    loader: Loader[ServedModel] | None = None,
) -> ModelPool[ServedModel]:
    """The served models, the default one (``engine`` over ``backend``) loaded."""
    info = backend.info
    first = default_spec(config, info.model_id, info.path, info.size_bytes)
    named = named_specs(config)
    if first.name in config.models:
        raise BackendError(
            f"model name {first.name!r} is the default model's id: name it otherwise "
            "or set model_id"
        )
    check_kv_shares(config)
    specs = [first, *named]
    catalog = Catalog.of(config)
    store = catalog.store
    loader = loader or model_loader(config, engine.ledger)
    pool = ModelPool(
        specs,
        lambda spec, metrics, _: loader(spec, metrics, model_events(config, spec.name, events)),
        budget_bytes=config.model.max_model_memory_mb * MIB,
        metrics=PoolMetrics(registry),
        events=events,
        slot_metrics={specs[0].name: engine.metrics},
        kv=KvGate(  # one ledger: the default model's engine made it
            engine.ledger,
            lambda spec: kv_allocated_bytes(config, spec),
        ),
        find=lambda name: pulled_spec(config, m.name, m.blob) if (m := store.find(name)) else None,
        pulls=PullFlights(
            lambda name, report: catalog.pull_on_use(config, name, report), catalog.pull_key
        ),
    )
    # Every pulled model is served (unloaded until asked for), as Ollama lists them; a
    # file served already (under a configured name, or another pulled one) keeps its slot.
    for stored in store.list():
        pool.add(pulled_spec(config, stored.name, stored.blob))
    pool.adopt(loaded_model(config, specs[0], engine, backend, events))
    return pool


def build_context(
    config: EngineConfig,
    engine: Engine,
    backend: Backend,
    events: EventSink,
    loader: Loader[ServedModel] | None = None,
) -> ServerContext:
    """Everything the routes need; ``engine`` over ``backend`` is the default model."""
    sched, stream, server = config.scheduler, config.stream, config.server
    registry = CollectorRegistry(auto_describe=True)
    pool = build_pool(config, engine, backend, events, registry=registry, loader=loader)
    router = build_router(config, registry, pool, events)
    pump_settings = PumpSettings(
        chunk_tokens=stream.chunk_size_tokens,
        flush_interval_s=stream.flush_interval_ms / 1000.0,
        heartbeat_interval_s=stream.heartbeat_interval_ms / 1000.0,
    )
    return ServerContext(
        pool=pool,
        registry=registry,
        config=config,
        router=router,
        dispatcher=Dispatcher(
            pool, router, pump_settings, Sessions(supersede=sched.supersede_sessions)
        ),
        resumable=ResumableStreams(
            stream.resume_grace_ms / 1000.0,
            stream.max_detached_streams,
            stream.resume_buffer_events,
            events,
        ),
        background=BackgroundResponses(
            stream.background_retention_ms / 1000.0,
            stream.max_background_responses,
            stream.background_ttft_timeout_ms / 1000.0,
        ),
        pump_settings=pump_settings,
        connection=ConnectionSettings(
            socket_send_buffer_bytes=server.socket_send_buffer_bytes,
            write_buffer_bytes=server.write_buffer_bytes,
            body_timeout_s=server.body_timeout_ms / 1000.0,
        ),
        priorities=PriorityDefaults.of(server),
    )


def build_router(
    config: EngineConfig,
    registry_: CollectorRegistry,
    pool: ModelPool[ServedModel],
    events: EventSink,
) -> UpstreamRouter:
    bp, server = config.backpressure, config.server

    def health_changed(upstream: Upstream, healthy: bool) -> None:
        level = logging.INFO if healthy else logging.WARNING
        _log.log(level, "upstream %s is %s", upstream.name, "healthy" if healthy else
                 f"unhealthy: {upstream.last_error}")  # fmt: skip
        events(Event.UPSTREAM_HEALTH, None, backend=upstream.name, healthy=healthy,
               error=upstream.last_error)  # fmt: skip

    registry = UpstreamRegistry(
        dict(config.upstream),
        health_interval_s=server.upstream_health_interval_ms / 1000.0,
        connect_timeout_s=server.upstream_connect_timeout_ms / 1000.0,
        receive_buffer_bytes=server.upstream_receive_buffer_bytes,
        on_health_change=health_changed,
    )
    metrics = BackendMetrics(registry_, LOCAL, list(config.upstream))
    for upstream in registry.upstreams:
        metrics.bind_upstream(
            upstream.name,
            healthy=lambda u=upstream: float(u.healthy),  # type: ignore[misc]
            streams_open=lambda u=upstream: float(u.num_open),  # type: ignore[misc]
        )

    settings = StreamSettings(
        buffer_chunks=bp.outbound_buffer_tokens,
        resume_threshold=bp.resume_threshold,
        heartbeat_interval_s=config.stream.heartbeat_interval_ms / 1000.0,
        connect_timeout_s=server.upstream_connect_timeout_ms / 1000.0,
        ttft_timeout_s=bp.ttft_timeout_ms / 1000.0 if bp.ttft_timeout_ms else None,
        max_pause_s=bp.max_pause_ms / 1000.0 if bp.max_pause_ms else None,
    )
    return UpstreamRouter(
        registry,
        local_models=pool.names,
        settings=settings,
        metrics=metrics,
        events=events,
    )


def _bound_socket(host: str, port: int, send_buffer: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if send_buffer:
        # Inherited by accepted sockets: the kernel buffers little for a stalled reader.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ListenError(host, port, exc) from exc
    return sock


def _warn_if_exposed(config: EngineConfig) -> None:
    host = config.server.host
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback and not config.server.api_key:
        _log.warning(
            "listening on %s without an API key: any device on the network can use "
            "this engine; set --api-key",
            host,
        )
