"""The seed's regenerate-storm comparison in one command.

Starts, on 127.0.0.1 with the same GGUF and threads, each under the same memory ceiling:

- ``edge-contract``: the seed's TOML (src/edge_llm/configs/engine.toml) with its TTFT
  time-out cut to 6 s, as the seed's fix did;
- ``edge-off``: the contract switched off as far as configuration allows: no pause on a
  full socket, no KV release on cancel, no supersede of a session's older request, TTFT
  time-out 10 s;
- ``edge-admission``: the contract plus deadline-aware admission (``--deadline-admission``:
  a request predicted to miss the 6 s TTFT time-out gets 503 ``queue_full`` at once);
- ``llama-server``: llama.cpp's server (``make bench-deps``), ``-np 4`` slots and a
  context of the same KV size as edge-llm's 256 MiB budget;

then runs ``edge-llm storm`` against them (same seeded users, targets taking turns) and
prints one table. Both edge-llm configurations take prompts up to 1,100 tokens (the
seed's ``max_prompt_tokens = 512`` would reject half the storm's prompts at once, which
is a different experiment). The memory ceiling is a cgroup (v1 or v2) memory limit, or
``prlimit --as`` where no cgroup can be made: a server killed by it is counted as an
out-of-memory event from the process (exit by SIGKILL plus the cgroup's ``oom_kill``
count) and restarted on the same port, as a device would reboot; its users then see
connection errors until it is back.

    .venv/bin/python benchmarks/storm.py --users 16 --duration 60 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from machine import Noise, noise, own_pids, snapshot
from output import add_output_flags, header, write_outputs
from peer_servers import PeerError, find_llama_server, free_port
from rich.console import Console

from edge_llm.bench.publish import rich_table, table_data
from edge_llm.bench.storm import (
    StormConfig,
    StormResult,
    StormSettings,
    run_storm,
    summary_row,
    write_html,
)
from edge_llm.bench.targets import Target
from edge_llm.cli.storm import parse_range

token_range = parse_range(int)
seconds_range = parse_range(float)

SEED_TOML = Path(__file__).parents[1] / "src" / "edge_llm" / "configs" / "engine.toml"
CGROUP_V1 = Path("/sys/fs/cgroup/memory")
CGROUP_V2 = Path("/sys/fs/cgroup")
KV_BUDGET_MIB = 256
WORKING_MIB = 256
KV_BYTES_PER_TOKEN = 23_072  # SmolLM2-135M (docs/design.md); llama-server gets the same KV size
START_TIMEOUT_S = 180.0
POLL_S = 0.2
MIB = 1024 * 1024
MAX_PROMPT_TOKENS = 1100

EDGE_COMMON = ["--config", str(SEED_TOML), "--max-prompt-tokens", str(MAX_PROMPT_TOKENS)]
EDGE_CONFIGS = {
    "edge-contract": [*EDGE_COMMON, "--ttft-timeout-ms", "6000"],
    "edge-off": [
        *EDGE_COMMON, "--ttft-timeout-ms", "10000", "--no-pause-on-socket-full",
        "--no-cancel-release-kv", "--no-supersede-sessions",
    ],
}  # fmt: skip


class MemoryCeiling:
    """A memory limit for a server and all its children, and its OOM-kill count."""

    def __init__(self, name: str, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.path: Path | None = None
        self.kind = "prlimit --as (virtual memory)"
        tag = f"edge-storm-{name}-{os.getpid()}"
        for root, kind in ((CGROUP_V2, "cgroup v2 memory.max"), (CGROUP_V1, "cgroup v1 memory")):
            with contextlib.suppress(OSError):
                if kind.startswith("cgroup v2") and not (root / "cgroup.controllers").exists():
                    continue
                path = root / tag
                path.mkdir(exist_ok=True)
                limit_file = "memory.max" if "v2" in kind else "memory.limit_in_bytes"
                (path / limit_file).write_text(str(limit_bytes))
                self.path, self.kind = path, kind
                break

    def wrap(self, cmd: list[str]) -> list[str]:
        """``cmd`` run inside the ceiling (the shell joins the cgroup, then execs)."""
        if self.path is None:
            return ["prlimit", f"--as={self.limit_bytes}", "--", *cmd]
        join = f"echo $$ > {shlex.quote(str(self.path / 'cgroup.procs'))} && exec "
        return ["sh", "-c", join + shlex.join(cmd)]

    def oom_kills(self) -> int | None:
        if self.path is None:
            return None
        for name in ("memory.events", "memory.oom_control"):
            with contextlib.suppress(OSError):
                for line in (self.path / name).read_text().splitlines():
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        return None

    def remove(self) -> None:
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.rmdir()


@dataclass
class Death:
    at_s: float
    returncode: int | None
    oom_kills: int | None


@dataclass
class Supervised:
    """A server on a fixed port under a ceiling, restarted when it dies."""

    name: str
    cmd: list[str]
    port: int
    ceiling: MemoryCeiling
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    deaths: list[Death] = field(default_factory=list)
    peak_rss: int = 0
    final_oom_kills: int | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _started_at: float = field(default_factory=time.monotonic)

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.ceiling.wrap(self.cmd), stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _healthy(self.root):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise PeerError(f"{self.name} did not start; see {self.log_path}")
            time.sleep(POLL_S)  # no readiness event to wait on: poll /health

    def supervise(self) -> None:
        threading.Thread(target=self._watch, daemon=True, name=f"watch-{self.name}").start()

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            proc = self.proc
            if proc is None:
                continue
            if proc.poll() is None:
                self.peak_rss = max(self.peak_rss, _rss(proc.pid))
                continue
            if self._stop.is_set():
                return
            at = time.monotonic() - self._started_at
            self.deaths.append(Death(at, proc.returncode, self.ceiling.oom_kills()))
            with contextlib.suppress(PeerError):
                self.start()

    def stop(self) -> None:
        self._stop.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.final_oom_kills = self.ceiling.oom_kills()
        self.ceiling.remove()


def _rss(pid: int) -> int:
    try:
        process = psutil.Process(pid)
        return sum(int(p.memory_info().rss) for p in [process, *process.children(recursive=True)])
    except psutil.Error:
        return 0


def _healthy(root: str) -> bool:
    try:
        with urllib.request.urlopen(root + "/health", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def default_ceiling_mib(model: str) -> int:
    """The device's memory in the comparison: model file + the seed's 256 MiB KV budget +
    256 MiB of working memory (runtime, buffers, HTTP). Chosen from the seed's numbers,
    not from what any server was measured to use."""
    return round(Path(model).stat().st_size / MIB) + KV_BUDGET_MIB + WORKING_MIB


def server_commands(args: argparse.Namespace, model: str) -> dict[str, list[str]]:
    python = sys.executable
    commands = {
        name: [python, "-m", "edge_llm", "serve", "--host", "127.0.0.1", "--model", model,
               "--n-threads", str(args.threads), *flags]
        for name, flags in EDGE_CONFIGS.items()
    }  # fmt: skip
    if not args.no_admission:
        commands["edge-admission"] = [*commands["edge-contract"], "--deadline-admission"]
    if not args.skip_llama:
        binary = find_llama_server(args.llama_server)
        ctx = KV_BUDGET_MIB * MIB // KV_BYTES_PER_TOKEN
        commands["llama-server"] = [
            binary, "-m", model, "-t", str(args.threads), "-tb", str(args.threads),
            "-np", "4", "-c", str(ctx), "--host", "127.0.0.1", "--metrics",
        ]  # fmt: skip
    return commands


def start_servers(args: argparse.Namespace, model: str, logs: Path) -> list[Supervised]:
    servers = []
    try:
        for name, cmd in server_commands(args, model).items():
            port = free_port()
            port_flag = ["--port", str(port)]
            ceiling = MemoryCeiling(name, args.memory_mb * MIB)
            server = Supervised(name, [*cmd, *port_flag], port, ceiling, logs / f"{name}.log")
            servers.append(server)
            server.start()
            server.supervise()
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--model", help="GGUF (default: the embedded SmolLM2-135M)")
    parser.add_argument("--threads", type=int, default=2, help="threads of every server")
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds per run")
    parser.add_argument("--rounds", type=int, default=2, help="runs per server, order rotating")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ttft-slo-ms", type=float, default=3000.0)
    parser.add_argument("--prompt-tokens", type=token_range, default=(128, 1024),
                        metavar="LOW-HIGH", help="prompt length range (tokens)")  # fmt: skip
    parser.add_argument("--patience", type=seconds_range, default=(3.0, 8.0),
                        metavar="LOW-HIGH", help="seconds before a user regenerates")  # fmt: skip
    parser.add_argument("--memory-mb", type=int, help="ceiling per server (default: model + "
                        "256 MiB KV + 256 MiB working memory)")  # fmt: skip
    parser.add_argument("--no-admission", action="store_true",
                        help="leave out edge-admission")  # fmt: skip
    parser.add_argument("--skip-llama", action="store_true", help="edge-llm configurations only")
    parser.add_argument("--llama-server", help="path of the llama-server binary")
    add_output_flags(parser)
    parser.add_argument("--report", help="write the storm's HTML report")
    parser.add_argument("--logs", default="/tmp", help="directory for the servers' logs")
    return parser.parse_args(argv)


def default_model() -> str:
    from edge_llm.engine.runtime.llama_backend import default_model_path

    return str(default_model_path())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=220)
    model = args.model or default_model()
    args.memory_mb = args.memory_mb or default_ceiling_mib(model)
    load_before = os.getloadavg()
    try:
        servers = start_servers(args, model, Path(args.logs))
    except PeerError as exc:
        print(f"storm benchmark: {exc}", file=sys.stderr)
        return 2
    try:
        settings = StormSettings(
            users=args.users, duration_s=args.duration, seed=args.seed,
            ttft_slo_ms=args.ttft_slo_ms, prompt_tokens=args.prompt_tokens,
            patience_s=args.patience,
        )  # fmt: skip
        targets = tuple(Target(s.name, s.root) for s in servers)
        pids = {s.name: s.proc.pid for s in servers if s.proc is not None}
        config = StormConfig(targets, settings, args.rounds, pids)
        started, start = datetime.now(UTC), snapshot()
        result = asyncio.run(run_storm(config))
        machine = noise(start, snapshot(), own_pids())  # while the servers still run
    finally:
        for server in servers:
            server.stop()
    setup = describe(args, servers, load_before)
    table = storm_table(result, servers)
    console.print(setup)
    console.print(rich_table(table))
    write_storm_outputs(args, result, servers, setup, (started, machine, table))
    return 0


def describe(
    args: argparse.Namespace, servers: list[Supervised], load_before: tuple[float, float, float]
) -> str:
    ceiling = servers[0].ceiling.kind if servers else "-"
    return (
        f"{os.cpu_count()} cores, load average before {load_before[0]:.1f}, after "
        f"{os.getloadavg()[0]:.1f}; {args.users} users x {args.duration:g} s x {args.rounds} "
        f"round(s), seed {args.seed}, prompts {args.prompt_tokens[0]}-{args.prompt_tokens[1]} "
        f"tokens, patience {args.patience[0]:g}-{args.patience[1]:g} s; memory ceiling "
        f"{args.memory_mb} MiB per server ({ceiling}); goodput = completed with TTFT <= "
        f"{args.ttft_slo_ms:.0f} ms"
    )


HEADERS = ("server", "requests", "completed", "abandoned", "superseded", "failed",
           "TTFT p50/p90/p99 ms", "goodput", "goodput/min", "tokens unread",
           "wasted prefill", "peak KV MiB", "peak run/wait/paused", "peak RSS MiB",
           "OOM kills / deaths", "errors")  # fmt: skip


def storm_table(result: StormResult, servers: list[Supervised]) -> dict[str, Any]:
    by_name = {s.name: s for s in servers}
    rows = []
    for summary in result.summaries:
        row = list(summary_row(summary))
        server = by_name[summary.target]
        row[13] = f"{server.peak_rss / MIB:.0f}"  # sampled every 0.2 s, restarts included
        kills = server.final_oom_kills
        deaths = f"{kills if kills is not None else '?'} / {len(server.deaths)}"
        rows.append([*row[:14], deaths, row[14]])
    return table_data("storm: one row per server", HEADERS, rows)


def write_storm_outputs(
    args: argparse.Namespace,
    result: StormResult,
    servers: list[Supervised],
    setup: str,
    run: tuple[datetime, Noise, dict[str, Any]],
) -> None:
    started, machine, table = run
    data: dict[str, Any] = result.to_json()
    data["servers"] = [
        {
            "name": s.name, "command": s.cmd, "ceiling": s.ceiling.kind,
            "ceiling_bytes": s.ceiling.limit_bytes, "peak_rss_bytes": s.peak_rss,
            "oom_kills": s.final_oom_kills,
            "deaths": [vars(d) for d in s.deaths],
        }
        for s in servers
    ]  # fmt: skip
    info = header("storm", "Regenerate storm", started, machine, [setup])
    write_outputs(args, info, [table], data)
    if args.report:
        write_html(result, args.report)


if __name__ == "__main__":
    sys.exit(main())
