"""Interactive TTFT under a saturating background batch, with and without priorities.

Starts one edge-llm server as ``make run`` serves it (``edge-llm serve`` with its
defaults and the embedded model, on 127.0.0.1; ``--threads`` and ``--serve-args`` add
flags), then, in one run:

1. **idle**: interactive requests one at a time on the idle engine (the interactive
   users' own first turns, same prompt lengths and text windows, another tag), read to
   the end;
2. **priorities**: ``edge-llm storm``'s mixed workload: ``--batch-users`` background jobs
   (by default as many as the engine's ``max_sequences``, so they fill every slot) sent
   with ``priority: --batch-priority``, beside ``--users`` interactive users (no
   priority field: class 0) who never regenerate, abandon nor read slowly, so every
   interactive TTFT is the whole wait;
3. **no priorities**: the same seeded load with no priority field (``--no-priorities``):
   one class, first come first served;
4. **text check**: up to ``--replays`` completed background jobs of each mixed run (the
   preempted ones first) sent again, alone, on the idle engine, with the same text at
   temperature 0: their answers must be identical.

The table: interactive TTFT p50/p99 and its ratio to idle, the background's completed
jobs, tokens lost, throughput (tokens read per second of the run) and preemptions.

    .venv/bin/python benchmarks/priorities.py --duration 60
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from machine import noise, own_pids, snapshot
from output import add_output_flags, header, write_outputs
from peer_servers import PeerError, ServerProcess, start_engine
from rich.console import Console

from edge_llm.bench.chat_stream import ChatStream, RequestOptions, read_stream
from edge_llm.bench.publish import rich_table, table_data
from edge_llm.bench.record import RequestRecord
from edge_llm.bench.runner import discover_model
from edge_llm.bench.stats import Distribution
from edge_llm.bench.storm import (
    StormConfig,
    StormResult,
    StormSettings,
    StormSettingsError,
    run_storm,
)
from edge_llm.bench.storm.load import BATCH, INTERACTIVE, fitted, user_turn
from edge_llm.bench.storm.run import wait_idle
from edge_llm.bench.storm.stats import ClassSummary, StormSummary
from edge_llm.bench.storm.user import StormRecord, turn_tag
from edge_llm.bench.storm.watch import ServerWatch
from edge_llm.bench.targets import Target
from edge_llm.cli.storm import parse_range
from edge_llm.config.tree import (
    ConfigError,
    EngineConfig,
    add_config_flags,
    flag_overrides,
    load_config,
)

token_range = parse_range(int)
seconds_range = parse_range(float)

GOAL_RATIO = 1.5  # issue #28: interactive TTFT p99 under load <= 1.5x idle
IDLE_TIMEOUT_S = 120.0
MIB = 1024 * 1024
DASH = "-"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None, allow_abbrev=False
    )
    add = parser.add_argument
    add("--model", help="GGUF (default: the embedded SmolLM2-135M)")
    add("--threads", type=int, default=os.cpu_count() or 2,
        help="the server's --n-threads (default: the CPU count, as make run)")  # fmt: skip
    add("--serve-args", default="", help="more `edge-llm serve` flags, one string (shell-split)")
    add("--users", type=int, default=2, help="interactive users")
    add("--batch-users", type=int,
        help="background jobs at once (default: the server's max_sequences)")  # fmt: skip
    add("--batch-priority", type=int, default=5,
        help="the background's priority (interactive: none, i.e. 0)")  # fmt: skip
    add("--duration", type=float, default=60.0, help="seconds per mixed run")
    add("--idle-requests", type=int, default=12, help="interactive requests on the idle engine")
    add("--replays", type=int, default=6,
        help="background jobs per mixed run replayed alone for the text check")  # fmt: skip
    add("--seed", type=int, default=0)
    add("--prompt-tokens", type=token_range, default=(128, 1024), metavar="LOW-HIGH",
        help="prompt length range (tokens), lowered to what the server admits")  # fmt: skip
    add("--max-tokens", type=int, default=128, help="per request")
    add("--think", type=seconds_range, default=(1.0, 4.0), metavar="LOW-HIGH",
        help="seconds between an interactive user's turns")  # fmt: skip
    add("--ttft-slo-ms", type=float, default=3000.0)
    add("--timeout", type=float, default=120.0, help="per request (s)")
    add_output_flags(parser)
    return parser.parse_args(argv)


def server_config(extra: list[str]) -> EngineConfig:
    """The configuration the server resolves from the same flags and environment."""
    parser = argparse.ArgumentParser(prog="edge-llm serve", allow_abbrev=False)
    parser.add_argument("--config")
    add_config_flags(parser)
    flags = parser.parse_args(extra)
    return load_config(flags.config, overrides=flag_overrides(flags))


def default_model() -> str:
    from edge_llm.engine.runtime.llama_backend import default_model_path

    return str(default_model_path())


# -- the phases -------------------------------------------------------------------------


@dataclass
class Replay:
    """A completed background job sent again alone: is its answer the same text?"""

    user: int
    turn: int
    preemptions: int
    identical: bool | None  # None: the replay failed
    error: str | None = None
    first_difference: int | None = None  # index of the first differing character
    under_load: str = ""
    alone: str = ""

    def to_json(self) -> dict[str, Any]:
        return vars(self)


@dataclass
class Mixed:
    """One mixed run (with or without priorities) and its replays."""

    name: str
    result: StormResult
    replays: list[Replay] = field(default_factory=list)

    @property
    def summary(self) -> StormSummary:
        return self.result.summaries[0]

    def cls(self, kind: str) -> ClassSummary | None:
        return next((c for c in self.summary.classes if c.kind == kind), None)

    def records(self, kind: str) -> list[StormRecord]:
        return [r for r in self.result.records if r.kind == kind]

    def streams(self) -> dict[str, dict[str, Any]]:
        return {sid: e for run in self.result.runs for sid, e in run.data.streams.items()}

    def batch_tokens_per_s(self) -> float | None:
        duration = self.summary.duration_s
        tokens = sum(r.tokens_read for r in self.records(BATCH))
        return tokens / duration if duration > 0 else None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "storm": self.result.to_json(),
            "batch_tokens_per_s": self.batch_tokens_per_s(),
            "replays": [r.to_json() for r in self.replays],
        }


@dataclass
class Idle:
    records: list[RequestRecord]

    @property
    def ttft(self) -> Distribution | None:
        return Distribution.of([r.ttft for r in self.records if r.ok and r.ttft is not None])

    @property
    def failed(self) -> int:
        return sum(1 for r in self.records if not r.ok)

    def to_json(self) -> dict[str, Any]:
        ttft = self.ttft
        return {"ttft": None if ttft is None else asdict(ttft),
                "records": [r.to_json() for r in self.records]}  # fmt: skip


def options(settings: StormSettings) -> RequestOptions:
    return RequestOptions(
        max_tokens=settings.max_tokens, temperature=0.0, timeout_s=settings.timeout_s
    )


async def send_alone(
    target: Target, prompt: Any, settings: StormSettings, index: int
) -> ChatStream:
    """One request on its own, read to the end."""
    record = RequestRecord(target.name, 1, index, prompt.id)
    return await read_stream(target, prompt, options(settings), record, epoch=0.0)


async def idle_phase(target: Target, watch: ServerWatch, settings: StormSettings, n: int) -> Idle:
    """The interactive users' first turns, one request at a time, tagged ``idle``."""
    records = []
    for i in range(n):
        user, index = i % settings.users, i // settings.users
        turn = user_turn(settings, user, index)
        await wait_idle(watch, IDLE_TIMEOUT_S)
        prompt = turn.prompt(settings, turn_tag("idle", 0, turn))
        records.append((await send_alone(target, prompt, settings, i)).record)
    return Idle(records)


async def mixed_phase(name: str, target: Target, settings: StormSettings, pid: int) -> Mixed:
    config = StormConfig((target,), settings, rounds=1, pids={target.name: pid})
    return Mixed(name, await run_storm(config))


async def replay_phase(
    mixed: Mixed, target: Target, watch: ServerWatch, settings: StormSettings, n: int
) -> None:
    """Up to ``n`` completed background jobs sent again alone, preempted ones first."""
    streams = mixed.streams()

    def preemptions(r: StormRecord) -> int:
        return int((streams.get(r.request.stream_id or "") or {}).get("preemptions") or 0)

    done = [r for r in mixed.records(BATCH) if r.outcome == "completed" and r.text is not None]
    done.sort(key=lambda r: (-preemptions(r), r.started_at))
    for i, record in enumerate(done[:n]):
        turn = user_turn(settings, record.user, record.turn, batch=True)
        prompt = turn.prompt(settings, turn_tag(mixed.result.run_tag, record.round, turn))
        await wait_idle(watch, IDLE_TIMEOUT_S)
        stream = await send_alone(target, prompt, settings, i)
        rec = stream.record
        loaded, alone = record.text or "", stream.text
        same = loaded == alone if rec.ok else None
        error = None if rec.ok else f"{rec.error_kind}: {rec.error_message}"
        diff = None if same is not False else first_difference(loaded, alone)
        replay = Replay(record.user, record.turn, preemptions(record), same, error, diff)
        replay.under_load, replay.alone = loaded, alone
        mixed.replays.append(replay)


def first_difference(a: str, b: str) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


async def measure(
    args: argparse.Namespace, server: ServerProcess, settings: StormSettings
) -> tuple[StormSettings, Idle, list[Mixed]]:
    target = await discover_model(Target("edge-llm", server.root))
    watch = ServerWatch(target, server.proc.pid)
    await watch.detect()
    settings = fitted(settings, watch.max_prompt_tokens)
    idle = await idle_phase(target, watch, settings, args.idle_requests)
    runs = []
    for name, on in (("priorities", True), ("no priorities", False)):
        runs.append(
            await mixed_phase(name, target, replace(settings, priorities=on), server.proc.pid)
        )
    for run in runs:
        await replay_phase(run, target, watch, settings, args.replays)
    return settings, idle, runs


# -- the table --------------------------------------------------------------------------

HEADERS = (
    "run", "interactive requests / failed", "interactive TTFT p50 / p99 ms",
    "x idle p50 / p99", f"p99 <= {GOAL_RATIO:g}x idle", "background completed / requests",
    "background tokens lost", "background tok/s", "background throughput vs no priorities",
    "preemptions", "text identical (replayed, of them preempted)", "peak KV MiB",
    "peak run / wait / paused", "errors",
)  # fmt: skip


def _ms_pair(d: Distribution | None) -> str:
    return DASH if d is None else f"{d.p50 * 1000:.0f} / {d.p99 * 1000:.0f}"


def _ratio(d: Distribution | None, idle: Distribution | None) -> str:
    if d is None or idle is None or idle.p50 <= 0 or idle.p99 <= 0:
        return DASH
    return f"{d.p50 / idle.p50:.2f} / {d.p99 / idle.p99:.2f}"


def _goal(d: Distribution | None, idle: Distribution | None) -> str:
    if d is None or idle is None:
        return DASH
    return "yes" if d.p99 <= GOAL_RATIO * idle.p99 else "no"


def _identity(replays: list[Replay]) -> str:
    if not replays:
        return "none replayed"
    same = sum(1 for r in replays if r.identical)
    pre = [r for r in replays if r.preemptions]
    pre_same = sum(1 for r in pre if r.identical)
    failed = sum(1 for r in replays if r.identical is None)
    text = f"{same}/{len(replays)} ({pre_same}/{len(pre)} preempted)"
    return text + (f", {failed} replay(s) failed" if failed else "")


def _peaks(s: StormSummary) -> str:
    return " / ".join(DASH if v is None else str(v)
                      for v in (s.peak_running, s.peak_waiting, s.peak_paused))  # fmt: skip


def mixed_row(run: Mixed, idle: Distribution | None, baseline: float | None) -> list[str]:
    inter, batch = run.cls(INTERACTIVE), run.cls(BATCH)
    s = run.summary
    throughput = run.batch_tokens_per_s()
    if run.name == "priorities" and throughput is not None and baseline:
        versus = f"{throughput / baseline - 1:+.0%}"
    else:
        versus = DASH
    kv = DASH if s.peak_kv_bytes is None else f"{s.peak_kv_bytes / MIB:.1f}"
    return [
        run.name,
        DASH if inter is None else f"{inter.n_requests} / {inter.outcomes.get('failed', 0)}",
        _ms_pair(None if inter is None else inter.ttft),
        _ratio(None if inter is None else inter.ttft, idle),
        _goal(None if inter is None else inter.ttft, idle) if run.name == "priorities" else DASH,
        DASH if batch is None else f"{batch.outcomes.get('completed', 0)} / {batch.n_requests}",
        DASH if batch is None or batch.tokens_lost is None else str(batch.tokens_lost),
        DASH if throughput is None else f"{throughput:.1f}",
        versus,
        DASH if batch is None or batch.preemptions is None else str(batch.preemptions),
        _identity(run.replays),
        kv,
        _peaks(s),
        _errors(run),
    ]


def _errors(run: Mixed) -> str:
    parts = []
    for kind, label in ((INTERACTIVE, "interactive"), (BATCH, "background")):
        failed = [r for r in run.records(kind) if r.outcome == "failed"]
        kinds = Counter(r.request.error_kind or "?" for r in failed)
        parts += [f"{label} {k} x{n}" for k, n in sorted(kinds.items())]
    return ", ".join(parts) or DASH


def result_table(idle: Idle, runs: list[Mixed]) -> dict[str, Any]:
    base = idle.ttft
    kinds = Counter(r.error_kind for r in idle.records if r.error_kind)
    errors = ", ".join(f"interactive {k} x{n}" for k, n in sorted(kinds.items())) or DASH
    idle_row = [
        "idle", f"{len(idle.records)} / {idle.failed}", _ms_pair(base), "1.00 / 1.00",
        *([DASH] * (len(HEADERS) - 5)), errors,
    ]  # fmt: skip
    baseline = next((r.batch_tokens_per_s() for r in runs if r.name == "no priorities"), None)
    rows = [idle_row, *(mixed_row(r, base, baseline) for r in runs)]
    return table_data("priorities: interactive TTFT under a background batch", HEADERS, rows)


def describe(
    args: argparse.Namespace, settings: StormSettings, config: EngineConfig, cmd: list[str]
) -> list[str]:
    low, high = settings.prompt_tokens
    return [
        f"server: {shlex.join(cmd)} (max_sequences {config.scheduler.max_sequences}, KV "
        f"budget {config.backpressure.max_kv_cache_mb} MiB, max_prompt_tokens "
        f"{config.backpressure.max_prompt_tokens}, ttft_timeout_ms "
        f"{config.backpressure.ttft_timeout_ms})",
        f"{os.cpu_count()} cores; seed {settings.seed}; {settings.users} interactive user(s) "
        f"(think {settings.think_s[0]:g}-{settings.think_s[1]:g} s, no regenerate, no abandon, "
        f"no slow reader) beside {settings.batch_users} background job(s) at a time (one "
        f"after another, priority {settings.batch_priority} in the priorities run, none in "
        f"the other), {settings.duration_s:g} s per mixed run; prompts {low}-{high} tokens, "
        f"max_tokens {settings.max_tokens}, temperature 0",
        f"idle: {args.idle_requests} interactive requests one at a time (the users' first "
        "turns, another tag: no prompt cache beyond the system prompt), each read to the end",
        "TTFT: first content chunk after the request's start, over the requests a user read; "
        "x idle: p50 over idle p50, p99 over idle p99; failed interactive requests (e.g. "
        "ttft_timeout) are not in the TTFT columns",
        "background tokens lost: generated for background jobs and never read "
        "(/debug/streams); throughput: tokens read by background jobs per second of the run; "
        "preemptions: of background streams (/debug/streams)",
        f"text identical: up to {args.replays} completed background jobs per mixed run "
        "(preempted first) replayed alone on the idle engine with the same prompt at "
        "temperature 0, answer compared with the one streamed under load "
        + (
            "(deterministic: neither a cache hit, nor a preemption, nor the other streams "
            "of its steps change a text)"
            if config.scheduler.deterministic
            else "(--no-deterministic: a text may differ past 256 cells because other "
            "streams shared its steps: docs/architecture.md, 'Batching and what stays "
            "deterministic')"
        ),
    ]


# -- main -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=220)
    model = args.model or default_model()
    extra = shlex.split(args.serve_args)
    try:
        config = server_config(extra)
    except (ConfigError, SystemExit) as exc:
        print(f"priorities benchmark: --serve-args: {exc}", file=sys.stderr)
        return 2
    settings = StormSettings(
        users=args.users, duration_s=args.duration, seed=args.seed,
        prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens,
        patience_s=(args.timeout, args.timeout), max_regenerates=0, abandon_share=0.0,
        slow_share=0.0, think_s=args.think, ttft_slo_ms=args.ttft_slo_ms,
        timeout_s=args.timeout, batch_users=args.batch_users or config.scheduler.max_sequences,
        batch_priority=args.batch_priority, fit_prompts=True,
    )  # fmt: skip
    try:
        settings.check()
    except StormSettingsError as exc:
        print(f"priorities benchmark: {exc}", file=sys.stderr)
        return 2
    try:
        server = start_engine(model, args.threads, extra)
    except PeerError as exc:
        print(f"priorities benchmark: {exc}", file=sys.stderr)
        return 2
    cmd = [str(c) for c in server.proc.args] if isinstance(server.proc.args, list) else []
    try:
        started, start = datetime.now(UTC), snapshot()
        settings, idle, runs = asyncio.run(measure(args, server, settings))
        machine = noise(start, snapshot(), own_pids())  # while the server still runs
        setup = describe(args, settings, config, cmd)
    finally:
        server.stop()
    table = result_table(idle, runs)
    for line in [*setup, *machine.lines()]:
        console.print(line, highlight=False)
    console.print(rich_table(table))
    info = header("priorities", "Priorities under a background batch", started, machine, setup)
    raw = {"settings": settings.to_json(), "idle": idle.to_json(),
           "runs": [r.to_json() for r in runs]}  # fmt: skip
    write_outputs(args, info, [table], raw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
