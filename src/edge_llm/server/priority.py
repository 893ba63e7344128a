"""The priority class a request runs in, from the request and the server's defaults.

The first of these that is given wins: the body (``priority``, else a service tier:
:mod:`edge_llm.protocol.priority`), the ``X-Priority`` header, the default of the
API key the client presented (``key_priority``), the default of the route
(``route_priority``), 0. A bad header is a 400 naming it even when the body wins.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from aiohttp import web

from edge_llm.config.tree import ServerConfig
from edge_llm.generation.job import Priority, PrioritySource
from edge_llm.protocol.priority import HEADER, header_priority
from edge_llm.server.http import presented_key


@dataclass(frozen=True)
class PriorityDefaults:
    routes: Mapping[str, int] = field(default_factory=dict)  # path -> class
    keys: Mapping[str, int] = field(default_factory=dict)  # API key -> class

    @classmethod
    def of(cls, server: ServerConfig) -> PriorityDefaults:
        return cls(server.route_priorities(), server.key_priorities())

    def resolve(self, request: web.Request, explicit: int | None) -> Priority:
        """The class of ``request``, whose body asked for ``explicit`` (or nothing),
        and who chose it."""
        header = header_priority(request.headers.get(HEADER))
        # The key was checked by the auth middleware when keys are required; without
        # them any key is as good as a body field (which anyone may send anyway).
        key = presented_key(request)
        given = (
            (explicit, PrioritySource.BODY),
            (header, PrioritySource.HEADER),
            (self.keys.get(key or ""), PrioritySource.KEY),
            (self.routes.get(request.path), PrioritySource.ROUTE),
        )
        for value, source in given:
            if value is not None:
                return Priority(value, source)
        return Priority()
