"""Text and JSON renderings of a :class:`~edge_llm.observability.blame.BlameReport`.

Text: one summary line per request (verdict, outcome, tokens, pauses, backpressure
peak, paused time), then for each finding its party, rule and message with the
evidence lines (local wall-clock time, offset from the request's first line, source,
event, fields), then what the logs cannot tell; a total line last. JSON: the same,
with the evidence lines exactly as they were logged.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

from edge_llm.observability.blame.lines import LogLine
from edge_llm.observability.blame.model import VERDICTS, BlameReport, Finding, RequestReport

MAX_EVIDENCE_LINES = 12
HIDDEN_FIELDS = ("ts", "mono", "source", "event", "request_id", "client_request_id")
HEADER = (
    f"{'REQUEST':<34} {'VERDICT':<9} {'OUTCOME':<22} {'TOKENS':>6} {'PAUSES':>6} "
    f"{'PEAK':>4} {'PAUSED':>10}"
)


def format_time(ts: float) -> str:
    """Local wall-clock time with milliseconds (what strace and syslog show)."""
    moment = datetime.datetime.fromtimestamp(ts)
    return moment.strftime("%H:%M:%S.") + f"{moment.microsecond // 1000:03d}"


def _value(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def format_event(event: LogLine, origin: float) -> str:
    """``12:00:01.234  +0.512s  engine  paused  cause=socket_full ring_fill=1.0 ...``"""
    ts = event.get("ts")
    when = float(ts) if isinstance(ts, int | float) else origin
    fields = " ".join(f"{k}={_value(v)}" for k, v in event.items() if k not in HIDDEN_FIELDS)
    head = f"{format_time(when)}  +{when - origin:.3f}s  {event.get('source', '?'):<6}"
    return f"{head}  {event.get('event')}  {fields}".rstrip()


def chronological(finding: Finding) -> list[LogLine]:
    """The evidence by wall-clock time (lines without ``ts`` first)."""
    return sorted(finding.evidence, key=lambda e: e.get("ts") or 0.0)


def summary_line(request: RequestReport) -> str:
    stats = request.stats
    tokens = "-" if request.n_generated is None else str(request.n_generated)
    return (
        f"{request.request_id:<34} {request.verdict:<9} {request.outcome:<22} {tokens:>6} "
        f"{stats.pauses:>6} {stats.backpressure_peak:>4} {stats.paused_ms:>7.0f} ms"
    )


def _finding_lines(finding: Finding, origin: float) -> list[str]:
    lines = [f"  {finding.party}: {finding.rule}: {finding.message}"]
    shown = chronological(finding)[:MAX_EVIDENCE_LINES]
    lines.extend(f"      {format_event(e, origin)}" for e in shown)
    hidden = len(finding.evidence) - len(shown)
    if hidden:
        lines.append(f"      ... {hidden} more evidence lines (--json shows all)")
    return lines


def request_lines(request: RequestReport) -> list[str]:
    lines = [summary_line(request)]
    if request.client_request_ids:
        lines.append(f"  client request id: {', '.join(request.client_request_ids)}")
    for finding in request.findings:
        lines.extend(_finding_lines(finding, request.first_ts))
    lines.extend(f"  cannot tell: {note}" for note in request.notes)
    return lines


def total_line(report: BlameReport) -> str:
    totals = report.totals()
    counts = ", ".join(f"{verdict} {totals[verdict]}" for verdict in VERDICTS)
    return f"total: {len(report.requests)} requests: {counts}"


def render_text(report: BlameReport) -> str:
    lines = [f"note: {note}" for note in report.notes]
    lines.append(HEADER)
    for request in report.requests:
        lines.extend(request_lines(request))
    lines.append(total_line(report))
    return "\n".join(lines) + "\n"


def _finding_json(finding: Finding) -> dict[str, Any]:
    return {
        "party": finding.party,
        "rule": finding.rule,
        "message": finding.message,
        "evidence": [dict(e) for e in chronological(finding)],
    }


def request_json(request: RequestReport) -> dict[str, Any]:
    stats = request.stats
    return {
        "request_id": request.request_id,
        "client_request_ids": list(request.client_request_ids),
        "verdict": request.verdict,
        "outcome": request.outcome,
        "n_generated": request.n_generated,
        "pauses": stats.pauses,
        "paused_ms": stats.paused_ms,
        "backpressure_peak": stats.backpressure_peak,
        "stats_from": stats.source,
        "findings": [_finding_json(f) for f in request.findings],
        "cannot_tell": list(request.notes),
    }


def report_json(report: BlameReport) -> dict[str, Any]:
    return {
        "requests": [request_json(r) for r in report.requests],
        "total": {"requests": len(report.requests), **report.totals()},
        "notes": list(report.notes),
    }
