"""Terminal tables of a bench result (rich): one per concurrency level, and the
slow-consumer findings. Latencies in milliseconds, rates per second."""

from __future__ import annotations

from rich.table import Table

from edge_llm.bench.runner import BenchResult, run_levels
from edge_llm.bench.slow_consumer import SlowConsumerResult
from edge_llm.bench.stats import Distribution, Summary

DASH = "-"


def ms(value: float | None) -> str:
    return DASH if value is None else f"{value * 1000.0:.0f}"


def rate(value: float | None) -> str:
    return DASH if value is None else f"{value:.1f}"


def _errors(summary: Summary) -> str:
    if not summary.errors:
        return DASH
    return ", ".join(f"{kind} x{count}" for kind, count in summary.errors.items())


def _ps(dist: Distribution | None, *fields: str) -> str:
    if dist is None:
        return DASH
    return " / ".join(ms(getattr(dist, field)) for field in fields)


def level_table(summaries: list[Summary], concurrency: int) -> Table:
    """One concurrency level: a row per target."""
    table = Table(title=f"concurrency {concurrency}  (latencies in ms)", title_justify="left")
    for header in (
        "target",
        "ok/n",
        "TTFR p50",
        "TTFT p50 / p90 / p99",
        "ITL p50 / p99",
        "TPOT p50",
        "E2EL p50",
        "decode tok/s p50",
        "out tok/s",
        "req/s",
        "errors",
    ):
        table.add_column(header, justify="left" if header in ("target", "errors") else "right")
    for s in summaries:
        table.add_row(
            s.target,
            f"{s.n_ok}/{s.n_requests}",
            _ps(s.ttfr, "p50"),
            _ps(s.ttft, "p50", "p90", "p99"),
            _ps(s.itl, "p50", "p99"),
            _ps(s.tpot, "p50"),
            _ps(s.e2el, "p50"),
            DASH if s.decode_rate is None else rate(s.decode_rate.p50),
            rate(s.output_tok_s),
            f"{s.request_s:.2f}" if s.request_s is not None else DASH,
            _errors(s),
        )
    return table


def _window(start: float | None, end: float | None) -> str:
    if start is None or end is None:
        return DASH
    return f"{start:.2f}-{end:.2f} s"


def _seconds(value: float | None) -> str:
    return DASH if value is None else f"{value:.2f} s"


def _paused(found: SlowConsumerResult) -> str:
    if found.server_paused is None:
        return "unknown"
    text = "yes" if found.server_paused else "no"
    if found.server_paused_ms is not None and found.server_paused:
        text += f", {found.server_paused_ms / 1000.0:.2f} s"
    return text


def _memory(found: SlowConsumerResult) -> str:
    growth = found.kv_growth_bytes
    return "not measurable" if growth is None else f"+{growth / 1024:.0f} KiB KV"


def slow_table(results: list[SlowConsumerResult]) -> Table:
    """The slow-consumer probe: a row per target, then each target's verdict."""
    table = Table(title="slow consumer (times since request start)", title_justify="left")
    for header in (
        "target",
        "client stall",
        "stream stopped arriving",
        "stopped for",
        "server paused",
        "how known",
        "burst after stall",
        "longest gap after",
        "memory",
    ):
        table.add_column(header)
    for found in results:
        table.add_row(
            found.target,
            _window(found.stall_start, found.stall_end),
            _seconds(found.arrival_stopped_at),
            _seconds(found.arrival_gap_s),
            _paused(found),
            found.verdict_source,
            f"{found.burst_chunks} chunks",
            _seconds(found.longest_gap_after_stall_s),
            _memory(found),
        )
    return table


def tables(result: BenchResult) -> list[Table]:
    """Every table for ``result``, in order."""
    out = []
    for level in run_levels(result.config):
        rows = [s for s in result.summaries if s.concurrency == level]
        out.append(level_table(rows, level))
    if result.slow_consumer:
        out.append(slow_table(result.slow_consumer))
    return out
