"""A storm's figures per target, from the users' records and the server's samples. Pure.

- outcomes: every request is exactly one of completed / abandoned / superseded / failed;
- TTFT: per request, from its own start, over requests a user read (completed and
  abandoned); ``wait``: from the turn's first click to the first token the user read;
- goodput: completed requests whose first token came within the SLO, also per minute of
  storm;
- tokens nobody read: the server's generated-token counter over the run minus the
  tokens users read (completed: ``usage.completion_tokens``; abandoned: chunks read);
- wasted prefill (edge-llm): prompt tokens prefilled for requests that no user read
  (superseded or failed), joined by ``X-Request-Id`` with ``/debug/streams``;
- peaks of the sampled KV bytes, running / waiting / paused sequences and RSS;
- per class (interactive users, the background batch): TTFT, goodput, tokens lost
  (generated for the class's requests and not read, from ``/debug/streams``) and how
  often its streams were preempted;
- server errors: the error kinds a server is at fault for (:func:`is_server_error`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from edge_llm.bench.stats import Distribution
from edge_llm.bench.storm.load import BATCH, INTERACTIVE
from edge_llm.bench.storm.user import OUTCOMES, StormRecord
from edge_llm.bench.storm.watch import CounterReading, ServerSample

READ_OUTCOMES = ("completed", "abandoned")
UNREAD_OUTCOMES = ("superseded", "failed")
# A 503 is a refusal the storm expects and retries after its Retry-After (queue full,
# KV budget, memory pressure). Every other 5xx is the server's failure, and so is an
# error inside a 200 stream with the code of one: edge-llm's 500, 502 and 504 codes,
# and the ``type`` other servers give a server error (OpenAI, Anthropic).
REFUSAL_STATUS = 503
STREAM_SERVER_ERRORS = frozenset(
    {"internal_error", "backend_error", "upstream_error", "ttft_timeout", "server_error",
     "api_error"}
)  # fmt: skip


@dataclass
class TargetRunData:
    """What one target's run produced besides the records."""

    duration_s: float
    samples: list[ServerSample] = field(default_factory=list)
    before: CounterReading = field(default_factory=CounterReading)
    after: CounterReading = field(default_factory=CounterReading)
    streams: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ClassSummary:
    """One class of requests (``interactive`` or ``batch``) of one target."""

    kind: str
    priority: int | None  # the priority field its requests carried (None: none)
    n_requests: int
    outcomes: dict[str, int]
    ttft: Distribution | None
    goodput: int
    tokens_lost: int | None  # None: the server does not list its streams
    preemptions: int | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class StormSummary:
    target: str
    n_requests: int
    outcomes: dict[str, int]
    n_turns: int
    regenerated_turns: int
    ttft: Distribution | None
    wait: Distribution | None
    ttft_slo_ms: float
    goodput: int
    goodput_per_min: float | None
    duration_s: float
    tokens_read: int
    tokens_generated: float | None
    tokens_unread: float | None
    prompt_tokens_processed: float | None
    wasted_prefill_tokens: int | None
    errors: dict[str, int]
    peak_kv_bytes: float | None
    peak_running: int | None
    peak_waiting: int | None
    peak_paused: int | None
    peak_rss_bytes: int | None
    server_unreachable_samples: int
    classes: tuple[ClassSummary, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def server_errors(self) -> dict[str, int]:
        """The errors (kind: count) the server is at fault for: :func:`is_server_error`."""
        return {kind: n for kind, n in self.errors.items() if is_server_error(kind)}


def is_server_error(error_kind: str) -> bool:
    """Whether a request's error kind (``"500 internal_error"``, ``"503 queue_full"``,
    ``"stream_error backend_error"``, ``"timeout"``) is a 5xx other than a 503, or
    such an error inside a 200 stream."""
    head, _, code = error_kind.partition(" ")
    if head == "stream_error":
        return code in STREAM_SERVER_ERRORS
    return head.isdigit() and 500 <= int(head) < 600 and int(head) != REFUSAL_STATUS


def summarize_storm(
    target: str, records: Sequence[StormRecord], runs: Sequence[TargetRunData], ttft_slo_ms: float
) -> StormSummary:
    """One target's summary over all its runs (rounds)."""
    outcomes = Counter(r.outcome for r in records if r.outcome)
    read = [r for r in records if r.outcome in READ_OUTCOMES]
    duration = sum(run.duration_s for run in runs)
    samples = [s for run in runs for s in run.samples]
    tokens_read = sum(r.tokens_read for r in records)
    generated = _delta(runs, "generated_tokens")
    good = sum(1 for r in records if _good(r, ttft_slo_ms))
    return StormSummary(
        target=target,
        n_requests=len(records),
        outcomes={name: outcomes.get(name, 0) for name in OUTCOMES},
        n_turns=len(_turns(records)),
        regenerated_turns=len(_turns(r for r in records if r.outcome == "superseded")),
        ttft=Distribution.of([r.ttft for r in read if r.ttft is not None]),
        wait=Distribution.of(_waits(read)),
        ttft_slo_ms=ttft_slo_ms,
        goodput=good,
        goodput_per_min=good * 60.0 / duration if duration > 0 else None,
        duration_s=duration,
        tokens_read=tokens_read,
        tokens_generated=generated,
        tokens_unread=None if generated is None else max(0.0, generated - tokens_read),
        prompt_tokens_processed=_delta(runs, "prompt_tokens"),
        wasted_prefill_tokens=_wasted_prefill(records, runs),
        errors=dict(
            sorted(
                Counter(
                    r.request.error_kind
                    for r in records
                    if r.outcome == "failed" and r.request.error_kind
                ).items()
            )
        ),
        peak_kv_bytes=_peak(s.kv_used_bytes for s in samples),
        peak_running=_peak_int(s.running for s in samples),
        peak_waiting=_peak_int(s.waiting for s in samples),
        peak_paused=_peak_int(s.paused for s in samples),
        peak_rss_bytes=_peak_int(s.rss_bytes for s in samples),
        server_unreachable_samples=sum(1 for s in samples if not s.alive),
        classes=tuple(_classes(records, runs, ttft_slo_ms)),
    )


def _classes(
    records: Sequence[StormRecord], runs: Sequence[TargetRunData], slo_ms: float
) -> Iterable[ClassSummary]:
    streams = _streams(runs)
    for kind in sorted({r.kind for r in records}, key=(INTERACTIVE, BATCH).index):
        mine = [r for r in records if r.kind == kind]
        read = [r for r in mine if r.outcome in READ_OUTCOMES]
        outcomes = Counter(r.outcome for r in mine if r.outcome)
        yield ClassSummary(
            kind=kind,
            priority=mine[0].priority,
            n_requests=len(mine),
            outcomes={name: outcomes.get(name, 0) for name in OUTCOMES},
            ttft=Distribution.of([r.ttft for r in read if r.ttft is not None]),
            goodput=sum(1 for r in mine if _good(r, slo_ms)),
            tokens_lost=_summed(mine, streams, _lost) if streams else None,
            preemptions=_summed(mine, streams, _preemptions) if streams else None,
        )


def _streams(runs: Sequence[TargetRunData]) -> dict[str, dict[str, Any]]:
    return {sid: entry for run in runs for sid, entry in run.streams.items()}


def _summed(
    records: Sequence[StormRecord],
    streams: dict[str, dict[str, Any]],
    figure: Callable[[StormRecord, dict[str, Any]], int],
) -> int:
    """``figure`` of each record and its stream, summed over the records listed."""
    entries = ((r, streams.get(r.request.stream_id or "")) for r in records)
    return sum(figure(r, entry) for r, entry in entries if entry is not None)


def _lost(record: StormRecord, stream: dict[str, Any]) -> int:
    """Tokens generated for the request and not read by its user."""
    return max(0, int(stream.get("n_generated") or 0) - record.tokens_read)


def _preemptions(_: StormRecord, stream: dict[str, Any]) -> int:
    return int(stream.get("preemptions") or 0)


def _good(record: StormRecord, slo_ms: float) -> bool:
    ttft = record.ttft
    return record.outcome == "completed" and ttft is not None and ttft * 1000.0 <= slo_ms


def _turns(records: Iterable[StormRecord]) -> set[tuple[int, int, int]]:
    return {(r.round, r.user, r.turn) for r in records}


def _waits(records: Iterable[StormRecord]) -> list[float]:
    return [r.started_at + r.ttft - r.turn_started_at for r in records if r.ttft is not None]


def _delta(runs: Sequence[TargetRunData], name: str) -> float | None:
    total = 0.0
    for run in runs:
        before, after = getattr(run.before, name), getattr(run.after, name)
        if before is None or after is None:
            return None
        total += max(0.0, after - before)  # a restarted server starts from zero again
    return total


def _wasted_prefill(records: Sequence[StormRecord], runs: Sequence[TargetRunData]) -> int | None:
    streams = _streams(runs)
    if not streams:
        return None
    wasted = 0
    for record in records:
        entry = streams.get(record.request.stream_id or "")
        if entry is not None and record.outcome in UNREAD_OUTCOMES:
            wasted += int(entry.get("prefill_done") or 0)
    return wasted


def _peak(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _peak_int(values: Iterable[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None
