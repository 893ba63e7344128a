"""Local or upstream: which backend takes a request, and the upstream streams alive.

A request naming an upstream's model goes to the upstreams listing it. A request
for the local model (or naming none) runs locally; when the device refuses it
(``prompt_too_long``, ``queue_full``, ``kv_budget_exceeded``) it goes to the
upstreams with ``fallback = true``, else the client gets the local refusal.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from edge_llm.errors import (
    EdgeLLMError,
    KvBudgetExceeded,
    KvBudgetNeverFits,
    ModelNotFound,
    PromptTooLong,
    QueueFull,
)
from edge_llm.observability.events import Event, EventSink
from edge_llm.upstream.metrics import BackendMetrics
from edge_llm.upstream.registry import Upstream, UpstreamRegistry
from edge_llm.upstream.stream import StreamSettings, UpstreamStream

LOCAL = "local"
# Local refusals an upstream with fallback = true may take instead.
FALLBACK_ERRORS = (PromptTooLong, QueueFull, KvBudgetExceeded, KvBudgetNeverFits)
_RECENT = 64  # finished upstream streams kept for /debug/streams
_RECENT_SECONDS = 30.0


class UpstreamRouter:
    def __init__(
        self,
        registry: UpstreamRegistry,
        *,
        local_models: list[str],
        settings: StreamSettings,
        metrics: BackendMetrics,
        events: EventSink,
    ) -> None:
        self.registry = registry
        self.local_models = local_models  # the device's models, the default first
        self.settings = settings
        self.metrics = metrics
        self.events = events
        self._live: dict[str, UpstreamStream] = {}
        self._recent: deque[UpstreamStream] = deque(maxlen=_RECENT)

    # -- decisions ---------------------------------------------------------------------

    def upstreams_for(
        self, model: str | None, *, any_model_local: bool = False
    ) -> list[Upstream] | None:
        """None: run locally. Else the upstreams serving ``model``. A model nobody
        serves is ModelNotFound, unless ``any_model_local`` (Anthropic's endpoint,
        where clients send their own ids): then it runs locally."""
        if model is None or model in self.local_models:
            return None
        serving = self.registry.serving(model)
        if serving:
            return serving
        if any_model_local:
            return None
        available = [*self.local_models, *(m for m, _ in self.registry.all_models())]
        raise ModelNotFound(
            f"model {model!r} is not served here; available: {', '.join(available)}",
            param="model",
            available=available,
        )

    def fallback_for(self, error: EdgeLLMError) -> list[Upstream]:
        """Healthy upstreams with room that may take a request the device refused
        with ``error`` (none: the client gets the device's refusal, which says more
        than ``upstream_unavailable``)."""
        if not isinstance(error, FALLBACK_ERRORS):
            return []
        return [u for u in self.registry.fallbacks() if u.healthy and u.has_room]

    def count_local(self) -> None:
        """A request runs locally (the requests counter's ``local`` backend)."""
        self.metrics.requests.labels(LOCAL, "local").inc()

    # -- streams -----------------------------------------------------------------------

    def open(
        self,
        path: str,
        body: dict[str, Any],
        candidates: list[Upstream],
        *,
        route: str,
        session: str | None,
        trace_headers: Callable[[], dict[str, str]] = dict,
    ) -> UpstreamStream:
        """Start relaying ``body`` (with ``stream`` on and usage asked for) to the
        first usable candidate. ``route`` is ``model`` or ``fallback_<code>``."""
        fallback = route != "model"
        asked = body.get("model")
        local = asked if asked in self.local_models else self.local_models[0]
        client_model = str(local if fallback else asked)
        usable = self.registry.usable(candidates)
        stream = UpstreamStream(
            stream_id="chatcmpl-" + uuid.uuid4().hex[:24],
            path=path,
            body=upstream_body(body),
            candidates=usable,
            registry=self.registry,
            settings=self.settings,
            client_model=client_model,
            session=session,
            metrics=self.metrics,
            events=self.events,
            trace_headers=trace_headers,
        )
        self._live[stream.id] = stream
        backend = usable[0].name if usable else "none"
        self.metrics.requests.labels(backend, route).inc()
        self.events(
            Event.ROUTED,
            stream.id,
            backend=backend,
            route=route,
            candidates=[u.name for u in usable],
            session=session,
        )
        stream.start()
        return stream

    def closed(self, stream: UpstreamStream) -> None:
        """The connection is done with ``stream`` (it is finished by then)."""
        if not stream.finished:
            stream.cancel("disconnect")
        self._live.pop(stream.id, None)
        self._recent.append(stream)

    def cancel_all(self, reason: str) -> None:
        for stream in list(self._live.values()):
            stream.cancel(reason)

    def snapshot(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        recent = [s for s in self._recent if now - (s.relay.finished_at or now) <= _RECENT_SECONDS]
        return [s.relay.describe(now, s.session) for s in [*self._live.values(), *recent]]

    def model_entries(self) -> list[tuple[str, str]]:
        """(model id, backend) of every upstream model."""
        return self.registry.all_models()


def upstream_body(body: dict[str, Any]) -> dict[str, Any]:
    """The client's request as the upstream gets it: streamed, with usage (each
    attempt sets ``model`` to what that upstream calls it), without the progress
    opt-in, which is between the client and this server (an upstream such as
    OpenAI's refuses fields it does not know); ``priority`` goes on."""
    forwarded = {k: v for k, v in body.items() if k != "return_progress"}
    forwarded["stream"] = True
    given = forwarded.get("stream_options")
    options = {k: v for k, v in given.items() if k != "include_progress"} if given else {}
    forwarded["stream_options"] = {**options, "include_usage": True}
    return forwarded
