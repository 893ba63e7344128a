"""edge-llm against llama.cpp's own ``llama-server``: same GGUF, same threads, side by side.

Usage::

    make bench-deps                      # builds llama-server with this host's CPU flags
    .venv/bin/python benchmarks/vs_llama_server.py [--repeats 3] [--json out.json]

edge-llm runs the configuration ``make run`` serves (the per-slot layout, 4 slots,
prefix cache and speculation on; only ``--max-prompt-tokens`` raised for the 950-token
prompts), llama-server ``-np 4`` with the same KV budget; ``--edge-layout pool`` runs
edge-llm with one unified pool instead. Both servers run for the whole comparison;
scenarios run one server at a time, alternating which goes first in each repeat, so
machine noise hits both alike.

Two states (``--states``): *fresh*, just started; *steady*, after each server has
served the same traffic (``scenarios.serve_traffic``: 24 distinct ~400-token prompts
and 8 regenerates), the state of a server that has run for a minute. The steady
state measures decode, 4 streams, cold TTFT and regenerate TTFT again. The table
gives each server's median (min-max over repeats) and the ratio edge-llm /
llama-server per repeat as min / median / max; a second table edge-llm's steady /
fresh ratio.

Scenarios (docs/design.md §9 goals in brackets):

- single-stream decode tok/s [>= 1.0x];
- 4 concurrent streams, aggregate decode tok/s while all four decode [>= 1.2x] (the
  JSON also has the rate from the first first-token and the overall throughput);
- 3 fast readers + 1 stalled reader: the fast readers' aggregate beside the stalled one
  over their aggregate alone, per server [edge-llm >= 0.95];
- TTFT of a short request while a ~1,000-token prompt is being prefilled [lower is better];
- prefill tok/s of a ~500-token prompt;
- cold TTFT of a lone request with a unique prompt of ~150, 270, 500 and 950 tokens [<= 1.0x];
- TTFT of a ~480-token prompt sent again at once (regenerate) [<= 0.5x];
- ITL p99 of 3 decoding streams while a ~1,000-token prompt prefills (the JSON has
  their median ITL then and before, and the long prompt's TTFT);
- peak RSS under a 200-connection flood over model size + KV budget + 150 MB [<= 1.0].

The machine is shared: under the table, the CPU time other processes used during the
run (and the busiest of them) and the load average, so a reader can judge the noise.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from machine import noise, own_pids, snapshot
from output import add_output_flags, header, write_outputs
from peer_servers import (
    PeerError,
    ServerProcess,
    find_llama_server,
    get_json,
    start_engine,
    start_llama_server,
    wait_idle,
)
from rich.console import Console
from scenarios import (
    COLD_SENTENCES,
    Context,
    Figures,
    Scenario,
    Settings,
    cold_ttft,
    concurrent_decode,
    flood_rss,
    itl_during_prefill,
    prefill_rate,
    regenerate_ttft,
    serve_traffic,
    single_decode,
    stalled_reader,
    ttft_under_prefill,
)

from edge_llm.bench.publish import rich_table, table_data
from edge_llm.bench.targets import Target

PARALLEL = 4
SLOT_CTX = 2048
# How edge-llm lays out its KV cache. "default": what make run serves (4 slots, each its
# own share of the budget, as llama-server -np PARALLEL); "pool": 32 sequences sharing
# one pool, where one sequence may use all of it.
EDGE_LAYOUTS = {
    "default": [],
    "pool": ["--kv-unified", "--max-sequences", "32"],
}
# Scenarios measured again after the traffic (docs: steady state).
STEADY_KEYS = ("decode1", "decode4", "cold150", "cold500", "cold950", "regen")
MAX_PROMPT_TOKENS = 2048
WIDE_OUTPUT = 160
SCENARIO_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class ScenarioSpec:
    key: str
    title: str
    unit: str
    goal: str
    run: Scenario


SCENARIOS = (
    ScenarioSpec("decode1", "single-stream decode", "tok/s", ">= 1.0x", single_decode),
    ScenarioSpec("decode4", "4 streams, aggregate decode", "tok/s", ">= 1.2x", concurrent_decode),
    ScenarioSpec(
        "stalled",
        "3 fast + 1 stalled: fast readers' retention",
        "ratio",
        "edge >= 0.95",
        stalled_reader,
    ),
    ScenarioSpec(
        "ttft_prefill", "short-request TTFT during a 1k prefill", "s", "lower", ttft_under_prefill
    ),
    ScenarioSpec("prefill", "prefill of a ~500-token prompt", "tok/s", "higher", prefill_rate),
    *(
        ScenarioSpec(
            f"cold{size}", f"cold TTFT, lone ~{size}-token prompt", "s", "<= 1.0x", cold_ttft(size)
        )
        for size in COLD_SENTENCES
    ),
    ScenarioSpec(
        "itl_prefill",
        "ITL p99 of 3 streams during a 1k prefill",
        "ms",
        "lower",
        itl_during_prefill,
    ),
    ScenarioSpec("regen", "regenerate TTFT, ~480-token prompt", "s", "<= 0.5x", regenerate_ttft),
    ScenarioSpec(
        "flood_rss", "peak RSS, 200 connections / (model+KV+150MB)", "ratio", "<= 1.0", flood_rss
    ),
)


@dataclass
class Results:
    """Figures per scenario key and server name, one per repeat (None when it failed)."""

    figures: dict[str, dict[str, list[Figures]]] = field(default_factory=dict)

    def add(self, key: str, server: str, figures: Figures) -> None:
        self.figures.setdefault(key, {}).setdefault(server, []).append(figures)

    def values(self, key: str, server: str) -> list[float | None]:
        return [f.value for f in self.figures.get(key, {}).get(server, [])]

    def to_json(self) -> dict[str, object]:
        return {
            key: {
                server: [{"value": f.value, **f.details} for f in runs]
                for server, runs in by_server.items()
            }
            for key, by_server in self.figures.items()
        }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--model", help="GGUF (default: the embedded SmolLM2-135M)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--llama-server", help="path of the llama-server binary")
    parser.add_argument(
        "--scenarios",
        default=",".join(s.key for s in SCENARIOS),
        help="comma-separated subset of: " + ", ".join(s.key for s in SCENARIOS),
    )
    parser.add_argument(
        "--states",
        default="fresh,steady",
        help="fresh (just started) and/or steady (after serve_traffic), comma-separated",
    )
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--flood", type=int, default=200, help="connections in the flood")
    parser.add_argument("--flood-seconds", type=float, default=3.0)
    add_output_flags(parser)
    parser.add_argument(
        "--edge-flags", default="", help="extra edge-llm serve flags, space-separated"
    )
    parser.add_argument(
        "--edge-layout",
        choices=sorted(EDGE_LAYOUTS),
        default="default",
        help="edge-llm's KV layout: 'default' what make run serves (4 slots, a share "
        "each, as llama-server -np 4), 'pool' one unified pool of 32 sequences",
    )
    return parser.parse_args(argv)


def default_model() -> str:
    from edge_llm.engine.llama_backend import default_model_path

    return str(default_model_path())


def kv_of_engine(engine: ServerProcess) -> tuple[int, int]:
    """(KV budget bytes, KV bytes per token) from the engine's /debug/streams."""
    debug = get_json(engine.root + "/debug/streams")
    budget, per_token = debug.get("kv_budget_bytes"), debug.get("kv_bytes_per_token")
    if not isinstance(budget, int) or not isinstance(per_token, int):
        raise PeerError("edge-llm's /debug/streams lacks kv_budget_bytes / kv_bytes_per_token")
    return budget, per_token


async def run_one(spec: ScenarioSpec, ctx: Context) -> Figures:
    """One scenario on one server; a scenario that hangs counts as failed."""
    try:
        async with asyncio.timeout(SCENARIO_TIMEOUT_S):
            return await spec.run(ctx)
    except TimeoutError:
        return Figures(None, {"error": f"scenario took over {SCENARIO_TIMEOUT_S:.0f} s"})


async def run_repeats(
    contexts: dict[str, Context],
    specs: list[ScenarioSpec],
    repeats: int,
    console: Console,
    first_variant: int = 0,
) -> Results:
    results = Results()
    names = list(contexts)
    for repeat in range(repeats):
        order = names if repeat % 2 == 0 else names[::-1]
        for spec in specs:
            for name in order:
                ctx = contexts[name]
                ctx.variant = first_variant + repeat * 1000 + specs.index(spec) * 10
                figures = await run_one(spec, ctx)
                if not await asyncio.to_thread(wait_idle, ctx.server):
                    figures.details["warning"] = "server still busy 60 s after the scenario"
                results.add(spec.key, name, figures)
                value = "failed" if figures.value is None else f"{figures.value:.3g}"
                console.print(f"repeat {repeat + 1}/{repeats} {spec.key:<13} {name:<13} {value}")
    return results


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.3g} ({min(values):.3g}-{max(values):.3g})"


def ratio_cell(edge: list[float | None], llama: list[float | None]) -> str:
    ratios = [e / ll for e, ll in zip(edge, llama, strict=False) if e is not None and ll]
    if not ratios:
        return "-"
    return f"{min(ratios):.2f} / {statistics.median(ratios):.2f} / {max(ratios):.2f}"


COLUMNS = ("scenario", "unit", "edge-llm median (min-max)", "llama-server median (min-max)",
           "ratio edge/llama min / median / max", "goal")  # fmt: skip


def table(
    phases: dict[str, Results], specs: dict[str, list[ScenarioSpec]], repeats: int
) -> dict[str, Any]:
    rows = []
    for state, results in phases.items():
        for spec in specs[state]:
            edge = results.values(spec.key, "edge-llm")
            llama = results.values(spec.key, "llama-server")
            rows.append(
                [
                    f"{spec.title}{'' if state == 'fresh' else f' ({state})'}",
                    spec.unit,
                    spread([v for v in edge if v is not None]) + _failed(edge),
                    spread([v for v in llama if v is not None]) + _failed(llama),
                    ratio_cell(edge, llama),
                    spec.goal,
                ]
            )
    return table_data(f"edge-llm vs llama-server, {repeats} repeat(s)", COLUMNS, rows)


STEADY_GOALS = {"tok/s": ">= 0.95", "s": "<= 1.05"}


def steady_table(phases: dict[str, Results], specs: list[ScenarioSpec]) -> dict[str, Any]:
    """Each server's steady-state median over its fresh median."""
    rows = []
    for spec in specs:
        row = [spec.title, spec.unit]
        for server in ("edge-llm", "llama-server"):
            fresh = [v for v in phases["fresh"].values(spec.key, server) if v is not None]
            steady = [v for v in phases["steady"].values(spec.key, server) if v is not None]
            ratio = (
                statistics.median(steady) / statistics.median(fresh) if fresh and steady else None
            )
            row.append("-" if ratio is None else f"{ratio:.2f}")
        rows.append([*row, STEADY_GOALS.get(spec.unit, "-")])
    columns = ("scenario", "unit", "edge-llm steady / fresh", "llama-server steady / fresh",
               "goal (edge-llm)")  # fmt: skip
    return table_data("after the traffic: steady state over fresh", columns, rows)


def _failed(values: list[float | None]) -> str:
    n = sum(v is None for v in values)
    return f" [{n} failed]" if n else ""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console() if sys.stdout.isatty() else Console(width=WIDE_OUTPUT)
    try:
        binary = find_llama_server(args.llama_server)
    except PeerError as exc:
        print(f"vs_llama_server: {exc}", file=sys.stderr)
        return 2
    comparison = Comparison(args, console, binary)
    try:
        comparison.run()
    except PeerError as exc:
        print(f"vs_llama_server: {exc}", file=sys.stderr)
        return 1
    finally:
        comparison.stop()
    return 0


class Comparison:
    """Both servers, started once, and the repeats run against them."""

    def __init__(self, args: argparse.Namespace, console: Console, binary: str) -> None:
        self.args = args
        self.console = console
        self.binary = binary
        self.model = args.model or default_model()
        self.specs = [s for s in SCENARIOS if s.key in args.scenarios.split(",")]
        self.settings = Settings(args.decode_tokens, args.flood, args.flood_seconds)
        self.servers: list[ServerProcess] = []

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def start(self) -> dict[str, Context]:
        flags = [
            "--max-prompt-tokens",
            str(MAX_PROMPT_TOKENS),
            *EDGE_LAYOUTS[self.args.edge_layout],
            *self.args.edge_flags.split(),
        ]
        engine = start_engine(self.model, self.args.threads, flags)
        self.servers.append(engine)
        kv_budget, kv_per_token = kv_of_engine(engine)
        # llama-server gets the same KV budget: the engine's capacity in tokens, in slots.
        self.ctx_tokens = max(kv_budget // kv_per_token // PARALLEL, SLOT_CTX) * PARALLEL
        llama = start_llama_server(
            self.binary, self.model, self.args.threads, self.ctx_tokens, PARALLEL
        )
        self.servers.append(llama)
        self.kv_budget = kv_budget
        self.model_bytes = Path(self.model).stat().st_size
        llama_kv = self.ctx_tokens * kv_per_token
        return {
            "edge-llm": self._context(engine, kv_budget),
            "llama-server": self._context(llama, llama_kv),
        }

    def _context(self, server: ServerProcess, kv_budget: int) -> Context:
        target = Target(server.name, server.root)
        return Context(server, target, self.settings, self.model_bytes, kv_budget)

    def run(self) -> None:
        contexts = self.start()
        started = datetime.now(UTC)
        start = snapshot()
        phases, traffic = asyncio.run(self._phases(contexts))
        machine = noise(start, snapshot(), own_pids())
        specs = {state: self._specs_of(state) for state in phases}
        tables = [table(phases, specs, self.args.repeats)]
        if "fresh" in phases and "steady" in phases:
            tables.append(steady_table(phases, specs["steady"]))
        setup = (
            f"model {self.model} ({self.model_bytes / 1e6:.0f} MB), {self.args.threads} threads "
            f"each; llama-server -np {PARALLEL} -c {self.ctx_tokens}; edge-llm KV budget "
            f"{self.kv_budget / (1 << 20):.0f} MiB, layout {self.args.edge_layout} "
            f"({' '.join(EDGE_LAYOUTS[self.args.edge_layout]) or 'make run defaults'}"
            f"{' ' + self.args.edge_flags if self.args.edge_flags else ''})"
        )
        for summary in tables:
            self.console.print(rich_table(summary))
        self.console.print(setup)
        for line in machine.lines():
            self.console.print(line)
        raw = {
            "results": {state: results.to_json() for state, results in phases.items()},
            "traffic": {name: {"value": f.value, **f.details} for name, f in traffic.items()},
            "model": self.model,
            "threads": self.args.threads,
            "llama_server_ctx": self.ctx_tokens,
            "edge_layout": self.args.edge_layout,
        }
        run = header("vs_llama_server", "edge-llm vs llama-server", started, machine, [setup])
        write_outputs(self.args, run, tables, raw)

    def _specs_of(self, state: str) -> list[ScenarioSpec]:
        return [s for s in self.specs if state == "fresh" or s.key in STEADY_KEYS]

    async def _phases(
        self, contexts: dict[str, Context]
    ) -> tuple[dict[str, Results], dict[str, Figures]]:
        """The fresh scenarios, then the same traffic on every server, then the steady
        ones (prompts of each phase and repeat unique: ``variant``)."""
        states = self.args.states.split(",")
        phases: dict[str, Results] = {}
        traffic: dict[str, Figures] = {}
        repeats = self.args.repeats
        if "fresh" in states:
            phases["fresh"] = await run_repeats(contexts, self._specs_of("fresh"), repeats,
                                                self.console)  # fmt: skip
        if "steady" in states:
            for name, ctx in contexts.items():
                traffic[name] = await serve_traffic(ctx)
                self.console.print(f"traffic {name:<13} {traffic[name].details}")
                await asyncio.to_thread(wait_idle, ctx.server)
            phases["steady"] = await run_repeats(
                contexts, self._specs_of("steady"), repeats, self.console, first_variant=500_000
            )
        return phases, traffic


if __name__ == "__main__":
    sys.exit(main())
