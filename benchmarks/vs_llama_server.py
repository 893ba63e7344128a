"""edge-llm against llama.cpp's own ``llama-server``: same GGUF, same threads, side by side.

Usage::

    make bench-deps                      # builds llama-server with this host's CPU flags
    make bench-models                    # the 1.5B model (1,117 MB) into ~/.cache/edge-llm
    .venv/bin/python benchmarks/vs_llama_server.py [--model qwen2.5-coder-1.5b] [--repeats 3]

The model matrix (``benchmarks/models.py``): ``--model`` takes ``smollm2-135m`` (the
embedded SmolLM2-135M Q4_1, the default), ``gemma3-270m`` (Gemma-3-270M Q4_K_M),
``qwen2.5-coder-1.5b`` (Qwen2.5-Coder-1.5B-Instruct Q4_K_M) or a GGUF path; several,
comma-separated, run one after another. Each run's title, benchmark name (and so its
published page and headline) and setup note say which model it measured.

edge-llm runs the configuration ``make run`` serves (the per-slot layout, 4 slots,
prefix cache and speculation on; only ``--max-prompt-tokens`` raised for the 950-token
prompts), llama-server ``-np 4`` with the same KV budget; ``--edge-layout pool`` runs
edge-llm with one unified pool instead. Both servers run for the whole comparison;
scenarios run one server at a time, alternating which goes first in each repeat, so
machine noise hits both alike; the short decode scenarios run several times a repeat
(``ScenarioSpec.rounds``), alternating too, and each run counts as one figure.

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
- peak RSS under a 200-connection flood over model size + KV budget + 150 MB [<= 1.0];
- next turn (issue 42): TTFT of a short question after a ~459-token prompt and its
  ~100-token answer, sent back as the assistant's message, median of 3 fresh
  conversations [<= 0.8x] (the JSON has each next turn's ``cached_tokens``);
- multi-turn chat (issue 42): 4 users at once, 3 turns each, a shared ~100-token system
  prompt and ~200-token user turns: output tok/s, and TTFT p50 / p95 per turn;
- copying a ~214-token passage, prompt + copy past 400 cells, 1 stream and 4 at once:
  decode tok/s counted from ``usage`` [>= 1.5x llama-server, >= 1.2x its ngram-mod];
- a code edit (issue 60): a 25-line function sent back with one variable renamed,
  decode tok/s from ``usage`` [>= 1.3x llama-server, >= 1.1x its ngram-mod].

The copy scenarios also run on a third server, llama-server with ``--spec-type
ngram-mod`` (n-gram speculation; ``--no-ngram-peer`` leaves it out), with the ratio
edge-llm / ngram-mod beside edge-llm / llama-server. ``--edge-flags`` passes more
flags to edge-llm (``--edge-flags=--deterministic`` measures that mode against the
same anchors); the run's title, its notes and its benchmark name say which ran, so
such a run is published beside the default one, not over the README's headline.
``--variant-flags`` starts a second edge-llm with those flags beside the first and runs
every scenario on it too (``--variant-flags=--deterministic``: what the mode costs,
side by side with the default in one run); a third table gives variant / edge-llm.
``--variant-src DIR`` runs that second edge-llm from another checkout's ``src/`` (a git
worktree of the commit before a change): a before/after pair measured in one run.

The machine is shared: under the table, the CPU time other processes used during the
run (and the busiest of them) and the load average, so a reader can judge the noise.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from conversations import multiturn, next_turn
from machine import noise, own_pids, snapshot
from models import ModelMissing, decode_prompt, resolve
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
    CODE_TASK,
    COLD_SENTENCES,
    Context,
    Figures,
    Scenario,
    Settings,
    cold_ttft,
    concurrent_decode,
    copy_four,
    copy_one,
    edit_one,
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
STEADY_KEYS = (
    "decode1", "decode4", "cold150", "cold500", "cold950", "regen",
    "next_turn", "multiturn", "copy1", "copy4", "edit1",
)  # fmt: skip
EDGE = "edge-llm"
LLAMA = "llama-server"
# The third server of the copy scenarios: llama-server with n-gram speculation.
NGRAM = "llama ngram-mod"
NGRAM_FLAGS = ["--spec-type", "ngram-mod"]
MAX_PROMPT_TOKENS = 2048
WIDE_OUTPUT = 160
SCENARIO_TIMEOUT_S = 600.0
MAX_ROUNDS = 10  # a scenario's runs per repeat; each gets prompts of its own


@dataclass(frozen=True)
class Extra:
    """A further row of a scenario's table: one of its details (a float or None)."""

    detail: str
    title: str
    unit: str
    goal: str


@dataclass(frozen=True)
class ScenarioSpec:
    key: str
    title: str
    unit: str
    goal: str
    run: Scenario
    extra: tuple[Extra, ...] = ()
    ngram: bool = False  # also run on the ngram-mod llama-server
    # Runs per repeat, alternating which server goes first: a short scenario measures
    # a second or two, and the machine's speed drifts by 20 % within seconds.
    rounds: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.rounds <= MAX_ROUNDS:
            raise ValueError(f"{self.key}: rounds must be 1 to {MAX_ROUNDS} (prompt variants)")

    def rows(self) -> list[Extra | None]:
        """The table's rows: None for the scenario's value, then its extras."""
        return [None, *self.extra]


def _turn_rows() -> tuple[Extra, ...]:
    return tuple(
        Extra(f"ttft_{q}_turn{turn}", f"multi-turn chat: TTFT {q}, turn {turn}", "s", "lower")
        for turn in (1, 2, 3)
        for q in ("p50", "p95")
    )


SCENARIOS = (
    ScenarioSpec("decode1", "single-stream decode", "tok/s", ">= 1.0x", single_decode, rounds=4),
    ScenarioSpec(
        "decode4", "4 streams, aggregate decode", "tok/s", ">= 1.2x", concurrent_decode, rounds=2
    ),
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
    ScenarioSpec(
        "next_turn",
        "next-turn TTFT after a ~459-token prompt and its answer",
        "s",
        "<= 0.8x",
        next_turn,
    ),
    ScenarioSpec(
        "multiturn",
        "multi-turn chat, 4 users x 3 turns: output throughput",
        "tok/s",
        "higher",
        multiturn,
        extra=_turn_rows(),
    ),
    ScenarioSpec(
        "copy1",
        "copy a ~214-token passage (> 400 cells), 1 stream, 3 passages in turn",
        "tok/s",
        ">= 1.5x (ngram-mod: >= 1.2x)",
        copy_one,
        ngram=True,
    ),
    ScenarioSpec(
        "copy4",
        "copy, 4 streams at once (aggregate)",
        "tok/s",
        ">= 1.5x (ngram-mod: >= 1.2x)",
        copy_four,
        ngram=True,
    ),
    ScenarioSpec(
        "edit1",
        "edit: a 25-line function with one variable renamed, 1 stream, 2 functions in turn",
        "tok/s",
        ">= 1.3x (ngram-mod: >= 1.1x)",
        edit_one,
        ngram=True,
    ),
)


@dataclass
class Results:
    """Figures per scenario key and server name, one per repeat (None when it failed)."""

    figures: dict[str, dict[str, list[Figures]]] = field(default_factory=dict)

    def add(self, key: str, server: str, figures: Figures) -> None:
        self.figures.setdefault(key, {}).setdefault(server, []).append(figures)

    def values(self, key: str, server: str, row: Extra | None = None) -> list[float | None]:
        """One figure per repeat: the scenario's value, or ``row``'s detail."""
        runs = self.figures.get(key, {}).get(server, [])
        if row is None:
            return [f.value for f in runs]
        return [_number(f.details.get(row.detail)) for f in runs]

    def to_json(self) -> dict[str, object]:
        return {
            key: {
                server: [{"value": f.value, **f.details} for f in runs]
                for server, runs in by_server.items()
            }
            for key, by_server in self.figures.items()
        }


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument(
        "--model",
        default="smollm2-135m",
        help="smollm2-135m (the embedded SmolLM2-135M Q4_1), gemma3-270m, qwen2.5-coder-1.5b "
        "or a GGUF path; comma-separated: each in turn",
    )
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
        "--edge-flags",
        default="",
        help="extra edge-llm serve flags, space-separated (--edge-flags=--deterministic); "
        "the run's title and benchmark name carry them",
    )
    parser.add_argument(
        "--variant-flags",
        default="",
        help="a second edge-llm with these extra flags, on every scenario, and its ratio "
        "to the first (--variant-flags=--deterministic)",
    )
    parser.add_argument(
        "--variant-src",
        default="",
        help="a second edge-llm run from this checkout's src/ (e.g. a git worktree of the "
        "commit before a change) with the same venv and flags: a before/after pair in one run",
    )
    parser.add_argument(
        "--llama",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run llama-server (--no-llama: edge-llm and its variant only, e.g. to price "
        "a mode on a busy machine, where llama-server's spinning threads crawl)",
    )
    parser.add_argument(
        "--ngram-peer",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the copy scenarios also on llama-server --spec-type ngram-mod",
    )
    parser.add_argument(
        "--edge-layout",
        choices=sorted(EDGE_LAYOUTS),
        default="default",
        help="edge-llm's KV layout: 'default' what make run serves (4 slots, a share "
        "each, as llama-server -np 4), 'pool' one unified pool of 32 sequences",
    )
    return parser.parse_args(argv)


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
        for spec in specs:
            for round_ in range(spec.rounds):
                first = (repeat * spec.rounds + round_) % 2
                variant = first_variant + (repeat * MAX_ROUNDS + round_) * 1000
                for name in names if first == 0 else names[::-1]:
                    if name == NGRAM and not spec.ngram:
                        continue
                    contexts[name].variant = variant + specs.index(spec) * 10
                    figures = await _run_on(spec, contexts[name])
                    results.add(spec.key, name, figures)
                    console.print(
                        f"repeat {repeat + 1}/{repeats} {spec.key:<13} {name:<13} {_shown(figures)}"
                    )
    return results


async def _run_on(spec: ScenarioSpec, ctx: Context) -> Figures:
    """One run of a scenario, then until the server is idle again."""
    figures = await run_one(spec, ctx)
    if not await asyncio.to_thread(wait_idle, ctx.server):
        figures.details["warning"] = "server still busy 60 s after the scenario"
    return figures


def _shown(figures: Figures) -> str:
    value = f"{figures.value:.3g}" if figures.value is not None else "failed"
    if "errors" in figures.details:  # why, at once (the JSON is written at the end)
        value += f" {figures.details['errors']}"
    return value


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.3g} ({min(values):.3g}-{max(values):.3g})"


def ratio_cell(edge: list[float | None], llama: list[float | None]) -> str:
    ratios = [e / ll for e, ll in zip(edge, llama, strict=False) if e is not None and ll]
    if not ratios:
        return "-"
    return f"{min(ratios):.2f} / {statistics.median(ratios):.2f} / {max(ratios):.2f}"


def columns(servers: list[str], edge_name: str = EDGE) -> list[str]:
    """The main table's columns: llama-server's, and ngram-mod's when it ran."""
    ngram = NGRAM in servers
    return [
        "scenario", "unit", f"{edge_name} median (min-max)", "llama-server median (min-max)",
        *(["llama-server --spec-type ngram-mod median (min-max)"] if ngram else []),
        "ratio edge/llama min / median / max",
        *(["ratio edge/ngram-mod min / median / max"] if ngram else []),
        "goal",
    ]  # fmt: skip


def _row_text(spec: ScenarioSpec, row: Extra | None) -> tuple[str, str, str]:
    """(title, unit, goal) of one of a scenario's rows."""
    return (spec.title, spec.unit, spec.goal) if row is None else (row.title, row.unit, row.goal)


def table(
    phases: dict[str, Results],
    specs: dict[str, list[ScenarioSpec]],
    repeats: int,
    servers: list[str],
    edge_name: str = EDGE,
) -> dict[str, Any]:
    """Each server's figures and edge-llm's ratio to each peer, per scenario row; a
    scenario a server did not run shows "-"."""
    peers = [LLAMA, *([NGRAM] if NGRAM in servers else [])]
    rows = []
    for label, unit, goal, values in _each_row(phases, specs):
        edge, by_peer = values(EDGE), [values(peer) for peer in peers]
        rows.append([
            label, unit,
            *(_spread_cell(figures) for figures in (edge, *by_peer)),
            *(ratio_cell(edge, figures) for figures in by_peer),
            goal,
        ])  # fmt: skip
    return table_data(
        f"{edge_name} vs llama-server, {repeats} repeat(s)", columns(servers, edge_name), rows
    )


def _each_row(
    phases: dict[str, Results], specs: dict[str, list[ScenarioSpec]]
) -> Iterator[tuple[str, str, str, Callable[[str], list[float | None]]]]:
    """Each table row of each state: (label, unit, goal, a server's figures for it)."""
    for state, results in phases.items():
        for spec in specs[state]:
            for row in spec.rows():
                title, unit, goal = _row_text(spec, row)
                label = f"{title}{'' if state == 'fresh' else f' ({state})'}"
                yield label, unit, goal, functools.partial(results.values, spec.key, row=row)


VARIANT_GOALS = {"tok/s": ">= 0.95", "s": "<= 1.05"}


def variant_table(
    phases: dict[str, Results], specs: dict[str, list[ScenarioSpec]], variant: str
) -> dict[str, Any]:
    """The variant edge-llm's figures beside the first's, per scenario row and state."""
    rows = []
    for label, unit, _, values in _each_row(phases, specs):
        edge, other = values(EDGE), values(variant)
        rows.append([
            label, unit, _spread_cell(edge), _spread_cell(other), ratio_cell(other, edge),
            VARIANT_GOALS.get(unit, "-"),
        ])  # fmt: skip
    columns = (
        "scenario", "unit", f"{EDGE} median (min-max)", f"{variant} median (min-max)",
        f"ratio {variant} / {EDGE} min / median / max", "goal",
    )  # fmt: skip
    return table_data(f"{variant} beside {EDGE}", columns, rows)


def _spread_cell(values: list[float | None]) -> str:
    return spread([v for v in values if v is not None]) + _failed(values)


STEADY_GOALS = {"tok/s": ">= 0.95", "s": "<= 1.05"}


def steady_table(
    phases: dict[str, Results], specs: list[ScenarioSpec], servers: list[str]
) -> dict[str, Any]:
    """Each server's steady-state median over its fresh median."""
    rows = []
    for spec in specs:
        for extra in spec.rows():
            title, unit, _ = _row_text(spec, extra)
            row = [title, unit]
            for server in servers:
                fresh = _median(phases["fresh"].values(spec.key, server, extra))
                steady = _median(phases["steady"].values(spec.key, server, extra))
                row.append(f"{steady / fresh:.2f}" if fresh and steady is not None else "-")
            rows.append([*row, STEADY_GOALS.get(unit, "-")])
    server_columns = [f"{server} steady / fresh" for server in servers]
    columns = ("scenario", "unit", *server_columns, "goal (edge-llm)")
    return table_data("after the traffic: steady state over fresh", columns, rows)


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _failed(values: list[float | None]) -> str:
    n = sum(v is None for v in values)
    return f" [{n} failed]" if n else ""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    unknown = set(args.scenarios.split(",")) - {s.key for s in SCENARIOS}
    if unknown:
        print(f"vs_llama_server: unknown scenario(s) {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    console = Console() if sys.stdout.isatty() else Console(width=WIDE_OUTPUT)
    try:
        binary = find_llama_server(args.llama_server) if args.llama else ""
        models = [resolve(model) for model in args.model.split(",")]
    except (PeerError, ModelMissing) as exc:
        print(f"vs_llama_server: {exc}", file=sys.stderr)
        return 2
    for model in models:
        comparison = Comparison(args, console, binary, model, several=len(models) > 1)
        try:
            comparison.run()
        except PeerError as exc:
            print(f"vs_llama_server: {exc}", file=sys.stderr)
            return 1
        finally:
            comparison.stop()
    return 0


def edge_name(args: argparse.Namespace) -> str:
    """edge-llm and any flags beyond make run's: the table's and the run's title."""
    layout = " ".join(EDGE_LAYOUTS[args.edge_layout])
    return " ".join(["edge-llm", *filter(None, (layout, args.edge_flags.strip()))])


def variant_name(args: argparse.Namespace) -> str | None:
    flags = args.variant_flags.strip()
    src = f"@{variant_commit(args.variant_src)}" if args.variant_src else ""
    return " ".join([EDGE, *filter(None, (src, flags))]) if flags or src else None


def variant_commit(checkout: str) -> str:
    """The short commit of the checkout whose ``src`` the variant runs."""
    return subprocess.run(
        ["git", "-C", checkout, "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip


def benchmark_name(args: argparse.Namespace, model_slug: str = "") -> str:
    """``vs_llama_server`` for make run's configuration on the default model; another
    model or other edge-llm flags make a name of its own
    (``vs_llama_server_qwen2_5_coder_1_5b``, ``vs_llama_server_deterministic``), so that
    publishing such a run lists it beside the default one, with its own headline; a
    run without llama-server (``--no-llama``) ends in ``_edge_only``."""
    words = [model_slug, *EDGE_LAYOUTS[args.edge_layout], *args.edge_flags.split()]
    if not args.llama:  # no comparison: never a model's headline
        words.append("edge_only")
    slug = "_".join(
        "".join(c if c.isalnum() else "_" for c in word.lstrip("-")).strip("_")
        for word in words
        if word
    )
    return "vs_llama_server" + (f"_{slug}" if slug else "")


class Comparison:
    """The servers, started once, and the repeats run against them: edge-llm,
    llama-server, and llama-server with ngram-mod speculation when a scenario needs it."""

    def __init__(
        self,
        args: argparse.Namespace,
        console: Console,
        binary: str,
        model: tuple[str, str, Path],
        several: bool = False,
    ) -> None:
        self.args = args
        self.console = console
        self.binary = binary
        self.model_slug, self.model_label, path = model
        self.model = str(path)
        self.several = several  # a matrix run: each model's --json gets its own file
        self.specs = [s for s in SCENARIOS if s.key in args.scenarios.split(",")]
        self.with_ngram = args.llama and args.ngram_peer and any(s.ngram for s in self.specs)
        self.settings = Settings(
            args.decode_tokens, args.flood, args.flood_seconds,
            decode_prompt=decode_prompt(self.model_slug),
        )  # fmt: skip
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
        self.kv_budget = kv_budget
        self.model_bytes = Path(self.model).stat().st_size
        contexts = {EDGE: self._context(engine, kv_budget)}
        variant = variant_name(self.args)
        if variant is not None:
            variant_flags = [*flags, *self.args.variant_flags.split()]
            src = str(Path(self.args.variant_src) / "src") if self.args.variant_src else ""
            other = start_engine(
                self.model, self.args.threads, variant_flags, name=variant, src=src
            )
            self.servers.append(other)
            contexts[variant] = self._context(other, kv_of_engine(other)[0])
        peers = [(LLAMA, [])] if self.args.llama else []
        if self.with_ngram:
            peers.append((NGRAM, NGRAM_FLAGS))
        for name, extra in peers:
            peer = start_llama_server(
                self.binary, self.model, self.args.threads, self.ctx_tokens, PARALLEL,
                extra=extra, name=name,
            )  # fmt: skip
            self.servers.append(peer)
            contexts[name] = self._context(peer, self.ctx_tokens * kv_per_token)
        return contexts

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
        servers = list(contexts)
        name = edge_name(self.args)
        tables = [table(phases, specs, self.args.repeats, servers, name)]
        if "fresh" in phases and "steady" in phases:
            tables.append(steady_table(phases, specs["steady"], servers))
        variant = variant_name(self.args)
        if variant is not None:
            tables.append(variant_table(phases, specs, variant))
        setup = self._setup()
        for summary in tables:
            self.console.print(rich_table(summary))
        self.console.print(setup)
        for line in machine.lines():
            self.console.print(line)
        raw = {
            "results": {state: results.to_json() for state, results in phases.items()},
            "traffic": {name: {"value": f.value, **f.details} for name, f in traffic.items()},
            "model": self.model,
            "model_label": self.model_label,
            "threads": self.args.threads,
            "llama_server_ctx": self.ctx_tokens,
            "edge_layout": self.args.edge_layout,
            "edge_flags": self.args.edge_flags.split(),
            "variant_flags": self.args.variant_flags.split(),
            "variant_src": self.args.variant_src
            and f"{self.args.variant_src} @ {variant_commit(self.args.variant_src)}",
            "servers": servers,
        }
        title = f"{name} vs llama-server on {self.model_label}"
        run = header(benchmark_name(self.args, self.model_slug), title, started, machine,
                     [setup])  # fmt: skip
        write_outputs(self._outputs(), run, tables, raw)

    def _outputs(self) -> argparse.Namespace:
        """The output flags; in a matrix run ``--json X.json`` becomes ``X-MODEL.json``."""
        if not (self.several and self.args.json):
            return self.args
        path = Path(self.args.json)
        slug = self.model_slug or "smollm2-135m"
        json_path = str(path.with_stem(f"{path.stem}-{slug}"))
        return argparse.Namespace(**{**vars(self.args), "json": json_path})

    def _setup(self) -> str:
        """The note under the tables: the model, each server's flags, the KV budgets."""
        flags = self.args.edge_flags.strip()
        variant = variant_name(self.args)
        ngram = (
            f"; llama-server {' '.join(NGRAM_FLAGS)} (same flags otherwise) for the copy scenarios"
            if self.with_ngram
            else ""
        )
        return (
            f"model {self.model_label}: {self.model} ({self.model_bytes / 1e6:.0f} MB), "
            f"{self.args.threads} threads "
            f"each; llama-server -np {PARALLEL} -c {self.ctx_tokens}{ngram}; edge-llm KV budget "
            f"{self.kv_budget / (1 << 20):.0f} MiB, layout {self.args.edge_layout} "
            f"({' '.join(EDGE_LAYOUTS[self.args.edge_layout]) or 'make run defaults'}); "
            f"extra edge-llm flags: {f'`{flags}`' if flags else 'none'}; "
            f"decode prompt: {self._decode_prompt_name()}"
            + (f"; a second edge-llm, `{variant}`, beside it" if variant else "")
            + "".join(
                f"; {spec.key} ran {spec.rounds} times a repeat"
                for spec in self.specs
                if spec.rounds > 1
            )
        )

    def _decode_prompt_name(self) -> str:
        return "a Python module" if self.settings.decode_prompt == CODE_TASK else "a story"

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
