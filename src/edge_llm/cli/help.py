"""One help format for every command: each option's default shown exactly once.

An option's help either says its default itself (it contains ``(default``, e.g.
``(default: the embedded model)``) or gets `` (default: X)`` appended; options
whose default is "not given" (``None``, an off switch, an empty list) show none.
"""

from __future__ import annotations

import argparse
from typing import Any

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


def show_default(value: object, metavar: object = None) -> str:
    """``300.0`` as ``300``, ``(128, 1024)`` as ``128-1024`` for a LOW-HIGH option,
    ``(1,)`` as ``1``; booleans, None and lists as the TOML config reads."""
    if value is None or isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple | list):
        separator = "-" if metavar == "LOW-HIGH" else ","
        return separator.join(show_default(item) for item in value) or "none"
    return str(value)


class HelpParser(argparse.ArgumentParser):
    """An ArgumentParser using :class:`DefaultsOnceFormatter` unless told otherwise
    (the ``parser_class`` of the subcommands)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsOnceFormatter)
        super().__init__(*args, **kwargs)
