"""OpenTelemetry from a real engine, measured and drawn (docs/observability.md).

``picture OUT.svg``: serve the embedded model with OTel exporting to a local OTLP/HTTP
receiver, stream one answer to a reader with a 4 KiB receive buffer that stalls twice
(the engine pauses it: socket_full) and then goes away (cancel: disconnect), and draw
the exported trace as a timeline (one lane per span, ticks at its span events).

``overhead``: the decode rate of the same streamed answers from two servers side by side,
OpenTelemetry off and on (exporting to the receiver), in the order off, on, on, off;
prints the medians and the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from edge_llm.bench.svg import REPORT_CSS, Lane, Window, timeline

STORY = "Write a very long story about a dragon and a knight."
SERVE = [sys.executable, "-m", "edge_llm", "serve", "--host", "127.0.0.1", "--port", "0"]


class Receiver:
    """OTLP/HTTP on 127.0.0.1: keeps the spans; answers metrics with an empty reply."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.loop = asyncio.new_event_loop()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait(30)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        app.router.add_post("/v1/metrics", self._metrics)
        runner = web.AppRunner(app)
        self.loop.run_until_complete(runner.setup())
        self.loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        ready.set()
        self.loop.run_forever()

    async def _traces(self, request: web.Request) -> web.Response:
        batch = ExportTraceServiceRequest.FromString(await request.read())
        for resource in batch.resource_spans:
            for scope in resource.scope_spans:
                self.spans.extend(scope.spans)
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    async def _metrics(self, request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=b"", content_type="application/x-protobuf")


def serve(env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        SERVE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, **env},
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if " on http://" in line:
            output = proc.stdout
            threading.Thread(target=output.read, daemon=True).start()  # drained, unread
            return proc, line.split(" on ", 1)[1].split()[0]
    raise RuntimeError("the engine did not start")


def otel_env(receiver: Receiver) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_METRIC_EXPORT_INTERVAL": "1000",
    }


def debug_stream(url: str) -> dict[str, Any] | None:
    """The engine's one live stream (None: none)."""
    with urllib.request.urlopen(url + "/debug/streams", timeout=30) as response:
        document = json.loads(response.read())
    live = [s for s in document["streams"] if s["state"] not in ("done", "cancelled")]
    return live[0] if live else None


def wait(check: Any, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.02)
    raise RuntimeError("timed out")


def stalling_reader(url: str, pauses: int) -> str:
    """Stream an answer to a reader that stops reading until the engine pauses it,
    ``pauses`` times, then drops the connection mid-answer; returns the request id."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    body = json.dumps({"messages": [{"role": "user", "content": STORY}], "max_tokens": 400,
                       "temperature": 0, "stream": True}).encode()  # fmt: skip
    sock.sendall(
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
        f"traceparent: 00-{'ab' * 16}-{'cd' * 8}-01\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    stream = wait(lambda: debug_stream(url))
    for _ in range(pauses):
        wait(lambda: (s := debug_stream(url)) and s["pause_cause"] == "socket_full")
        time.sleep(1.5)  # the reader is busy elsewhere a while longer
        sock.settimeout(5)
        resumed_at = time.monotonic()
        while time.monotonic() - resumed_at < 0.6:  # it reads again for a while
            sock.recv(65536)
    sock.close()  # gone mid-answer: the engine cancels it (disconnect)
    return str(stream["id"])


def picture(out: Path) -> None:
    receiver = Receiver()
    proc, url = serve(otel_env(receiver))
    try:
        request_id = stalling_reader(url, pauses=2)
        server = wait(lambda: _server_span(receiver, request_id))
        wait(lambda: len(_trace(receiver, server)) >= 5)
        time.sleep(1.0)  # the last children
    finally:
        proc.terminate()
        proc.wait(60)
    spans = _trace(receiver, server)
    out.write_text(draw(server, spans) + "\n")
    print(f"wrote {out}: {len(spans)} spans, {len(server.events)} span events")


def _server_span(receiver: Receiver, request_id: str) -> Any:
    for span in list(receiver.spans):
        if span.kind == 2 and request_id.encode() in span.SerializeToString():
            return span
    return None


def _trace(receiver: Receiver, server: Any) -> list[Any]:
    return [s for s in list(receiver.spans) if s.trace_id == server.trace_id]


def draw(server: Any, spans: list[Any]) -> str:
    origin = server.start_time_unix_nano
    kinds = {"queue": "stall", "prefill": "burst"}
    lanes = []
    children = sorted((s for s in spans if s is not server), key=lambda s: s.start_time_unix_nano)
    for span in [server, *children]:
        start = (span.start_time_unix_nano - origin) / 1e9
        end = (span.end_time_unix_nano - origin) / 1e9
        kind = "pause" if span.name.startswith("paused") else kinds.get(span.name, "completed")
        ticks = [(e.time_unix_nano - origin) / 1e9 for e in span.events]
        label = "server span" if span is server else span.name
        lanes.append(Lane(label, ticks, "#333333", (Window(start, end, kind),)))
    svg = timeline(
        "One trace: a stream paused twice by its stalled reader, then cancelled",
        lanes,
        x_label="seconds since the request arrived (ticks: span events)",
        width=900,
    )
    head = svg.index(">") + 1  # a standalone picture carries the report's styles
    style = "".join(line for line in REPORT_CSS.splitlines() if line.startswith("svg"))
    return f"{svg[:head]}<style>{style}</style>{svg[head:]}"


def overhead(rounds: int, n_requests: int, max_tokens: int, page: Path | None) -> None:
    """Two servers side by side, OpenTelemetry off and on, warmed by one answer each;
    then rounds of answers in the order off, on, on, off (so a drift of the machine
    weighs on both alike). The figure is the median of the per-round ratios on / off."""
    started, load_before = datetime.now(UTC), os.getloadavg()
    receiver = Receiver()
    servers = {mode: serve(otel_env(receiver) if mode == "on" else {}) for mode in ("off", "on")}
    try:
        rates = asyncio.run(_paired_rates(servers, rounds, n_requests, max_tokens))
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(60)
    lines = []
    for mode in ("off", "on"):
        values = [rate for round_ in rates for rate in round_[mode]]
        lines.append(f"OTel {mode}: decode {statistics.median(values):.1f} tok/s median of "
                     f"{len(values)} (min {min(values):.1f}, max {max(values):.1f})")  # fmt: skip
    ratios = [statistics.median(r["on"]) / statistics.median(r["off"]) for r in rates]
    lines.append(f"on/off: {statistics.median(ratios):.3f} median of {len(ratios)} rounds "
                 f"(min {min(ratios):.3f}, max {max(ratios):.3f}); spans received: "
                 f"{len(receiver.spans)}")  # fmt: skip
    print("\n".join(lines))
    if page is not None:
        write_page(page, started, (load_before, os.getloadavg()), lines)


def write_page(
    page: Path, started: datetime, loads: tuple[tuple[float, ...], ...], lines: list[str]
) -> None:
    """The run's own output as a page: when, the command, the load before and after."""
    command = " ".join([".venv/bin/python", "scripts/otel_trace.py", *sys.argv[1:]])
    load = " -> ".join(f"{one:.2f}" for one, *_ in loads)
    page.write_text(
        f"# OpenTelemetry's cost on decode, {started:%Y-%m-%d %H:%M} UTC\n\n"
        f"Command: `{command}`\n\n1-minute load average before -> after: {load} "
        f"(on {os.cpu_count()} CPUs)\n\n```text\n" + "\n".join(lines) + "\n```\n"
    )
    print(f"wrote {page}")


async def _paired_rates(
    servers: dict[str, tuple[subprocess.Popen[str], str]], rounds: int, n: int, max_tokens: int
) -> list[dict[str, list[float]]]:
    async with aiohttp.ClientSession() as session:
        for _, url in servers.values():
            await _decode_rate(session, url, max_tokens)  # warm-up: served traffic first
        result = []
        for _ in range(rounds):
            round_: dict[str, list[float]] = {"off": [], "on": []}
            for _ in range(n):
                for mode in ("off", "on", "on", "off"):
                    rate = await _decode_rate(session, servers[mode][1], max_tokens)
                    round_[mode].append(rate)
            result.append(round_)
        return result


async def _decode_rate(session: aiohttp.ClientSession, url: str, max_tokens: int) -> float:
    body = {"messages": [{"role": "user", "content": STORY}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}  # fmt: skip
    times = []
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        async for line in response.content:
            if line.startswith(b"data: {") and b'"content"' in line:
                times.append(time.perf_counter())
    return (len(times) - 1) / (times[-1] - times[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    draw_cmd = sub.add_parser("picture")
    draw_cmd.add_argument("out", type=Path)
    cost = sub.add_parser("overhead")
    cost.add_argument("--rounds", type=int, default=2)
    cost.add_argument("--requests", type=int, default=3)
    cost.add_argument("--max-tokens", type=int, default=200)
    cost.add_argument("--page", type=Path, help="also write the output as a page here")
    args = parser.parse_args()
    if args.command == "picture":
        picture(args.out)
    else:
        overhead(args.rounds, args.requests, args.max_tokens, args.page)


if __name__ == "__main__":
    main()
