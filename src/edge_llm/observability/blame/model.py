"""What blame works with: the parties, the thresholds, a request's timeline and
the findings and reports the rules produce."""

from __future__ import annotations

from dataclasses import dataclass, field

from edge_llm.observability.blame.lines import LogLine, ts_of

ENGINE = "engine"
UPSTREAM = "upstream"
CLIENT = "client"
TRANSPORT = "transport"
NETWORK = "network"  # a resumable stream's connection dropped (the server detached it)
UNKNOWN = "unknown"
OK = "ok"
VERDICT_PRIORITY = (ENGINE, UPSTREAM, TRANSPORT, NETWORK, CLIENT, UNKNOWN)
VERDICTS = (*VERDICT_PRIORITY, OK)


@dataclass(frozen=True)
class Thresholds:
    """How long each side may take before silence counts against it."""

    grace_s: float = 0.5  # watermark_high -> PAUSE sent; PAUSE/CANCEL sent -> engine acts
    lag_s: float = 1.0  # engine first token -> client first token
    kv_grace_s: float = 1.0  # end/cancel -> kv_freed (a step, with margin)
    upstream_ttft_s: float = 3.0  # an upstream's first token (the client's ttft_warn_ms)


@dataclass(frozen=True)
class Finding:
    party: str
    rule: str
    message: str
    evidence: tuple[LogLine, ...]


@dataclass
class Timeline:
    """One request: its engine lines and client lines, each in log order."""

    request_id: str
    client_request_ids: list[str] = field(default_factory=list)
    engine: list[LogLine] = field(default_factory=list)
    client: list[LogLine] = field(default_factory=list)
    have_engine_log: bool = False
    have_client_log: bool = False
    engine_log_end_ts: float | None = None  # the last line of the whole engine log

    @property
    def first_ts(self) -> float:
        return min((ts_of(e) for e in [*self.engine, *self.client]), default=0.0)


@dataclass(frozen=True)
class PauseStats:
    pauses: int
    paused_ms: float
    backpressure_peak: int
    source: str  # which lines the numbers come from


@dataclass(frozen=True)
class RequestReport:
    request_id: str
    client_request_ids: tuple[str, ...]
    verdict: str
    findings: tuple[Finding, ...]
    notes: tuple[str, ...]
    outcome: str
    n_generated: int | None
    stats: PauseStats
    first_ts: float


@dataclass(frozen=True)
class BlameReport:
    requests: tuple[RequestReport, ...]
    notes: tuple[str, ...]

    def totals(self) -> dict[str, int]:
        counts = dict.fromkeys(VERDICTS, 0)
        for request in self.requests:
            counts[request.verdict] += 1
        return counts
