"""KV reuse (issue #14) side by side with llama.cpp's ``llama-server`` (its default prompt cache).

Usage::

    make bench-deps
    .venv/bin/python benchmarks/prefix_cache.py [--repeats 3] [--json out.json]

edge-llm runs with its defaults (``make run``: 4 slots with a share of the KV budget
each, prefix cache and host tier on);
llama-server with ``-np 4`` and its default prompt cache. Same GGUF, same threads.
Scenarios, with the issue's goals in brackets:

- regenerate: the same ~480-token prompt sent 4 times (stream, max_tokens 4), TTFT of
  the 2nd-4th send [edge-llm <= 0.5x llama-server];
- storm: 20 "regenerate" clicks 0.1 s apart in one session (each click abandons the
  previous stream), prompt tokens actually computed over one prompt [<= 1.1];
- shared system prompt: 4 concurrent streams with one ~300-token system prompt and
  their own question, completion tokens/s from request start [>= 1.15x];
- offload (edge-llm only, a KV budget for two requests): two fast streams' aggregate
  tokens/s while two paused streams are offloaded, over the same without them [>= 0.95].
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import time
import urllib.request
import uuid
from datetime import UTC, datetime
from typing import Any

import aiohttp
from machine import noise, own_pids, snapshot
from output import add_output_flags, header, write_outputs
from peer_servers import (
    PeerError,
    ServerProcess,
    find_llama_server,
    start_engine,
    start_llama_server,
    wait_idle,
)
from rich.console import Console

from edge_llm.bench.publish import rich_table, table_data
from edge_llm.engine.runtime.llama_backend import default_model_path

PARALLEL = 4
LLAMA_CTX = PARALLEL * 2048
NOTES = (
    "Rivers carry water from the mountains to the sea and shape the valleys they cross. "
    "People settled along them for water, food, transport and fertile soil. "
)
REGENERATE_SENTENCES = 16  # about 480 prompt tokens with the chat template
SYSTEM_SENTENCES = 10  # about 300 tokens
CLICKS = 20
CLICK_GAP_S = 0.1
SHARED_MAX_TOKENS = 128
OFFLOAD_ENGINE = ["--max-kv-cache-mb", "12", "--offload-paused-after-ms", "200"]
OFFLOAD_MAX_TOKENS = 160


def new_session(**kwargs: Any) -> aiohttp.ClientSession:
    """A connection per request: llama-server closes a streamed response's connection,
    and a reused one failed the next request ("Cannot write to closing transport")."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True), **kwargs)


def tag() -> str:
    return f"[{uuid.uuid4().hex[:8]}] "


def chat(messages: list[dict[str, str]], max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "messages": messages, "max_tokens": max_tokens, "temperature": 0,
        "stream": True, "stream_options": {"include_usage": True}, **extra,
    }  # fmt: skip


async def stream(session: aiohttp.ClientSession, root: str, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed request: TTFT, end time (from its start), completion tokens."""
    start = time.perf_counter()
    ttft, n_tokens = None, 0
    usage: dict[str, Any] = {}
    async with session.post(root + "/v1/chat/completions", json=body) as response:
        if response.status != 200:
            raise PeerError(f"{root}: HTTP {response.status}: {await response.text()}")
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                if choice.get("delta", {}).get("content"):
                    ttft = ttft if ttft is not None else time.perf_counter() - start
                    n_tokens += 1
    completion = int(usage.get("completion_tokens", n_tokens)) if usage else n_tokens
    return {"ttft": ttft, "end": time.perf_counter() - start, "tokens": completion, "start": start}


def metric(root: str, pattern: str) -> float:
    with urllib.request.urlopen(root + "/metrics", timeout=30) as response:
        text = response.read().decode()
    match = re.search(rf"^{pattern} (\S+)$", text, re.M)
    return float(match.group(1)) if match else float("nan")


def prompt_counters(server: ServerProcess) -> tuple[float, float]:
    """(prompt tokens computed, prompt tokens read from the cache) so far."""
    if server.engine:
        computed = metric(server.root, "edge_llm_prompt_tokens_total")
        return computed, metric(server.root, "edge_llm_prompt_tokens_cached_total")
    return metric(server.root, "llamacpp:prompt_tokens_total"), float("nan")


# -- scenarios ------------------------------------------------------------------------------


async def regenerate(server: ServerProcess) -> dict[str, Any]:
    messages = [{"role": "user", "content": tag() + NOTES * REGENERATE_SENTENCES}]
    async with new_session() as session:
        sends = [await stream(session, server.root, chat(messages, 4)) for _ in range(4)]
    ttfts = [s["ttft"] for s in sends]
    return {"ttft_s": ttfts, "repeat_ttft_s": statistics.median(ttfts[1:])}


async def storm(server: ServerProcess) -> dict[str, Any]:
    messages = [{"role": "user", "content": tag() + NOTES * REGENERATE_SENTENCES}]
    session_id = uuid.uuid4().hex
    before = prompt_counters(server)
    async with new_session(headers={"X-Session-Id": session_id}) as session:
        one = chat(messages, 8, user=session_id)
        clicks: list[asyncio.Task[dict[str, Any]]] = []
        for _ in range(CLICKS):
            if clicks:
                clicks[-1].cancel()  # the user clicked again: the old stream is abandoned
            clicks.append(asyncio.create_task(stream(session, server.root, one)))
            await asyncio.sleep(CLICK_GAP_S)
        last = await clicks[-1]
        await asyncio.gather(*clicks[:-1], return_exceptions=True)
    wait_idle(server)
    after = prompt_counters(server)
    async with new_session() as session:  # one prompt's size, from a fresh tag
        n_prompt = await prompt_size(session, server.root, messages)
    computed = after[0] - before[0]
    return {
        "prompt_tokens": n_prompt,
        "computed_tokens": computed,
        "cached_tokens": after[1] - before[1],
        "computed_over_one_prompt": computed / n_prompt,
        "last_ttft_s": last["ttft"],
    }


async def prompt_size(session: aiohttp.ClientSession, root: str, messages: list[Any]) -> int:
    body = {**chat(messages, 1), "stream": False}
    async with session.post(root + "/v1/chat/completions", json=body) as response:
        return int((await response.json())["usage"]["prompt_tokens"])


async def shared_system(server: ServerProcess) -> dict[str, Any]:
    system = tag() + "You answer questions about rivers. " + NOTES * SYSTEM_SENTENCES
    questions = ["Name a river.", "Why do rivers flood?", "What is a delta?", "Who uses rivers?"]
    async with new_session() as session:
        start = time.perf_counter()
        runs = await asyncio.gather(*[
            stream(session, server.root, chat(
                [{"role": "system", "content": system}, {"role": "user", "content": q}],
                SHARED_MAX_TOKENS,
            ))
            for q in questions
        ])  # fmt: skip
    span = max(r["start"] + r["end"] for r in runs) - start
    return {"tokens_per_s": sum(r["tokens"] for r in runs) / span}


async def offload(model: str, threads: int) -> dict[str, Any]:
    """On an engine with room for two requests: two fast streams alone, then the same
    beside two paused streams (which must be offloaded for the fast ones to run)."""
    engine = start_engine(model, threads, OFFLOAD_ENGINE)
    try:
        alone = await fast_pair(engine)
        async with new_session() as session:
            paused = [await paused_stream(session, engine) for _ in range(2)]
            beside = await fast_pair(engine)
            offloads = metric(engine.root, "edge_llm_kv_offloads_total")
            for ws in paused:
                await ws.close()
        return {"alone_tps": alone, "beside_offloaded_tps": beside, "ratio": beside / alone,
                "offloads": offloads}  # fmt: skip
    finally:
        engine.stop()


async def fast_pair(engine: ServerProcess) -> float:
    async with new_session() as session:
        start = time.perf_counter()
        runs = await asyncio.gather(*[
            stream(session, engine.root, chat(
                [{"role": "user", "content": tag() + "Tell a long story about a lighthouse."}],
                OFFLOAD_MAX_TOKENS,
            ))
            for _ in range(2)
        ])  # fmt: skip
    tokens = sum(int(r["tokens"]) for r in runs)
    return tokens / (max(float(r["start"] + r["end"]) for r in runs) - start)


async def paused_stream(
    session: aiohttp.ClientSession, engine: ServerProcess
) -> aiohttp.ClientWebSocketResponse:
    ws = await session.ws_connect(engine.root.replace("http", "ws") + "/v1/stream")
    body = chat([{"role": "user", "content": tag() + "Tell a long story about a storm."}], 160)
    await ws.send_json({"type": "start", "request": {**body, "stream": True}})
    while (await ws.receive_json())["type"] != "delta":
        pass
    await ws.send_json({"type": "pause"})
    while (await ws.receive_json())["type"] != "paused":
        pass
    return ws


# -- running --------------------------------------------------------------------------------


async def compare(servers: list[ServerProcess], repeats: int) -> dict[str, Any]:
    results: dict[str, dict[str, list[Any]]] = {s.name: {} for s in servers}
    for repeat in range(repeats):
        order = servers if repeat % 2 == 0 else servers[::-1]
        for name, scenario in (("regenerate", regenerate), ("storm", storm),
                               ("shared_system", shared_system)):  # fmt: skip
            for server in order:
                wait_idle(server)
                figures = await scenario(server)
                results[server.name].setdefault(name, []).append(figures)
                print(f"repeat {repeat + 1} {name:14} {server.name:12} {figures}", flush=True)
    return results


def summary(results: dict[str, Any], offloaded: dict[str, Any]) -> dict[str, Any]:
    def med(server: str, scenario: str, key: str) -> float:
        return float(statistics.median(r[key] for r in results[server][scenario]))

    edge, peer = "edge-llm", "llama-server"
    regen = (med(edge, "regenerate", "repeat_ttft_s"), med(peer, "regenerate", "repeat_ttft_s"))
    shared = (
        med(edge, "shared_system", "tokens_per_s"),
        med(peer, "shared_system", "tokens_per_s"),
    )
    storms = (med(edge, "storm", "computed_over_one_prompt"),
              med(peer, "storm", "computed_over_one_prompt"))  # fmt: skip
    rows = [
        ["regenerate TTFT, 2nd-4th send, s", f"{regen[0]:.3f}", f"{regen[1]:.3f}",
         f"{regen[0] / regen[1]:.2f}", "<= 0.5"],
        ["20-click storm: prompt tokens computed / one prompt", f"{storms[0]:.2f}",
         f"{storms[1]:.2f}", "-", "edge <= 1.1"],
        ["4 streams, shared 300-token system prompt, tok/s from start", f"{shared[0]:.1f}",
         f"{shared[1]:.1f}", f"{shared[0] / shared[1]:.2f}", ">= 1.15"],
        [f"fast streams beside two offloaded paused ones / alone "
         f"({offloaded['offloads']:.0f} offloads)",
         f"{offloaded['ratio']:.2f} ({offloaded['beside_offloaded_tps']:.1f} vs "
         f"{offloaded['alone_tps']:.1f} tok/s)", "-", "-", ">= 0.95"],
    ]  # fmt: skip
    columns = ("scenario", "edge-llm", "llama-server", "ratio", "goal")
    return table_data("KV reuse, medians", columns, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default=None)
    parser.add_argument("--llama-server", default=None)
    add_output_flags(parser)
    args = parser.parse_args(argv)
    model = args.model or str(default_model_path())
    try:
        binary = find_llama_server(args.llama_server)
    except PeerError as exc:
        print(f"prefix_cache: {exc}", file=sys.stderr)
        return 2
    servers: list[ServerProcess] = []
    try:
        servers.append(start_engine(model, args.threads, ["--max-prompt-tokens", "2048"]))
        servers.append(start_llama_server(binary, model, args.threads, LLAMA_CTX, PARALLEL))
        started, start = datetime.now(UTC), snapshot()
        results = asyncio.run(compare(servers, args.repeats))
        # The servers' CPU is ours only while they run: measure before stopping them.
        machine = noise(start, snapshot(), own_pids())
        for server in servers:
            server.stop()
        offloaded = asyncio.run(offload(model, args.threads))
    except PeerError as exc:
        print(f"prefix_cache: {exc}", file=sys.stderr)
        return 1
    finally:
        for server in servers:
            server.stop()
    table = summary(results, offloaded)
    setup = (
        f"model {model}, {args.threads} threads each; edge-llm defaults (--max-prompt-tokens "
        f"2048), llama-server -np {PARALLEL} -c {LLAMA_CTX}; the machine's load is that of the "
        "side-by-side part (the offload scenario runs after it)"
    )
    Console(width=160).print(rich_table(table))
    print(setup)
    for line in machine.lines():
        print(line)
    run = header("prefix_cache", "Prefix cache and offload vs llama-server", started, machine,
                 [setup])  # fmt: skip
    write_outputs(args, run, [table], {"results": results, "offload": offloaded, "model": model})
    return 0


if __name__ == "__main__":
    sys.exit(main())
