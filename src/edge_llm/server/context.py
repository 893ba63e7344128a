"""What every route needs, stored on the aiohttp application."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CollectorRegistry

from edge_llm.config import EngineConfig
from edge_llm.models.pool import LoadedModel, ModelPool
from edge_llm.protocol.responses import ResponseStore
from edge_llm.server.dispatch import Dispatcher
from edge_llm.server.http import ConnectionSettings
from edge_llm.server.priority import PriorityDefaults
from edge_llm.server.pump import PumpSettings
from edge_llm.upstream.router import UpstreamRouter


@dataclass
class ServerContext:
    # The served models: each loaded one has its engine and service.
    pool: ModelPool
    # /metrics: the models' engine metrics, the pool's and the upstreams'.
    registry: CollectorRegistry
    config: EngineConfig
    pump_settings: PumpSettings
    connection: ConnectionSettings
    # Upstream engines (none configured: every request runs locally).
    router: UpstreamRouter
    # Who answers each request (the router's decision, fallback), for every route.
    dispatcher: Dispatcher
    started_at: int = field(default_factory=lambda: int(time.time()))
    draining: bool = False
    # Open connections; set once the aiohttp server exists.
    count_connections: Callable[[], int] = lambda: 0
    # Conversations behind the Responses API's previous_response_id.
    responses: ResponseStore = field(default_factory=ResponseStore)
    # route_priority and key_priority: the class of a request that names none.
    priorities: PriorityDefaults = field(default_factory=PriorityDefaults)

    def default_model(self) -> LoadedModel | None:
        """The default model, if loaded (it is, unless unloaded on purpose)."""
        return self.pool.loaded(self.pool.default)


CONTEXT = web.AppKey("edge_llm_context", ServerContext)


def context_of(request: web.Request) -> ServerContext:
    return request.app[CONTEXT]
