"""The GenAI semantic conventions' histograms, with the buckets the conventions give.

Server side (every request this server answers): ``gen_ai.server.time_to_first_token``,
``gen_ai.server.time_per_output_token`` (successful responses only) and
``gen_ai.server.request.duration`` (every response; ``error.type`` on a failed one).
Client side (the relay's calls to an upstream): ``gen_ai.client.token.usage``
(``gen_ai.token.type`` input or output) and ``gen_ai.client.operation.duration``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from opentelemetry.metrics import Meter

AttributeValue = str | int | float | bool | Sequence[str]
Attributes = Mapping[str, AttributeValue]

# From the conventions (docs/gen-ai/gen-ai-metrics.md, semantic-conventions 1.36+).
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
DURATION_BUCKETS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
TOKEN_BUCKETS = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip


class GenAiMetrics:
    """The histograms, created once per meter; ``record_*`` may be called from any thread."""

    def __init__(self, meter: Meter) -> None:
        self.ttft = meter.create_histogram(
            "gen_ai.server.time_to_first_token",
            unit="s",
            description="Time to generate first token for successful responses",
            explicit_bucket_boundaries_advisory=list(TTFT_BUCKETS),
        )
        self.tpot = meter.create_histogram(
            "gen_ai.server.time_per_output_token",
            unit="s",
            description="Time per output token generated after the first token for "
            "successful responses",
            explicit_bucket_boundaries_advisory=list(TPOT_BUCKETS),
        )
        self.duration = meter.create_histogram(
            "gen_ai.server.request.duration",
            unit="s",
            description="Generative AI server request duration such as time-to-last byte "
            "or last output token",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
        )
        self.client_tokens = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used",
            explicit_bucket_boundaries_advisory=list(TOKEN_BUCKETS),
        )
        self.client_duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
        )

    def record_server(
        self,
        attributes: Attributes,
        *,
        duration_s: float,
        ttft_s: float | None,
        tpot_s: float | None,
        error_type: str | None,
    ) -> None:
        """One answered request: its duration always, its first-token and per-token
        times when it succeeded."""
        if error_type is not None:
            self.duration.record(duration_s, {**attributes, "error.type": error_type})
            return
        self.duration.record(duration_s, attributes)
        if ttft_s is not None:
            self.ttft.record(ttft_s, attributes)
        if tpot_s is not None:
            self.tpot.record(tpot_s, attributes)

    def record_client(
        self,
        attributes: Attributes,
        *,
        duration_s: float,
        input_tokens: int | None,
        output_tokens: int | None,
        error_type: str | None,
    ) -> None:
        """One call to an upstream: its duration and the tokens it used."""
        extra = {"error.type": error_type} if error_type is not None else {}
        self.client_duration.record(duration_s, {**attributes, **extra})
        for kind, count in (("input", input_tokens), ("output", output_tokens)):
            if count is not None:
                self.client_tokens.record(count, {**attributes, "gen_ai.token.type": kind})
