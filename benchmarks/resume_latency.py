"""Resumable streams: how long from a reconnect to the first resumed token, and what a
resume costs against a fresh request.

One fresh server (``--resume-grace-ms`` at its default). Each of ``--drops`` rounds
sends a resumable story request (``--tokens`` tokens at temperature 0, a fresh tag so
nothing is cached), reads a random 5 to 20 events, drops the connection, then
resumes at once with ``GET /v1/streams/{id}`` and ``Last-Event-ID``. Per round: the
time from the resume's request to its first event with content (the replayed ones
first, if any), the prompt tokens the engine prefilled after the drop (0 is the goal:
nothing recomputed) and the fresh request's own TTFT for comparison.

    .venv/bin/python benchmarks/resume_latency.py --drops 100 --json /tmp/resume.json

The goal in issue 44: reconnect to the first resumed token at most 50 ms p95 on
loopback; a resume costs at most 1 % of a fresh request's work.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
from machine import noise, own_pids, snapshot
from output import add_output_flags, header, write_outputs
from peer_servers import ServerProcess, read_metric, start_engine

from edge_llm.protocol.sse import SSEParser

PROMPT = "Write a very long story about a dragon and a knight."
PREFILLED = "edge_llm_prompt_tokens_total"
COLUMNS = ["drops", "resume p50 ms", "resume p95 ms", "fresh TTFT p50 ms", "prompt recomputed"]


@dataclass(frozen=True)
class Round:
    ttft_ms: float  # the fresh request's first content event
    resume_to_token_ms: float  # the resume's request to its first content event
    events_before_drop: int
    prefilled_after_drop: float  # prompt tokens the engine computed after the drop


def body(tokens: int) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": f"[{uuid.uuid4().hex[:8]}] {PROMPT}"}],
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"resumable": True},
    }


def has_content(data: str) -> bool:
    if data == "[DONE]":
        return False
    choices = json.loads(data).get("choices") or []
    return any((c.get("delta") or {}).get("content") for c in choices)


async def first_content(response: aiohttp.ClientResponse, parser: SSEParser) -> str | None:
    """Read until an event with content; its id (None: the stream ended first)."""
    async for data in response.content.iter_any():
        for event in parser.feed(data):
            if has_content(event.data):
                return event.id
    return None


async def one_round(session: aiohttp.ClientSession, server: ServerProcess, tokens: int) -> Round:
    rng = random.Random()
    start = time.perf_counter()
    response = await session.post(server.root + "/v1/chat/completions", json=body(tokens))
    stream_id, parser = response.headers["X-Stream-Id"], SSEParser()
    taken: list[str] = []
    ttft_ms = 0.0
    wanted = rng.randint(5, 20)
    async for data in response.content.iter_any():
        for event in parser.feed(data):
            if not ttft_ms and has_content(event.data):
                ttft_ms = (time.perf_counter() - start) * 1000
            taken.append(event.id or "")
        if len(taken) >= wanted:
            break
    response.close()  # the drop
    prefilled = read_metric(server, PREFILLED) or 0.0
    began = time.perf_counter()
    headers = {"Last-Event-ID": taken[-1]}
    async with session.get(f"{server.root}/v1/streams/{stream_id}", headers=headers) as resumed:
        await first_content(resumed, SSEParser())
        resume_ms = (time.perf_counter() - began) * 1000
        async for _ in resumed.content.iter_any():
            pass  # the rest of the answer: the next round starts on a quiet engine
    after = (read_metric(server, PREFILLED) or 0.0) - prefilled
    return Round(ttft_ms, resume_ms, len(taken), after)


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) >= 2 else values[0]


async def run(server: ServerProcess, drops: int, tokens: int) -> list[Round]:
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        return [await one_round(session, server, tokens) for _ in range(drops)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drops", type=int, default=100)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--n-threads", type=int, default=2)
    add_output_flags(parser)
    args = parser.parse_args()
    from edge_llm.engine.runtime.llama_backend import default_model_path  # loads llama.cpp

    started, before = datetime.now(UTC), snapshot()
    server = start_engine(str(default_model_path()), args.n_threads, [])
    try:
        rounds = asyncio.run(run(server, args.drops, args.tokens))
    finally:
        server.stop()
    machine = noise(before, snapshot(), own_pids())
    resume = [r.resume_to_token_ms for r in rounds]
    ttft = [r.ttft_ms for r in rounds]
    table = {
        "title": "Reconnect to the first resumed token (loopback)",
        "columns": COLUMNS,
        "rows": [
            [
                len(rounds),
                round(statistics.median(resume), 1),
                round(p95(resume), 1),
                round(statistics.median(ttft), 1),
                sum(r.prefilled_after_drop for r in rounds),
            ]
        ],
    }
    print(table["title"])
    for column, value in zip(table["columns"], table["rows"][0], strict=True):
        print(f"  {column}: {value}")
    title = "Resumable streams: reconnect latency"
    run_header = header("resume_latency", title, started, machine)
    write_outputs(args, run_header, [table], {"rounds": [asdict(r) for r in rounds]})


if __name__ == "__main__":
    main()
