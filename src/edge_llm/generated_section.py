"""A section of a docs page generated from the code, between two marker lines: found,
printed and rewritten in one place for every generator (the configuration reference,
the stream states table), so a test can compare the page with what the code renders."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def marked_part(page: str, begin: str, end: str) -> str:
    """The text between the markers, markers included ('' when they are missing)."""
    start, stop = page.find(begin), page.find(end)
    return page[start : stop + len(end)] if 0 <= start < stop else ""


def main(
    render: Callable[[], str], begin: str, end: str, description: str | None,
    argv: list[str] | None = None,
) -> int:  # fmt: skip
    """Print the rendered section, or with ``--write PAGE`` replace it in the page."""
    parser = argparse.ArgumentParser(description=description, allow_abbrev=False)
    parser.add_argument("--write", metavar="PAGE", help="replace the generated part of this page")
    args = parser.parse_args(argv)
    if args.write is None:
        print(render())
        return 0
    path = Path(args.write)
    page = path.read_text(encoding="utf-8")
    old = marked_part(page, begin, end)
    if not old:
        print(f"{path}: no '{begin}' ... '{end}' markers", file=sys.stderr)
        return 1
    path.write_text(page.replace(old, render()), encoding="utf-8")
    return 0
