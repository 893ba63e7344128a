"""What a relayed stream's state decided, told: the event log's lines and the
backend metrics (:class:`~edge_llm.upstream.metrics.BackendMetrics`). The driver
(``stream.py``) calls it after each decision of ``RelayState``; it decides nothing."""

from __future__ import annotations

from edge_llm.observability.events import Event, EventSink
from edge_llm.upstream.metrics import BackendMetrics
from edge_llm.upstream.relay_state import RelayState
from edge_llm.upstream.translate import usage_counts


class RelayLog:
    def __init__(self, relay: RelayState, events: EventSink, metrics: BackendMetrics) -> None:
        self.relay = relay
        self.events = events
        self.metrics = metrics

    def received(self, event: Event) -> None:
        """The client's PAUSE or RESUME arrived."""
        self.events(event, self.relay.id, n_generated=self.relay.progress.n_content)

    def paused(self) -> None:
        relay = self.relay
        self.events(Event.PAUSED, relay.id, cause=relay.pause_cause, backend=relay.backend)

    def resumed(self) -> None:
        self.events(Event.RESUMED, self.relay.id, backend=self.relay.backend)

    def first_token(self) -> None:
        ttft = self.relay.ttft_s() or 0.0
        self.metrics.ttft.labels(self.relay.backend).observe(ttft)
        self.events(
            Event.FIRST_TOKEN, self.relay.id, ttft_ms=round(ttft * 1000.0, 3),
            backend=self.relay.backend,
        )  # fmt: skip

    def chunk(self) -> None:
        self.metrics.generated_chunks.labels(self.relay.backend).inc()

    def failover(self, backend: str, reason: str, unhealthy: bool) -> None:
        self.metrics.failovers.labels(backend, "unhealthy" if unhealthy else "busy").inc()
        self.events(Event.UPSTREAM_FAILOVER, self.relay.id, backend=backend, reason=reason)

    def ended(self, now: float) -> None:
        relay = self.relay
        outcome = relay.outcome
        if outcome is None:
            return
        if outcome.reason:
            self.metrics.cancellations.labels(relay.backend, outcome.reason).inc()
            self.events(
                Event.CANCEL, relay.id, reason=outcome.reason, backend=relay.backend,
                state="upstream",
            )  # fmt: skip
        usage = relay.progress.usage  # the upstream's, when it sent one
        self.events(
            Event.END, relay.id, finish_reason=outcome.finish_reason,
            error=outcome.error.code if outcome.error else None,
            n_prompt_tokens=usage_counts(usage)["prompt_tokens"] if usage else None,
            n_generated=relay.progress.n_content, **relay.stats(now),
        )  # fmt: skip
