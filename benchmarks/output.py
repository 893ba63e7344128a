"""What a benchmark run leaves behind: ``--json FILE`` and ``--publish``.

Both carry the same document: the benchmark's raw figures plus a ``run`` header
(command, start time, what else used the CPU) and the ``tables`` it printed, from
which ``edge_llm.bench.publish`` writes the dated page under docs/benchmarks.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from machine import Noise

from edge_llm.bench.publish import publish, run_header


def add_output_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", help="write every figure, the tables and the run's header here")
    parser.add_argument(
        "--publish",
        action="store_true",
        help="also publish the run: a dated page in docs/benchmarks, the index and the "
        "README's headline (see docs/development.md)",
    )


def machine_figures(machine: Noise) -> dict[str, Any]:
    return {**asdict(machine), "others_share": machine.others_share}


def write_outputs(
    args: argparse.Namespace,
    header: Mapping[str, Any],
    tables: Sequence[Mapping[str, Any]],
    raw: Mapping[str, Any],
) -> None:
    """Write ``--json`` and ``--publish`` outputs, whichever were asked for; ``header``
    from :func:`header`."""
    document = {"run": dict(header), "tables": list(tables), **raw}
    if args.json:
        Path(args.json).write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    if args.publish:
        print(f"published {publish(document)}")


def header(
    benchmark: str, title: str, started: datetime, machine: Noise, notes: Sequence[str] = ()
) -> dict[str, Any]:
    """The run's header: this process's command line, its start, the machine's load."""
    return run_header(benchmark, title, started, machine_figures(machine), notes=notes)
