"""What an upstream does while a client keeps its stream paused, and how fast a
CANCEL reaches it: edge-llm as the front, with edge-llm and llama.cpp's
``llama-server`` side by side as its upstream (same GGUF, same threads).

For each upstream: a WebSocket stream through the front (``max_tokens`` 1000),
PAUSE after the first delta, then for ``--hold`` seconds the tokens the upstream
has generated (edge-llm: ``/debug/streams`` ``n_generated``; llama-server:
``/slots`` ``n_decoded``) and the chunks the front read; then CANCEL and the time
until the upstream shows the request gone (edge-llm: state ``cancelled``;
llama-server: no slot processing).

    python benchmarks/upstream_pause.py [--hold 10] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
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
)
from rich.console import Console

from edge_llm.bench.publish import rich_table, table_data
from edge_llm.engine.runtime.llama_backend import default_model_path

PROMPT = "Write a very long story about a dragon and a knight."
MAX_TOKENS = 1000
POLL_S = 0.05


def _json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def edge_generated(upstream: ServerProcess, session: str) -> tuple[int, str]:
    for stream in _json(upstream.root + "/debug/streams")["streams"]:
        if stream["session"] == session:
            return int(stream["n_generated"]), str(stream["state"])
    return 0, "absent"


def llama_generated(upstream: ServerProcess, session: str) -> tuple[int, str]:
    del session  # one request at a time: the busy slot is ours
    for slot in _json(upstream.root + "/slots"):
        if slot.get("is_processing"):
            return int(slot["next_token"][0]["n_decoded"]), "processing"
    return 0, "idle"


Probe = Callable[[ServerProcess, str], tuple[int, str]]


@dataclass
class Row:
    upstream: str
    at_pause: int = 0
    after_1s: int = 0
    after_hold: int = 0
    state_after_hold: str = ""
    front_chunks_after_pause: int = 0
    cancel_seen_ms: float = 0.0


def front_stream(front: ServerProcess, stream_id: str) -> dict[str, Any]:
    streams = _json(front.root + "/debug/streams")["streams"]
    return dict(next(s for s in streams if s["id"] == stream_id))


async def measure(
    name: str,
    *,
    front: ServerProcess,
    upstream: ServerProcess,
    probe: Probe,
    model: str,
    hold_s: float,
) -> Row:
    row = Row(name)
    session = f"pause-{name}-{time.monotonic_ns()}"
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "user": session,
    }
    url = front.root.replace("http", "ws") + "/v1/stream"
    async with aiohttp.ClientSession() as client, client.ws_connect(url) as ws:
        await ws.send_json({"type": "start", "request": body})
        stream_id = ""
        while True:
            frame = await ws.receive_json(timeout=120)
            stream_id = frame.get("id", stream_id) if frame["type"] == "started" else stream_id
            if frame["type"] == "delta":
                break
        await ws.send_json({"type": "pause"})
        paused_at = time.monotonic()
        row.at_pause = (await asyncio.to_thread(probe, upstream, session))[0]
        read_at_pause = front_stream(front, stream_id)["ring_write"]
        await asyncio.sleep(1.0)  # sampling the upstream over time is the measurement
        row.after_1s = (await asyncio.to_thread(probe, upstream, session))[0]
        await asyncio.sleep(max(0.0, hold_s - (time.monotonic() - paused_at)))
        row.after_hold, row.state_after_hold = await asyncio.to_thread(probe, upstream, session)
        row.front_chunks_after_pause = front_stream(front, stream_id)["ring_write"] - read_at_pause
        await ws.send_json({"type": "cancel"})
        sent = time.monotonic()
        busy = ("processing", "paused", "decoding")
        while True:  # polled: the upstream's own view is what is measured
            if (await asyncio.to_thread(probe, upstream, session))[1] not in busy:
                break
            await asyncio.sleep(POLL_S)
        row.cancel_seen_ms = (time.monotonic() - sent) * 1000.0
    return row


def start_front(upstream: ServerProcess, threads: int) -> ServerProcess:
    return start_engine(
        str(default_model_path()),
        threads,
        ["--upstream", f"up={upstream.root}", "--max-pause-ms", "600000"],
    )


async def run(hold_s: float, threads: int) -> list[Row]:
    model = str(default_model_path())
    rows = []
    edge_flags = ["--model-id", "up-model", "--max-pause-ms", "600000"]
    targets: list[tuple[str, Callable[[], ServerProcess], Probe]] = [
        ("edge-llm", lambda: start_engine(model, threads, edge_flags), edge_generated),
    ]
    try:
        binary = find_llama_server()
        start = lambda: start_llama_server(binary, model, threads, 4096, 2)  # noqa: E731
        targets.append(("llama-server", start, llama_generated))
    except PeerError as exc:
        print(f"llama-server skipped: {exc}", file=sys.stderr)
    for name, start_upstream, probe in targets:
        upstream = start_upstream()
        front = start_front(upstream, threads)
        try:
            served = _json(front.root + "/v1/models")["data"][-1]["id"]  # the upstream's
            rows.append(
                await measure(
                    name, front=front, upstream=upstream, probe=probe, model=served, hold_s=hold_s
                )
            )
        finally:
            front.stop()
            upstream.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--hold", type=float, default=10.0, help="seconds paused")
    parser.add_argument("--threads", type=int, default=1, help="threads of each server")
    add_output_flags(parser)
    args = parser.parse_args()
    started, start = datetime.now(UTC), snapshot()
    rows = asyncio.run(run(args.hold, args.threads))
    machine = noise(start, snapshot(), own_pids())  # stopped servers count as ours too
    columns = ("upstream", "tokens generated at PAUSE", "+1 s", f"+{args.hold:.0f} s",
               "upstream state then", "chunks the front read after PAUSE",
               "CANCEL seen by the upstream")  # fmt: skip
    cells = [
        [r.upstream, str(r.at_pause), str(r.after_1s), str(r.after_hold), r.state_after_hold,
         str(r.front_chunks_after_pause), f"{r.cancel_seen_ms:.0f} ms"]
        for r in rows
    ]  # fmt: skip
    title = f"PAUSE held {args.hold:.0f} s, max_tokens {MAX_TOKENS}, {args.threads} thread(s) each"
    table = table_data(title, columns, cells)
    Console(width=160).print(rich_table(table))
    for line in machine.lines():
        print(line)
    info = header("upstream_pause", "An upstream while its client is paused", started, machine)
    write_outputs(args, info, [table], {"rows": [vars(r) for r in rows]})


if __name__ == "__main__":
    main()
