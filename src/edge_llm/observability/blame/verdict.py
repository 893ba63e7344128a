"""Judging: every rule over every request, the verdict, and what the logs cannot tell.

The verdict is the most serious party found (``engine`` > ``upstream`` >
``transport`` > ``client`` > ``unknown``), else ``ok``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from edge_llm.observability.blame.lines import (
    LogLine,
    first_of,
    int_of,
    last_of,
    name_of,
    named,
    num_of,
)
from edge_llm.observability.blame.model import (
    OK,
    VERDICT_PRIORITY,
    BlameReport,
    Finding,
    PauseStats,
    RequestReport,
    Thresholds,
    Timeline,
)
from edge_llm.observability.blame.rules import (
    CLIENT_PAUSE_EVENTS,
    LOCAL_ONLY_RULES,
    RULES,
    kv_release,
    upstream_of,
)
from edge_llm.observability.blame.timeline import build_timelines
from edge_llm.observability.events import Event

# -- what a single log cannot tell ---------------------------------------------------------


def notes_for(t: Timeline, th: Thresholds) -> list[str]:
    """What this request's lines cannot tell (a log missing altogether is said once,
    in :func:`log_notes`)."""
    notes = []
    if t.have_engine_log and not t.engine:
        notes.append("no engine lines for this request: it never reached this engine's log")
    if t.have_client_log and not t.client:
        notes.append("no client lines for this request (a client without an event log?)")
    if kv_release(t, th) == "unseen":
        notes.append("the log ends (or the engine shut down) before KV release could show")
    return notes


# -- judging -------------------------------------------------------------------------------


def pause_stats(t: Timeline) -> PauseStats:
    """Pauses, paused time and backpressure peak: from the engine's ``end`` line, else
    its paused/resumed lines, else the client's pause lines."""
    end = last_of(t.engine, Event.END)
    if end is not None:
        return PauseStats(
            int_of(end, "pauses") or 0,
            num_of(end, "paused_ms") or 0.0,
            int_of(end, "backpressure_peak") or 0,
            "engine end",
        )
    if t.engine:
        return _stats_from_engine_pauses(t.engine)
    return _stats_from_client_pauses(t.client)


def _stats_from_engine_pauses(engine: Sequence[LogLine]) -> PauseStats:
    level = peak = pauses = 0
    paused_ms = 0.0
    for event in named(engine, Event.PAUSED, Event.RESUMED):
        step = 1 if name_of(event) == Event.PAUSED else -1
        level = max(0, level + step)
        peak = max(peak, level)
        pauses += step == 1
        paused_ms += num_of(event, "paused_ms") or 0.0
    return PauseStats(pauses, round(paused_ms, 3), peak, "engine pause lines")


def _stats_from_client_pauses(client: Sequence[LogLine]) -> PauseStats:
    pauses = 0
    paused_ms = 0.0
    since: float | None = None
    for event in named(client, *CLIENT_PAUSE_EVENTS, Event.RESUME_SENT, Event.READ_RESUMED):
        mono = num_of(event, "mono")
        if name_of(event) in CLIENT_PAUSE_EVENTS:
            pauses += 1
            since = mono
        elif since is not None and mono is not None:
            paused_ms += (mono - since) * 1000.0
            since = None
    return PauseStats(pauses, round(paused_ms, 3), min(pauses, 1), "client pause lines")


def outcome(t: Timeline) -> str:
    rejected = first_of(t.engine, Event.REJECTED)
    cancel = first_of(t.engine, Event.CANCEL)
    end = last_of(t.engine, Event.END)
    client_end = last_of(t.client, Event.END)
    client_error = last_of(t.client, Event.ERROR)
    if rejected is not None:
        return f"rejected ({rejected.get('code')})"
    if cancel is not None:
        return f"cancelled ({cancel.get('reason')})"
    if end is not None:
        return str(end.get("finish_reason") or f"error ({end.get('error')})")
    if client_error is not None:
        return f"client error ({client_error.get('code')})"
    if client_end is not None:
        return str(client_end.get("finish_reason"))
    return "no end line"


def n_generated(t: Timeline) -> int | None:
    counts = [n for n in (int_of(e, "n_generated") for e in t.engine) if n is not None]
    if counts:
        return max(counts)
    return int_of(last_of(t.client, Event.END), "n_tokens")


def verdict_of(findings: Iterable[Finding]) -> str:
    parties = {f.party for f in findings}
    return next((p for p in VERDICT_PRIORITY if p in parties), OK)


def judge(t: Timeline, th: Thresholds) -> RequestReport:
    relayed = upstream_of(t) is not None
    rules = [r for r in RULES if not (relayed and r in LOCAL_ONLY_RULES)]
    findings = tuple(f for rule in rules for f in rule(t, th))
    return RequestReport(
        request_id=t.request_id,
        client_request_ids=tuple(t.client_request_ids),
        verdict=verdict_of(findings),
        findings=findings,
        notes=tuple(notes_for(t, th)),
        outcome=outcome(t),
        n_generated=n_generated(t),
        stats=pause_stats(t),
        first_ts=t.first_ts,
    )


def log_notes(
    engine_events: Sequence[LogLine],
    client_events: Sequence[LogLine],
    *,
    have_engine: bool,
    have_client: bool,
) -> list[str]:
    notes = []
    if not have_engine:
        notes.append(
            "no engine log: cannot tell whether the engine honoured PAUSE/CANCEL, freed KV, "
            "or why its ring filled"
        )
    if not have_client:
        notes.append(
            "no client log: cannot tell whether the render queue was high, whether PAUSE was "
            "sent in time, or whether bytes were delayed in transit"
        )
    for closed in named([*engine_events, *client_events], Event.LOG_CLOSED):
        dropped = int_of(closed, "dropped") or 0
        if dropped:
            notes.append(
                f"the {closed.get('source')} log dropped {dropped} lines: evidence may be missing"
            )
    return notes


def blame(
    engine_events: Sequence[LogLine],
    client_events: Sequence[LogLine],
    *,
    have_engine_log: bool,
    have_client_log: bool,
    thresholds: Thresholds | None = None,
) -> BlameReport:
    """Join both logs and judge every request. Pass ``have_*_log=False`` for a log that
    was not given (an empty list then means "unknown", not "nothing happened")."""
    th = thresholds or Thresholds()
    timelines = build_timelines(
        engine_events,
        client_events,
        have_engine_log=have_engine_log,
        have_client_log=have_client_log,
    )
    return BlameReport(
        requests=tuple(judge(t, th) for t in timelines),
        notes=tuple(
            log_notes(
                engine_events,
                client_events,
                have_engine=have_engine_log,
                have_client=have_client_log,
            )
        ),
    )


def select(report: BlameReport, request: str) -> BlameReport:
    """Only the requests whose server id starts with ``request`` or whose client id is it."""
    chosen = tuple(
        r
        for r in report.requests
        if r.request_id.startswith(request) or request in r.client_request_ids
    )
    return BlameReport(chosen, report.notes)
