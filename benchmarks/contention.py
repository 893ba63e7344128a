"""Fresh servers beside busy loops: edge-llm as ``make run`` serves it, edge-llm with
``--no-adaptive-threads``, and llama-server, side by side in one run.

Each round starts every configuration in turn, fresh, beside ``--busy`` loops
(``python3 -c 'while True: pass'``, started by this script) and sends ``--requests``
story requests one after the other (a fresh tag each, so nothing is cached;
``--tokens`` tokens at temperature 0). A request not done within ``--timeout`` seconds
counts as "no answer"; the server is then stopped. ``--quiet-rounds`` rounds follow
with no loops: what the configuration costs when nothing competes for the cores.

Then the light client (issue 49, ``light_client.py``): on the quiet machine, the same
three configurations, started once and kept running side by side, each get one
stream and then four streams started together (``--light-tokens`` each) from this
process, ``--light-rounds`` times in a rotating order; edge-llm's
``edge_llm_decode_threads`` is read every 250 ms during its 4-stream runs.

The first table: per configuration and load, the first request's time and TTFT, the
later requests' time (min–max over every server), and how many requests got no answer.
The second: the light client's throughput and ratios (``light_client.py`` says how).

    .venv/bin/python benchmarks/contention.py --rounds 5 --quiet-rounds 2 --light-rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from light_client import (
    GAUGE_PERIOD_S,
    IDLE_BEFORE_S,
    LIGHT_STREAMS,
    LightRun,
    light_json,
    light_rounds,
    light_table,
)
from machine import noise, own_pids, snapshot
from output import add_output_flags, header, write_outputs
from peer_servers import ServerProcess, find_llama_server, start_engine, start_llama_server
from rich.console import Console

from edge_llm.bench.chat_stream import RequestOptions, read_stream
from edge_llm.bench.prompts import Prompt
from edge_llm.bench.publish import rich_table, table_data
from edge_llm.bench.record import RequestRecord
from edge_llm.bench.targets import Target

STORY = "Write a very long story about a dragon and a knight."
LLAMA_PARALLEL = 4
DEFAULTS = "edge-llm (make run)"
FIXED_THREADS = "edge-llm --no-adaptive-threads"
LLAMA_CTX = 8192
COLUMNS = (
    "server", "load", "first request (s)", "its TTFT (s)", "later requests (s)", "no answer",
)  # fmt: skip


@dataclass
class Figures:
    """One configuration under one load: each server's requests, in order."""

    name: str
    load: str
    runs: list[list[RequestRecord]] = field(default_factory=list)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--rounds", type=int, default=5, help="fresh servers per configuration")
    parser.add_argument("--quiet-rounds", type=int, default=2)
    parser.add_argument("--busy", type=int, default=2, help="busy loops beside the servers")
    parser.add_argument("--requests", type=int, default=3, help="requests per server")
    parser.add_argument("--tokens", type=int, default=120)
    parser.add_argument("--timeout", type=float, default=200.0, help="seconds per request")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--llama-server", help="llama-server binary (default: found)")
    parser.add_argument(
        "--light-rounds", type=int, default=5, help="rounds of the light client (0: none)"
    )
    parser.add_argument("--light-tokens", type=int, default=160)
    add_output_flags(parser)
    return parser.parse_args(argv)


@contextmanager
def busy_loops(n: int) -> Iterator[None]:
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


async def requests(server: ServerProcess, args: argparse.Namespace) -> list[RequestRecord]:
    """``args.requests`` requests one after the other; stops at the first unanswered."""
    options = RequestOptions(max_tokens=args.tokens, timeout_s=args.timeout)
    records = []
    for index in range(args.requests):
        prompt = Prompt.user(f"story-{index}", f"[{uuid.uuid4().hex[:8]}] {STORY}")
        record = RequestRecord(server.name, 1, index, prompt.id)
        await read_stream(Target(server.name, server.root), prompt, options, record, epoch=0.0)
        records.append(record)
        if not record.ok:
            break
    return records


def run_round(
    starters: dict[str, Callable[[], ServerProcess]],
    figures: dict[tuple[str, str], Figures],
    load: str,
    args: argparse.Namespace,
) -> None:
    for name, start in starters.items():
        server = start()
        try:
            records = asyncio.run(requests(server, args))
        finally:
            server.stop()
        figures.setdefault((name, load), Figures(name, load)).runs.append(records)
        print(f"{load:>12} {name:<34} " + " ".join(_seconds(r) for r in records), flush=True)


def _seconds(record: RequestRecord) -> str:
    return f"{record.e2el:.2f}" if record.ok and record.e2el is not None else "none"


def _span(values: Sequence[float]) -> str:
    if not values:
        return "—"
    low, high = min(values), max(values)
    return f"{low:.2f}" if round(low, 2) == round(high, 2) else f"{low:.2f}–{high:.2f}"


def row(fig: Figures, args: argparse.Namespace) -> list[str]:
    answered = [[r for r in run if r.ok and r.e2el is not None] for run in fig.runs]
    first = [run[0] for run in answered if run and run[0].index == 0]
    later = [r.e2el for run in answered for r in run[1:] if r.e2el is not None]
    missing = args.requests * len(fig.runs) - sum(len(run) for run in answered)
    return [
        fig.name, fig.load,
        _span([r.e2el for r in first if r.e2el is not None]),
        _span([r.ttft for r in first if r.ttft is not None]),
        _span(later),
        f"{missing} of {args.requests * len(fig.runs)}",
    ]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    binary = find_llama_server(args.llama_server)
    from edge_llm.engine.runtime.llama_backend import default_model_path  # loads llama.cpp

    model = str(default_model_path())
    starters: dict[str, Callable[[], ServerProcess]] = {
        DEFAULTS: lambda: start_engine(model, args.threads, []),
        FIXED_THREADS: lambda: start_engine(model, args.threads, ["--no-adaptive-threads"]),
        "llama-server": lambda: start_llama_server(
            binary, model, args.threads, LLAMA_CTX, LLAMA_PARALLEL
        ),
    }
    started, start = datetime.now(UTC), snapshot()
    figures: dict[tuple[str, str], Figures] = {}
    loaded = f"{args.busy} busy loops"
    with busy_loops(args.busy):
        for _ in range(args.rounds):
            run_round(starters, figures, loaded, args)
    for _ in range(args.quiet_rounds):
        run_round(starters, figures, "quiet", args)
    light = run_light_client(starters, args) if args.light_rounds > 0 else {}
    machine = noise(start, snapshot(), own_pids())
    tables = [
        table_data(
            "Fresh servers beside busy loops", COLUMNS, [row(f, args) for f in figures.values()]
        )
    ]
    if light:
        tables.append(light_table(light, "llama-server", FIXED_THREADS, args.threads,
                                  args.light_rounds))  # fmt: skip
    for result in tables:
        Console(width=200).print(rich_table(result))
    for line in machine.lines():
        print(line)
    raw = {
        "figures": [
            {"name": f.name, "load": f.load, "runs": [[asdict(r) for r in run] for run in f.runs]}
            for f in figures.values()
        ],
        "light_client": light_json(light),
        "args": {k: v for k, v in vars(args).items() if k not in ("json", "publish")},
    }
    title = "Fresh servers beside busy loops" + (", and a light client" if light else "")
    run = header("contention", title, started, machine, notes(args, bool(light)))
    write_outputs(args, run, tables, raw)
    return 0


def run_light_client(
    starters: dict[str, Callable[[], ServerProcess]], args: argparse.Namespace
) -> dict[str, list[LightRun]]:
    """Every configuration started at once, the light client's rounds, all stopped."""
    servers: dict[str, ServerProcess] = {}
    try:
        for name, start in starters.items():
            servers[name] = start()
        return asyncio.run(
            light_rounds(servers, args.light_rounds, args.light_tokens, args.timeout,
                         lambda line: print(line, flush=True))
        )  # fmt: skip
    finally:
        for server in servers.values():
            server.stop()


def notes(args: argparse.Namespace, light: bool) -> list[str]:
    lines = [
        f"SmolLM2-135M, {args.threads} threads each; {args.rounds} fresh servers per "
        f"configuration beside {args.busy} `python3 -c 'while True: pass'` loops (this "
        f"script's own children, so not in 'other processes' below), then "
        f"{args.quiet_rounds} each on the quiet machine; {args.requests} requests per "
        f"server one after the other, {args.tokens} tokens each at temperature 0, a "
        f"unique story prompt each; no answer within {args.timeout:.0f} s counts as none "
        f"and ends that server's run. llama-server: -np {LLAMA_PARALLEL} -c {LLAMA_CTX}."
    ]
    if light:
        lines.append(
            f"Light client: the three configurations running side by side on the quiet "
            f"machine, this script the only client (in-process, on the same cores); "
            f"{args.light_rounds} rounds, the order rotating; per round and server one "
            f"stream, then {LIGHT_STREAMS} started together, {args.light_tokens} tokens each "
            f"at temperature 0, each after {IDLE_BEFORE_S:g} s idle; tok/s = completion "
            f"tokens over first request start to last token; ratios per round. The "
            f"decode_threads column: seconds from the {LIGHT_STREAMS} requests' start until "
            f"`edge_llm_decode_threads` first read {args.threads} (read every "
            f"{GAUGE_PERIOD_S * 1000:.0f} ms), median (min-max) over rounds."
        )
    return lines


if __name__ == "__main__":
    sys.exit(main())
