"""Two edge-llm workers behind SGLang Model Gateway: a multi-user shared-prefix workload,
once per gateway configuration (docs/fleet.md): ``--policy cache_aware`` as it comes,
``cache_aware`` with ``--balance-abs-threshold N`` for each ``--balance`` N (default 1:
it balances once the workers' requests in flight differ by 2; its default, 64, suits
servers that run hundreds at once, not a device that runs four) and ``round_robin``.

``--groups`` documents (distinct texts of some ``--doc-words`` words, each a system
prompt) are shared by ``--users`` concurrent users; each user sends ``--requests``
questions one after the other, each about a document drawn at random (seeded: every
configuration gets the same sequence), asking for ``--tokens`` tokens at temperature
0. The default 16 documents are more than one worker's cache holds (4 slots, no host
tier: a device whose memory holds a few prompts), so where the gateway sends a
document decides whether the worker still has it. Each configuration gets fresh
workers (``--n-threads`` threads each, ``--host-cache-mb``) and a fresh gateway.
Reported per configuration: the workers' prefix-cache hit rate (their
``vllm:prefix_cache_hits_total`` over ``vllm:prefix_cache_queries_total``, in
tokens), TTFT p50 / p95 and throughput (requests and generated tokens per second of
the whole pass), all from this run.

    .venv/bin/python benchmarks/fleet.py --publish
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from machine import noise, own_pids, snapshot
from output import add_output_flags, header, write_outputs
from peer_servers import ServerProcess, free_port, start_engine
from rich.console import Console

from edge_llm.bench.chat_stream import RequestOptions, read_stream
from edge_llm.bench.prompts import Prompt
from edge_llm.bench.publish import rich_table, table_data
from edge_llm.bench.record import RequestRecord
from edge_llm.bench.stats import percentile
from edge_llm.bench.targets import Target

CACHE_AWARE = ["--policy", "cache_aware"]
READY_TIMEOUT_S = 60.0
COLUMNS = (
    "gateway", "prefix-cache hit rate", "TTFT p50 (s)", "TTFT p95 (s)", "requests/s",
    "generated tok/s", "requests per worker", "failed",
)  # fmt: skip
_WORDS = (
    "river", "lantern", "harbour", "copper", "orchard", "glacier", "meadow", "signal",
    "tunnel", "market", "violet", "engine", "canyon", "ledger", "thistle", "beacon",
    "quarry", "saddle", "timber", "marble", "falcon", "vessel", "pepper", "ribbon",
)  # fmt: skip


@dataclass
class Pass:
    """One configuration's pass: every request's record and the workers' cache counters."""

    label: str
    seconds: float
    records: list[RequestRecord]
    queries: float
    hits: float
    per_worker: list[float]  # requests each worker answered a first token to

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--groups", type=int, default=16, help="shared documents")
    parser.add_argument("--doc-words", type=int, default=260, help="words per document")
    parser.add_argument("--users", type=int, default=4, help="concurrent users")
    parser.add_argument("--requests", type=int, default=24, help="requests per user")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--n-threads", type=int, default=1, help="threads per worker")
    parser.add_argument("--host-cache-mb", type=int, default=0, help="each worker's host tier")
    parser.add_argument(
        "--balance", type=int, nargs="*", default=[1], metavar="N",
        help="a cache_aware row per N with --balance-abs-threshold N (the gateway's is 64)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=43)
    parser.add_argument(
        "--backend", choices=("sglang", "openai"), default="sglang",
        help="the gateway's worker protocol (openai: 0.3.2 sends every request to one worker)",
    )  # fmt: skip
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per request")
    add_output_flags(parser)
    return parser.parse_args(argv)


def configurations(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """(row label, the gateway's policy flags): cache_aware as it comes, tuned, and
    round robin."""
    tuned = [
        (f"cache_aware, balance {n}", [*CACHE_AWARE, "--balance-abs-threshold", str(n)])
        for n in args.balance
    ]
    return [("cache_aware", CACHE_AWARE), *tuned, ("round_robin", ["--policy", "round_robin"])]


def documents(args: argparse.Namespace) -> list[str]:
    """``--groups`` distinct texts (seeded), each opening with its own number."""
    rng = random.Random(args.seed)
    return [
        f"Document {g}. " + " ".join(rng.choice(_WORDS) for _ in range(args.doc_words)) + "."
        for g in range(args.groups)
    ]


def workload(args: argparse.Namespace, docs: list[str]) -> list[list[Prompt]]:
    """Each user's prompts in order: a document as system prompt, then a question."""
    rng = random.Random(args.seed + 1)
    users = []
    for user in range(args.users):
        prompts = []
        for n in range(args.requests):
            group = rng.randrange(len(docs))
            messages = (
                {"role": "system", "content": docs[group]},
                {"role": "user", "content": f"User {user}, question {n}: which word comes first?"},
            )
            prompts.append(Prompt(f"u{user}-q{n}-g{group}", messages))
        users.append(prompts)
    return users


@dataclass
class Gateway:
    root: str
    proc: subprocess.Popen[bytes]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_gateway(
    workers: list[ServerProcess], policy_flags: list[str], log: Path, backend: str = "sglang"
) -> Gateway:
    """``python -m sglang_router.launch_router`` on 127.0.0.1; ready once it lists
    every worker healthy."""
    port = free_port()
    cmd = [
        sys.executable, "-m", "sglang_router.launch_router",
        "--host", "127.0.0.1", "--port", str(port),
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
        "--backend", backend, *policy_flags,
        "--worker-urls", *[w.root for w in workers], "--log-level", "warn",
    ]  # fmt: skip
    with log.open("wb") as out:
        gateway = Gateway(f"http://127.0.0.1:{port}", subprocess.Popen(cmd, stdout=out, stderr=out))
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if gateway.proc.poll() is not None:
            raise RuntimeError("the gateway exited:\n" + log.read_text(errors="replace"))
        try:
            listed = _get_json(gateway.root + "/workers")["workers"]
            if len(listed) == len(workers) and all(w["is_healthy"] for w in listed):
                return gateway
        except OSError:
            pass
        time.sleep(0.2)
    gateway.stop()
    raise RuntimeError("the gateway did not list its workers healthy")


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


COUNTERS = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:time_to_first_token_seconds_count",
)


def counters(worker: ServerProcess) -> list[float]:
    """The worker's COUNTERS now (its prefix-cache tokens, its first tokens)."""
    values = dict.fromkeys(COUNTERS, 0.0)
    with urllib.request.urlopen(worker.root + "/metrics", timeout=30) as response:
        for line in response.read().decode().splitlines():
            name, _, value = line.partition(" ")
            if name in values:
                values[name] = float(value)
    return [values[name] for name in COUNTERS]


async def run_users(
    target: Target, users: list[list[Prompt]], args: argparse.Namespace
) -> list[RequestRecord]:
    options = RequestOptions(max_tokens=args.tokens, timeout_s=args.timeout)
    epoch = time.perf_counter()

    async def user(index: int, prompts: list[Prompt]) -> list[RequestRecord]:
        records = []
        for n, prompt in enumerate(prompts):
            record = RequestRecord(target.name, args.users, index * args.requests + n, prompt.id)
            await read_stream(target, prompt, options, record, epoch=epoch)
            records.append(record)
        return records

    per_user = await asyncio.gather(*(user(i, p) for i, p in enumerate(users)))
    return [record for records in per_user for record in records]


def run_pass(
    label: str,
    policy_flags: list[str],
    users: list[list[Prompt]],
    args: argparse.Namespace,
    log: Path,
) -> Pass:
    from edge_llm.engine.runtime.llama_backend import default_model_path  # loads llama.cpp

    # No TTFT time-out: on a loaded machine a slow first token is a figure, not an error.
    flags = ["--host-cache-mb", str(args.host_cache_mb), "--ttft-timeout-ms", "0"]
    workers = [start_engine(str(default_model_path()), args.n_threads, flags) for _ in range(2)]
    gateway = None
    try:
        gateway = start_gateway(workers, policy_flags, log, args.backend)
        served = _get_json(workers[0].root + "/v1/models")["data"][0]["id"]
        before = [counters(w) for w in workers]
        began = time.perf_counter()
        records = asyncio.run(run_users(Target(label, gateway.root, model=served), users, args))
        seconds = time.perf_counter() - began
        deltas = [
            [end - start for start, end in zip(b, counters(w), strict=True)]
            for b, w in zip(before, workers, strict=True)
        ]
        queries, hits = (sum(d[i] for d in deltas) for i in (0, 1))
        return Pass(label, seconds, records, queries, hits, [d[2] for d in deltas])
    finally:
        if gateway is not None:
            gateway.stop()
        for worker in workers:
            worker.stop()


def row(result: Pass) -> list[str]:
    ok = [r for r in result.records if r.ok and r.ttft is not None]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    generated = sum(r.completion_tokens or 0 for r in ok)
    return [
        result.label,
        f"{result.hit_rate:.1%}",
        f"{percentile(ttfts, 50):.3f}" if ttfts else "—",
        f"{percentile(ttfts, 95):.3f}" if ttfts else "—",
        f"{len(ok) / result.seconds:.2f}",
        f"{generated / result.seconds:.1f}",
        " / ".join(f"{n:.0f}" for n in result.per_worker),
        f"{len(result.records) - len(ok)} of {len(result.records)}",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    docs = documents(args)
    users = workload(args, docs)
    started, start = datetime.now(UTC), snapshot()
    passes = []
    with TemporaryDirectory(prefix="edge-llm-fleet-") as tmp:
        for n, (label, flags) in enumerate(configurations(args)):
            passes.append(run_pass(label, flags, users, args, Path(tmp) / f"gateway-{n}.log"))
            print(" | ".join(row(passes[-1])), flush=True)
    machine = noise(start, snapshot(), own_pids())
    title = "Two workers behind SGLang Model Gateway: cache_aware, tuned and not, vs round_robin"
    result = table_data(title, COLUMNS, [row(p) for p in passes])
    Console(width=200).print(rich_table(result))
    for line in machine.lines():
        print(line)
    notes = [
        f"SmolLM2-135M; two `edge-llm serve` workers (--n-threads {args.n_threads}, "
        f"--host-cache-mb {args.host_cache_mb}, no TTFT time-out, otherwise as `make run`: "
        "4 slots of their own KV share each) behind sglang-router 0.3.2 "
        f"(`--backend {args.backend}`), fresh workers and gateway per configuration, all "
        f"on this machine's 2 cores; {args.groups} shared documents of {args.doc_words} words "
        f"as system prompts; {args.users} concurrent users x {args.requests} requests, "
        f"each about a document drawn at random (seed {args.seed}, the same sequence for "
        f"every configuration), {args.tokens} tokens at temperature 0. Hit rate: the "
        "workers' vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total over the pass "
        "(tokens); requests per worker: their first tokens; TTFT as the client saw it "
        "through the gateway."
    ]
    raw = {
        "passes": [
            {**{k: v for k, v in asdict(p).items() if k != "records"},
             "records": [asdict(r) for r in p.records]}
            for p in passes
        ],
        "args": {k: v for k, v in vars(args).items() if k not in ("json", "publish")},
    }  # fmt: skip
    write_outputs(args, header("fleet", title, started, machine, notes), [result], raw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
