"""``edge-llm bench``: the same prompts against several OpenAI-compatible endpoints.

Example::

    edge-llm bench --target edge=http://127.0.0.1:8000 \\
        --target llama=http://127.0.0.1:8080/v1,model=smollm2 \\
        --prompt-set short --requests 16 --concurrency 1,4 --slow-consumer \\
        --json out.json --report out.html
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from edge_llm.bench.chat_stream import RequestOptions
from edge_llm.bench.prompts import PROMPT_SETS, PromptError, builtin_prompts, load_jsonl
from edge_llm.bench.report import write_html
from edge_llm.bench.runner import BenchConfig, BenchResult, run_bench, total_steps
from edge_llm.bench.slow_consumer import SlowConsumerSettings
from edge_llm.bench.table import tables
from edge_llm.bench.targets import (
    TargetError,
    TargetUnreachable,
    add_target_arguments,
    targets_from_args,
)

WIDE_OUTPUT = 200


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmark OpenAI-compatible endpoints side by side",
        description="Send the same prompts to every target, taking turns (A, B, A, B ...), "
        "and report TTFR, TTFT, ITL, TPOT, E2EL, decode rate, throughput and errors per "
        "target and concurrency level.",
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text}")
    return value


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated integers expected: {text}") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"concurrency levels must be >= 1: {text}")
    return levels


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--prompts", metavar="FILE", help="JSONL prompts (prompt or messages)")
    source.add_argument(
        "--prompt-set",
        choices=PROMPT_SETS,
        default="short",
        help="built-in prompts (long: ~1,000 tokens; an edge-llm engine needs "
        "--max-prompt-tokens 2048 for it)",
    )
    parser.add_argument("--requests", type=int, default=8, help="requests per target and level")
    parser.add_argument("--concurrency", type=_levels, default=(1,), help="levels, e.g. 1,2,4")
    parser.add_argument("--max-tokens", type=_positive_int, default=64, help="per request")
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="sampling temperature; 0 is greedy"
    )
    parser.add_argument("--warmup", type=int, default=1, help="warm-up requests per target")
    parser.add_argument("--timeout", type=float, default=300.0, help="per request (s)")
    parser.add_argument("--no-usage", action="store_true", help="do not ask for usage chunks")
    parser.add_argument(
        "--verbatim-prompts",
        action="store_true",
        help="send prompts unchanged (default: each starts with a unique [tag] so that no "
        "server answers a repeated prompt from its prompt cache)",
    )
    slow = parser.add_argument_group("slow consumer")
    slow.add_argument("--slow-consumer", action="store_true", help="run the stalled-reader probe")
    slow.add_argument("--stall-after", type=_positive_int, default=8, help="chunks before stall")
    slow.add_argument("--stall-seconds", type=float, default=4.0, help="how long to stop reading")
    slow.add_argument("--rcvbuf", type=_positive_int, default=4096, help="SO_RCVBUF (bytes)")
    slow.add_argument(
        "--slow-max-tokens", type=_positive_int, default=400, help="max_tokens of the probe"
    )
    slow.add_argument(
        "--stall-until-paused",
        action="store_true",
        help="keep stalling an edge-llm target until /debug/streams shows the pause "
        "(at most --max-stall-seconds); other targets stall --stall-seconds",
    )
    slow.add_argument(
        "--max-stall-seconds", type=float, default=60.0, help="bound for --stall-until-paused"
    )
    parser.add_argument("--json", metavar="OUT", help="write config, records and summaries")
    parser.add_argument("--report", metavar="OUT.html", help="write the HTML report")


def build_config(args: argparse.Namespace) -> BenchConfig:
    """The run's configuration; raises TargetError, PromptError or ValueError."""
    targets = targets_from_args(args, os.environ)
    if args.prompts:
        prompts, source = load_jsonl(args.prompts), args.prompts
    else:
        prompts, source = builtin_prompts(args.prompt_set), args.prompt_set
    if args.requests < 0 or args.warmup < 0:
        raise ValueError("--requests and --warmup must be >= 0")
    if args.stall_seconds <= 0 or args.timeout <= 0:
        raise ValueError("--stall-seconds and --timeout must be > 0")
    slow = None
    if args.slow_consumer:
        slow = SlowConsumerSettings(
            rcvbuf=args.rcvbuf,
            stall_after_chunks=args.stall_after,
            stall_s=args.stall_seconds,
            max_tokens=args.slow_max_tokens,
            until_paused=args.stall_until_paused,
            max_stall_s=max(args.max_stall_seconds, args.stall_seconds),
        )
    options = RequestOptions(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        include_usage=not args.no_usage,
        timeout_s=args.timeout,
    )
    return BenchConfig(
        targets=tuple(targets),
        prompts=tuple(prompts),
        prompt_source=source,
        requests=args.requests,
        concurrency=args.concurrency,
        warmup=args.warmup,
        options=options,
        slow_consumer=slow,
        unique_prompts=not args.verbatim_prompts,
    )


def run(args: argparse.Namespace) -> int:
    # Piped or redirected output keeps whole tables instead of wrapping them at 80 columns.
    console = Console() if sys.stdout.isatty() else Console(width=WIDE_OUTPUT)
    try:
        config = build_config(args)
    except (TargetError, PromptError, ValueError) as exc:
        print(f"edge-llm bench: {exc}", file=sys.stderr)
        return 2
    try:
        result = _run_with_progress(config, Console(stderr=True))
    except TargetUnreachable as exc:
        print(f"edge-llm bench: {exc}", file=sys.stderr)
        return 1
    for table in tables(result):
        console.print(table)
    for found in result.slow_consumer:
        console.print(f"[bold]{found.target}[/bold]: {found.verdict}; {found.memory_note}")
    return _write_outputs(result, args, console)


def _run_with_progress(config: BenchConfig, console: Console) -> BenchResult:
    columns = (
        TextColumn("{task.description:<28}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("bench", total=total_steps(config))

        def advance(description: str) -> None:
            progress.update(task, advance=1, description=description)

        return asyncio.run(run_bench(config, on_progress=advance))


def _write_outputs(result: BenchResult, args: argparse.Namespace, console: Console) -> int:
    try:
        if args.json:
            result.write_json(args.json)
            console.print(f"JSON written to {args.json}")
        if args.report:
            write_html(result, args.report)
            console.print(f"report written to {args.report}")
    except OSError as exc:
        print(f"edge-llm bench: cannot write output: {exc}", file=sys.stderr)
        return 1
    return 0
