"""The ``edge-llm top`` frame: pure functions from ``/debug/streams`` and ``/metrics``
to a rich renderable (no I/O, no clock: the caller passes the sample times).

One frame shows the engine header (alive, steps, running/waiting/paused, tok/s
between refreshes, backpressure and its peak, KV used against its capacity; a narrow
terminal wraps it between fields, never inside one), one row per
stream (priority class and times preempted, state, pause cause, tokens, prefill,
outbound ring fill as a bar with its write/read cursors, KV cursor, pauses, paused
time, tok/s, age) and the engine's totals from its Prometheus counters and histograms.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console, ConsoleOptions, Group, JustifyMethod, RenderableType
from rich.table import Table
from rich.text import Text

from edge_llm.observability.units import mib

PREFIX = "edge_llm_"
BAR_WIDTH = 10
ID_WIDTH = 17  # "chatcmpl-" + 8 hex: a prefix ``edge-llm blame --request`` accepts
FIELD_GAP = "  "
STATE_STYLES = {
    "queued": "dim",
    "prefill": "cyan",
    "decoding": "green",
    "paused": "yellow",
    "preempted": "bold yellow",
    "detached": "bold blue",  # its connection dropped: it waits to be resumed
    "offloaded": "blue",
    "done": "dim",
    "cancelled": "magenta",
}

Metrics = dict[str, dict[str, float]]  # sample name without prefix -> label values -> value
StreamsDoc = Mapping[str, Any]


@dataclass(frozen=True)
class Sample:
    """What tok/s is derived from: when, the engine's token counter, each stream's count."""

    at: float
    generated_total: float | None
    per_stream: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Rates:
    total: float | None = None
    per_stream: Mapping[str, float] = field(default_factory=dict)


# -- metrics --------------------------------------------------------------------------------


def parse_metrics(text: str) -> Metrics:
    """``edge_llm_*`` samples by name (prefix removed) and label values joined with ``,``
    (a histogram bucket is keyed by its ``le``). Raises ValueError on malformed text."""
    metrics: Metrics = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith(PREFIX):
                continue
            key = ",".join(str(v) for _, v in sorted(sample.labels.items()))
            metrics.setdefault(sample.name[len(PREFIX) :], {})[key] = float(sample.value)
    return metrics


def metric_total(metrics: Metrics, name: str) -> float | None:
    values = metrics.get(name)
    return None if values is None else sum(values.values())


def histogram_quantile(metrics: Metrics, name: str, q: float) -> float | None:
    """Upper bound of the bucket holding quantile ``q`` (None without observations;
    the largest finite bound when it lies in ``+Inf``)."""
    buckets = sorted((float(le), n) for le, n in metrics.get(name + "_bucket", {}).items())
    count = buckets[-1][1] if buckets else 0.0
    if count <= 0:
        return None
    finite = [le for le, _ in buckets if math.isfinite(le)]
    bound = next(le for le, n in buckets if n >= q * count)
    return bound if math.isfinite(bound) else (finite[-1] if finite else None)


# -- rates ----------------------------------------------------------------------------------


def sample_of(at: float, streams: StreamsDoc, metrics: Metrics) -> Sample:
    per_stream = {
        str(s.get("id")): int(s.get("n_generated") or 0) for s in streams.get("streams", [])
    }
    return Sample(at, metric_total(metrics, "generated_tokens_total"), per_stream)


def rates_between(before: Sample | None, now: Sample) -> Rates:
    """Tokens per second between two samples (nothing for the first frame)."""
    if before is None or now.at <= before.at:
        return Rates()
    elapsed = now.at - before.at
    total = None
    if now.generated_total is not None and before.generated_total is not None:
        total = max(0.0, now.generated_total - before.generated_total) / elapsed
    per_stream = {
        stream_id: max(0, n - before.per_stream[stream_id]) / elapsed
        for stream_id, n in now.per_stream.items()
        if stream_id in before.per_stream
    }
    return Rates(total, per_stream)


# -- pieces ---------------------------------------------------------------------------------


def bar(fraction: float, width: int = BAR_WIDTH) -> Text:
    """``███░░░░░░░`` coloured green, yellow (>= 0.5), red (>= 0.9)."""
    fraction = min(1.0, max(0.0, fraction))
    filled = round(fraction * width)
    style = "red" if fraction >= 0.9 else "yellow" if fraction >= 0.5 else "green"
    return Text.assemble(("█" * filled, style), ("░" * (width - filled), "dim"))


def ring_fill(stream: Mapping[str, Any]) -> float:
    capacity = int(stream.get("ring_capacity") or 0)
    pending = int(stream.get("ring_write") or 0) - int(stream.get("ring_read") or 0)
    return pending / capacity if capacity > 0 else 0.0


def _ms(value: object) -> str:
    number = float(value) if isinstance(value, int | float) else 0.0
    return f"{number / 1000:.1f} s" if number >= 10_000 else f"{number:.0f} ms"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _mib(value: object) -> str:
    return mib(value) if isinstance(value, int | float) else "?"


# -- the frame ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fields:
    """Fields on one line, wrapped between fields when the terminal is narrow:
    a figure and its unit (``26.5 tok/s``) always stay together."""

    fields: tuple[Text, ...]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Text]:
        line = Text()
        for item in self.fields:
            if line and line.cell_len + len(FIELD_GAP) + item.cell_len > options.max_width:
                yield line
                line = Text()
            if line:
                line.append(FIELD_GAP)
            line.append_text(item)
        yield line


def engine_line(streams: StreamsDoc, metrics: Metrics, rates: Rates) -> Fields:
    used, capacity = streams.get("kv_used_bytes") or 0, streams.get("kv_budget_bytes") or 0
    paused = metric_total(metrics, "streams_paused")
    detached = metric_total(metrics, "streams_detached")
    alive = streams.get("engine_alive")
    kv = Text("KV ").append_text(bar(used / capacity if capacity else 0.0))
    kv.append(f" {_mib(used)}/{_mib(capacity)} MiB used/capacity")
    fields = [
        Text("engine ") + (Text("alive", "green") if alive else Text("DEAD", "bold red")),
        Text(f"steps {streams.get('steps', '?')}"),
        Text(f"running {streams.get('requests_running', '?')}"),
        Text(f"waiting {streams.get('requests_waiting', '?')}"),
        Text(f"paused {'?' if paused is None else f'{paused:.0f}'}"),
        Text(f"detached {'?' if detached is None else f'{detached:.0f}'}"),
        Text(f"{_rate(rates.total)} tok/s"),
        Text(
            f"backpressure {streams.get('backpressure', '?')} "
            f"(peak {streams.get('backpressure_peak', '?')})"
        ),
        kv,
        Text(
            f"(reserved {_mib(streams.get('kv_reserved_bytes'))}"
            f", cached {_mib(streams.get('kv_cached_bytes', 0))}"
            f", offloaded {_mib(streams.get('kv_offloaded_bytes', 0))})"
        ),
    ]
    return Fields(tuple(fields))


def _state(stream: Mapping[str, Any]) -> Text:
    state = str(stream.get("state"))
    return Text(state, style=STATE_STYLES.get(state, ""))


def _cause(stream: Mapping[str, Any]) -> str:
    return str(
        stream.get("pause_cause")
        or stream.get("cancel_reason")
        or stream.get("finish_reason")
        or ""
    )


def _priority(stream: Mapping[str, Any]) -> str:
    """The class, and how often it was preempted (``5 x2``); ``-`` when relayed."""
    priority = stream.get("priority")
    if priority is None:
        return "-"
    preemptions = stream.get("preemptions") or 0
    return f"{priority} x{preemptions}" if preemptions else str(priority)


def _ring(stream: Mapping[str, Any]) -> Text:
    cursors = f" {stream.get('ring_write')}/{stream.get('ring_read')}/{stream.get('ring_capacity')}"
    return bar(ring_fill(stream)) + Text(cursors)


def stream_row(stream: Mapping[str, Any], rates: Rates) -> list[RenderableType]:
    stream_id = str(stream.get("id"))
    return [
        stream_id[:ID_WIDTH],
        str(stream.get("session") or "-"),
        _priority(stream),
        _state(stream),
        _cause(stream),
        f"{stream.get('n_generated')}/{stream.get('max_tokens')}",
        f"{stream.get('prefill_done')}/{stream.get('n_prompt_tokens')}",
        _ring(stream),
        str(stream.get("kv_tokens")),
        str(stream.get("pauses")),
        _ms(stream.get("paused_ms")),
        str(stream.get("tokens_while_paused")),
        _rate(rates.per_stream.get(stream_id)),
        _ms(stream.get("age_ms")),
    ]


STREAM_COLUMNS: tuple[tuple[str, JustifyMethod], ...] = (
    ("ID", "left"),
    ("SESSION", "left"),
    ("PRIO", "right"),
    ("STATE", "left"),
    ("WHY", "left"),
    ("TOKENS", "right"),
    ("PREFILL", "right"),
    ("RING fill  w/r/cap", "left"),
    ("KV", "right"),
    ("PAUSES", "right"),
    ("PAUSED", "right"),
    ("AFTER PAUSE", "right"),
    ("TOK/S", "right"),
    ("AGE", "right"),
)


# Columns a narrow terminal (or a long session name) must never squeeze out.
KEPT_WIDTHS = {"ID": ID_WIDTH, "STATE": len("offloaded"), "WHY": len("socket_full")}
SESSION_MAX_WIDTH = 24  # a long session id is cut ("…") instead of squeezing out the rest


def streams_table(streams: StreamsDoc, rates: Rates) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for title, justify in STREAM_COLUMNS:
        keep = KEPT_WIDTHS.get(title)  # narrow terminals shrink the others
        cap = SESSION_MAX_WIDTH if title == "SESSION" else None
        table.add_column(title, justify=justify, no_wrap=True, min_width=keep, max_width=cap)
    rows = list(streams.get("streams", []))
    for stream in rows:
        table.add_row(*stream_row(stream, rates))
    if not rows:
        table.caption = "no live or recent streams"
    return table


def _labelled(metrics: Metrics, name: str, *, zeros: bool) -> str:
    values = metrics.get(name, {})
    shown = [f"{label} {value:.0f}" for label, value in sorted(values.items()) if zeros or value]
    return " ".join(shown) or "none"


def _by_priority(metrics: Metrics, name: str) -> str:
    """``prio 5 x2`` per class with a count, or ``none``."""
    values = metrics.get(name, {})
    shown = [f"prio {label} x{value:.0f}" for label, value in sorted(values.items()) if value]
    return " ".join(shown) or "none"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:g} s"


def totals_line(metrics: Metrics) -> Text:
    if not metrics:
        return Text("metrics unavailable", style="dim")
    generated = metric_total(metrics, "generated_tokens_total") or 0.0
    prompt = metric_total(metrics, "prompt_tokens_total") or 0.0
    ttft = "time_to_first_token_seconds"
    return Text(
        f"pauses {_labelled(metrics, 'backpressure_pauses_total', zeros=False)}"
        f"  |  cancels {_labelled(metrics, 'cancellations_total', zeros=False)}"
        f"  |  rejected {_labelled(metrics, 'admission_rejections_total', zeros=False)}"
        f"  |  preempted {_by_priority(metrics, 'preemptions_total')}"
        f"  |  tokens {generated:.0f} generated, {prompt:.0f} prompt"
        f"  |  TTFT p50 <= {_seconds(histogram_quantile(metrics, ttft, 0.5))}"
        f" p90 <= {_seconds(histogram_quantile(metrics, ttft, 0.9))}"
    )


def render_frame(
    streams: StreamsDoc, metrics: Metrics, rates: Rates, *, title: str = "edge-llm top"
) -> RenderableType:
    """The whole frame: title, engine line, streams table, totals."""
    return Group(
        Text(title, style="bold"),
        engine_line(streams, metrics, rates),
        Text(""),
        streams_table(streams, rates),
        Text(""),
        totals_line(metrics),
    )


def render_error(title: str, message: str) -> RenderableType:
    return Group(Text(title, style="bold"), Text(message, style="bold red"))
