"""Metrics labelled ``backend`` (``local`` or an upstream's name), in the engine's registry."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from edge_llm.observability.metrics import PREFIX

_TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class BackendMetrics:
    def __init__(self, registry: CollectorRegistry, local: str, upstreams: Iterable[str]) -> None:
        r = registry
        self.requests = Counter(
            PREFIX + "backend_requests",
            "Requests routed, by backend and why (model, local, fallback_<code>)",
            ["backend", "route"],
            registry=r,
        )
        self.ttft = Histogram(
            PREFIX + "backend_time_to_first_token_seconds",
            "Upstream streams: request start to first content chunk",
            ["backend"],
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.cancellations = Counter(
            PREFIX + "backend_cancellations",
            "Upstream streams aborted (connection closed), by reason",
            ["backend", "reason"],
            registry=r,
        )
        self.failovers = Counter(
            PREFIX + "backend_failovers",
            "Upstream attempts given up before any token was sent, by backend and why",
            ["backend", "reason"],
            registry=r,
        )
        self.generated_chunks = Counter(
            PREFIX + "backend_generated_chunks",
            "Content chunks relayed from each upstream",
            ["backend"],
            registry=r,
        )
        self.healthy = Gauge(
            PREFIX + "backend_healthy", "1 if the backend takes requests", ["backend"], registry=r
        )
        self.streams_open = Gauge(
            PREFIX + "backend_streams_open",
            "Streams open to each upstream",
            ["backend"],
            registry=r,
        )
        self.requests.labels(local, "local")
        for backend in upstreams:
            self.requests.labels(backend, "model")
            self.ttft.labels(backend)
            self.generated_chunks.labels(backend)

    def bind_upstream(
        self, name: str, healthy: Callable[[], float], streams_open: Callable[[], float]
    ) -> None:
        self.healthy.labels(name).set_function(healthy)
        self.streams_open.labels(name).set_function(streams_open)
