"""The self-contained HTML report: tables and inline SVG charts, no external assets.

Per concurrency level: the summary table, TTFT and ITL distributions per target
(empirical CDFs) and a chunk-arrival timeline per request. For the slow-consumer probe:
its findings, a timeline per target with the client's stall (grey), the server's pause
(orange, when the server says so) and the burst after the stall (green) marked, the
kernel receive queue while stalled, and the server's generated-token count over time
(when it exposes ``/debug/streams`` or llama.cpp's ``/slots``).
"""

from __future__ import annotations

import json
from html import escape

from edge_llm.bench.record import RequestRecord
from edge_llm.bench.runner import BenchResult, run_levels
from edge_llm.bench.slow_consumer import SlowConsumerResult
from edge_llm.bench.stats import Summary
from edge_llm.bench.svg import (
    REPORT_CSS,
    Lane,
    Series,
    Window,
    color,
    ecdf_points,
    line_chart,
    timeline,
)
from edge_llm.bench.table import DASH, ms, rate

MAX_LANES_PER_TARGET = 24


def render_html(result: BenchResult) -> str:
    """The whole report as one HTML string."""
    names = [t.name for t in result.config.targets]
    parts = [_header(result)]
    for level in run_levels(result.config):
        parts.append(_level_section(result, level, names))
    if result.slow_consumer:
        parts.append(_slow_section(result.slow_consumer, names))
    parts.append(_definitions())
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>edge-llm bench {escape(result.started_at)}</title><style>{REPORT_CSS}</style>"
        "</head><body>" + "".join(parts) + "</body></html>"
    )


def write_html(result: BenchResult, path: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(render_html(result))


def _header(result: BenchResult) -> str:
    config = json.dumps(result.config.to_json(), indent=1)
    host = json.dumps(result.host)
    return (
        f"<h1>edge-llm bench, {escape(result.started_at)}</h1>"
        f"<p class='note'>Host: {escape(host)}</p>"
        f"<details><summary>Configuration</summary><pre>{escape(config)}</pre></details>"
    )


def _level_section(result: BenchResult, level: int, names: list[str]) -> str:
    summaries = [s for s in result.summaries if s.concurrency == level]
    records = [r for r in result.records if r.concurrency == level]
    return (
        f"<h2>Concurrency {level}</h2>"
        + _summary_table(summaries)
        + _distributions(records, names, level)
        + _request_timeline(records, names, level)
    )


def _summary_table(summaries: list[Summary]) -> str:
    head = (
        "<tr><th>target</th><th>ok/n</th><th>TTFR p50</th><th>TTFT mean</th><th>TTFT p50</th>"
        "<th>TTFT p90</th><th>TTFT p99</th><th>ITL p50</th><th>ITL p90</th><th>ITL p99</th>"
        "<th>TPOT p50</th><th>E2EL p50</th><th>decode tok/s p50</th><th>out tok/s</th>"
        "<th>req/s</th><th>errors</th></tr>"
    )
    rows = [head] + [_summary_row(s) for s in summaries]
    return "<table>" + "".join(rows) + "</table><p class='note'>Latencies in ms.</p>"


def _summary_row(s: Summary) -> str:
    def cell(value: str) -> str:
        return f"<td>{escape(value)}</td>"

    def pick(name: str, field: str) -> str:
        dist = s.metric(name)
        return DASH if dist is None else ms(getattr(dist, field))

    errors = ", ".join(f"{k} x{v}" for k, v in s.errors.items()) or DASH
    decode = DASH if s.decode_rate is None else rate(s.decode_rate.p50)
    cells = [
        cell(s.target),
        cell(f"{s.n_ok}/{s.n_requests}"),
        cell(pick("ttfr", "p50")),
        cell(pick("ttft", "mean")),
        cell(pick("ttft", "p50")),
        cell(pick("ttft", "p90")),
        cell(pick("ttft", "p99")),
        cell(pick("itl", "p50")),
        cell(pick("itl", "p90")),
        cell(pick("itl", "p99")),
        cell(pick("tpot", "p50")),
        cell(pick("e2el", "p50")),
        cell(decode),
        cell(rate(s.output_tok_s)),
        cell(DASH if s.request_s is None else f"{s.request_s:.2f}"),
        f"<td class='text'>{escape(errors)}</td>",
    ]
    return "<tr>" + "".join(cells) + "</tr>"


def _distributions(records: list[RequestRecord], names: list[str], level: int) -> str:
    ttft, itl = [], []
    for i, name in enumerate(names):
        ok = [r for r in records if r.target == name and r.ok]
        ttfts = [r.ttft for r in ok if r.ttft is not None]
        gaps = [gap for r in ok for gap in r.itls()]
        ttft.append(Series(name, ecdf_points(ttfts, 1000.0), color(i), step=True))
        itl.append(Series(name, ecdf_points(gaps, 1000.0), color(i), step=True))
    return line_chart(
        f"TTFT distribution, concurrency {level}",
        ttft,
        x_label="TTFT (ms)",
        y_label="fraction of requests",
    ) + line_chart(
        f"ITL distribution, concurrency {level}",
        itl,
        x_label="inter-chunk latency (ms)",
        y_label="fraction of gaps",
    )


def _request_timeline(records: list[RequestRecord], names: list[str], level: int) -> str:
    lanes: list[Lane] = []
    shown_all = True
    for i, name in enumerate(names):
        mine = [r for r in records if r.target == name]
        shown_all = shown_all and len(mine) <= MAX_LANES_PER_TARGET
        for record in mine[:MAX_LANES_PER_TARGET]:
            label = f"{name} #{record.index} {record.prompt_id}"
            if not record.ok:
                label += f" ({record.error_kind})"
            lanes.append(Lane(label, record.chunk_times, color(i), failed=not record.ok))
    note = "" if shown_all else f"<p class='note'>First {MAX_LANES_PER_TARGET} per target.</p>"
    chart = timeline(
        f"Chunk arrivals per request, concurrency {level}",
        lanes,
        x_label="seconds since the request started",
    )
    return "<h3>Chunk timeline</h3>" + note + chart


def _slow_section(results: list[SlowConsumerResult], names: list[str]) -> str:
    key = (
        "<p class='key'>Marked: <span style='background:#bbbbbb'></span>client stalled "
        "(not reading) <span style='background:#ffb347'></span>server paused (reported by "
        "/debug/streams) <span style='background:#7fc97f'></span>burst after the stall</p>"
    )
    return (
        "<h2>Slow consumer</h2>"
        + _slow_table(results)
        + key
        + _slow_timeline(results, names)
        + _queue_chart(results, names)
        + _generated_chart(results, names)
    )


def _slow_table(results: list[SlowConsumerResult]) -> str:
    head = (
        "<tr><th>target</th><th>client stall (s)</th><th>stream stopped arriving (s)</th>"
        "<th>stopped for (s)</th><th>receive queue peak</th><th>trickle after stop</th>"
        "<th>server paused</th><th>burst after stall</th><th>longest gap after stall (s)</th>"
        "<th>KV growth</th><th>finding</th></tr>"
    )
    rows = [head]
    for found in results:
        growth = found.kv_growth_bytes
        cells = [
            found.target,
            _window_text(found.stall_start, found.stall_end),
            _seconds(found.arrival_stopped_at),
            _seconds(found.arrival_gap_s),
            DASH if found.queue_peak_bytes is None else f"{found.queue_peak_bytes} B",
            DASH if found.trickle_bytes is None else f"{found.trickle_bytes} B",
            _paused_text(found),
            f"{found.burst_chunks} chunks",
            _seconds(found.longest_gap_after_stall_s),
            found.memory_note if growth is None else f"{growth / 1024:.0f} KiB",
        ]
        row = "".join(f"<td>{escape(c)}</td>" for c in cells)
        rows.append(f"<tr>{row}<td class='text'>{escape(found.verdict)}</td></tr>")
    return "<table>" + "".join(rows) + "</table>"


def _window_text(start: float | None, end: float | None) -> str:
    return DASH if start is None or end is None else f"{start:.2f} - {end:.2f}"


def _seconds(value: float | None) -> str:
    return DASH if value is None else f"{value:.2f}"


def _paused_text(found: SlowConsumerResult) -> str:
    if found.server_paused is None:
        return "unknown"
    if not found.server_paused:
        return f"no ({found.verdict_source})"
    extra = ""
    if found.server_paused_ms is not None:
        extra = f", {found.server_paused_ms / 1000.0:.2f} s, {found.server_pauses} pause(s)"
    return f"yes ({found.verdict_source}{extra})"


def slow_windows(found: SlowConsumerResult) -> list[Window]:
    """The marked windows of one probe: stall, server pause, burst."""
    windows = []
    if found.stall_start is not None and found.stall_end is not None:
        windows.append(Window(found.stall_start, found.stall_end, "stall", "client stalled"))
    if found.paused_at is not None:
        end = found.resumed_at or found.record.ended_at or found.paused_at
        windows.append(
            Window(found.paused_at, end, "pause", f"server paused ({found.pause_cause})")
        )
    if found.stall_end is not None and found.burst_span_s is not None and found.burst_chunks:
        start = found.arrival_resumed_at or found.stall_end
        end = start + max(found.burst_span_s, 0.01)
        windows.append(Window(start, end, "burst", f"burst of {found.burst_chunks} chunks"))
    return windows


def _slow_timeline(results: list[SlowConsumerResult], names: list[str]) -> str:
    lanes = [
        Lane(
            f.target,
            f.record.chunk_times,
            color(_index(names, f.target)),
            slow_windows(f),
            failed=not f.record.ok,
        )
        for f in results
    ]
    return timeline(
        "Slow consumer: chunk arrivals", lanes, x_label="seconds since the request started"
    )


def _queue_chart(results: list[SlowConsumerResult], names: list[str]) -> str:
    series = [
        Series(
            f.target,
            [(t, q / 1024) for t, q in f.samples.queue],
            color(_index(names, f.target)),
        )
        for f in results
    ]
    windows = [w for f in results for w in slow_windows(f) if w.kind == "stall"][:1]
    return line_chart(
        "Kernel receive queue of the slow reader (FIONREAD)",
        series,
        x_label="seconds since the request started",
        y_label="KiB queued",
        windows=windows,
    )


def _generated_chart(results: list[SlowConsumerResult], names: list[str]) -> str:
    series = [
        Series(
            f"{f.target} ({f.verdict_source})",
            [(t, float(n)) for t, n in f.samples.decoded],
            color(_index(names, f.target)),
        )
        for f in results
        if f.samples.decoded
    ]
    if not series:
        return "<p class='note'>No target reports its generation progress: inferred.</p>"
    windows = [w for f in results if f.samples.decoded for w in slow_windows(f)]
    return line_chart(
        "Tokens generated by the server (edge-llm /debug/streams, llama.cpp /slots)",
        series,
        x_label="seconds since the request started",
        y_label="tokens generated",
        windows=windows,
    )


def _index(names: list[str], name: str) -> int:
    return names.index(name) if name in names else len(names)


def _definitions() -> str:
    return (
        "<h2>Definitions</h2><p class='note'>All times from the request's start. "
        "TTFR: first data event. TTFT: first chunk with content. ITL: gaps between content "
        "chunks (pooled over requests). E2EL: last content chunk. TPOT: (E2EL - TTFT) / "
        "(N_out - 1). Decode rate: (N_out - 1) / (t_last - t_first). N_out: "
        "usage.completion_tokens when the server sends usage, else the number of content "
        "chunks. Percentiles by linear interpolation. Output tok/s and req/s divide by the "
        "time the target was being measured (targets take turns). Failed requests are "
        "counted by kind and never enter latency figures.</p>"
    )
