"""guidellm, the serving harness (PyPI ``guidellm``), against a server as ``make run``
starts it: its chat and multi-turn scenarios on synthetic data, its requests exactly
as it sends them (``ignore_eos``, ``stream_options.continuous_usage_stats``,
``max_completion_tokens``, each turn's history).

Reported per scenario, from guidellm's own JSON: requests answered, errored and
incomplete; how many answers had exactly the requested output tokens (guidellm asks
for them with ``ignore_eos``); the prompt tokens the server found cached (guidellm
reads ``usage.prompt_tokens_details.cached_tokens``); TTFT p50 / p95 and output
tokens per second of the whole scenario.

guidellm runs from a virtualenv of its own: it imports torch (only for its data
loader), and ``scripts/install-guidellm.sh DIR`` installs it with the CPU build of
torch (about 1.5 GB; PyPI's default torch is a CUDA build of several GB). Its
tokenizer is the served model's own, read from the GGUF by transformers (no model
hub is asked: ``HF_HUB_OFFLINE=1``).

    make bench-guidellm ARGS=--publish    # = the two lines below
    scripts/install-guidellm.sh .venv-guidellm
    .venv/bin/python benchmarks/guidellm_scenarios.py --guidellm .venv-guidellm/bin/guidellm
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from machine import noise, own_pids, snapshot
from output import add_output_flags, header, write_outputs
from peer_servers import ServerProcess, start_engine
from rich.console import Console

from edge_llm.bench.publish import rich_table, table_data
from edge_llm.bench.stats import percentile

COLUMNS = (
    "scenario", "requests", "errored", "incomplete", "exact output length",
    "prompt tokens (median)", "cached prompt tokens", "TTFT p50 (s)", "TTFT p95 (s)",
    "output tok/s",
)  # fmt: skip
RUN_TIMEOUT_S = 1800.0


@dataclass
class Scenario:
    name: str
    data: dict[str, Any]  # guidellm's synthetic_text data arguments
    streams: int
    requests: int

    @property
    def output_tokens(self) -> int:
        return int(self.data["output_tokens"])


@dataclass
class Outcome:
    """One scenario's figures, from guidellm's JSON."""

    scenario: str
    requests: int
    errored: int
    incomplete: int
    exact: int  # answers with exactly the requested output tokens
    output_lengths: list[int]
    prompt_tokens: list[int]
    cached_tokens: int
    ttft_s: list[float]
    seconds: float
    errors: list[str]
    request_body: dict[str, Any] | None  # the first request as guidellm sent it


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument(
        "--guidellm", default=".venv-guidellm/bin/guidellm",
        help="guidellm's executable (scripts/install-guidellm.sh DIR puts it in DIR/bin)",
    )  # fmt: skip
    parser.add_argument("--streams", type=int, default=4, help="chat: concurrent requests")
    parser.add_argument("--requests", type=int, default=16, help="chat: requests in all")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--turns", type=int, default=3, help="multi-turn: turns each")
    parser.add_argument("--conversations", type=int, default=4, help="multi-turn: in all")
    add_output_flags(parser)
    return parser.parse_args(argv)


def scenarios(args: argparse.Namespace) -> list[Scenario]:
    """guidellm's two chat shapes, sized for ``make run``'s limits (prompts of at most
    512 tokens): single requests, and conversations whose turns carry the history."""
    chat = {"prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens}
    turn = {"prompt_tokens": args.prompt_tokens // 2, "output_tokens": args.output_tokens // 2}
    multiturn = {**turn, "turns": args.turns, "prefix_tokens": 64, "prefix_count": 2}
    return [
        Scenario("chat", chat, args.streams, args.requests),
        Scenario("multi-turn", multiturn, 2, args.conversations * args.turns),
    ]


def scenario_file(scenario: Scenario, server: ServerProcess, model: str, path: Path) -> None:
    """guidellm's scenario: its OpenAI HTTP backend on chat completions, the served
    model's tokenizer from its GGUF, a fixed number of requests at a concurrency."""
    from edge_llm.engine.runtime.llama_backend import default_model_path  # loads llama.cpp

    gguf = default_model_path()
    spec = {
        "backend": {
            "kind": "openai_http", "target": server.root, "model": model,
            "request_format": "/v1/chat/completions",
        },
        "tokenizer": {
            "kind": "huggingface_auto", "model": str(gguf.parent),
            "load_kwargs": {"gguf_file": gguf.name},
        },
        "profile": {"kind": "concurrent", "streams": scenario.streams},
        "data": [{"kind": "synthetic_text", **scenario.data}],
        "constraints": [{"kind": "max_requests", "count": scenario.requests}],
    }  # fmt: skip
    path.write_text(json.dumps({"spec": spec}, indent=1), encoding="utf-8")


def run_guidellm(guidellm: str, scenario_path: Path, out: Path, log: Path) -> None:
    cmd = [
        guidellm, "run", "-c", str(scenario_path),
        "--output", f"kind=json,path={out}", "--disable-console-interactive",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with log.open("wb") as sink:
        done = subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env,
                              timeout=RUN_TIMEOUT_S, check=False)  # fmt: skip
    if done.returncode != 0 or not out.exists():
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"guidellm exited with {done.returncode}:\n{tail}")


def outcome(scenario: Scenario, out: Path) -> Outcome:
    benchmark = json.loads(out.read_text(encoding="utf-8"))["benchmarks"][0]
    requests = benchmark["requests"]
    ok = requests["successful"]
    lengths = [int(r["output_tokens"] or 0) for r in ok]
    ttfts = [r["time_to_first_token_ms"] / 1000 for r in ok if r["time_to_first_token_ms"]]
    body = json.loads(ok[0]["request_args"])["body"] if ok and ok[0]["request_args"] else None
    return Outcome(
        scenario=scenario.name,
        requests=len(ok) + len(requests["errored"]) + len(requests["incomplete"]),
        errored=len(requests["errored"]),
        incomplete=len(requests["incomplete"]),
        exact=sum(n == scenario.output_tokens for n in lengths),
        output_lengths=lengths,
        prompt_tokens=[int(r["prompt_tokens"] or 0) for r in ok],
        cached_tokens=sum(int(r["cached_tokens"] or 0) for r in ok),
        ttft_s=ttfts,
        seconds=float(benchmark["duration"]),
        errors=[str(r["info"].get("error")) for r in requests["errored"]],
        request_body=body,
    )


def row(result: Outcome, scenario: Scenario) -> list[str]:
    answered = len(result.output_lengths)
    prompts = result.prompt_tokens
    return [
        f"{result.scenario} ({scenario.streams} at a time)",
        str(result.requests),
        str(result.errored),
        str(result.incomplete),
        f"{result.exact} of {answered} ({scenario.output_tokens} tokens)",
        f"{percentile([float(p) for p in prompts], 50):.0f}" if prompts else "—",
        f"{result.cached_tokens / sum(prompts):.1%}" if prompts else "—",
        f"{percentile(result.ttft_s, 50):.2f}" if result.ttft_s else "—",
        f"{percentile(result.ttft_s, 95):.2f}" if result.ttft_s else "—",
        f"{sum(result.output_lengths) / result.seconds:.1f}" if result.seconds else "—",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not Path(args.guidellm).exists():
        print(f"no guidellm at {args.guidellm}: scripts/install-guidellm.sh DIR installs it")
        return 2
    from edge_llm.engine.runtime.llama_backend import default_model_path  # loads llama.cpp

    plan = scenarios(args)
    started, start = datetime.now(UTC), snapshot()
    results = []
    # As `make run` starts it: every setting at its default (threads: the CPU count).
    server = start_engine(str(default_model_path()), os.cpu_count() or 1, [])
    try:
        with urllib.request.urlopen(server.root + "/v1/models", timeout=30) as response:
            model = json.loads(response.read())["data"][0]["id"]
        with TemporaryDirectory(prefix="edge-llm-guidellm-") as tmp:
            for scenario in plan:
                spec, out = Path(tmp) / f"{scenario.name}.json", Path(tmp) / "out.json"
                scenario_file(scenario, server, model, spec)
                run_guidellm(args.guidellm, spec, out, Path(tmp) / "guidellm.log")
                results.append(outcome(scenario, out))
                out.unlink()
                print(" | ".join(row(results[-1], scenario)), flush=True)
    finally:
        server.stop()
    machine = noise(start, snapshot(), own_pids())
    title = "guidellm 0.8.1 against make run's server: chat and multi-turn"
    table = table_data(title, COLUMNS, [row(r, s) for r, s in zip(results, plan, strict=True)])
    Console(width=200).print(rich_table(table))
    for line in machine.lines():
        print(line)
    for result in results:
        for error in result.errors[:5]:
            print(f"{result.scenario}: {error}")
    notes = [
        "guidellm 0.8.1 (its own virtualenv, torch 2.13.0 CPU build), `guidellm run` with a "
        "scenario file: backend openai_http on /v1/chat/completions, synthetic_text data, "
        "profile concurrent, max_requests; tokenizer: the served GGUF's, through "
        "transformers (load_kwargs gguf_file). Chat: "
        f"{args.prompt_tokens}-token prompts asking {args.output_tokens} tokens; multi-turn: "
        f"{args.conversations} conversations of {args.turns} turns, "
        f"{args.prompt_tokens // 2}-token turns after one of 2 shared 64-token prefixes, "
        f"asking {args.output_tokens // 2} tokens, the history sent with each turn. The "
        "server: `edge-llm serve` with every setting at its default (as `make run`), on "
        "this machine's 2 cores beside guidellm. Cached prompt tokens: the sum of "
        "usage.prompt_tokens_details.cached_tokens over the prompt tokens.",
    ]
    raw = {
        "results": [asdict(r) for r in results],
        "scenarios": [asdict(s) for s in plan],
        "args": {k: v for k, v in vars(args).items() if k not in ("json", "publish")},
    }
    write_outputs(args, header("guidellm", title, started, machine, notes), [table], raw)
    return 0 if all(r.errored == 0 and r.incomplete == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
