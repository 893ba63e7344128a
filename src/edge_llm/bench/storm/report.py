"""A storm's output: the per-target and per-class tables (terminal and HTML) and the
HTML report.

The report is one self-contained page (inline SVG, no scripts): the table, then per
target over time the KV bytes in use, live sequences (running, waiting, paused) and RSS,
a TTFT scatter (request start vs TTFT, coloured by target, the SLO as a line) and
per-user timelines (one lane per user: each request shaded by outcome, a tick at the
first token the user read).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from html import escape

from rich.table import Table

from edge_llm.bench.stats import Distribution
from edge_llm.bench.storm.run import StormResult
from edge_llm.bench.storm.stats import StormSummary
from edge_llm.bench.storm.user import OUTCOMES, StormRecord
from edge_llm.bench.storm.watch import ServerSample
from edge_llm.bench.svg import REPORT_CSS, Lane, Series, Window, color, line_chart, timeline

DASH = "-"
MIB = 1024.0 * 1024.0
MAX_LANES = 40

COLUMNS = (
    "target",
    "requests",
    "completed",
    "abandoned",
    "superseded",
    "failed",
    "TTFT p50 / p90 / p99 ms",
    "goodput",
    "goodput /min",
    "tokens unread",
    "wasted prefill",
    "peak KV MiB",
    "peak run / wait / paused",
    "peak RSS MiB",
    "errors",
)


CLASS_COLUMNS = (
    "target",
    "class",
    "priority",
    "requests",
    "completed",
    "failed",
    "TTFT p50 / p99 ms",
    "goodput",
    "tokens lost",
    "preemptions",
)


def _ms(dist: Distribution | None) -> str:
    if dist is None:
        return DASH
    return " / ".join(f"{v * 1000.0:.0f}" for v in (dist.p50, dist.p90, dist.p99))


def _num(value: float | None, scale: float = 1.0, digits: int = 0) -> str:
    return DASH if value is None else f"{value / scale:.{digits}f}"


def _peaks(s: StormSummary) -> str:
    return " / ".join(
        DASH if v is None else str(v) for v in (s.peak_running, s.peak_waiting, s.peak_paused)
    )


def summary_row(s: StormSummary) -> tuple[str, ...]:
    """The table row of one target, as text (shared by terminal, HTML and benchmarks)."""
    errors = ", ".join(f"{k} x{v}" for k, v in s.errors.items()) or DASH
    return (
        s.target,
        str(s.n_requests),
        *(str(s.outcomes.get(name, 0)) for name in OUTCOMES),
        _ms(s.ttft),
        f"{s.goodput} ({s.goodput / s.n_requests:.0%})" if s.n_requests else "0",
        _num(s.goodput_per_min, digits=1),
        _num(s.tokens_unread),
        _num(s.wasted_prefill_tokens),
        _num(s.peak_kv_bytes, MIB, 1),
        _peaks(s),
        _num(s.peak_rss_bytes, MIB),
        errors,
    )


def class_rows(s: StormSummary) -> list[tuple[str, ...]]:
    """One row per class of one target (interactive users, the batch), as text."""
    rows: list[tuple[str, ...]] = []
    for c in s.classes:
        ttft = DASH if c.ttft is None else f"{c.ttft.p50 * 1000:.0f} / {c.ttft.p99 * 1000:.0f}"
        share = f" ({c.goodput / c.n_requests:.0%})" if c.n_requests else ""
        rows.append((
            s.target, c.kind, DASH if c.priority is None else str(c.priority), str(c.n_requests),
            str(c.outcomes.get("completed", 0)), str(c.outcomes.get("failed", 0)), ttft,
            f"{c.goodput}{share}", _num(c.tokens_lost), _num(c.preemptions),
        ))  # fmt: skip
    return rows


def class_table(result: StormResult) -> Table:
    """Each target's classes side by side: what the batch cost the interactive users."""
    table = Table(title="storm by class (priority: the field sent)", title_justify="left")
    for header in CLASS_COLUMNS:
        table.add_column(header, justify="left" if header in ("target", "class") else "right")
    for summary in result.summaries:
        for row in class_rows(summary):
            table.add_row(*row)
    return table


def storm_table(result: StormResult) -> Table:
    slo = result.config.settings.ttft_slo_ms
    table = Table(
        title=f"storm: goodput = completed with TTFT <= {slo:.0f} ms", title_justify="left"
    )
    for header in COLUMNS:
        table.add_column(header, justify="left" if header in ("target", "errors") else "right")
    for summary in result.summaries:
        table.add_row(*summary_row(summary))
    return table


def render_html(result: StormResult) -> str:
    names = [t.name for t in result.config.targets]
    parts = [
        f"<h1>edge-llm storm, {escape(result.started_at)}</h1>",
        f"<p class='note'>Host: {escape(json.dumps(result.host))}</p>",
        "<details><summary>Configuration</summary><pre>"
        + escape(json.dumps(result.config.to_json(), indent=1))
        + "</pre></details>",
        _table_html(result),
        _class_table_html(result),
        _over_time(result, names),
        _ttft_scatter(result, names),
        _user_timelines(result, names),
        _definitions(),
    ]
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>edge-llm storm {escape(result.started_at)}</title><style>{REPORT_CSS}</style>"
        "</head><body>" + "".join(parts) + "</body></html>"
    )


def write_html(result: StormResult, path: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(render_html(result))


def _table_html(result: StormResult) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in COLUMNS)
    rows = [f"<tr>{head}</tr>"]
    for summary in result.summaries:
        cells = summary_row(summary)
        body = "".join(f"<td>{escape(c)}</td>" for c in cells[:-1])
        rows.append(f"<tr>{body}<td class='text'>{escape(cells[-1])}</td></tr>")
    return "<h2>Per target</h2><table>" + "".join(rows) + "</table>"


def _class_table_html(result: StormResult) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in CLASS_COLUMNS)
    rows = [f"<tr>{head}</tr>"]
    for summary in result.summaries:
        for cells in class_rows(summary):
            rows.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
    return "<h2>Per class</h2><table>" + "".join(rows) + "</table>"


def _kv_mib(s: ServerSample) -> float | None:
    return None if s.kv_used_bytes is None else s.kv_used_bytes / MIB


def _rss_mib(s: ServerSample) -> float | None:
    return None if s.rss_bytes is None else s.rss_bytes / MIB


_OVER_TIME: tuple[tuple[str, str, Callable[[ServerSample], float | None]], ...] = (
    ("KV cache in use", "MiB", _kv_mib),
    ("Running sequences", "sequences", lambda s: s.running),
    ("Waiting requests", "requests", lambda s: s.waiting),
    ("Paused streams", "streams", lambda s: s.paused),
    ("Server RSS", "MiB", _rss_mib),
)


def _over_time(result: StormResult, names: list[str]) -> str:
    parts = ["<h2>Server over time (each run from its own start)</h2>"]
    for title, unit, pick in _OVER_TIME:
        series = []
        for run in result.runs:
            points = [(s.t, float(v)) for s in run.data.samples if (v := pick(s)) is not None]
            if points:
                label = f"{run.target} r{run.round + 1}"
                series.append(Series(label, points, color(_index(names, run.target)), step=True))
        if series:
            parts.append(line_chart(title, series, x_label="seconds", y_label=unit))
        else:
            parts.append(f"<p class='note'>{escape(title)}: no target exposes it.</p>")
    return "".join(parts)


def _ttft_scatter(result: StormResult, names: list[str]) -> str:
    series = []
    for i, name in enumerate(names):
        points = [
            (r.started_at, r.ttft * 1000.0)
            for r in result.records
            if r.target == name and r.ttft is not None and r.outcome in ("completed", "abandoned")
        ]
        series.append(Series(name, points, color(i), dots=True))
    span = max((r.started_at for r in result.records), default=1.0)
    slo = result.config.settings.ttft_slo_ms
    series.append(Series(f"SLO {slo:.0f} ms", [(0.0, slo), (span, slo)], "#888888"))
    return "<h2>TTFT of each request read by a user</h2>" + line_chart(
        "TTFT vs request start", series, x_label="request start (s)", y_label="TTFT (ms)"
    )


def _user_timelines(result: StormResult, names: list[str]) -> str:
    key = "".join(
        f"<span style='background:{c}'></span>{o}"
        for o, c in (("completed", "#7fc97f"), ("abandoned", "#ffb347"),
                     ("superseded", "#bbbbbb"), ("failed", "#e06666"))
    )  # fmt: skip
    parts = ["<h2>Per-user timelines</h2>", f"<p class='key'>{key}; tick: first token read</p>"]
    for run in result.runs:
        mine = [r for r in result.records if r.target == run.target and r.round == run.round]
        lanes = _lanes(mine, color(_index(names, run.target)))
        note = f" (first {MAX_LANES} users)" if len(lanes) > MAX_LANES else ""
        title = f"{run.target}, round {run.round + 1}{note}"
        parts.append(timeline(title, lanes[:MAX_LANES], x_label="seconds since the run started"))
    return "".join(parts)


def _lanes(records: list[StormRecord], lane_color: str) -> list[Lane]:
    users = sorted({r.user for r in records})
    lanes = []
    for user in users:
        mine = [r for r in records if r.user == user]
        windows = [
            Window(
                r.started_at,
                r.ended_at if r.ended_at is not None else r.started_at,
                r.outcome or "failed",
                _label(r),
            )
            for r in mine
        ]
        ticks = [
            r.started_at + r.ttft
            for r in mine
            if r.ttft is not None and r.outcome in ("completed", "abandoned")
        ]
        failed = any(r.outcome == "failed" for r in mine)
        lanes.append(Lane(f"user {user}", ticks, lane_color, windows, failed=failed))
    return lanes


def _label(record: StormRecord) -> str:
    label = f"turn {record.turn} attempt {record.attempt}: {record.outcome}"
    if record.request.error_kind and record.outcome == "failed":
        label += f" ({record.request.error_kind})"
    return label


def _index(names: list[str], name: str) -> int:
    return names.index(name) if name in names else len(names)


def _definitions() -> str:
    return (
        "<h2>Definitions</h2><p class='note'>Each request has exactly one outcome: "
        "completed (read to [DONE]), abandoned (closed by its user mid-stream), superseded "
        "(its user pressed regenerate before its first token; the connection stays open and "
        "unread until the turn ends), failed (an error status or stream error, or no answer "
        "within the timeout). TTFT: first content chunk after the request's own start, over "
        "completed and abandoned requests. Goodput: completed requests whose TTFT is within "
        "the SLO. Tokens unread: the server's generated-token counter over the run minus "
        "the tokens users read; per class, tokens lost: the tokens the server generated "
        "for the class's requests (edge-llm /debug/streams) minus those its users read. "
        "Classes: interactive users, and the background batch (jobs one after another, "
        "never regenerated nor abandoned), sent with its priority unless --no-priorities. "
        "Wasted prefill: prompt tokens the server prefilled for "
        "superseded or failed requests (edge-llm /debug/streams). Peaks are of samples taken "
        "every sample interval. Percentiles by linear interpolation.</p>"
    )
