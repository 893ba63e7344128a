"""The comparison's scenarios, each run against one server and returning its figures.

Built on edge-llm's bench library (``edge_llm.bench``): every request is a
:class:`ChatStream` whose content chunks are timestamped on arrival. Each repeat uses
prompts no earlier request used (``variant``), tagged at the start, so no server gets
prompt-cache hits beyond the chat template's fixed system prompt.

The decode scenarios (decode1, decode4, stalled, itl_prefill) ask for something the
model writes at length, past ``decode_tokens``: a story (STORY) on the chat models, a
Python module (CODE_TASK) on a coder model (``models.py``; since 2026-12-08: the
2026-12-07 run of Qwen2.5-Coder-1.5B used the story, which it answered in 14 tokens).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from peer_servers import ServerProcess, read_metric

from edge_llm.bench.chat_stream import ChatStream, RequestOptions, read_stream, run_request
from edge_llm.bench.connection import SMALL_LIMIT
from edge_llm.bench.prompts import Prompt, long_text
from edge_llm.bench.record import RequestRecord
from edge_llm.bench.stats import percentile
from edge_llm.bench.targets import Target

# The unique tag comes first: llama-server reuses a slot's cached KV for a common
# prefix, so a tag at the end would let it skip most of a repeated prompt's prefill
# (measured: TTFT 150 ms instead of 590 for four 65-token prompts).
STORY = (
    "(Draft {variant}.) Write a very long story about a lighthouse keeper during a "
    "storm. Make it at least 1000 words long."
)
# The decode prompt of a coder model (``models.py`` picks it per model): on 2026-12-07
# Qwen2.5-Coder-1.5B answered STORY in 14 tokens, so its four decode4 streams were
# never all decoding at once and the scenario's rate was undefined. Asked for code, it
# writes past ``decode_tokens``.
CODE_TASK = (
    "(Draft {variant}.) Write a complete Python module for a command-line to-do list "
    "manager: a Task dataclass, a TaskList class with add, remove, complete, search and "
    "sort methods, saving to and loading from a JSON file, an argparse main function, "
    "and a docstring for every class and function."
)
SHORT = "(Question {variant}.) In one sentence, what is a lighthouse for?"
FLOOD_PROMPT = "(Visitor {variant}.) Say hello."
LONG_SENTENCES = 58  # about 1,000 prompt tokens
PREFILL_SENTENCES = 28  # about 500 prompt tokens
STALLED_READER_TOKENS = 2048
STALLED_RCVBUF = 4096
STALL_AFTER_CHUNKS = 4
# The scenario measures the others while the stalled stream sits stalled: its reader
# stops, then both servers get this long (the same for each) before the fast readers
# start, time for the client's and the server's socket buffers to fill.
STALL_SETTLE_S = 3.0
PREFILL_HEAD_START_S = 0.3
# Sentences of long_text for cold prompts of about 150, 270, 500 and 950 tokens
# (with the chat template; the figures give the prompt tokens each server counted).
COLD_SENTENCES = {150: 5, 270: 12, 500: 26, 950: 54}
BESIDE_TOKENS = 600  # the decoding streams outlast the long prompt's prefill
DECODING_AFTER_CHUNKS = 8
RSS_SAMPLE_S = 0.05
MIB = 1 << 20
FLOOD_BUDGET_EXTRA_BYTES = 150 * 1000 * 1000


@dataclass(frozen=True)
class Settings:
    decode_tokens: int = 128
    flood_connections: int = 200
    flood_seconds: float = 3.0
    timeout_s: float = 300.0
    # The decode scenarios' prompt ({variant}: the run's tag): one the model answers at
    # length (STORY, or CODE_TASK for a coder model).
    decode_prompt: str = STORY


@dataclass
class Figures:
    """One scenario on one server: the headline ``value`` and supporting numbers."""

    value: float | None
    details: dict[str, object] = field(default_factory=dict)


@dataclass
class Context:
    server: ServerProcess
    target: Target
    settings: Settings
    model_bytes: int
    kv_budget_bytes: int
    variant: int = 0
    epoch: float = field(default_factory=time.perf_counter)

    def options(self, max_tokens: int) -> RequestOptions:
        return RequestOptions(max_tokens=max_tokens, timeout_s=self.settings.timeout_s)

    def record(self, prompt: Prompt, index: int = 0) -> RequestRecord:
        return RequestRecord(self.target.name, 1, index, prompt.id)

    async def request(self, prompt: Prompt, max_tokens: int, index: int = 0) -> RequestRecord:
        record = self.record(prompt, index)
        return await run_request(
            self.target, prompt, self.options(max_tokens), record, epoch=self.epoch
        )


Scenario = Callable[[Context], Awaitable[Figures]]


def story(ctx: Context, index: int = 0) -> Prompt:
    """The decode scenarios' prompt (``Settings.decode_prompt``), tagged for the run."""
    text = ctx.settings.decode_prompt.format(variant=f"{ctx.variant}.{index}")
    return Prompt.user(f"story-{ctx.variant}-{index}", text)


def aggregate_decode_rate(records: list[RequestRecord]) -> float | None:
    """The streams' combined decode rate while all of them were decoding: tokens that
    arrived between the last stream's first token and the first stream's last token,
    over that window (absolute times).

    Servers stage concurrent prompts differently (llama-server prefills requests that
    arrive together in one batch; edge-llm starts each on arrival and prefills later
    ones beside decoding streams), so any window that starts at the first first-token
    counts one server's prefill as decode time and not the other's. This one holds only
    steps where every stream was live; ``span_decode_rate`` is that other figure.
    """
    ok = [r for r in records if r.ok and r.n_chunks >= 2]
    if not ok:
        return None
    start = max(r.started_at + r.chunk_times[0] for r in ok)
    end = min(r.started_at + r.chunk_times[-1] for r in ok)
    if end <= start:
        return None
    tokens = 0.0
    for r in ok:
        inside = sum(1 for t in r.chunk_times if start < r.started_at + t <= end)
        tokens += inside * r.n_output_tokens / r.n_chunks  # a chunk may carry several
    return tokens / (end - start)


def span_decode_rate(records: list[RequestRecord]) -> float | None:
    """Tokens after each stream's first, over the span from the first first-token to
    the last last-token: includes later streams' prefill and the tail."""
    ok = [r for r in records if r.ok and r.n_chunks >= 2]
    if not ok:
        return None
    first = min(r.started_at + r.chunk_times[0] for r in ok)
    last = max(r.started_at + r.chunk_times[-1] for r in ok)
    tokens = sum(r.n_output_tokens - 1 for r in ok)
    return tokens / (last - first) if last > first else None


def pooled_decode_rate(records: list[RequestRecord]) -> float | None:
    """Requests run one after another: their tokens after the first over the sum of
    their spans from first to last content chunk."""
    spans = [
        (r.n_output_tokens - 1, r.chunk_times[-1] - r.chunk_times[0])
        for r in records
        if r.ok and r.n_chunks >= 2
    ]
    seconds = sum(span for _, span in spans)
    return sum(tokens for tokens, _ in spans) / seconds if seconds > 0 else None


def throughput(records: list[RequestRecord]) -> float | None:
    """All output tokens over the time from the first request's start to the last
    token: what the clients got overall, prefill included."""
    ok = [r for r in records if r.ok and r.n_chunks]
    if not ok:
        return None
    begin = min(r.started_at for r in ok)
    last = max(r.started_at + r.chunk_times[-1] for r in ok)
    return sum(r.n_output_tokens for r in ok) / (last - begin) if last > begin else None


def failures(records: list[RequestRecord]) -> dict[str, object]:
    errors = [r.error_kind for r in records if not r.ok]
    return {"errors": errors} if errors else {}


async def single_decode(ctx: Context) -> Figures:
    """Decode tok/s of one stream writing ``decode_tokens`` (the decode prompt)."""
    record = await ctx.request(story(ctx), ctx.settings.decode_tokens)
    return Figures(record.decode_rate, {"tokens": record.n_output_tokens, **failures([record])})


async def concurrent_decode(ctx: Context) -> Figures:
    """Four streams at once, each ``decode_tokens`` of its own decode prompt: their
    rate while all four decode (:func:`aggregate_decode_rate`), undefined (None) when
    one ends before the last starts; details: the span rate and the throughput."""
    records = await asyncio.gather(
        *(ctx.request(story(ctx, i), ctx.settings.decode_tokens, i) for i in range(4))
    )
    done = list(records)
    details: dict[str, object] = {
        "tokens": sum(r.n_output_tokens for r in done),
        "span_decode_tok_s": span_decode_rate(done),
        "throughput_tok_s": throughput(done),
    }
    return Figures(aggregate_decode_rate(done), details | failures(done))


async def _fast_readers(ctx: Context, first_index: int) -> list[RequestRecord]:
    requests = (
        ctx.request(story(ctx, first_index + i), ctx.settings.decode_tokens, i) for i in range(3)
    )
    return list(await asyncio.gather(*requests))


async def stalled_reader(ctx: Context) -> Figures:
    """Three fast readers alone, then the same three beside a reader that stopped
    reading after a few chunks (its own small-SO_RCVBUF socket) STALL_SETTLE_S
    before they start, and stays stalled until they finish."""
    alone = aggregate_decode_rate(await _fast_readers(ctx, 0))
    prompt = story(ctx, 9)
    record = ctx.record(prompt, 9)
    stalled = ChatStream(
        ctx.target, prompt, ctx.options(STALLED_READER_TOKENS), record,
        rcvbuf=STALLED_RCVBUF, limit=SMALL_LIMIT,
    )  # fmt: skip
    try:
        if await stalled.open(ctx.epoch):
            while record.n_chunks < STALL_AFTER_CHUNKS and await stalled.read_some():
                pass
            await asyncio.sleep(STALL_SETTLE_S)
        beside = aggregate_decode_rate(await _fast_readers(ctx, 3))
    finally:
        stalled.close()
    retention = beside / alone if beside and alone else None
    details: dict[str, object] = {"fast_alone_tok_s": alone, "fast_beside_stalled_tok_s": beside}
    return Figures(retention, details | failures([record]))


async def ttft_under_prefill(ctx: Context) -> Figures:
    """TTFT of a short request sent while a ~1,000-token prompt is being prefilled."""
    long_prompt = Prompt.user(f"long-{ctx.variant}", long_text(ctx.variant, LONG_SENTENCES))
    short_prompt = Prompt.user(f"short-{ctx.variant}", SHORT.format(variant=ctx.variant))
    long_task = asyncio.create_task(ctx.request(long_prompt, 8, 0))
    # The scenario's definition: the short request starts this long after the long one.
    await asyncio.sleep(PREFILL_HEAD_START_S)
    short = await ctx.request(short_prompt, 8, 1)
    long = await long_task
    details: dict[str, object] = {
        "long_ttft_s": long.ttft,
        "long_prompt_tokens": long.prompt_tokens,
    }
    return Figures(short.ttft if short.ok else None, details | failures([short, long]))


async def prefill_rate(ctx: Context) -> Figures:
    """Prompt tokens (from usage) over TTFT for a ~500-token prompt."""
    prompt = Prompt.user(f"prefill-{ctx.variant}", long_text(100 + ctx.variant, PREFILL_SENTENCES))
    record = await ctx.request(prompt, 2)
    rate = None
    if record.ok and record.prompt_tokens and record.ttft:
        rate = record.prompt_tokens / record.ttft
    return Figures(rate, {"prompt_tokens": record.prompt_tokens, **failures([record])})


async def flood_rss(ctx: Context) -> Figures:
    """Peak RSS while ``flood_connections`` streaming requests are open, as a fraction of
    model size + KV budget + 150 MB (at most 1.0 is the goal)."""
    budget = ctx.model_bytes + ctx.kv_budget_bytes + FLOOD_BUDGET_EXTRA_BYTES
    before = ctx.server.rss_bytes()
    tasks = [
        asyncio.create_task(_flood_request(ctx, i)) for i in range(ctx.settings.flood_connections)
    ]
    peak = await _sample_rss(ctx.server, ctx.settings.flood_seconds)
    finished = [t.result() for t in tasks if t.done() and t.exception() is None]
    for task in tasks:
        task.cancel()  # closes each connection (run_request closes its socket)
    await asyncio.gather(*tasks, return_exceptions=True)
    details = {
        "rss_before_mb": before / MIB,
        "rss_peak_mb": peak / MIB,
        "budget_mb": budget / MIB,
        "finished_ok": sum(r.ok for r in finished),
        "refused_or_failed": _count_errors(finished),
        "still_open": len(tasks) - len(finished),
    }
    return Figures(peak / budget if peak else None, details)


async def _flood_request(ctx: Context, index: int) -> RequestRecord:
    prompt = Prompt.user(f"flood-{index}", FLOOD_PROMPT.format(variant=f"{ctx.variant}.{index}"))
    return await ctx.request(prompt, 16, index)


def _count_errors(records: list[RequestRecord]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for record in records:
        if record.error_kind:
            counts[record.error_kind] = counts.get(record.error_kind, 0) + 1
    return counts


async def _sample_rss(server: ServerProcess, seconds: float) -> int:
    peak = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        peak = max(peak, await asyncio.to_thread(server.rss_bytes))
        await asyncio.sleep(RSS_SAMPLE_S)
    return peak


REGENERATE_SENTENCES = 25  # about 480 prompt tokens
TRAFFIC_SENTENCES = 20  # about 400 prompt tokens
TRAFFIC_PROMPTS = 24
TRAFFIC_REGENERATES = 8
TRAFFIC_CONCURRENCY = 2
TRAFFIC_TOKENS = 48


async def regenerate_ttft(ctx: Context) -> Figures:
    """TTFT of a ~480-token prompt sent a second time right after the first (the
    user's "regenerate"): a prompt cache answers it without prefilling."""
    text = long_text(700 + ctx.variant, REGENERATE_SENTENCES)
    prompt = Prompt.user(f"regen-{ctx.variant}", text)
    first = await ctx.request(prompt, 8, 0)
    again = await ctx.request(prompt, 8, 1)
    details: dict[str, object] = {"first_ttft_s": first.ttft, "prompt_tokens": again.prompt_tokens}
    return Figures(again.ttft if again.ok else None, details | failures([first, again]))


async def serve_traffic(ctx: Context) -> Figures:
    """What a server has done after a minute of use: TRAFFIC_PROMPTS distinct ~400-token
    prompts, TRAFFIC_CONCURRENCY at a time, then TRAFFIC_REGENERATES of them again. The
    same prompts for every server (the figures: what the traffic itself took)."""
    prompts = [
        Prompt.user(f"traffic-{i}", long_text(900 + i, TRAFFIC_SENTENCES))
        for i in range(TRAFFIC_PROMPTS)
    ]
    order = [*prompts, *prompts[:TRAFFIC_REGENERATES]]
    records: list[RequestRecord] = []
    began = time.perf_counter()
    for start in range(0, len(order), TRAFFIC_CONCURRENCY):
        batch = order[start : start + TRAFFIC_CONCURRENCY]
        records.extend(
            await asyncio.gather(
                *(ctx.request(p, TRAFFIC_TOKENS, start + i) for i, p in enumerate(batch))
            )
        )
    details: dict[str, object] = {"requests": len(records), "seconds": time.perf_counter() - began}
    return Figures(float(sum(r.ok for r in records)), details | failures(records))


def cold_ttft(size: int) -> Scenario:
    """TTFT of a lone request with a unique prompt of about ``size`` tokens."""

    async def run(ctx: Context) -> Figures:
        text = long_text(500 + ctx.variant, COLD_SENTENCES[size])
        record = await ctx.request(Prompt.user(f"cold-{size}-{ctx.variant}", text), 2)
        value = record.ttft if record.ok else None
        return Figures(value, {"prompt_tokens": record.prompt_tokens, **failures([record])})

    return run


async def itl_during_prefill(ctx: Context) -> Figures:
    """ITL p99 (ms) of 3 decoding streams while a ~1,000-token prompt prefills: the gaps
    between their chunks that end between the long request's start and its first
    token. Details: their median ITL in that window and before it, the long TTFT."""
    records = [ctx.record(story(ctx, i), i) for i in range(3)]
    streams = [
        ChatStream(ctx.target, story(ctx, i), ctx.options(BESIDE_TOKENS), r)
        for i, r in enumerate(records)
    ]
    decoding = [asyncio.Event() for _ in streams]
    readers = [
        asyncio.create_task(_read_signalling(s, ctx.epoch, e))
        for s, e in zip(streams, decoding, strict=True)
    ]
    try:
        await asyncio.gather(*(e.wait() for e in decoding))
        long_prompt = Prompt.user(f"itl-long-{ctx.variant}", long_text(ctx.variant, LONG_SENTENCES))
        long = await ctx.request(long_prompt, 2, 3)
    finally:
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        for stream in streams:
            stream.close()
    if not long.ok or long.ttft is None:
        return Figures(None, failures([long, *records]))
    start, first = long.started_at, long.started_at + long.ttft
    inside, before = _gaps(records, start, first)
    details: dict[str, object] = {
        "itl_median_ms": percentile(inside, 50) * 1000 if inside else None,
        "itl_median_before_ms": percentile(before, 50) * 1000 if before else None,
        "long_ttft_s": long.ttft,
        "long_prompt_tokens": long.prompt_tokens,
        "gaps": len(inside),
    }
    return Figures(percentile(inside, 99) * 1000 if inside else None, details)


async def _read_signalling(stream: ChatStream, epoch: float, decoding: asyncio.Event) -> None:
    """Read a stream to its end; ``decoding`` is set after its eighth chunk (or its end)."""
    try:
        if await stream.open(epoch):
            while await stream.read_some():
                if stream.record.n_chunks >= DECODING_AFTER_CHUNKS:
                    decoding.set()
    finally:
        decoding.set()


def _gaps(
    records: list[RequestRecord], start: float, end: float
) -> tuple[list[float], list[float]]:
    """Chunk gaps of the streams ending inside [start, end], and those ending before."""
    inside: list[float] = []
    before: list[float] = []
    for r in records:
        times = [r.started_at + t for t in r.chunk_times]
        for earlier, later in itertools.pairwise(times):
            if start < later <= end:
                inside.append(later - earlier)
            elif later <= start:
                before.append(later - earlier)
    return inside, before


COPY_SENTENCES = 12  # a passage of about 214 tokens
COPY_INSTRUCTION = "Repeat the passage above exactly."
COPY_MAX_TOKENS = 240  # the copy itself (~214 tokens): SmolLM2 runs on past it to any limit
COPY_STREAMS = 4
# One stream copies this many passages in turn: a copy may end early (greedy text
# differs with a server's batch shapes), and the rate of a short one says little.
COPY_PASSAGES = 3
MIN_COPY_CELLS = 400  # issue 42: copying measured past 400 cells (prompt + output)
DRAFT_METRIC = "edge_llm_spec_draft_tokens_total"


def copy_prompt(ctx: Context, index: int) -> Prompt:
    """A ~214-token passage (tagged, so unique to the run) and the instruction to copy it:
    prompt and copy together pass MIN_COPY_CELLS."""
    variant = ctx.variant * 10 + index
    passage = long_text(300 + variant, COPY_SENTENCES).rsplit("\n\n", 1)[0]  # no question
    return Prompt.user(f"copy-{variant}", f"(Passage {variant}.) {passage}\n\n{COPY_INSTRUCTION}")


def copy_details(records: list[RequestRecord], drafted: float | None) -> dict[str, object]:
    """Tokens, the cells the shortest copy reached, and (edge-llm) the tokens drafted."""
    ok = [r for r in records if r.ok]
    cells = [(r.prompt_tokens or 0) + r.n_output_tokens for r in ok]
    details: dict[str, object] = {
        "tokens": [r.n_output_tokens for r in ok],
        "prompt_tokens": [r.prompt_tokens for r in ok],
        "min_cells": min(cells, default=None),
        "tokens_from_usage": all(r.tokens_from_usage for r in ok),
    }
    if cells and min(cells) < MIN_COPY_CELLS:
        details["warning"] = f"a copy ended below {MIN_COPY_CELLS} cells"
    if drafted is not None:
        details["draft_tokens"] = drafted
    return details | failures(records)


async def _drafted_since(ctx: Context, before: float | None) -> float | None:
    after = await asyncio.to_thread(read_metric, ctx.server, DRAFT_METRIC)
    return after - before if after is not None and before is not None else None


async def copy_one(ctx: Context) -> Figures:
    """Decode tok/s of one stream copying COPY_PASSAGES passages one after another:
    their completion tokens from ``usage``, less one each, over their spans from first
    to last content chunk (a speculating server may send several tokens per chunk, so
    chunks are not counted); a copy that ends early weighs by its length."""
    before = await asyncio.to_thread(read_metric, ctx.server, DRAFT_METRIC)
    records = [
        await ctx.request(copy_prompt(ctx, i), COPY_MAX_TOKENS) for i in range(COPY_PASSAGES)
    ]
    details = copy_details(records, await _drafted_since(ctx, before))
    return Figures(pooled_decode_rate(records) if all(r.ok for r in records) else None, details)


async def copy_four(ctx: Context) -> Figures:
    """COPY_STREAMS streams at once, each copying its own passage: their aggregate
    decode tok/s while all of them decode (tokens from ``usage``)."""
    before = await asyncio.to_thread(read_metric, ctx.server, DRAFT_METRIC)
    records = list(
        await asyncio.gather(
            *(ctx.request(copy_prompt(ctx, i), COPY_MAX_TOKENS, i) for i in range(COPY_STREAMS))
        )
    )
    details = copy_details(records, await _drafted_since(ctx, before))
    details["span_decode_tok_s"] = span_decode_rate(records)
    value = aggregate_decode_rate(records) if all(r.ok for r in records) else None
    return Figures(value, details)


EDIT_FUNCTIONS = 2  # one stream edits this many functions in turn
EDIT_MAX_TOKENS = 400  # the function (~260 tokens) in a code block, and a line or two
EDIT_FUNCTION = '''def summarize_orders_{v}(orders, threshold={t}):
    """Summarise the orders of batch {v}: totals, counts and the largest order."""
    total = 0
    count = 0
    largest = None
    skipped = []
    for order in orders:
        if order.get("status") == "cancelled":
            skipped.append(order["id"])
            continue
        amount = order["quantity"] * order["unit_price"]
        if order.get("discount"):
            amount -= amount * order["discount"] / 100
        total += amount
        count += 1
        if largest is None or amount > largest["amount"]:
            largest = {{"id": order["id"], "amount": amount}}
    average = total / count if count else 0.0
    flagged = [o["id"] for o in orders if o["quantity"] > threshold]
    return {{
        "total": round(total, 2),
        "count": count,
        "average": round(average, 2),
        "largest": largest,
        "skipped": skipped,
        "flagged": flagged,
    }}'''
EDIT_INSTRUCTION = (
    "Rename the local variable `total` to `running_total` in this function. Reply with "
    "the whole function in one Python code block and nothing else."
)


def edit_prompt(ctx: Context, index: int) -> Prompt:
    """A 25-line function (unique to the run: its name and default) and the instruction
    to send it back with one variable renamed: an on-device coder's everyday edit."""
    variant = ctx.variant * 10 + index
    function = EDIT_FUNCTION.format(v=variant, t=3 + variant % 17)
    return Prompt.user(f"edit-{variant}", f"```python\n{function}\n```\n\n{EDIT_INSTRUCTION}")


async def edit_one(ctx: Context) -> Figures:
    """Decode tok/s of one stream sending back EDIT_FUNCTIONS edited functions in turn
    (tokens from ``usage``, as in :func:`copy_one`); the details say whether each answer
    has the renamed variable."""
    before = await asyncio.to_thread(read_metric, ctx.server, DRAFT_METRIC)
    streams = [
        await read_stream(
            ctx.target, prompt, ctx.options(EDIT_MAX_TOKENS), ctx.record(prompt), epoch=ctx.epoch
        )
        for prompt in (edit_prompt(ctx, i) for i in range(EDIT_FUNCTIONS))
    ]
    records = [stream.record for stream in streams]
    details = copy_details(records, await _drafted_since(ctx, before))
    details["renamed"] = [s.text.count("running_total") for s in streams if s.record.ok]
    return Figures(pooled_decode_rate(records) if all(r.ok for r in records) else None, details)
