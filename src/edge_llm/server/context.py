"""What every route needs, stored on the aiohttp application."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from aiohttp import web
from prometheus_client import CollectorRegistry

from edge_llm.config.tree import EngineConfig
from edge_llm.errors import EdgeLLMError
from edge_llm.generation.background import BackgroundResponses
from edge_llm.generation.dispatch import Answer, Dispatcher
from edge_llm.generation.job import GenerationJob, Priority
from edge_llm.generation.pump import PumpSettings
from edge_llm.generation.resumable import ResumableStreams
from edge_llm.generation.service import ServedModel
from edge_llm.models.pool import ModelPool
from edge_llm.protocol.responses import ResponseStore
from edge_llm.server.access_log import answering
from edge_llm.server.http import ConnectionSettings, session_of
from edge_llm.server.priority import PriorityDefaults
from edge_llm.server.telemetry import begin_span, caller_trace, started
from edge_llm.upstream.router import UpstreamRouter

if TYPE_CHECKING:  # OpenTelemetry is imported only when it is on
    from edge_llm.observability.otel.spans import RequestSpan, RequestTracer


@dataclass
class ServerContext:
    # The served models: each loaded one has its engine and service.
    pool: ModelPool[ServedModel]
    # /metrics: the models' engine metrics, the pool's and the upstreams'.
    registry: CollectorRegistry
    config: EngineConfig
    pump_settings: PumpSettings
    connection: ConnectionSettings
    # Upstream engines (none configured: every request runs locally).
    router: UpstreamRouter
    # Who answers each request (the router's decision, fallback), for every route.
    dispatcher: Dispatcher
    # Streams that opted in to resuming after a dropped connection.
    resumable: ResumableStreams
    # The Responses API's background responses, by id.
    background: BackgroundResponses
    started_at: int = field(default_factory=lambda: int(time.time()))
    draining: bool = False
    # Open connections; set once the aiohttp server exists.
    count_connections: Callable[[], int] = lambda: 0
    # Conversations behind the Responses API's previous_response_id.
    responses: ResponseStore = field(default_factory=ResponseStore)
    # route_priority and key_priority: the class of a request that names none.
    priorities: PriorityDefaults = field(default_factory=PriorityDefaults)
    # OpenTelemetry's request spans (None: off, see edge_llm.server.telemetry).
    tracing: RequestTracer | None = None

    def default_model(self) -> ServedModel | None:
        """The default model, if loaded (it is, unless unloaded on purpose)."""
        return self.pool.loaded(self.pool.default)


CONTEXT = web.AppKey("edge_llm_context", ServerContext)


def context_of(request: web.Request) -> ServerContext:
    return request.app[CONTEXT]


class Caller(NamedTuple):
    """Who asks: the request's session and the priority class it runs in."""

    session: str | None
    priority: Priority


def caller_of(
    request: web.Request, user: str | None = None, explicit_priority: int | None = None
) -> Caller:
    """The session (``X-Session-Id``, else the body's ``user``) and the priority class
    (the body's ``explicit_priority``, else header, API key, route) of ``request``."""
    priorities = context_of(request).priorities
    return Caller(session_of(request, user), priorities.resolve(request, explicit_priority))


@asynccontextmanager
async def answer_to(request: web.Request, job: GenerationJob) -> AsyncIterator[Answer]:
    """The answer to ``job``, started where the dispatcher sends it and closed however
    the handler ends (a stream still running is cancelled; a resumable one's
    stream closes it when it ends); its facts go into the
    request's access-log line."""
    answer, span = await dispatch(request, job)
    with answering(request, answer):
        try:
            yield answer
        finally:
            if not answer.handed_over:  # else its resumable stream closes it
                answer.close()
                if span is not None:
                    span.close()


async def dispatch(
    request: web.Request, job: GenerationJob, *, start_ns: int | None = None
) -> tuple[Answer, RequestSpan | None]:
    """Start ``job`` where the dispatcher sends it. With OpenTelemetry on, the request's
    span (from ``start_ns``, else the request's arrival) learns its id and facts, or
    ends with the refusal; the request's ``end`` line ends it."""
    ctx = context_of(request)
    if ctx.tracing is None:  # an upstream still joins the caller's trace
        return await ctx.dispatcher.start(job.traced(caller_trace(request.headers))), None
    tracer = ctx.tracing
    span = begin_span(tracer, request, job, start_ns)
    job = job.traced(span.trace_headers)
    try:
        with tracer.admitting(span):
            answer = await ctx.dispatcher.start(job)
    except EdgeLLMError as refused:
        span.fail(refused.code, refused.message)
        raise
    except BaseException as failed:
        span.fail(type(failed).__name__, str(failed))
        raise
    started(span, answer)
    return answer, span
