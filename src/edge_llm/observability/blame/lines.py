"""Reading one event line: its time, its fields, its name (blame's accessors).

A line is the JSON object a log holds, untouched; a missing or mistyped field
reads as None (or 0.0 for ``ts``), never as an error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from edge_llm.observability.events import Event

LogLine = Mapping[str, Any]


def ts_of(event: LogLine) -> float:
    value = event.get("ts")
    return float(value) if isinstance(value, int | float) else 0.0


def int_of(event: LogLine | None, key: str) -> int | None:
    value = None if event is None else event.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def num_of(event: LogLine | None, key: str) -> float | None:
    value = None if event is None else event.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def name_of(event: LogLine) -> str:
    return str(event.get("event"))


def named(events: Iterable[LogLine], *names: Event) -> list[LogLine]:
    return [e for e in events if e.get("event") in names]


def first_of(events: Iterable[LogLine], *names: Event) -> LogLine | None:
    return next(iter(named(events, *names)), None)


def last_of(events: Sequence[LogLine], *names: Event) -> LogLine | None:
    found = named(events, *names)
    return found[-1] if found else None


def within(events: Iterable[LogLine], start: float, stop: float, *names: Event) -> list[LogLine]:
    return [e for e in named(events, *names) if start <= ts_of(e) <= stop]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"
