"""The stream states in docs/architecture.md are what the stream rules generate."""

from __future__ import annotations

from pathlib import Path

from edge_llm.protocol.stream_rules import TRANSITIONS
from edge_llm.protocol.stream_rules_table import generated_part, render

PAGE = Path(__file__).parents[2] / "docs" / "architecture.md"
REGENERATE = "python -m edge_llm.protocol.stream_rules_table --write docs/architecture.md"


def test_the_page_holds_what_the_rules_render_now() -> None:
    part = generated_part(PAGE.read_text(encoding="utf-8"))
    assert part, f"docs/architecture.md has no stream-states markers; run {REGENERATE}"
    assert part == render(), f"the stream states changed; run {REGENERATE}"


def test_every_move_is_a_row() -> None:
    rows = [line for line in render().splitlines() if line.startswith("| `")]
    assert len(rows) == len(TRANSITIONS)
