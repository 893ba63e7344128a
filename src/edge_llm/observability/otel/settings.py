"""Whether OpenTelemetry is on, read from the standard variables (no OpenTelemetry import).

Off unless an OTLP endpoint is configured: ``OTEL_EXPORTER_OTLP_ENDPOINT``, or the
signal's own ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``..._METRICS_ENDPOINT``.
``OTEL_SDK_DISABLED=true`` turns everything off, ``OTEL_TRACES_EXPORTER=none`` or
``OTEL_METRICS_EXPORTER=none`` one signal. The protocol is
``OTEL_EXPORTER_OTLP_{TRACES,METRICS}_PROTOCOL`` or ``OTEL_EXPORTER_OTLP_PROTOCOL``:
``http/protobuf`` (the default, as the specification recommends) or ``grpc``.

Everything else is read by the OpenTelemetry SDK itself, as every SDK reads it:
the endpoints, headers, time-outs and compression by the exporters,
``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` by the resource,
``OTEL_TRACES_SAMPLER`` (and its argument) by the tracer provider,
``OTEL_METRIC_EXPORT_INTERVAL`` by the metric reader.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

HTTP_PROTOBUF = "http/protobuf"
GRPC = "grpc"
PROTOCOLS = (HTTP_PROTOBUF, GRPC)
DEFAULT_SERVICE_NAME = "edge-llm"
_SIGNALS = {"traces": "TRACES", "metrics": "METRICS"}


class OtelConfigError(ValueError):
    """An OpenTelemetry variable this server cannot honour (the message names it)."""


@dataclass(frozen=True)
class OtelSettings:
    """Which signals are exported, and over which protocol each."""

    traces: str | None  # the protocol, or None: not exported
    metrics: str | None
    # The resource's service.name when neither OTEL_SERVICE_NAME nor
    # OTEL_RESOURCE_ATTRIBUTES names one (None: the SDK's own applies).
    default_service_name: str | None

    @property
    def enabled(self) -> bool:
        return self.traces is not None or self.metrics is not None


def otel_settings(environ: Mapping[str, str]) -> OtelSettings | None:
    """The OpenTelemetry settings ``environ`` asks for; None when it is off. Raises
    OtelConfigError naming the variable a value cannot be honoured for."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    settings = OtelSettings(
        traces=_signal(environ, "traces"),
        metrics=_signal(environ, "metrics"),
        default_service_name=None if _names_service(environ) else DEFAULT_SERVICE_NAME,
    )
    return settings if settings.enabled else None


def _signal(environ: Mapping[str, str], signal: str) -> str | None:
    """The protocol ``signal`` is exported with, or None."""
    upper = _SIGNALS[signal]
    exporter_var = f"OTEL_{upper}_EXPORTER"
    exporter = environ.get(exporter_var, "otlp").strip().lower() or "otlp"
    if exporter == "none":
        return None
    if exporter != "otlp":
        raise OtelConfigError(f"{exporter_var}={exporter!r}: only otlp or none is supported")
    endpoint = environ.get(f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT") or environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if not endpoint:
        return None
    protocol_var = f"OTEL_EXPORTER_OTLP_{upper}_PROTOCOL"
    if not environ.get(protocol_var):
        protocol_var = "OTEL_EXPORTER_OTLP_PROTOCOL"
    protocol = environ.get(protocol_var, HTTP_PROTOBUF).strip().lower() or HTTP_PROTOBUF
    if protocol not in PROTOCOLS:
        raise OtelConfigError(
            f"{protocol_var}={protocol!r}: supported are {' and '.join(PROTOCOLS)} "
            "(the Python exporters have no http/json)"
        )
    return protocol


def _names_service(environ: Mapping[str, str]) -> bool:
    if environ.get("OTEL_SERVICE_NAME", "").strip():
        return True
    attributes = environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    return any(pair.split("=", 1)[0].strip() == "service.name" for pair in attributes.split(","))
