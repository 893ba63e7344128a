"""What one grammar-constrained stream costs the plain streams batched with it.

Four sequences decode together through the llama backend (one ``llama_decode``
per step, as the engine runs them), greedy, for a fixed number of steps:

- ``plain``: four plain streams;
- ``schema``: three plain streams and one under a JSON-schema grammar;
- ``json_object``: three plain streams and one under the any-JSON-object grammar.

The figure is the plain streams' decode rate (tokens per second per plain
stream); scenarios alternate for ``--rounds`` rounds and medians are reported,
with what else the machine did meanwhile. Goal (issue 15): the rate drops by at
most 5 % when one of the four uses a grammar.

    .venv/bin/python benchmarks/grammar_overhead.py [--steps 128] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime

from machine import noise, own_pids, snapshot
from output import add_output_flags, header, write_outputs
from rich.console import Console

from edge_llm.bench.publish import rich_table, table_data
from edge_llm.engine.runtime.backend import BatchItem
from edge_llm.engine.runtime.llama_backend import LlamaBackend
from edge_llm.protocol.sampling import SamplingParams

PROMPTS = (
    "Write a long story about a lighthouse keeper.",
    "Explain how rain forms, in detail.",
    "Describe a busy market in the morning.",
    "List many animal names as JSON.",  # the slot that gets the grammar
)
SCHEMA = {"type": "array", "items": {"type": "string", "maxLength": 24}, "minItems": 200}
N_STREAMS = len(PROMPTS)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--steps", type=int, default=128, help="decode steps per run")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each scenario")
    parser.add_argument("--threads", type=int, default=2)
    add_output_flags(parser)
    return parser.parse_args()


def run(backend: LlamaBackend, params: list[SamplingParams], steps: int) -> float:
    """Decode ``steps`` steps with all four slots live; seconds spent."""
    prompts = [
        backend.tokenize(backend.render_chat([{"role": "user", "content": p}]), add_special=True)
        for p in PROMPTS
    ]
    for slot, slot_params in enumerate(params):
        backend.start_sequence(str(slot), slot_params)
    try:
        first = backend.decode([BatchItem(s, p, 0, True, str(s)) for s, p in enumerate(prompts)])
        last = [sampled.token for sampled in first]
        positions = [len(p) for p in prompts]
        started = time.perf_counter()
        for _ in range(steps):
            items = [BatchItem(s, [last[s]], positions[s], True, str(s)) for s in range(N_STREAMS)]
            last = [sampled.token for sampled in backend.decode(items)]
            positions = [p + 1 for p in positions]
        return time.perf_counter() - started
    finally:
        for slot in range(N_STREAMS):
            backend.truncate(slot, 0)
            backend.end_sequence(str(slot))


def main() -> int:
    args = parse_args()
    backend = LlamaBackend(
        None,
        kv_budget_bytes=64 << 20,
        max_sequences=N_STREAMS,
        max_batch_tokens=512,
        n_threads=args.threads,
    )
    plain = SamplingParams()
    scenarios = {
        "plain": [plain] * N_STREAMS,
        "schema": [plain] * 3 + [SamplingParams(grammar=backend.json_schema_grammar(SCHEMA))],
        "json_object": [plain] * 3 + [SamplingParams(grammar=backend.json_schema_grammar(None))],
    }
    rates: dict[str, list[float]] = {name: [] for name in scenarios}
    started, start = datetime.now(UTC), snapshot()
    try:
        run(backend, scenarios["plain"], 8)  # warm-up
        for _ in range(args.rounds):
            for name, params in scenarios.items():
                rates[name].append(args.steps / run(backend, params, args.steps))
    finally:
        backend.close()
    machine = noise(start, snapshot(), own_pids())
    medians = {name: statistics.median(values) for name, values in rates.items()}
    rows = [
        [
            name,
            f"{median:.1f}",
            f"{median / medians['plain'] - 1.0:+.1%}",
            ", ".join(f"{r:.1f}" for r in rates[name]),
        ]
        for name, median in medians.items()
    ]
    title = (
        f"plain-stream decode rate, tok/s per stream ({args.rounds} rounds x {args.steps} steps)"
    )
    table = table_data(title, ("scenario", "median", "change vs plain", "runs"), rows)
    Console(width=140).print(rich_table(table))
    for line in machine.lines():
        print(line)
    notes = ["Goal: at most 5 % lower with one grammar stream among the four."]
    info = header("grammar_overhead", "Grammar overhead", started, machine, notes)
    write_outputs(args, info, [table], {"rates": rates, "medians": medians})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
