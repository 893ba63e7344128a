"""Soak: mixed traffic for a long time, the engine's RSS and memory ledger sampled.

Starts its own engine (the embedded model) once per configuration and keeps
``--workers`` clients busy for ``--minutes`` with a mix like a device's day (issue
48): chat, long prompts, conversations in a session (a regenerate, then the next
turn), streams the client cuts (SSE dropped, WebSocket paused and cancelled),
Ollama chat, embeddings and Responses. Every second it samples the engine's RSS;
every few seconds ``/debug/streams``' ``memory_ledger``. At the end: RSS when ready,
its peak and end, the ledger's peak against ``max_kv_cache_mb``, what RSS holds
beyond weights + cap (the runtime), the regenerate and next-turn cache hit rates,
requests by kind and refusals, and whether KV is back to idle.

Configurations (``--configs``): ``default`` (no flags: the defaults, as ``make
run``), ``seed`` (the seed's TOML, src/edge_llm/configs/engine.toml) and
``no-host-tiers`` (``--host-cache-mb 0 --host-offload-mb 0``: the whole cap as live
KV, no host tiers), so the reuse the host tiers buy is visible beside the memory, and
``additive`` (``--max-kv-cache-mb 1024``: the total the tiers could reach before the
ledger, 256 + 256 + 512, as the cap), whose hit rates the defaults' are held against.
A request that fails in a way the mix does not expect is counted by its exception's
name and the worker goes on: a rare failure must not end a half-hour run.

    .venv/bin/python benchmarks/soak.py --minutes 30 --configs default,seed
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from machine import noise, own_pids
from machine import snapshot as machine_snapshot
from output import add_output_flags, header, write_outputs
from rich.console import Console

from edge_llm.bench.publish import rich_table, table_data

MIB = 1 << 20
SEED_TOML = Path(__file__).resolve().parents[1] / "src/edge_llm/configs/engine.toml"
CONFIGS = {
    "default": [],
    "seed": ["--config", str(SEED_TOML)],
    "no-host-tiers": ["--host-cache-mb", "0", "--host-offload-mb", "0"],
    # The earlier additive tiers' total (256 + 256 + 512 MiB) as the cap: the host
    # tiers get a quarter of it (256 MiB, what host_cache_mb alone held before the
    # ledger) and the KV context the rest (768 MiB; it was 256): the reuse of roomier
    # tiers than ever before, to compare the defaults' hit rates with.
    "additive": ["--max-kv-cache-mb", "1024"],
}
TOPICS = (
    "a lighthouse keeper",
    "a night train",
    "a mountain village",
    "a river delta",
    "an old library",
    "a market at dawn",
    "a storm at sea",
    "a desert observatory",
)
LONG_TEXT = (
    "The harbour wakes before the town. Boats come in with the tide, gulls circle the "
    "nets, and the auction hall fills with buyers who have driven through the night. "
) * 12  # about 400 tokens
KINDS = ("chat", "long", "conversation", "cut_sse", "cut_ws", "ollama", "embeddings", "responses")


def start_engine(flags: list[str]) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "edge_llm", "serve", "--port", "0", *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if " on http://" in line:
            threading.Thread(target=_drain, args=(proc,), daemon=True).start()
            return proc, line.split(" on ", 1)[1].split()[0]
    raise RuntimeError("engine did not start")


def _drain(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    for _ in proc.stdout:
        pass


def debug(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/debug/streams", timeout=30) as response:
        result: dict[str, Any] = json.loads(response.read())
        return result


def models(url: str) -> list[str]:
    with urllib.request.urlopen(url + "/v1/models", timeout=30) as response:
        return [m["id"] for m in json.loads(response.read())["data"]]


@dataclass
class Tally:
    requests: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)  # status or error code -> count
    regenerates: int = 0
    regenerate_hits: int = 0  # the whole prompt came from the cache
    next_turns: int = 0
    next_turn_cached: float = 0.0  # sum of cached / prompt tokens

    def count(self, kind: str) -> None:
        self.requests[kind] = self.requests.get(kind, 0) + 1

    def refuse(self, why: str) -> None:
        self.refused[why] = self.refused.get(why, 0) + 1


class Client:
    def __init__(self, session: aiohttp.ClientSession, url: str, tally: Tally, model: str) -> None:
        self.session, self.url, self.tally, self.model = session, url, tally, model

    async def post(self, path: str, body: dict[str, Any], **headers: str) -> dict[str, Any] | None:
        async with self.session.post(self.url + path, json=body, headers=headers) as reply:
            data = await reply.read()
            if reply.status != 200:
                error = json.loads(data).get("error", {}) if data.startswith(b"{") else {}
                code = error.get("code") if isinstance(error, dict) else None
                self.tally.refuse(f"{path} {reply.status} {code or ''}".strip())
                return None
            result: dict[str, Any] = json.loads(data)
            return result

    async def chat(self, messages: list[dict[str, str]], max_tokens: int, **headers: str) -> Any:
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
        return await self.post("/v1/chat/completions", body, **headers)

    async def run(self, kind: str, rng: random.Random) -> None:
        self.tally.count(kind)
        await getattr(self, "chat_" if kind == "chat" else kind)(rng)

    async def chat_(self, rng: random.Random) -> None:
        await self.chat(
            [{"role": "user", "content": f"Tell me about {rng.choice(TOPICS)}."}],
            rng.randint(32, 96),
        )

    async def long(self, rng: random.Random) -> None:
        text = f"[{uuid.uuid4().hex[:6]}] Summarise in two sentences: {LONG_TEXT}"
        await self.chat([{"role": "user", "content": text}], 32)

    async def conversation(self, rng: random.Random) -> None:
        """A first turn, its regenerate, then the next turn, in one session."""
        sid = uuid.uuid4().hex[:12]
        messages = [{"role": "user", "content": f"Describe {rng.choice(TOPICS)} in detail."}]
        first = await self.chat(messages, 64, **{"X-Session-Id": sid})
        again = await self.chat(messages, 64, **{"X-Session-Id": sid})
        if first is None or again is None:
            return
        usage = again["usage"]
        self.tally.regenerates += 1
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        self.tally.regenerate_hits += int(cached == usage["prompt_tokens"])
        answer = again["choices"][0]["message"]["content"]
        turn = [
            *messages,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "And what happens at night?"},
        ]
        nxt = await self.chat(turn, 48, **{"X-Session-Id": sid})
        if nxt is not None:
            usage = nxt["usage"]
            self.tally.next_turns += 1
            cached = usage["prompt_tokens_details"]["cached_tokens"]
            self.tally.next_turn_cached += cached / usage["prompt_tokens"]

    async def cut_sse(self, rng: random.Random) -> None:
        body = {
            "messages": [{"role": "user", "content": f"A story about {rng.choice(TOPICS)}."}],
            "max_tokens": 200,
            "stream": True,
        }
        async with self.session.post(self.url + "/v1/chat/completions", json=body) as reply:
            if reply.status != 200:
                self.tally.refuse(str(reply.status))
                return
            for _ in range(rng.randint(2, 12)):
                if not await reply.content.readline():
                    break

    async def cut_ws(self, rng: random.Random) -> None:
        """Start, pause a while (long enough to be offloaded if others wait), cancel."""
        async with self.session.ws_connect(self.url.replace("http", "ws") + "/v1/stream") as ws:
            request = {
                "messages": [{"role": "user", "content": f"A poem on {rng.choice(TOPICS)}."}],
                "max_tokens": 200,
            }
            await ws.send_json({"type": "start", "request": request})
            for _ in range(rng.randint(2, 8)):
                frame = await ws.receive_json()
                if frame["type"] in ("done", "error"):
                    return
            await ws.send_json({"type": "pause"})
            await asyncio.sleep(rng.uniform(0.5, 3.0))
            await ws.send_json({"type": "cancel" if rng.random() < 0.7 else "resume"})

    async def ollama(self, rng: random.Random) -> None:
        body = {
            "messages": [{"role": "user", "content": f"Name a sound of {rng.choice(TOPICS)}."}],
            "stream": False,
            "options": {"num_predict": 32},
        }
        await self.post("/api/chat", {**body, "model": self.model})

    async def embeddings(self, rng: random.Random) -> None:
        inputs = [f"{rng.choice(TOPICS)} {i}" for i in range(rng.randint(1, 4))]
        await self.post("/v1/embeddings", {"input": inputs})

    async def responses(self, rng: random.Random) -> None:
        body = {"input": f"One line about {rng.choice(TOPICS)}.", "max_output_tokens": 32}
        await self.post("/v1/responses", body)


async def worker(url: str, deadline: float, tally: Tally, seed: int) -> None:
    rng = random.Random(seed)
    model = (await asyncio.to_thread(models, url))[0]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        client = Client(session, url, tally, model)
        while time.monotonic() < deadline:
            kind = rng.choice(KINDS)
            try:
                await client.run(kind, rng)
            except Exception as exc:  # counted by name: a soak outlives one bad answer
                tally.refuse(f"{kind} {type(exc).__name__}")


@dataclass
class Samples:
    rss: list[tuple[float, int]] = field(default_factory=list)  # (elapsed s, bytes)
    ledger_max: int = 0
    ledger_cap: int | None = None
    ledger_misses: int = 0  # ledger reads that failed (the RSS samples go on)


def sample(url: str, process: psutil.Process, samples: Samples, stop: threading.Event) -> None:
    """RSS every second, the ledger every fifth second, until ``stop``."""
    began, tick = time.monotonic(), 0
    while not stop.wait(1.0):
        samples.rss.append((time.monotonic() - began, process.memory_info().rss))
        tick += 1
        if tick % 5 == 0:
            try:
                ledger = debug(url)["memory_ledger"]
            except (OSError, ValueError):  # a busy engine late to answer: the next read
                samples.ledger_misses += 1
                continue
            samples.ledger_max = max(samples.ledger_max, ledger["total_bytes"])
            samples.ledger_cap = ledger["cap_bytes"]


async def wait_idle(url: str, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        state = await asyncio.to_thread(debug, url)
        if state["kv_used_bytes"] == 0 and state["requests_running"] == 0:
            return state
        if time.monotonic() > deadline:
            return state
        await asyncio.sleep(0.2)


@dataclass
class Result:
    config: str
    ready_rss: int
    samples: Samples
    tally: Tally
    end_rss: int
    weights: int
    kv_idle: bool

    def row(self) -> list[str]:
        peak = max((rss for _, rss in self.samples.rss), default=self.end_rss)
        cap = self.samples.ledger_cap or 0
        regen = self.tally.regenerate_hits / self.tally.regenerates if self.tally.regenerates else 0
        turn = self.tally.next_turn_cached / self.tally.next_turns if self.tally.next_turns else 0
        return [
            self.config,
            f"{self.ready_rss / MIB:.0f}",
            f"{peak / MIB:.0f}",
            f"{self.end_rss / MIB:.0f}",
            f"{self.samples.ledger_max / MIB:.0f}/{cap / MIB:.0f}",
            f"{(peak - self.weights - cap) / MIB:.0f}",
            f"{regen:.0%} of {self.tally.regenerates}",
            f"{turn:.0%} of {self.tally.next_turns}",
            str(sum(self.tally.requests.values())),
            str(sum(self.tally.refused.values())),
            str(self.kv_idle),
        ]


COLUMNS = (
    "config",
    "RSS ready MiB",
    "RSS peak MiB",
    "RSS end MiB",
    "ledger peak/cap MiB",
    "peak - weights - cap MiB",
    "regenerate: whole prompt cached",
    "next turn: prompt cached",
    "requests",
    "refused",
    "KV idle at end",
)


async def soak_one(config: str, args: argparse.Namespace) -> Result:
    proc, url = start_engine(CONFIGS[config])
    try:
        process = psutil.Process(proc.pid)
        ready = process.memory_info().rss
        weights = debug(url)["memory_ledger"]["weights_bytes"]
        samples, tally, stop = Samples(), Tally(), threading.Event()
        sampler = threading.Thread(target=sample, args=(url, process, samples, stop), daemon=True)
        sampler.start()
        deadline = time.monotonic() + args.minutes * 60
        await asyncio.gather(*(worker(url, deadline, tally, i) for i in range(args.workers)))
        final = await wait_idle(url)
        stop.set()
        sampler.join(timeout=30)
        end = process.memory_info().rss
        return Result(config, ready, samples, tally, end, weights, final["kv_used_bytes"] == 0)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--minutes", type=float, default=30.0, help="per configuration")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument(
        "--configs", default="default,seed", help=f"comma-separated, of: {', '.join(CONFIGS)}"
    )
    parser.add_argument("--seed", type=int, default=48)
    add_output_flags(parser)
    args = parser.parse_args()
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown configuration {unknown[0]!r}: one of {', '.join(CONFIGS)}")
    started, start = datetime.now(UTC), machine_snapshot()
    results = [asyncio.run(soak_one(config, args)) for config in configs]
    machine = noise(start, machine_snapshot(), own_pids())
    title = f"{args.minutes:g} min per configuration, {args.workers} workers, mixed traffic"
    table = table_data(title, COLUMNS, [r.row() for r in results])
    Console(width=200).print(rich_table(table))
    for result in results:
        print(f"{result.config}: requests {result.tally.requests}; refused {result.tally.refused}")
    ok = all(r.kv_idle and r.samples.ledger_max <= (r.samples.ledger_cap or 0) for r in results)
    verdict = f"ledger within its cap and KV idle at the end: {'pass' if ok else 'FAIL'}"
    print(verdict)
    info = header(
        "soak", "Soak: mixed traffic, RSS and the memory ledger", started, machine, [verdict]
    )
    raw = {
        "results": [
            {
                "config": r.config,
                "ready_rss": r.ready_rss,
                "end_rss": r.end_rss,
                "rss": r.samples.rss,
                "ledger_max": r.samples.ledger_max,
                "ledger_cap": r.samples.ledger_cap,
                "ledger_misses": r.samples.ledger_misses,
                "requests": r.tally.requests,
                "refused": r.tally.refused,
                "regenerates": r.tally.regenerates,
                "regenerate_hits": r.tally.regenerate_hits,
                "next_turns": r.tally.next_turns,
                "next_turn_cached": r.tally.next_turn_cached,
                "kv_idle": r.kv_idle,
            }
            for r in results
        ]
    }
    write_outputs(args, info, [table], raw)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
