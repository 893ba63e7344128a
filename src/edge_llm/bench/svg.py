"""Tiny inline-SVG charts for the HTML report (no scripts, no external assets).

- :func:`line_chart`: several (x, y) series on linear axes, with optional shaded
  x-windows (used for distributions as ECDF steps and for sampled values over time);
- :func:`timeline`: one lane per request with a tick per chunk arrival and shaded
  windows (client stall, server pause).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

# The stylesheet of the HTML reports (bench and storm) these charts go into.
REPORT_CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px}h2{font-size:18px;margin-top:32px}h3{font-size:15px}
table{border-collapse:collapse;margin:8px 0 16px}
td,th{border:1px solid #ccc;padding:3px 7px;font-size:13px;text-align:right}
td:first-child,th:first-child,td.text{text-align:left}
.note{color:#555;font-size:13px}
svg{display:block;margin:8px 0 16px;background:#fff}
svg .grid{stroke:#e4e4e4;stroke-width:1}
svg text{font-size:11px;fill:#333}
svg .tick{text-anchor:middle}svg .ytick{text-anchor:end}
svg .label{text-anchor:middle;fill:#555}svg .title{font-weight:bold;font-size:12px}
svg .lane{text-anchor:end;font-size:10px}svg .failed{fill:#d62728}
.key span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;opacity:.6}
"""

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b")
WINDOW_COLORS = {
    "stall": "#bbbbbb",
    "pause": "#ffb347",
    "burst": "#7fc97f",
    # storm outcomes
    "completed": "#7fc97f",
    "abandoned": "#ffb347",
    "superseded": "#bbbbbb",
    "failed": "#e06666",
}
MARGIN_LEFT = 64
MARGIN_RIGHT = 16
MARGIN_TOP = 28
MARGIN_BOTTOM = 40
LANE_HEIGHT = 14
LABEL_WIDTH = 150
LEGEND_MIN_WIDTH = 150
LEGEND_CHAR_WIDTH = 6.2


def color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


@dataclass(frozen=True, slots=True)
class Window:
    """A shaded x-range: ``kind`` is ``stall``, ``pause`` or ``burst``."""

    start: float
    end: float
    kind: str
    label: str = ""


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    points: Sequence[tuple[float, float]]
    color: str
    step: bool = False
    dots: bool = False  # a scatter: one dot per point, no line


@dataclass(frozen=True, slots=True)
class Lane:
    """One timeline row: chunk arrival ``ticks`` and shaded ``windows``."""

    label: str
    ticks: Sequence[float]
    color: str
    windows: Sequence[Window] = field(default_factory=tuple)
    failed: bool = False


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values from at or below ``low`` to at or above ``high``."""
    if high <= low:
        high = low + 1.0
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.floor(low / step) * step
    last = math.ceil(high / step - 1e-9) * step
    n = round((last - first) / step)
    return [round(first + i * step, 10) for i in range(n + 1)]


def _line(x1: float, y1: float, x2: float, y2: float) -> str:
    return f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" class="grid"/>'


def _text(x: float, y: float, css: str, text: str) -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" class="{css}">{escape(text)}</text>'


def _fmt(value: float) -> str:
    return f"{value:g}" if abs(value) < 1e5 else f"{value:.3g}"


class _Axes:
    """Maps data coordinates into the plot area of a width x height SVG."""

    def __init__(self, width: int, height: int, x_max: float, y_max: float) -> None:
        self.width, self.height = width, height
        self.x_ticks = nice_ticks(0.0, x_max)
        self.y_ticks = nice_ticks(0.0, y_max)
        self.x_max = max(self.x_ticks[-1], 1e-9)
        self.y_max = max(self.y_ticks[-1], 1e-9)

    def x(self, value: float) -> float:
        span = self.width - MARGIN_LEFT - MARGIN_RIGHT
        return MARGIN_LEFT + span * min(max(value, 0.0), self.x_max) / self.x_max

    def y(self, value: float) -> float:
        span = self.height - MARGIN_TOP - MARGIN_BOTTOM
        return self.height - MARGIN_BOTTOM - span * min(max(value, 0.0), self.y_max) / self.y_max

    def grid(self, x_label: str, y_label: str) -> list[str]:
        parts = []
        bottom, top = self.height - MARGIN_BOTTOM, MARGIN_TOP
        for tick in self.x_ticks:
            x = self.x(tick)
            parts.append(_line(x, top, x, bottom))
            parts.append(_text(x, bottom + 14, "tick", _fmt(tick)))
        for tick in self.y_ticks:
            y = self.y(tick)
            right = self.width - MARGIN_RIGHT
            parts.append(
                f'<line x1="{MARGIN_LEFT}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" class="grid"/>'
            )
            parts.append(
                f'<text x="{MARGIN_LEFT - 4}" y="{y + 4:.1f}" class="ytick">{_fmt(tick)}</text>'
            )
        parts.append(
            f'<text x="{(MARGIN_LEFT + self.width) / 2:.0f}" y="{self.height - 6}" '
            f'class="label">{escape(x_label)}</text>'
        )
        parts.append(
            f'<text x="12" y="{(self.height) / 2:.0f}" class="label" '
            f'transform="rotate(-90 12 {self.height / 2:.0f})">{escape(y_label)}</text>'
        )
        return parts


def _svg(width: int, height: int, title: str, body: list[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img"><title>{escape(title)}</title>'
        f'<text x="{MARGIN_LEFT}" y="16" class="title">{escape(title)}</text>'
        + "".join(body)
        + "</svg>"
    )


def _polyline(axes: _Axes, series: Series) -> str:
    if series.dots:
        return _dots(axes, series)
    coords: list[str] = []
    previous: tuple[float, float] | None = None
    for x, y in series.points:
        if series.step and previous is not None:
            coords.append(f"{axes.x(x):.1f},{axes.y(previous[1]):.1f}")
        coords.append(f"{axes.x(x):.1f},{axes.y(y):.1f}")
        previous = (x, y)
    return (
        f'<polyline fill="none" stroke="{series.color}" stroke-width="1.6" '
        f'points="{" ".join(coords)}"><title>{escape(series.name)}</title></polyline>'
    )


def _dots(axes: _Axes, series: Series) -> str:
    circles = "".join(
        f'<circle cx="{axes.x(x):.1f}" cy="{axes.y(y):.1f}" r="2.2"/>' for x, y in series.points
    )
    return (
        f'<g fill="{series.color}" opacity="0.75"><title>{escape(series.name)}</title>{circles}</g>'
    )


def _legend(series: Sequence[Series], width: int) -> list[str]:
    parts = []
    longest = max((len(item.name) for item in series), default=0)
    x = width - MARGIN_RIGHT - max(LEGEND_MIN_WIDTH, 20 + LEGEND_CHAR_WIDTH * longest)
    for i, item in enumerate(series):
        y = MARGIN_TOP + 12 + 14 * i
        parts.append(f'<rect x="{x}" y="{y - 8}" width="10" height="10" fill="{item.color}"/>')
        parts.append(f'<text x="{x + 14}" y="{y + 1}" class="legend">{escape(item.name)}</text>')
    return parts


def _window_rect(axes: _Axes, window: Window, top: float, height: float) -> str:
    x0, x1 = axes.x(window.start), axes.x(window.end)
    fill = WINDOW_COLORS.get(window.kind, "#dddddd")
    label = escape(window.label or window.kind)
    return (
        f'<rect x="{x0:.1f}" y="{top:.1f}" width="{max(x1 - x0, 1.0):.1f}" '
        f'height="{height:.1f}" fill="{fill}" opacity="0.45"><title>{label}</title></rect>'
    )


def line_chart(
    title: str,
    series: Sequence[Series],
    *,
    x_label: str,
    y_label: str,
    windows: Sequence[Window] = (),
    width: int = 640,
    height: int = 260,
) -> str:
    """Series on linear axes starting at 0; ``windows`` shade x-ranges behind them."""
    xs = [x for s in series for x, _ in s.points] + [w.end for w in windows]
    ys = [y for s in series for _, y in s.points]
    axes = _Axes(width, height, max(xs, default=1.0), max(ys, default=1.0))
    plot_height = height - MARGIN_TOP - MARGIN_BOTTOM
    body = [_window_rect(axes, w, MARGIN_TOP, plot_height) for w in windows]
    body += axes.grid(x_label, y_label)
    body += [_polyline(axes, s) for s in series if s.points]
    body += _legend(series, width)
    return _svg(width, height, title, body)


def ecdf_points(values: Sequence[float], scale: float = 1.0) -> list[tuple[float, float]]:
    """Empirical CDF as step points: (value x scale, fraction of values <= it)."""
    ordered = sorted(values)
    n = len(ordered)
    points = [(ordered[0] * scale, 0.0)] if ordered else []
    points += [(v * scale, (i + 1) / n) for i, v in enumerate(ordered)]
    return points


def timeline(title: str, lanes: Sequence[Lane], *, x_label: str, width: int = 900) -> str:
    """A lane per request: a tick per chunk arrival, shaded windows, failed lanes in red."""
    height = MARGIN_TOP + MARGIN_BOTTOM + LANE_HEIGHT * max(len(lanes), 1)
    x_max = max(
        [t for lane in lanes for t in lane.ticks] + [w.end for lane in lanes for w in lane.windows],
        default=1.0,
    )
    axes = _TimelineAxes(width, height, x_max)
    body = axes.grid(x_label)
    for row, lane in enumerate(lanes):
        body += _lane(axes, row, lane)
    return _svg(width, height, title, body)


class _TimelineAxes(_Axes):
    """Like :class:`_Axes` but the plot starts after a column of lane labels."""

    def __init__(self, width: int, height: int, x_max: float) -> None:
        super().__init__(width, height, x_max, 1.0)

    def x(self, value: float) -> float:
        span = self.width - LABEL_WIDTH - MARGIN_RIGHT
        return LABEL_WIDTH + span * min(max(value, 0.0), self.x_max) / self.x_max

    def grid(self, x_label: str, y_label: str = "") -> list[str]:
        parts = []
        bottom = self.height - MARGIN_BOTTOM
        for tick in self.x_ticks:
            x = self.x(tick)
            parts.append(
                f'<line x1="{x:.1f}" y1="{MARGIN_TOP}" x2="{x:.1f}" y2="{bottom}" class="grid"/>'
            )
            parts.append(f'<text x="{x:.1f}" y="{bottom + 14}" class="tick">{_fmt(tick)}</text>')
        parts.append(
            f'<text x="{(LABEL_WIDTH + self.width) / 2:.0f}" y="{self.height - 6}" '
            f'class="label">{escape(x_label)}</text>'
        )
        return parts


def _lane(axes: _TimelineAxes, row: int, lane: Lane) -> list[str]:
    top = MARGIN_TOP + row * LANE_HEIGHT
    middle = top + LANE_HEIGHT / 2
    parts = [_window_rect(axes, w, top + 1, LANE_HEIGHT - 2) for w in lane.windows]
    label_class = "lane failed" if lane.failed else "lane"
    parts.append(
        f'<text x="{LABEL_WIDTH - 6}" y="{middle + 4:.1f}" class="{label_class}">'
        f"{escape(lane.label)}</text>"
    )
    path = "".join(f"M{axes.x(t):.1f} {top + 2:.1f}v{LANE_HEIGHT - 4}" for t in lane.ticks)
    if path:
        parts.append(f'<path d="{path}" stroke="{lane.color}" stroke-width="1"/>')
    return parts
