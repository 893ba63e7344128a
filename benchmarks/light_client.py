"""The light client of issue 49: on a quiet machine, the benchmark itself is the only
other process, a client on the same cores that sends requests and reads streams.

Every configuration runs at once for the whole scenario (started once, warmed up by
one request). Each round, in an order that rotates, each server gets one stream, then
LIGHT_STREAMS streams started together, ``--light-tokens`` tokens each at temperature
0 with a prompt unique to the round; before each, the server has been idle for
IDLE_BEFORE_S, longer than the engine's idle spell (``engine/runtime/threads.py``, IDLE_S), so
each starts as a first request after idle does. The figure is throughput: completion
tokens (from ``usage``) over the time from the requests' start to the last token,
prefill included, so a slow start counts. During the 4-stream run of an edge-llm
server, ``edge_llm_decode_threads`` is read from ``/metrics`` every GAUGE_PERIOD_S.

The table: per configuration and stream count, tok/s median (min-max) over the
rounds, the ratios to llama-server and to ``--no-adaptive-threads`` (each per round,
min / median / max), how long the gauge read below full width and round 1's readings
(its first 6 s; the JSON has them all).
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from peer_servers import ServerProcess, read_metric, wait_idle
from scenarios import aggregate_decode_rate, throughput

from edge_llm.bench.chat_stream import RequestOptions, run_request
from edge_llm.bench.prompts import Prompt
from edge_llm.bench.publish import table_data
from edge_llm.bench.record import RequestRecord
from edge_llm.bench.targets import Target

STORY = "Write a very long story about a dragon and a knight."
LIGHT_STREAMS = 4
GAUGE_PERIOD_S = 0.25
DECODE_THREADS = "edge_llm_decode_threads"
IDLE_BEFORE_S = 2.0
SHOWN_SAMPLES = 24  # round 1's first 6 s of readings in the table (all in the JSON)
WARMUP_TOKENS = 8
LIGHT_COLUMNS = (
    "server", "streams", "tok/s median (min-max)", "/ llama-server min / median / max",
    "/ --no-adaptive-threads min / median / max", "decode_threads below full width (s)",
    "decode_threads every 250 ms, round 1",
)  # fmt: skip


@dataclass
class LightRun:
    """One server's figures in one round."""

    one: float | None
    four: float | None
    four_decode: float | None  # aggregate decode while all four decoded (JSON only)
    samples: list[tuple[float, float | None]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


async def _streams(
    server: ServerProcess, n: int, tokens: int, timeout_s: float
) -> list[RequestRecord]:
    target = Target(server.name, server.root)
    options = RequestOptions(max_tokens=tokens, timeout_s=timeout_s)
    tag = uuid.uuid4().hex[:8]
    epoch = time.perf_counter()

    async def one(index: int) -> RequestRecord:
        prompt = Prompt.user(f"light-{tag}-{index}", f"[{tag}.{index}] {STORY}")
        record = RequestRecord(server.name, n, index, prompt.id)
        return await run_request(target, prompt, options, record, epoch=epoch)

    return list(await asyncio.gather(*(one(i) for i in range(n))))


async def _sample_threads(
    server: ServerProcess, stop: asyncio.Event
) -> list[tuple[float, float | None]]:
    """(seconds since the start, decode threads) every GAUGE_PERIOD_S until ``stop``."""
    samples: list[tuple[float, float | None]] = []
    began = time.perf_counter()
    while not stop.is_set():
        value = await asyncio.to_thread(read_metric, server, DECODE_THREADS)
        samples.append((round(time.perf_counter() - began, 3), value))
        try:
            await asyncio.wait_for(stop.wait(), GAUGE_PERIOD_S)
        except TimeoutError:
            continue
    return samples


async def _four_with_gauge(
    server: ServerProcess, tokens: int, timeout_s: float
) -> tuple[list[RequestRecord], list[tuple[float, float | None]]]:
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sample_threads(server, stop)) if server.engine else None
    try:
        records = await _streams(server, LIGHT_STREAMS, tokens, timeout_s)
    finally:
        stop.set()
    return records, (await sampler if sampler else [])


async def light_run(server: ServerProcess, tokens: int, timeout_s: float) -> LightRun:
    """One stream, then LIGHT_STREAMS together, each after IDLE_BEFORE_S of idle."""
    await asyncio.sleep(IDLE_BEFORE_S)  # the scenario's definition: a request after idle
    one = await _streams(server, 1, tokens, timeout_s)
    await asyncio.to_thread(wait_idle, server)
    await asyncio.sleep(IDLE_BEFORE_S)
    four, samples = await _four_with_gauge(server, tokens, timeout_s)
    await asyncio.to_thread(wait_idle, server)
    records = [*one, *four]
    return LightRun(
        one=throughput(one) if all(r.ok for r in one) else None,
        four=throughput(four) if all(r.ok for r in four) else None,
        four_decode=aggregate_decode_rate(four),
        samples=samples,
        errors=[r.error_kind for r in records if r.error_kind],
    )


async def warm_up(server: ServerProcess, timeout_s: float) -> None:
    await _streams(server, 1, WARMUP_TOKENS, timeout_s)
    await asyncio.to_thread(wait_idle, server)


async def light_rounds(
    servers: dict[str, ServerProcess],
    rounds: int,
    tokens: int,
    timeout_s: float,
    log: Callable[[str], None],
) -> dict[str, list[LightRun]]:
    """``rounds`` rounds over every server, the order rotating each round."""
    for server in servers.values():
        await warm_up(server, timeout_s)
    runs: dict[str, list[LightRun]] = {name: [] for name in servers}
    names = list(servers)
    for index in range(rounds):
        for name in names[index % len(names) :] + names[: index % len(names)]:
            run = await light_run(servers[name], tokens, timeout_s)
            runs[name].append(run)
            log(f"light client round {index + 1}/{rounds} {name:<34} 1 stream {_num(run.one)} "
                f"tok/s, {LIGHT_STREAMS} streams {_num(run.four)} tok/s")  # fmt: skip
    return runs


def _num(value: float | None) -> str:
    return "failed" if value is None else f"{value:.1f}"


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def _failed(values: list[float | None]) -> str:
    n = sum(v is None for v in values)
    return f" [{n} failed]" if n else ""


def _ratios(mine: list[float | None], other: list[float | None]) -> str:
    ratios = [m / o for m, o in zip(mine, other, strict=False) if m is not None and o]
    if not ratios:
        return "-"
    return f"{min(ratios):.2f} / {statistics.median(ratios):.2f} / {max(ratios):.2f}"


def below_full_width(samples: list[tuple[float, float | None]], threads: int) -> float | None:
    """Seconds from the start until the gauge first read ``threads``; None when it never
    did (or was never read)."""
    return next((t for t, v in samples if v is not None and v >= threads), None)


def _gauge_cells(runs: list[LightRun], threads: int) -> tuple[str, str]:
    """The time below full width, median (min-max) over the rounds that reached it
    (and how many never did), and round 1's readings."""
    spans = [below_full_width(r.samples, threads) for r in runs]
    reached = [s for s in spans if s is not None]
    never = len(spans) - len(reached)
    cell = (
        f"{statistics.median(reached):.2f} ({min(reached):.2f}-{max(reached):.2f})"
        if reached
        else "-"
    )
    if never:
        cell += f" [never in {never} round(s)]"
    shown = runs[0].samples[:SHOWN_SAMPLES]
    first = " ".join("-" if v is None else f"{v:g}" for _, v in shown)
    return cell, first + (" …" if len(runs[0].samples) > SHOWN_SAMPLES else "")


def light_table(
    runs: dict[str, list[LightRun]], llama: str, fixed: str, threads: int, rounds: int
) -> dict[str, Any]:
    """Rows per server and stream count; ``llama`` and ``fixed`` name the anchors (the
    ratios are per round)."""
    rows = []
    for name, mine in runs.items():
        gauge = _gauge_cells(mine, threads) if mine and mine[0].samples else ("-", "-")
        for streams, pick in ((1, _one), (LIGHT_STREAMS, _four)):
            values = [pick(r) for r in mine]
            rows.append(
                [
                    name, str(streams), _spread([v for v in values if v is not None])
                    + _failed(values),
                    _ratios(values, [pick(r) for r in runs[llama]]) if name != llama else "-",
                    _ratios(values, [pick(r) for r in runs[fixed]])
                    if name not in (fixed, llama) else "-",
                    *(gauge if streams == LIGHT_STREAMS else ("-", "-")),
                ]
            )  # fmt: skip
    title = f"Light client on a quiet machine: throughput, {rounds} round(s)"
    return table_data(title, LIGHT_COLUMNS, rows)


def _one(run: LightRun) -> float | None:
    return run.one


def _four(run: LightRun) -> float | None:
    return run.four


def light_json(runs: dict[str, list[LightRun]]) -> dict[str, list[dict[str, Any]]]:
    return {name: [asdict(r) for r in mine] for name, mine in runs.items()}
