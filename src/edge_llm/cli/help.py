"""One help format for every command: each option's default shown exactly once.

An option's help either says its default itself (it contains ``(default``, e.g.
``(default: the embedded model)``) or gets `` (default: X)`` appended; options
whose default is "not given" (``None``, an off switch, an empty list) show none.
"""

from __future__ import annotations

import argparse
from typing import Any

from edge_llm.config.tree import show_default

DEFAULT_MARK = "(default"


class DefaultsOnceFormatter(argparse.HelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        if text is None or text == argparse.SUPPRESS or not action.option_strings:
            return text
        if DEFAULT_MARK in text or not_given(action.default):
            return text
        shown = show_default(action.default, action.metavar).replace("%", "%%")
        return f"{text} (default: {shown})"


def not_given(default: object) -> bool:
    """A default that means "not set" (compared by identity: 0 is a real default)."""
    return default is None or default is False or default is argparse.SUPPRESS or default == []


class HelpParser(argparse.ArgumentParser):
    """An ArgumentParser using :class:`DefaultsOnceFormatter` unless told otherwise
    (the ``parser_class`` of the subcommands), with abbreviations off: ``--max-kv-cache``
    is refused, not taken for ``--max-kv-cache-mb`` (as the same typo in TOML is)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsOnceFormatter)
        kwargs.setdefault("allow_abbrev", False)  # a typo must not pass for another flag
        super().__init__(*args, **kwargs)
