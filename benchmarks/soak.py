"""Long run: thousands of start/pause/resume/cancel/disconnect cycles.

Starts its own engine (the embedded model, default configuration), drives
``--cycles`` cycles across WebSocket and SSE with a few concurrent workers, and
prints the engine's RSS and KV use every ``--report-every`` cycles. It checks at
the end that KV is back at its idle value and that RSS after the warm-up stayed
flat within ``--max-growth-mb``. Exit code 0 when both hold.

    .venv/bin/python benchmarks/soak.py --cycles 2000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp
import psutil
from machine import noise, own_pids
from machine import snapshot as machine_snapshot
from output import add_output_flags, header, write_outputs
from rich.console import Console

from edge_llm.bench.publish import rich_table, table_data

STORY = "Write a very long story about a dragon and a knight."


def start_engine(extra: list[str]) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "edge_llm", "serve", "--port", "0", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if " on http://" in line:
            return proc, line.split(" on ", 1)[1].split()[0]
    raise RuntimeError("engine did not start")


def snapshot(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/debug/streams", timeout=30) as response:
        result: dict[str, Any] = json.loads(response.read())
        return result


def body(max_tokens: int) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": STORY}],
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "stream": True,
    }


async def ws_cycle(session: aiohttp.ClientSession, url: str, rng: random.Random) -> str:
    """start, maybe pause/resume, then cancel or just close (disconnect)."""
    async with session.ws_connect(url.replace("http", "ws") + "/v1/stream") as ws:
        await ws.send_json({"type": "start", "request": body(rng.randint(8, 128))})
        for _ in range(rng.randint(1, 6)):
            frame = await ws.receive_json()
            if frame["type"] in ("done", "error"):
                return "finished"
        if rng.random() < 0.5:
            await ws.send_json({"type": "pause"})
            await ws.send_json({"type": "resume"})
        if rng.random() < 0.5:
            await ws.send_json({"type": "cancel"})
            return "cancel"
    return "disconnect"


async def sse_cycle(session: aiohttp.ClientSession, url: str, rng: random.Random) -> str:
    """read a few chunks, then drop the connection, or read to the end."""
    async with session.post(url + "/v1/chat/completions", json=body(rng.randint(8, 128))) as r:
        if r.status != 200:
            return f"status {r.status}"
        if rng.random() < 0.3:
            await r.read()
            return "finished"
        for _ in range(rng.randint(1, 6)):
            if not await r.content.readline():
                break
    return "disconnect"


async def worker(url: str, cycles: int, counts: dict[str, int], seed: int) -> None:
    rng = random.Random(seed)
    async with aiohttp.ClientSession() as session:
        for _ in range(cycles):
            cycle = ws_cycle if rng.random() < 0.5 else sse_cycle
            outcome = await cycle(session, url, rng)
            counts[outcome] = counts.get(outcome, 0) + 1


async def wait_idle(url: str, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        state = await asyncio.to_thread(snapshot, url)
        if state["kv_used_bytes"] == 0 and state["requests_running"] == 0:
            return state
        if time.monotonic() > deadline:
            return state
        await asyncio.sleep(0.1)


@dataclass
class Soak:
    """Checkpoints (cycles, elapsed s, RSS MB, KV bytes in use, outcomes so far) and verdict."""

    checkpoints: list[list[str]] = field(default_factory=list)
    kv_idle: bool = False
    growth_mb: float = 0.0


async def soak(url: str, process: psutil.Process, args: argparse.Namespace) -> Soak:
    counts: dict[str, int] = {}
    per_round = args.report_every // args.workers
    baseline_rss = None
    started = time.monotonic()
    done = 0
    result = Soak()
    print("cycles  elapsed_s  rss_mb  kv_used_bytes  outcomes")
    while done < args.cycles:
        await asyncio.gather(
            *(worker(url, per_round, counts, done * 31 + i) for i in range(args.workers))
        )
        done += per_round * args.workers
        state = await wait_idle(url)
        rss = process.memory_info().rss
        if baseline_rss is None and done >= args.warmup:
            baseline_rss = rss
        elapsed = time.monotonic() - started
        print(
            f"{done:6d}  {elapsed:9.1f}  {rss / 1e6:6.1f}  {state['kv_used_bytes']:13d}  {counts}"
        )
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        row = [str(done), f"{elapsed:.1f}", f"{rss / 1e6:.1f}", str(state["kv_used_bytes"])]
        result.checkpoints.append([*row, outcomes])
    final = await wait_idle(url)
    result.growth_mb = (process.memory_info().rss - (baseline_rss or 0)) / 1e6
    result.kv_idle = final["kv_used_bytes"] == 0
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--report-every", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--max-growth-mb", type=float, default=16.0)
    add_output_flags(parser)
    args = parser.parse_args()
    started, start = datetime.now(UTC), machine_snapshot()
    proc, url = start_engine([])
    try:
        result = asyncio.run(soak(url, psutil.Process(proc.pid), args))
        machine = noise(start, machine_snapshot(), own_pids())  # while the engine runs
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    ok = result.kv_idle and result.growth_mb <= args.max_growth_mb
    columns = ("cycles", "elapsed s", "engine RSS MB", "KV bytes in use", "outcomes so far")
    table = table_data(f"{args.cycles} cycles, {args.workers} workers", columns, result.checkpoints)
    Console(width=160).print(rich_table(table))
    verdict = (
        f"KV idle at the end: {result.kv_idle}; RSS growth after the first {args.warmup} cycles: "
        f"{result.growth_mb:.1f} MB (limit {args.max_growth_mb:g}): {'pass' if ok else 'FAIL'}"
    )
    print(verdict)
    info = header("soak", "Soak: start/pause/resume/cancel/disconnect cycles", started, machine,
                  [verdict])  # fmt: skip
    raw = {"kv_idle": result.kv_idle, "rss_growth_mb": result.growth_mb}
    write_outputs(args, info, [table], raw)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
