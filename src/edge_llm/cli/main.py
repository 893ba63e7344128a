"""The ``edge-llm`` command: one module per subcommand."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from edge_llm import __version__
from edge_llm.cli.help import HelpParser

# Each module exposes register(subparsers), which sets ``func`` to its run(args) -> int.
SUBCOMMANDS = (
    "serve", "pull", "list", "rm", "chat", "bench", "storm", "doctor", "blame", "top", "config",
)  # fmt: skip
# Where a subcommand lives when its module is not named after it (``pull`` holds the
# model store's three commands).
_MODULES = {"config": "config_cmd", "list": "pull", "rm": "pull"}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """All subcommands, or just ``only``: ``serve`` need not import the bench or TUI code."""
    parser = HelpParser(
        prog="edge-llm",
        description="On-device LLM streaming engine with a token backpressure contract.",
    )
    parser.add_argument("--version", action="version", version=f"edge-llm {__version__}")
    subparsers = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=HelpParser
    )
    names = (only,) if only in SUBCOMMANDS else SUBCOMMANDS
    for module_name in dict.fromkeys(_MODULES.get(name, name) for name in names):
        module = importlib.import_module(f"edge_llm.cli.{module_name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    first = arguments[0] if arguments else None
    args = build_parser(only=first).parse_args(arguments)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
