"""``--help`` of every command shows each option's default exactly once."""

from __future__ import annotations

import argparse
import re

import pytest

from edge_llm.cli.main import SUBCOMMANDS, build_parser
from edge_llm.config.tree import add_config_flags


def subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser(only=name)
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub: argparse.ArgumentParser = action.choices[name]
    return sub


def option_blocks(help_text: str) -> dict[str, str]:
    """Each option's help, whitespace collapsed, keyed by its first flag."""
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in help_text.splitlines():
        match = re.match(r"^  (-[-\w]+)", line)
        if match:
            current = blocks.setdefault(match.group(1), [])
        elif not line.startswith("   "):
            current = None  # a group title, the epilog, a blank line
        if current is not None:
            current.append(line.strip())
    return {flag: " ".join(lines) for flag, lines in blocks.items()}


def has_value(action: argparse.Action) -> bool:
    default = action.default
    return not (default is None or default is False or default == [] or action.help is None)


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_each_default_is_shown_once(name: str) -> None:
    parser = subparser(name)
    blocks = option_blocks(parser.format_help())
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        block = blocks[action.option_strings[0]]
        assert block.count("(default") <= 1, block
        assert "(default: None)" not in block
        if has_value(action) and action.dest != "help":
            assert block.count("(default") == 1, block


def test_serve_shows_the_config_defaults() -> None:
    blocks = option_blocks(subparser("serve").format_help())
    assert "(default: 256) [EDGE_LLM_MAX_KV_CACHE_MB]" in blocks["--max-kv-cache-mb"]
    assert "(default: 512) [EDGE_LLM_MAX_PROMPT_TOKENS]" in blocks["--max-prompt-tokens"]
    assert "(default: true)" in blocks["--pause-on-socket-full"]
    assert "(default: 0.3)" in blocks["--resume-threshold"]
    assert "(default: prompt_lookup)" in blocks["--speculative"]
    assert "(default: the embedded SmolLM2-135M-Instruct)" in blocks["--model-path"]


def test_config_flags_still_override_nothing_when_not_given() -> None:
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    args = parser.parse_args([])
    assert args.max_kv_cache_mb is None and args.pause_on_socket_full is None


def test_bench_shows_tuples_and_floats_plainly() -> None:
    blocks = option_blocks(subparser("bench").format_help())
    assert blocks["--concurrency"].endswith("(default: 1)")
    assert blocks["--timeout"].endswith("(default: 300)")
    storm = option_blocks(subparser("storm").format_help())
    assert storm["--prompt-tokens"].endswith("(default: 128-1024)")
    assert storm["--seed"].endswith("(default: 0)")
