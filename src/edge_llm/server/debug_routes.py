"""Health, Prometheus metrics and /debug/streams."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from edge_llm import __version__
from edge_llm.protocol.openapi import openapi_document
from edge_llm.server.context import context_of
from edge_llm.upstream.router import LOCAL


async def health(request: web.Request) -> web.Response:
    """Dead if a loaded model's engine thread died; the counts are all models'."""
    ctx = context_of(request)
    engines = [model.engine for model in ctx.pool.loaded_models()]
    for engine in engines:
        if not engine.alive:
            crash = repr(engine.crash) if engine.crash else "engine thread is not running"
            return web.json_response({"status": "dead", "error": crash}, status=503)
    status = "draining" if ctx.draining else "ok"
    body: dict[str, object] = {
        "status": status,
        "model": ctx.pool.default,
        "requests_running": sum(e.scheduler.num_running for e in engines),
        "requests_waiting": sum(e.scheduler.num_waiting for e in engines),
    }
    if len(ctx.pool.names) > 1:
        body["models"] = {name: ctx.pool.state(name).value for name in ctx.pool.names}
    upstreams = ctx.router.registry.upstreams
    if upstreams:  # names, health and errors only: /health needs no key
        body["upstreams"] = [
            {"name": u.name, "healthy": u.healthy, "error": u.last_error} for u in upstreams
        ]
    return web.json_response(body, status=503 if ctx.draining else 200)


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(context_of(request).registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def streams(request: web.Request) -> web.Response:
    """The default model's totals at the top level (as with one model), every local
    stream (``backend: local``, its ``model``), then those relayed from upstreams;
    ``models``: each served model's state, memory and (loaded) totals;
    ``max_prompt_tokens``: the longest prompt the default model admits (a load
    generator keeps its prompts within it)."""
    ctx = context_of(request)
    pool = ctx.pool
    document: dict[str, Any] = {}
    local: list[dict[str, Any]] = []
    models: dict[str, dict[str, Any]] = {}
    for name in pool.names:
        loaded = pool.loaded(name)
        snapshot = loaded.engine.snapshot() if loaded else _unloaded()
        for stream in snapshot["streams"]:
            stream.update(backend=LOCAL, model=name)
        local.extend(snapshot.pop("streams"))
        models[name] = {**pool.describe(name), **snapshot}
        if name == pool.default:
            document.update(snapshot)
            if loaded:
                document["max_prompt_tokens"] = loaded.service.prompt_limit()[1]
    document["streams"] = [*local, *ctx.router.snapshot()]
    document["models"] = models
    document["model_memory_used_bytes"] = pool.used_bytes()
    document["model_memory_budget_bytes"] = pool.budget_bytes
    document["upstreams"] = [u.describe() for u in ctx.router.registry.upstreams]
    return web.json_response(document)


def _unloaded() -> dict[str, Any]:
    """The totals of a model that is not loaded: nothing runs, no KV is allocated."""
    return {
        "streams": [],
        "kv_used_bytes": 0,
        "kv_budget_bytes": 0,
        "requests_running": 0,
        "requests_waiting": 0,
        "backpressure": 0,
        "backpressure_peak": 0,
        "engine_alive": False,
        "steps": 0,
    }


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document(__version__))
