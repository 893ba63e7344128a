"""Slow-consumer probe: a reader that really fills the socket, then stalls.

The reader opens its own socket with a small ``SO_RCVBUF`` (set before connect) and a
small userspace buffer, reads the first ``stall_after_chunks`` content chunks, then
stops reading for ``stall_s`` seconds and finally reads the rest as fast as it can.
While stalled, the kernel receive queue (FIONREAD) is sampled: when it stops growing,
the TCP window is closed and the stream has stopped arriving.

What the server did meanwhile:

- edge-llm (it has ``/debug/streams``): the stream's entry, found by the
  ``X-Request-Id`` header, is sampled; state ``paused`` with ``pause_cause`` gives when
  it paused and when it resumed, and the final entry the server's own ``pauses``,
  ``paused_ms`` and ``tokens_while_paused``.
- llama.cpp's ``llama-server`` (it has ``/slots``): the busy slot's ``n_decoded`` is
  sampled; still rising through the stall means it kept generating, flat means it
  stopped (when, and at how many tokens).
- other servers: inferred. Everything that arrives in one burst right after the stall
  was generated while the client was stalled. At the pace seen before the stall, a
  burst of N chunks is N x pace seconds of generation: about the whole stall (or the
  stream finishing inside the burst) means the server kept generating; much less
  means it stopped (paused, or blocked on the socket).

Memory: ``edge_llm_kv_cache_used_bytes`` before, at peak and after, when ``/metrics``
exposes it; otherwise reported as not measurable.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from edge_llm.bench.chat_stream import ChatStream, Clock, RequestOptions
from edge_llm.bench.connection import SMALL_LIMIT
from edge_llm.bench.inspector import ServerInspector, StreamSample, slot_progress
from edge_llm.bench.prompts import Prompt
from edge_llm.bench.record import RequestRecord
from edge_llm.bench.targets import Target

SLOW_PROMPT = Prompt.user(
    "slow-consumer",
    "Write a very long story about a lighthouse keeper during a storm. "
    "Make it at least 1000 words long.",
)
KEPT_GENERATING_FRACTION = 0.8
BURST_GAP_FRACTION = 0.25
MIN_BURST_GAP_S = 0.002
MAX_SAMPLES = 10_000
PAUSE_HOLD_S = 1.0
STALL_SLACK_S = 0.05


@dataclass(frozen=True, slots=True)
class SlowConsumerSettings:
    """How the slow reader behaves. ``rcvbuf`` is SO_RCVBUF in bytes (Linux doubles it).

    With ``until_paused``, a target that has ``/debug/streams`` is stalled until it
    reports the stream paused (at least ``stall_s``, at most ``max_stall_s``), so the
    pause and the resume are seen however slow the machine is; other targets are
    stalled for ``stall_s`` as usual.
    """

    rcvbuf: int = 4096
    stall_after_chunks: int = 8
    stall_s: float = 3.0
    max_tokens: int = 400
    poll_interval_s: float = 0.1
    until_paused: bool = False
    max_stall_s: float = 60.0


@dataclass
class Samples:
    """What was sampled while the probe ran (bounded by :data:`MAX_SAMPLES`)."""

    queue: list[tuple[float, int]] = field(default_factory=list)
    server: list[StreamSample] = field(default_factory=list)
    decoded: list[tuple[float, int]] = field(default_factory=list)
    kv: list[tuple[float, float]] = field(default_factory=list)

    def full(self) -> bool:
        return len(self.queue) >= MAX_SAMPLES


@dataclass
class SlowConsumerResult:
    """The probe's findings for one target (times in seconds since the request start)."""

    target: str
    record: RequestRecord
    settings: SlowConsumerSettings
    introspection: bool
    slots: bool = False
    stall_start: float | None = None
    stall_end: float | None = None
    chunks_before_stall: int = 0
    queue_peak_bytes: int | None = None
    arrival_stopped_at: float | None = None
    trickle_bytes: int | None = None
    arrival_resumed_at: float | None = None
    pace_s: float | None = None
    burst_chunks: int = 0
    burst_span_s: float | None = None
    longest_gap_after_stall_s: float | None = None
    finished_in_burst: bool = False
    generated_during_stall_s: float | None = None
    generation_stopped_at: float | None = None
    server_paused: bool | None = None
    verdict_source: str = "inferred"
    verdict: str = ""
    paused_at: float | None = None
    resumed_at: float | None = None
    pause_cause: str | None = None
    n_generated_at_pause: int | None = None
    server_pauses: int | None = None
    server_paused_ms: float | None = None
    tokens_while_paused: int | None = None
    backpressure_peak: int | None = None
    kv_before_bytes: float | None = None
    kv_peak_bytes: float | None = None
    kv_after_bytes: float | None = None
    memory_note: str = ""
    samples: Samples = field(default_factory=Samples)

    @property
    def arrival_gap_s(self) -> float | None:
        """How long the stream stopped arriving (kernel queue full until reading resumed)."""
        if self.arrival_stopped_at is None or self.arrival_resumed_at is None:
            return None
        return self.arrival_resumed_at - self.arrival_stopped_at

    @property
    def kv_growth_bytes(self) -> float | None:
        if self.kv_before_bytes is None or self.kv_peak_bytes is None:
            return None
        return self.kv_peak_bytes - self.kv_before_bytes

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["record"] = self.record.to_json()
        data["arrival_gap_s"] = self.arrival_gap_s
        data["kv_growth_bytes"] = self.kv_growth_bytes
        return data


class _Sampler:
    """Samples the receive queue and the server until :meth:`stop` is called."""

    def __init__(
        self, stream: ChatStream, inspector: ServerInspector, result: SlowConsumerResult
    ) -> None:
        self.stream = stream
        self.inspector = inspector
        self.introspection = result.introspection
        self.slots = result.slots
        self.interval = result.settings.poll_interval_s
        self.samples = Samples()
        self.paused_seen = asyncio.Event()
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        while not self._stop.is_set() and not self.samples.full():
            await self.sample_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.interval)

    async def sample_once(self) -> None:
        t = self.stream.now()
        queued = self.stream.queued_bytes()
        if queued is not None and not self.stream.finished:
            self.samples.queue.append((t, queued))
        if self.introspection:
            await self._sample_engine(t)
        elif self.slots:
            slots = await self.inspector.slots()
            decoded = slot_progress(slots) if slots is not None else None
            if decoded is not None:
                self.samples.decoded.append((t, decoded))

    async def _sample_engine(self, t: float) -> None:
        stream_id = self.stream.record.stream_id
        entry = await self.inspector.stream_entry(stream_id) if stream_id else None
        if entry is not None:
            sample = StreamSample.of(t, entry)
            self.samples.server.append(sample)
            self.samples.decoded.append((t, sample.n_generated))
            if sample.state == "paused":
                self.paused_seen.set()
        kv = await self.inspector.kv_used_bytes()
        if kv is not None:
            self.samples.kv.append((t, kv))


async def probe(
    target: Target,
    settings: SlowConsumerSettings,
    options: RequestOptions,
    *,
    epoch: float,
    clock: Clock = time.perf_counter,
    prompt: Prompt = SLOW_PROMPT,
) -> SlowConsumerResult:
    """Run the slow reader once against ``target`` and analyse what happened."""
    inspector = ServerInspector(target)
    introspection = await inspector.debug_streams() is not None
    record = RequestRecord(target.name, concurrency=1, index=0, prompt_id=prompt.id)
    result = SlowConsumerResult(target.name, record, settings, introspection)
    result.slots = not introspection and await inspector.slots() is not None
    result.kv_before_bytes = await inspector.kv_used_bytes()
    stream = ChatStream(
        target,
        prompt,
        replace(options, max_tokens=settings.max_tokens),
        record,
        clock=clock,
        rcvbuf=settings.rcvbuf,
        limit=SMALL_LIMIT,
    )
    sampler = _Sampler(stream, inspector, result)
    try:
        async with asyncio.timeout(options.timeout_s + settings.max_stall_s):
            await _run_stalled(stream, sampler, result, epoch)
    except TimeoutError:
        stream.fail_timeout(options.timeout_s + settings.max_stall_s)
    finally:
        sampler.stop()
        stream.close()
    result.samples = sampler.samples
    await _finish(result, inspector)
    return result


async def _run_stalled(
    stream: ChatStream, sampler: _Sampler, result: SlowConsumerResult, epoch: float
) -> None:
    if not await stream.open(epoch):
        return
    while stream.record.n_chunks < result.settings.stall_after_chunks:
        if not await stream.read_some():
            return
    result.chunks_before_stall = stream.record.n_chunks
    task = asyncio.create_task(sampler.run())
    try:
        result.stall_start = stream.now()
        await _stall(result, sampler)
        result.stall_end = stream.now()
        await stream.run_to_end()
        await sampler.sample_once()
    finally:
        sampler.stop()
        await task


async def _stall(result: SlowConsumerResult, sampler: _Sampler) -> None:
    """Read nothing: for ``stall_s`` (the scenario itself, not a synchronisation), then,
    with ``until_paused`` on an introspectable target, until the server reports the
    pause (an event) or ``max_stall_s`` has passed, then :data:`PAUSE_HOLD_S` more so
    that the pause lasts long enough to be seen."""
    settings = result.settings
    await asyncio.sleep(settings.stall_s)
    if not (settings.until_paused and result.introspection) or sampler.paused_seen.is_set():
        return
    remaining = max(settings.max_stall_s - settings.stall_s, 0.0)
    try:
        await asyncio.wait_for(sampler.paused_seen.wait(), remaining)
    except TimeoutError:
        return
    await asyncio.sleep(PAUSE_HOLD_S)


async def _finish(result: SlowConsumerResult, inspector: ServerInspector) -> None:
    stream_id = result.record.stream_id
    final = None
    if result.introspection and stream_id:
        final = await inspector.stream_entry(stream_id)
    result.kv_after_bytes = await inspector.kv_used_bytes()
    analyse(result, final)


def analyse(result: SlowConsumerResult, final: dict[str, Any] | None) -> None:
    """Fill the derived fields from the record and samples (pure; tested directly)."""
    start, end = result.stall_start, result.stall_end
    if start is None or end is None:
        result.verdict = _no_stall_reason(result)
    else:
        _analyse_queue(result, start, end)
        _analyse_burst(result, start, end)
        if result.introspection:
            _analyse_server(result, final)
        elif not (result.slots and _analyse_slots(result, start, end)):
            _infer_server(result, end - start)
    _analyse_memory(result)


def _no_stall_reason(result: SlowConsumerResult) -> str:
    record = result.record
    if not record.ok:
        return f"request failed before the stall: {record.error_kind} ({record.error_message})"
    return (
        f"the stream ended after {record.n_chunks} content chunks, before the stall "
        f"(needs {result.settings.stall_after_chunks}); use a prompt with a longer answer"
    )


def _analyse_queue(result: SlowConsumerResult, start: float, end: float) -> None:
    """The stream stopped arriving when the kernel receive queue first stopped growing
    (the TCP window closed); bytes that still came after that are the trickle."""
    during = [(t, q) for t, q in result.samples.queue if start <= t <= end]
    after = [t for t in result.record.chunk_times if t >= end]
    result.arrival_resumed_at = after[0] if after else None
    if not during:
        return
    result.queue_peak_bytes = max(q for _, q in during)
    for (t, q), (_, q_next) in itertools.pairwise(during):
        if q > 0 and q_next <= q:
            result.arrival_stopped_at = t
            result.trickle_bytes = result.queue_peak_bytes - q
            return


def _analyse_burst(result: SlowConsumerResult, start: float, end: float) -> None:
    times = result.record.chunk_times
    before = [t for t in times if t <= start]
    gaps = [b - a for a, b in itertools.pairwise(before)]
    result.pace_s = statistics.median(gaps) if gaps else None
    threshold = max(MIN_BURST_GAP_S, BURST_GAP_FRACTION * (result.pace_s or 0.0))
    after = [t for t in times if t >= end]
    burst = after[:1]
    for earlier, later in itertools.pairwise(after):
        if later - earlier > threshold:
            break
        burst.append(later)
    gaps_after = [b - a for a, b in itertools.pairwise(after)]
    result.longest_gap_after_stall_s = max(gaps_after, default=None)
    result.burst_chunks = len(burst)
    result.burst_span_s = burst[-1] - burst[0] if burst else None
    result.finished_in_burst = bool(burst) and len(burst) == len(after)
    if result.pace_s is not None:
        result.generated_during_stall_s = len(burst) * result.pace_s


def _analyse_server(result: SlowConsumerResult, final: dict[str, Any] | None) -> None:
    result.verdict_source = "debug_streams"
    samples = result.samples.server
    paused = [s for s in samples if s.state == "paused"]
    if paused:
        first = paused[0]
        result.paused_at = first.t
        result.pause_cause = first.pause_cause
        result.n_generated_at_pause = first.n_generated
        later = [s for s in samples if s.t > first.t and s.state != "paused"]
        result.resumed_at = later[0].t if later else None
    if final is not None:
        last = StreamSample.of(result.record.ended_at or 0.0, final)
        result.server_pauses = last.pauses
        result.server_paused_ms = last.paused_ms
        result.tokens_while_paused = last.tokens_while_paused
        result.backpressure_peak = last.backpressure_peak
    result.server_paused = bool(paused) or bool(result.server_pauses)
    result.verdict = _server_verdict(result)


def _server_verdict(result: SlowConsumerResult) -> str:
    if not result.server_paused:
        return "the server reports no pause for this stream"
    parts = [f"the server paused the stream (cause {result.pause_cause or 'not sampled'})"]
    if result.paused_at is not None:
        parts.append(f"seen paused at {result.paused_at:.2f} s")
    if result.resumed_at is not None:
        parts.append(f"running again at {result.resumed_at:.2f} s")
    if result.server_paused_ms is not None:
        parts.append(f"paused {result.server_paused_ms / 1000.0:.2f} s in all")
    return ", ".join(parts)


def _analyse_slots(result: SlowConsumerResult, start: float, end: float) -> bool:
    """llama.cpp's /slots: did the busy slot's n_decoded keep rising through the stall?
    False when there were too few samples to tell (the caller then infers)."""
    during = [(t, n) for t, n in result.samples.decoded if start <= t <= end]
    if len(during) < 2:
        return False
    result.verdict_source = "llama.cpp /slots"
    last_rise = start
    for (_, n), (t_next, n_next) in itertools.pairwise(during):
        if n_next > n:
            last_rise = t_next
    first_n, last_n = during[0][1], during[-1][1]
    still_rising = end - last_rise <= 2 * result.settings.poll_interval_s + STALL_SLACK_S
    kept_going = still_rising or result.finished_in_burst
    result.server_paused = not kept_going
    if result.finished_in_burst:
        result.verdict = (
            f"kept generating while the client was stalled and finished: n_decoded {first_n} "
            f"-> {last_n} (llama.cpp /slots), the rest arrived in one burst"
        )
    elif still_rising:
        result.verdict = (
            f"kept generating while the client was stalled: n_decoded {first_n} -> {last_n} "
            "during the stall (llama.cpp /slots)"
        )
    else:
        result.generation_stopped_at = last_rise
        result.verdict = (
            f"stopped generating {last_rise - start:.2f} s into the stall at n_decoded "
            f"{last_n} (llama.cpp /slots)"
        )
    return True


def _infer_server(result: SlowConsumerResult, stall: float) -> None:
    generated = result.generated_during_stall_s
    if result.finished_in_burst or (
        generated is not None and generated >= KEPT_GENERATING_FRACTION * stall
    ):
        result.server_paused = False
        result.verdict = (
            f"inferred: kept generating while the client was stalled ({result.burst_chunks} "
            "chunks arrived in one burst after the stall"
            + (", including the end of the stream)" if result.finished_in_burst else ")")
        )
    elif generated is not None:
        result.server_paused = True
        result.verdict = (
            f"inferred: stopped generating about {generated:.2f} s into the {stall:.2f} s stall "
            f"(only {result.burst_chunks} chunks were waiting when the client resumed)"
        )
    else:
        result.verdict = "not inferable: too few chunks before the stall to know the pace"


def _analyse_memory(result: SlowConsumerResult) -> None:
    values = [kv for _, kv in result.samples.kv]
    if result.kv_before_bytes is not None:
        values.append(result.kv_before_bytes)
    if not values:
        result.memory_note = (
            "not measurable: the endpoint exposes no edge_llm_kv_cache_used_bytes in /metrics"
        )
        return
    result.kv_peak_bytes = max(values)
    growth = result.kv_growth_bytes
    result.memory_note = (
        f"KV cache grew by {growth / 1024:.0f} KiB at peak" if growth is not None else ""
    )
