"""A request's priority class, lower first: the range every layer holds requests to
(request fields, the X-Priority header, the configured defaults; the engine orders
its queue by it), and the configured defaults' ``NAME=N`` entries."""

from __future__ import annotations

import re

MIN_PRIORITY, MAX_PRIORITY = -10, 10
# The routes that start a generation, which ``route_priority`` may name.
PRIORITY_ROUTES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
    "/v1/stream",
    "/api/chat",
    "/api/generate",
)


def priority_map(entries: list[str], name: str) -> dict[str, int]:
    """``NAME=N`` entries as a mapping; ValueError naming the first bad entry. The
    number is after the last ``=`` (a key may hold ``=``)."""
    result: dict[str, int] = {}
    for entry in entries:
        what, _, number = entry.rpartition("=")
        value = parse_priority(number)
        if not what.strip() or value is None:
            raise ValueError(
                f"entry {entry!r} is not {name}=N with N an integer from "
                f"{MIN_PRIORITY} to {MAX_PRIORITY}"
            )
        result[what.strip()] = value
    return result


def parse_priority(text: str) -> int | None:
    """``text`` as a priority class (ASCII digits, in range), else None."""
    text = text.strip()
    if re.fullmatch(r"[+-]?[0-9]{1,3}", text) is None:
        return None
    value = int(text)
    return value if MIN_PRIORITY <= value <= MAX_PRIORITY else None
