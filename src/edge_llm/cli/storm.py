"""``edge-llm storm``: simulated users who regenerate, abandon and read slowly.

Example::

    edge-llm storm --target edge=http://127.0.0.1:8000 \\
        --target llama=http://127.0.0.1:8080 --pid edge=1234 --pid llama=5678 \\
        --users 16 --duration 60 --json storm.json --report storm.html

Beside the interactive users, ``--batch-users`` (default 2) run a background batch with
``priority: --batch-priority``; ``--no-priorities`` runs the same load in one class.
Without ``--prompt-tokens`` the prompts stay within the smallest ``max_prompt_tokens``
an edge-llm target reports. Exit status: 0; 1 when a request met a server error (a 5xx
other than 503, or one inside a 200 stream: ``stats.is_server_error``), or a target was
unreachable, or the output could not be written; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable

from rich.console import Console
from rich.live import Live
from rich.table import Table

from edge_llm.bench.storm import (
    OUTCOMES,
    LiveState,
    StormConfig,
    StormResult,
    StormSettings,
    StormSettingsError,
    class_table,
    run_storm,
    storm_table,
    write_html,
)
from edge_llm.bench.targets import (
    TargetError,
    TargetUnreachable,
    add_target_arguments,
    targets_from_args,
)
from edge_llm.config.tree import show_default
from edge_llm.observability.units import MIB, mib

WIDE_OUTPUT = 220
BATCH_USERS = 2  # the command's default; the library's StormSettings has none


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "storm",
        help="regenerate storm: users who lose patience, abandon and read slowly",
        description="Simulated users send prompts of 128-1,024 tokens (fewer where a target "
        "admits less); a user whose first "
        "token does not come within its patience presses regenerate (same prompt, same "
        "X-Session-Id); some abandon streams mid-way, some read slowly through a small "
        "receive buffer. Beside them a background batch runs one job after another at a "
        "less urgent priority. Targets take turns under the same seeded load.",
        epilog="Exit status 1 when any request met a server error: a 5xx other than 503 "
        "(retried after Retry-After), or one inside a 200 stream.",
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def parse_range(cast: Callable[[str], float]) -> Callable[[str], tuple[float, float]]:
    def parse(text: str) -> tuple[float, float]:
        low, sep, high = text.partition("-")
        try:
            values = (cast(low), cast(high)) if sep else (cast(text), cast(text))
        except ValueError:
            raise argparse.ArgumentTypeError(f"LOW-HIGH or one value expected: {text}") from None
        if values[0] > values[1]:
            raise argparse.ArgumentTypeError(f"LOW must not exceed HIGH: {text}")
        return values

    return parse


def _pid(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value.strip().isdigit():
        raise argparse.ArgumentTypeError(f"--pid must be NAME=PID: {text}")
    return name.strip(), int(value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = StormSettings()
    add_target_arguments(parser)
    parser.add_argument("--pid", action="append", type=_pid, default=[], metavar="NAME=PID",
                        help="server process of a target here: peak RSS")  # fmt: skip
    parser.add_argument("--users", type=int, default=d.users, help="simulated users")
    parser.add_argument("--duration", type=float, default=d.duration_s, help="seconds per run")
    parser.add_argument("--rounds", type=int, default=1, help="runs per target, order rotating")
    parser.add_argument("--seed", type=int, default=d.seed, help="seed of users and prompts")
    load = parser.add_argument_group("load model")
    load.add_argument("--prompt-tokens", type=parse_range(int), metavar="LOW-HIGH",
                      help="prompt length range (tokens), by default lowered to the smallest "
                      "max_prompt_tokens an edge-llm target reports (default: "
                      f"{show_default(d.prompt_tokens, 'LOW-HIGH')})")  # fmt: skip
    load.add_argument("--max-tokens", type=int, default=d.max_tokens, help="per request")
    load.add_argument("--patience", type=parse_range(float), default=d.patience_s,
                      metavar="LOW-HIGH", help="seconds before a regenerate")  # fmt: skip
    load.add_argument("--max-regenerates", type=int, default=d.max_regenerates,
                      help="per turn; the last waits up to --timeout")  # fmt: skip
    load.add_argument("--abandon-share", type=float, default=d.abandon_share,
                      help="share of turns closed mid-stream")  # fmt: skip
    load.add_argument("--abandon-after", type=parse_range(int), default=d.abandon_after_tokens,
                      metavar="LOW-HIGH", help="tokens read before abandoning")  # fmt: skip
    load.add_argument("--slow-share", type=float, default=d.slow_share,
                      help="share of users who render slowly")  # fmt: skip
    load.add_argument("--slow-rate", type=float, default=d.slow_tokens_per_s,
                      help="tokens per second a slow user reads")  # fmt: skip
    load.add_argument("--slow-rcvbuf", type=int, default=d.slow_rcvbuf,
                      help="SO_RCVBUF of slow users' sockets (bytes)")  # fmt: skip
    load.add_argument("--think", type=parse_range(float), default=d.think_s, metavar="LOW-HIGH",
                      help="seconds between a user's turns")  # fmt: skip
    load.add_argument("--timeout", type=float, default=d.timeout_s, help="per request (s)")
    load.add_argument("--batch-users", type=int, default=BATCH_USERS,
                      help="background jobs run one after another, beside the users")  # fmt: skip
    load.add_argument("--batch-priority", type=int, default=d.batch_priority,
                      help="the batch's priority (lower first; users send none: 0)")  # fmt: skip
    load.add_argument("--priorities", action=argparse.BooleanOptionalAction,
                      default=d.priorities,
                      help="send the batch's priority (no: same load, one class)")  # fmt: skip
    parser.add_argument("--ttft-slo-ms", type=float, default=d.ttft_slo_ms,
                        help="goodput counts completed requests with TTFT within this")  # fmt: skip
    parser.add_argument("--sample-interval", type=float, default=0.5,
                        help="seconds between looks at the server")  # fmt: skip
    parser.add_argument("--json", metavar="OUT", help="write config, records, samples, summaries")
    parser.add_argument("--report", metavar="OUT.html", help="write the HTML report")


def build_config(args: argparse.Namespace) -> StormConfig:
    """Raises TargetError, StormSettingsError or ValueError with a clear message."""
    targets = targets_from_args(args, os.environ)
    pids = dict(args.pid)
    unknown = set(pids) - {t.name for t in targets}
    if unknown:
        raise ValueError(f"--pid names no target: {', '.join(sorted(unknown))}")
    if args.rounds < 1 or args.sample_interval <= 0:
        raise ValueError("--rounds must be >= 1 and --sample-interval > 0")
    settings = StormSettings(
        users=args.users,
        duration_s=args.duration,
        prompt_tokens=args.prompt_tokens or StormSettings().prompt_tokens,
        fit_prompts=args.prompt_tokens is None,
        batch_users=args.batch_users,
        batch_priority=args.batch_priority,
        priorities=args.priorities,
        max_tokens=args.max_tokens,
        patience_s=args.patience,
        max_regenerates=args.max_regenerates,
        abandon_share=args.abandon_share,
        abandon_after_tokens=args.abandon_after,
        slow_share=args.slow_share,
        slow_tokens_per_s=args.slow_rate,
        slow_rcvbuf=args.slow_rcvbuf,
        think_s=args.think,
        ttft_slo_ms=args.ttft_slo_ms,
        timeout_s=args.timeout,
        seed=args.seed,
    )
    settings.check()
    return StormConfig(tuple(targets), settings, args.rounds, pids, args.sample_interval)


def run(args: argparse.Namespace) -> int:
    console = Console() if sys.stdout.isatty() else Console(width=WIDE_OUTPUT)
    try:
        config = build_config(args)
    except (TargetError, StormSettingsError, ValueError) as exc:
        print(f"edge-llm storm: {exc}", file=sys.stderr)
        return 2
    try:
        result = run_with_live_view(config, Console(stderr=True))
    except TargetUnreachable as exc:
        print(f"edge-llm storm: {exc}", file=sys.stderr)
        return 1
    console.print(storm_table(result))
    if config.settings.batch_users:
        console.print(class_table(result))
    fitted = result.config.settings.prompt_tokens
    if fitted != config.settings.prompt_tokens:
        low, high = fitted
        console.print(f"prompts of {low}-{high} tokens: within the targets' max_prompt_tokens")
    try:
        if args.json:
            result.write_json(args.json)
            console.print(f"JSON written to {args.json}")
        if args.report:
            write_html(result, args.report)
            console.print(f"report written to {args.report}")
    except OSError as exc:
        print(f"edge-llm storm: cannot write output: {exc}", file=sys.stderr)
        return 1
    return report_server_errors(result)


def report_server_errors(result: StormResult) -> int:
    """1 (with the kinds, per target) when a request met a server error: a 5xx other
    than a 503, which the users retry; else 0."""
    failing = {s.target: s.server_errors for s in result.summaries if s.server_errors}
    for target, errors in failing.items():
        kinds = ", ".join(f"{kind} x{n}" for kind, n in errors.items())
        print(f"edge-llm storm: {target}: server errors: {kinds}", file=sys.stderr)
    return 1 if failing else 0


def run_with_live_view(config: StormConfig, console: Console) -> StormResult:
    with Live(live_table(LiveState(), config), console=console, transient=True) as live:

        def update(state: LiveState) -> None:
            live.update(live_table(state, config))

        return asyncio.run(run_storm(config, on_update=update))


def live_table(state: LiveState, config: StormConfig) -> Table:
    """The live view: per target its outcome counters and the last look at its server."""
    duration = config.settings.duration_s
    title = f"storm  round {state.round + 1}/{config.rounds}  {state.target or '-'}  "
    title += f"{state.elapsed_s:5.1f}/{duration:g} s"
    table = Table(title=title, title_justify="left")
    for header in ("target", "started", "live", *OUTCOMES, "KV MiB", "run/wait/paused", "RSS MiB"):
        table.add_column(header, justify="left" if header == "target" else "right")
    for name, counters in state.counters.items():
        sample = state.last_sample.get(name)
        kv = rss = peaks = "-"
        if sample is not None:
            kv = "-" if sample.kv_used_bytes is None else mib(sample.kv_used_bytes)
            rss = "-" if sample.rss_bytes is None else f"{sample.rss_bytes / MIB:.0f}"
            peaks = "/".join(
                "-" if v is None else str(v)
                for v in (sample.running, sample.waiting, sample.paused)
            )
        outcomes = [str(counters.outcomes[o]) for o in OUTCOMES]
        table.add_row(name, str(counters.started), str(counters.live), *outcomes, kv, peaks, rss)
    return table
