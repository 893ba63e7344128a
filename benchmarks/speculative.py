"""Prompt-lookup speculation: edge-llm with and without it against llama-server plain
and with its n-gram ``--spec-type`` modes, side by side in one run.

Usage::

    make bench-deps
    .venv/bin/python benchmarks/speculative.py [--repeats 3] [--json out.json]

Scenarios (greedy; decode tok/s = (completion tokens - 1) / (last chunk - first chunk),
tokens from ``usage``, since a speculating server may send several tokens per chunk):

- ``copy1``: one stream rewrites a ~400-token passage given in its prompt, word for word;
- ``copy4``: four such streams at once, each its own passage: aggregate decode tok/s
  while all four decode;
- ``fresh``: one stream writes a story (nothing to copy): where speculation can only cost.

Every server runs for the whole comparison, KV laid out alike (4 slots with a share of
the same budget each: llama-server ``-np 4``, edge-llm ``--max-sequences 4
--no-kv-unified``, edge-llm's default; ``--edge-layout pool`` runs edge-llm with one
unified pool); scenarios run one server at a time, the order rotating per repeat.
Each repeat uses passages no earlier request used. Under the table: what else used the
CPU meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from machine import noise, own_pids, snapshot
from output import add_output_flags, header, write_outputs
from peer_servers import (
    PeerError,
    ServerProcess,
    find_llama_server,
    start_engine,
    start_llama_server,
    wait_idle,
)
from rich.console import Console
from scenarios import Context, Figures, Settings, aggregate_decode_rate, story

from edge_llm.bench.prompts import Prompt, long_text
from edge_llm.bench.publish import rich_table, table_data
from edge_llm.bench.targets import Target

PARALLEL = 4
CTX_TOKENS = 4 * 2048
COPY_SENTENCES = 24  # about 400 tokens
COPY_MAX_TOKENS = 450
FRESH_MAX_TOKENS = 256
COPY_INSTRUCTION = "Repeat the following text exactly, word for word, and nothing else:\n\n"
EDGE_LAYOUTS = {
    "slots": ["--max-sequences", str(PARALLEL), "--no-kv-unified"],
    "pool": ["--kv-unified", "--max-sequences", "32"],
}
EDGE = ["--max-prompt-tokens", "2048"]
LLAMA_MODES = ("ngram-simple", "ngram-map-k", "ngram-mod")
WIDE_OUTPUT = 180

Scenario = Callable[[Context], Awaitable[Figures]]


def passage(ctx: Context, index: int) -> Prompt:
    variant = ctx.variant * 10 + index
    text = long_text(700 + variant, COPY_SENTENCES).rsplit("\n\n", 1)[0]  # without its question
    return Prompt.user(f"copy-{variant}", COPY_INSTRUCTION + text)


async def copy_one(ctx: Context) -> Figures:
    record = await ctx.request(passage(ctx, 0), COPY_MAX_TOKENS)
    details: dict[str, object] = {
        "tokens": record.n_output_tokens,
        "prompt_tokens": record.prompt_tokens,
    }
    return Figures(record.decode_rate if record.ok else None, details)


async def copy_four(ctx: Context) -> Figures:
    records = await asyncio.gather(
        *(ctx.request(passage(ctx, i), COPY_MAX_TOKENS, i) for i in range(4))
    )
    ok = [r for r in records if r.ok]
    details: dict[str, object] = {
        "tokens": sum(r.n_output_tokens for r in ok),
        "failed": len(records) - len(ok),
    }
    return Figures(aggregate_decode_rate(list(records)), details)


async def fresh(ctx: Context) -> Figures:
    record = await ctx.request(story(ctx), FRESH_MAX_TOKENS)
    return Figures(record.decode_rate if record.ok else None, {"tokens": record.n_output_tokens})


SCENARIOS: dict[str, tuple[str, Scenario]] = {
    "copy1": ("copy a ~400-token passage, 1 stream", copy_one),
    "copy4": ("copy, 4 streams (aggregate)", copy_four),
    "fresh": ("fresh story, 1 stream", fresh),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--model", help="GGUF (default: the embedded SmolLM2-135M)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--llama-server", help="path of the llama-server binary")
    parser.add_argument("--modes", default=",".join(LLAMA_MODES), help="llama-server spec types")
    parser.add_argument(
        "--lookup-flags",
        default="",
        help="extra flags of the prompt_lookup edge-llm, space-separated",
    )
    parser.add_argument(
        "--edge-layout", choices=sorted(EDGE_LAYOUTS), default="slots",
        help="edge-llm's KV layout: 'slots' as llama-server's (the default), 'pool' one pool",
    )  # fmt: skip
    add_output_flags(parser)
    return parser.parse_args(argv)


def edge_flags(args: argparse.Namespace) -> list[str]:
    return [*EDGE_LAYOUTS[args.edge_layout], *EDGE]


def start_servers(args: argparse.Namespace, binary: str, model: str) -> dict[str, ServerProcess]:
    servers: dict[str, ServerProcess] = {}
    edge = edge_flags(args)
    servers["edge-llm off"] = start_engine(model, args.threads, [*edge, "--speculative", "off"])
    servers["edge-llm lookup"] = start_engine(
        model, args.threads, [*edge, "--speculative", "prompt_lookup", *args.lookup_flags.split()]
    )
    servers["llama plain"] = start_llama_server(binary, model, args.threads, CTX_TOKENS, PARALLEL)
    for mode in [m for m in args.modes.split(",") if m]:
        servers[f"llama {mode}"] = start_llama_server(
            binary, model, args.threads, CTX_TOKENS, PARALLEL, extra=["--spec-type", mode]
        )
    return servers


async def run_all(
    servers: dict[str, ServerProcess], repeats: int, console: Console
) -> dict[str, dict[str, list[Figures]]]:
    results: dict[str, dict[str, list[Figures]]] = {key: {} for key in SCENARIOS}
    names = list(servers)
    for repeat in range(repeats):
        order = names[repeat % len(names) :] + names[: repeat % len(names)]
        for key, (_, scenario) in SCENARIOS.items():
            for name in order:
                server = servers[name]
                ctx = Context(server, Target(name, server.root), Settings(), 0, 0)
                # The same passages for every server in a repeat: they are separate processes.
                ctx.variant = repeat * 100 + list(SCENARIOS).index(key) * 10
                figures = await scenario(ctx)
                await asyncio.to_thread(wait_idle, server)
                results[key].setdefault(name, []).append(figures)
                value = "failed" if figures.value is None else f"{figures.value:.1f}"
                console.print(f"repeat {repeat + 1}/{repeats} {key:<6} {name:<22} {value}")
    return results


def median(figures: list[Figures]) -> float | None:
    values = [f.value for f in figures if f.value is not None]
    return statistics.median(values) if values else None


def cell(figures: list[Figures]) -> str:
    values = [f.value for f in figures if f.value is not None]
    if not values:
        return "failed"
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def ratio(value: float | None, other: float | None) -> str:
    return f"{value / other:.2f}x" if value and other else "-"


def table(
    results: dict[str, dict[str, list[Figures]]], names: list[str], repeats: int
) -> dict[str, Any]:
    columns = ["scenario", *names, "lookup / llama plain", "lookup / best llama n-gram",
               "lookup / edge off"]  # fmt: skip
    rows = []
    for key, (title, _) in SCENARIOS.items():
        by_server = results[key]
        lookup = median(by_server["edge-llm lookup"])
        plain = median(by_server["llama plain"])
        best = max(
            (m for n, f in by_server.items() if n.startswith("llama ng") and (m := median(f))),
            default=None,
        )
        off = median(by_server["edge-llm off"])
        rows.append(
            [
                title,
                *(cell(by_server[name]) for name in names),
                *(ratio(lookup, other) for other in (plain, best, off)),
            ]
        )
    return table_data(f"decode tok/s, median (min-max) of {repeats}", columns, rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console() if sys.stdout.isatty() else Console(width=WIDE_OUTPUT)
    try:
        binary = find_llama_server(args.llama_server)
    except PeerError as exc:
        print(f"speculative: {exc}", file=sys.stderr)
        return 2
    from edge_llm.engine.runtime.llama_backend import default_model_path

    model = args.model or str(default_model_path())
    servers: dict[str, ServerProcess] = {}
    try:
        servers = start_servers(args, binary, model)
        started = datetime.now(UTC)
        start = snapshot()
        results = asyncio.run(run_all(servers, args.repeats, console))
        machine = noise(start, snapshot(), own_pids())
    except PeerError as exc:
        print(f"speculative: {exc}", file=sys.stderr)
        return 1
    finally:
        for server in servers.values():
            server.stop()
    summary = table(results, list(servers), args.repeats)
    setup = (
        f"model {model}, {args.threads} threads each; {' '.join(edge_flags(args))}; "
        f"lookup: --speculative prompt_lookup {args.lookup_flags}; "
        f"llama-server -np {PARALLEL} -c {CTX_TOKENS}"
    )
    console.print(rich_table(summary))
    console.print(setup)
    for line in machine.lines():
        console.print(line)
    raw = {
        "results": {
            key: {n: [{"value": f.value, **f.details} for f in fs] for n, fs in by.items()}
            for key, by in results.items()
        }
    }
    run = header("speculative", "Prompt-lookup speculation", started, machine, [setup])
    write_outputs(args, run, [summary], raw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
