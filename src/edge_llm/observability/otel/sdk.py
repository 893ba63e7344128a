"""The OpenTelemetry SDK and its OTLP exporters, set up from :class:`OtelSettings`.

Imported only when OpenTelemetry is on (``otel_settings`` returned settings): with it
off, no ``opentelemetry`` module is loaded. The providers belong to the server (no
global provider is set), and :meth:`Telemetry.shutdown` exports what is still held.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edge_llm.observability.otel.settings import GRPC, OtelConfigError, OtelSettings

try:
    from opentelemetry.metrics import Meter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.trace import Tracer
except ImportError as missing:  # pragma: no cover - the extra is installed by make install
    raise OtelConfigError(
        f"OpenTelemetry is configured (OTEL_EXPORTER_OTLP_*) but its packages are not "
        f"installed ({missing.name}): pip install 'edge-llm[otel]'"
    ) from missing

SCOPE = "edge_llm"


@dataclass
class Telemetry:
    """The providers of one process (either may be off)."""

    tracer_provider: TracerProvider | None
    meter_provider: MeterProvider | None

    def tracer(self, version: str) -> Tracer | None:
        provider = self.tracer_provider
        return provider.get_tracer(SCOPE, version) if provider is not None else None

    def meter(self, version: str) -> Meter | None:
        provider = self.meter_provider
        return provider.get_meter(SCOPE, version) if provider is not None else None

    def shutdown(self) -> None:
        """Export what is held and stop the exporters."""
        for provider in (self.tracer_provider, self.meter_provider):
            if provider is not None:
                provider.shutdown()


def start_telemetry(settings: OtelSettings) -> Telemetry:
    """Providers exporting over OTLP as ``settings`` (and the SDK's variables) say."""
    resource = Resource.create(
        {"service.name": settings.default_service_name} if settings.default_service_name else {}
    )
    tracer_provider = meter_provider = None
    if settings.traces is not None:
        tracer_provider = TracerProvider(resource=resource)  # the sampler: OTEL_TRACES_SAMPLER
        tracer_provider.add_span_processor(BatchSpanProcessor(_span_exporter(settings.traces)))
    if settings.metrics is not None:
        # The period: OTEL_METRIC_EXPORT_INTERVAL (60 s unless set).
        reader = PeriodicExportingMetricReader(_metric_exporter(settings.metrics))
        meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    return Telemetry(tracer_provider, meter_provider)


# Only the protocol chosen is imported (gRPC's loads grpcio, a large native module).
def _span_exporter(protocol: str) -> Any:
    try:
        if protocol == GRPC:
            from opentelemetry.exporter.otlp.proto.grpc import (  # noqa: PLC0415
                trace_exporter,
            )
        else:
            from opentelemetry.exporter.otlp.proto.http import (  # type: ignore[no-redef]  # noqa: PLC0415
                trace_exporter,
            )
    except ImportError as missing:
        raise _not_installed(protocol, missing) from missing
    return trace_exporter.OTLPSpanExporter()


def _metric_exporter(protocol: str) -> Any:
    try:
        if protocol == GRPC:
            from opentelemetry.exporter.otlp.proto.grpc import (  # noqa: PLC0415
                metric_exporter,
            )
        else:
            from opentelemetry.exporter.otlp.proto.http import (  # type: ignore[no-redef]  # noqa: PLC0415
                metric_exporter,
            )
    except ImportError as missing:
        raise _not_installed(protocol, missing) from missing
    return metric_exporter.OTLPMetricExporter()


def _not_installed(protocol: str, missing: ImportError) -> OtelConfigError:
    return OtelConfigError(
        f"the OTLP {protocol} exporter is not installed ({missing.name}): "
        f"pip install 'edge-llm[otel]'"
    )
