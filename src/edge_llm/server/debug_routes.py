"""Health, Prometheus metrics and /debug/streams."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from edge_llm import __version__
from edge_llm.protocol.openapi import openapi_document
from edge_llm.server.context import context_of
from edge_llm.upstream.router import LOCAL


async def health(request: web.Request) -> web.Response:
    ctx = context_of(request)
    engine = ctx.engine
    if not engine.alive:
        crash = repr(engine.crash) if engine.crash else "engine thread is not running"
        return web.json_response({"status": "dead", "error": crash}, status=503)
    status = "draining" if ctx.draining else "ok"
    body: dict[str, object] = {
        "status": status,
        "model": ctx.service.model_id,
        "requests_running": engine.scheduler.num_running,
        "requests_waiting": engine.scheduler.num_waiting,
    }
    upstreams = ctx.router.registry.upstreams
    if upstreams:  # names, health and errors only: /health needs no key
        body["upstreams"] = [
            {"name": u.name, "healthy": u.healthy, "error": u.last_error} for u in upstreams
        ]
    return web.json_response(body, status=503 if ctx.draining else 200)


async def metrics(request: web.Request) -> web.Response:
    body = context_of(request).engine.metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def streams(request: web.Request) -> web.Response:
    """The engine's streams (``backend: local``), then those relayed from upstreams;
    ``max_prompt_tokens``: the longest prompt admitted here (a load generator keeps
    its prompts within it)."""
    ctx = context_of(request)
    snapshot = ctx.engine.snapshot()
    snapshot["max_prompt_tokens"] = ctx.service.prompt_limit()[1]
    for stream in snapshot["streams"]:
        stream["backend"] = LOCAL
    snapshot["streams"].extend(ctx.router.snapshot())
    snapshot["upstreams"] = [u.describe() for u in ctx.router.registry.upstreams]
    return web.json_response(snapshot)


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document(__version__))
