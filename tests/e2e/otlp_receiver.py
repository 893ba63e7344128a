"""A real OTLP/HTTP receiver for the tests: aiohttp on 127.0.0.1 (a thread of its own),
decoding ``POST /v1/traces`` and ``/v1/metrics`` with ``opentelemetry-proto``."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from helpers import free_port

T = TypeVar("T")
PROTOBUF = "application/x-protobuf"


class OtlpReceiver:
    """Collects what an exporter sends; ``url`` is its OTEL_EXPORTER_OTLP_ENDPOINT."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.traces: list[ExportTraceServiceRequest] = []
        self.metrics: list[ExportMetricsServiceRequest] = []
        self.content_types: set[str] = set()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        assert self._started.wait(30), "the OTLP receiver did not start"

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/traces", self._on_traces)
        app.router.add_post("/v1/metrics", self._on_metrics)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        self._loop.run_until_complete(site.start())
        self._started.set()
        self._loop.run_forever()

    async def _on_traces(self, request: web.Request) -> web.Response:
        decoded = ExportTraceServiceRequest.FromString(await request.read())
        with self._lock:
            self.traces.append(decoded)
            self.content_types.add(request.content_type)
        return _reply(ExportTraceServiceResponse())

    async def _on_metrics(self, request: web.Request) -> web.Response:
        decoded = ExportMetricsServiceRequest.FromString(await request.read())
        with self._lock:
            self.metrics.append(decoded)
        return _reply(ExportMetricsServiceResponse())

    def spans(self) -> list[tuple[dict[str, Any], Span]]:
        """Every span received: (its resource's attributes, the span)."""
        with self._lock:
            batches = list(self.traces)
        return [
            (attributes(resource.resource.attributes), span)
            for batch in batches
            for resource in batch.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]

    def histogram_counts(self) -> dict[str, int]:
        """Each histogram's count over its data points, in the newest export that has it
        (cumulative: the newest holds everything)."""
        with self._lock:
            batches = list(self.metrics)
        counts: dict[str, int] = {}
        for batch in batches:
            for resource in batch.resource_metrics:
                for scope in resource.scope_metrics:
                    for metric in scope.metrics:
                        if metric.HasField("histogram"):
                            points = metric.histogram.data_points
                            counts[metric.name] = sum(p.count for p in points)
        return counts

    def histogram_bounds(self, name: str) -> list[float]:
        with self._lock:
            batches = list(self.metrics)
        for batch in batches:
            for resource in batch.resource_metrics:
                for scope in resource.scope_metrics:
                    for metric in scope.metrics:
                        if metric.name == name and metric.histogram.data_points:
                            return list(metric.histogram.data_points[0].explicit_bounds)
        return []

    def wait_for(self, found: Callable[[], T | None], what: str, timeout: float = 60.0) -> T:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = found()
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"the receiver never got {what}")

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()


def attributes(pairs: Any) -> dict[str, Any]:
    """OTLP key-values as a dict of Python values."""
    out: dict[str, Any] = {}
    for pair in pairs:
        value = pair.value
        kind = value.WhichOneof("value")
        if kind == "array_value":
            out[pair.key] = [getattr(v, v.WhichOneof("value")) for v in value.array_value.values]
        elif kind is not None:
            out[pair.key] = getattr(value, kind)
    return out


def _reply(message: Any) -> web.Response:
    return web.Response(body=message.SerializeToString(), content_type=PROTOBUF)
