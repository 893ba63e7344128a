"""The aiohttp application: routes, middlewares, and nothing else."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from edge_llm.errors import (
    AuthenticationFailed,
    BodyTooLarge,
    EdgeLLMError,
    InvalidRequest,
    NotFound,
    TooManyConnections,
)
from edge_llm.server import (
    access_log,
    anthropic_routes,
    debug_routes,
    model_routes,
    ollama_routes,
    openai_routes,
    playground_routes,
    pull_routes,
    responses_routes,
    resumable_sse,
    telemetry,
    ws_route,
)
from edge_llm.server.context import CONTEXT, ServerContext, context_of
from edge_llm.server.http import error_response, presented_key

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_OPEN_PATHS = frozenset({"/health"})
_DEBUG_PATHS = frozenset({"/metrics", "/debug/streams"})
_log = logging.getLogger("edge_llm.server")


def create_app(ctx: ServerContext) -> web.Application:
    middlewares = [_errors, _limit_connections, _cors, _auth]
    if ctx.config.server.access_log:
        middlewares.insert(0, access_log.middleware)  # outermost: it sees every ending
    if ctx.tracing is not None:
        middlewares.insert(0, telemetry.arrival)  # a request's span starts on arrival
    app = web.Application(client_max_size=ctx.config.server.max_body_bytes, middlewares=middlewares)
    app[CONTEXT] = ctx
    app.router.add_post("/v1/chat/completions", openai_routes.chat_completions)
    app.router.add_post("/v1/completions", openai_routes.completions)
    app.router.add_post("/v1/messages", anthropic_routes.messages)
    app.router.add_post("/v1/messages/count_tokens", anthropic_routes.count_tokens)
    app.router.add_post("/v1/responses", responses_routes.create_response)
    app.router.add_get("/v1/responses/{response_id}", responses_routes.retrieve_response)
    app.router.add_post("/v1/responses/{response_id}/cancel", responses_routes.cancel_response)
    app.router.add_delete("/v1/responses/{response_id}", responses_routes.delete_response)
    app.router.add_get("/v1/models", openai_routes.models)
    app.router.add_get("/v1/models/{id:.+}", model_routes.retrieve)
    app.router.add_post("/v1/embeddings", model_routes.embeddings)
    app.router.add_post("/models/load", model_routes.load)
    app.router.add_post("/models/unload", model_routes.unload)
    app.router.add_post("/api/chat", ollama_routes.chat)
    app.router.add_post("/api/generate", ollama_routes.generate)
    app.router.add_post("/api/embed", ollama_routes.embed)
    app.router.add_get("/api/tags", ollama_routes.tags)
    app.router.add_get("/api/ps", ollama_routes.ps)
    app.router.add_post("/api/show", ollama_routes.show)
    app.router.add_get("/api/version", ollama_routes.version)
    app.router.add_post("/api/pull", pull_routes.pull)
    app.router.add_delete("/api/delete", pull_routes.delete)
    app.router.add_get("/v1/stream", ws_route.stream_socket)
    app.router.add_get("/v1/streams/{stream_id}", resumable_sse.resume_stream)
    app.router.add_delete("/v1/streams/{stream_id}", resumable_sse.cancel_stream)
    app.router.add_get("/health", debug_routes.health)
    app.router.add_get("/metrics", debug_routes.metrics)
    app.router.add_get("/debug/streams", debug_routes.streams)
    app.router.add_get("/openapi.json", debug_routes.openapi)
    if ctx.config.server.playground:
        playground_routes.add_routes(app)
    return app


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error leaves with its status, in the shape of the API its path belongs
    to (Anthropic's under /v1/messages, else OpenAI's); bad input is never a 500."""
    try:
        response = await handler(request)
    except (ConnectionResetError, ConnectionAbortedError):
        raise
    except Exception as exc:
        error = _as_engine_error(request, exc)
        if error is None:
            raise
        response = error_response(error, request.path)
    if response.status >= 400 and not response.prepared:
        response.headers.setdefault("X-Request-Id", access_log.request_id(request))
    return response


def _as_engine_error(request: web.Request, exc: Exception) -> EdgeLLMError | None:
    """The error the client gets for ``exc`` (None: not an error, let it through)."""
    if isinstance(exc, EdgeLLMError):
        return exc
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return BodyTooLarge("request body too large")
    if isinstance(exc, web.HTTPNotFound):
        return NotFound(f"no route for {request.method} {request.path}{_v1_hint(request)}")
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            return None
        message = exc.reason
        if isinstance(exc, web.HTTPMethodNotAllowed):
            message = f"{request.method} is not allowed on {request.path}"
        error = InvalidRequest(message)
        error.status = exc.status
        return error
    _log.exception("unexpected error in %s %s", request.method, request.path)
    return EdgeLLMError(f"internal error: {type(exc).__name__}")


def _v1_hint(request: web.Request) -> str:
    """A path that exists under ``/v1`` (a base URL without it): say so."""
    wanted = "/v1" + request.path
    if any(resource.canonical == wanted for resource in request.app.router.resources()):
        return f"; did you mean {wanted}? (an OpenAI base URL ends in /v1)"
    return ""


@web.middleware
async def _limit_connections(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Beyond ``max_connections`` open sockets, answer 503 and close at once, so
    idle or slow clients cannot exhaust the daemon's file descriptors."""
    ctx = context_of(request)
    limit = ctx.config.server.max_connections
    if ctx.count_connections() > limit:
        raise TooManyConnections(f"more than {limit} open connections", retry_after_s=1)
    return await handler(request)


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    keys = context_of(request).config.server.api_key
    if not keys or not _needs_key(request):
        return await handler(request)
    presented = presented_key(request)
    if presented is None or not _matches_any(presented, keys):
        raise AuthenticationFailed(
            "missing or wrong API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'"
        )
    return await handler(request)


def _needs_key(request: web.Request) -> bool:
    if request.path in _OPEN_PATHS or request.method == "OPTIONS":
        return False
    if playground_routes.is_playground_path(request.path):
        return False  # the page holds no secret; it asks for the key itself
    if request.path in _DEBUG_PATHS:
        return context_of(request).config.server.protect_debug
    return True


def _matches_any(presented: str, keys: list[str]) -> bool:
    """Constant-time comparison against every key (no early exit on a match)."""
    given = presented.encode()
    matches = [hmac.compare_digest(given, key.encode()) for key in keys]
    return any(matches)


@web.middleware
async def _cors(request: web.Request, handler: Handler) -> web.StreamResponse:
    allowed = context_of(request).config.server.cors_allow_origin
    origin = request.headers.get("Origin")
    if not allowed or origin is None or (origin not in allowed and "*" not in allowed):
        return await handler(request)
    if request.method == "OPTIONS":
        response: web.StreamResponse = web.Response(status=204)
    else:
        response = await handler(request)
    if not response.prepared:
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Allow-Headers"] = (
            "Authorization, Content-Type, X-Priority, X-Session-Id, x-api-key"
        )
        response.headers["Access-Control-Allow-Methods"] = "GET, POST, DELETE, OPTIONS"
    return response
