"""Prometheus metrics (docs/design.md §7), in a registry owned by one engine."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

PREFIX = "edge_llm_"
_LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# Our series that vLLM has under another name (VllmNames).
_VLLM_RENAMED = {
    PREFIX + "requests_running": "vllm:num_requests_running",
    PREFIX + "requests_waiting": "vllm:num_requests_waiting",
    PREFIX + "time_to_first_token_seconds": "vllm:time_to_first_token_seconds",
    PREFIX + "inter_token_latency_seconds": "vllm:inter_token_latency_seconds",
}


class EngineMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.ttft = Histogram(
            PREFIX + "time_to_first_token_seconds",
            "Request arrival to first generated token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            PREFIX + "inter_token_latency_seconds",
            "Time between consecutive tokens of one sequence",
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            PREFIX + "request_queue_time_seconds",
            "Arrival to admission into a decode slot",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.requests_running = Gauge(
            PREFIX + "requests_running", "Sequences holding a slot", registry=r
        )
        self.requests_waiting = Gauge(
            PREFIX + "requests_waiting", "Sequences waiting for a slot", registry=r
        )
        self.streams_paused = Gauge(PREFIX + "streams_paused", "Paused streams", registry=r)
        self.streams_detached = Gauge(
            PREFIX + "streams_detached",
            "Resumable streams whose connection dropped, waiting to be resumed",
            registry=r,
        )
        self.stream_resumes = Counter(
            PREFIX + "stream_resumes",
            "Detached streams resumed by a new connection",
            registry=r,
        )
        self.kv_cache_used_bytes = Gauge(
            PREFIX + "kv_cache_used_bytes", "KV cells in use, in bytes", registry=r
        )
        self.backpressure_peak = Gauge(
            PREFIX + "backpressure_peak",
            "Peak of the seed's counter (PAUSE +1, RESUME -1) since start",
            registry=r,
        )
        self.pauses = Counter(
            PREFIX + "backpressure_pauses", "Pauses by cause", ["cause"], registry=r
        )
        self.paused_seconds = Counter(
            PREFIX + "stream_paused_seconds", "Seconds streams spent paused", ["cause"], registry=r
        )
        self.cancellations = Counter(
            PREFIX + "cancellations", "Cancelled streams by reason", ["reason"], registry=r
        )
        self.rejections = Counter(
            PREFIX + "admission_rejections", "Rejected requests by reason", ["reason"], registry=r
        )
        self.generated_tokens = Counter(PREFIX + "generated_tokens", "Tokens generated", registry=r)
        self.prompt_tokens = Counter(
            PREFIX + "prompt_tokens", "Prompt tokens prefilled", registry=r
        )
        self.prompt_tokens_cached = Counter(
            PREFIX + "prompt_tokens_cached", "Prompt tokens found in the prefix cache", registry=r
        )
        self.prefix_cache_queries = Counter(  # vLLM's name only (VllmNames)
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            registry=r,
        )
        self.kv_tier_bytes = Gauge(
            PREFIX + "kv_cache_tier_bytes",
            "Bytes of KV held per tier: device_live (running streams), device_cached "
            "(kept slots or pool cache), host (the prefix cache's host tier), offload "
            "(offloaded streams), disk",
            ["tier"],
            registry=r,
        )
        # The labels the engine's tiers and ledger name, bound once (bind_tiers, bind_ledger).
        self._tiers: tuple[str, ...] = ()
        self._lines: tuple[str, ...] = ()
        self.memory_ledger_bytes = Gauge(
            PREFIX + "memory_ledger_bytes",
            "The memory ledger of every KV tier (a CPU device: max_kv_cache_mb bounds them "
            "together): device_live, device_cached and device_free (the KV context, "
            "allocated whole), host_cache, offload, embeddings, reserve (saves in flight), "
            "other_models (every other loaded model's lines), total, and cap (NaN: no "
            "common cap)",
            ["line"],
            registry=r,
        )
        self.prompt_cache_hits = Counter(
            PREFIX + "prompt_cache_hits",
            "Requests that started from cached cells, by the tier they came from",
            ["tier"],
            registry=r,
        )
        self.memory_available = Gauge(
            PREFIX + "memory_available_bytes",
            "Device memory available at the last check (cgroup room or MemAvailable)",
            registry=r,
        )
        self.decode_threads = Gauge(
            PREFIX + "decode_threads",
            "llama.cpp threads decoding now (fewer while other processes hold the cores)",
            registry=r,
        )
        self.memory_actions = Counter(
            PREFIX + "memory_pressure_actions",
            "What the engine did under min_available_mb besides refusing requests "
            "(admission_rejections_total): host cache entries dropped, streams cancelled",
            ["action"],
            registry=r,
        )
        self.preemptions = Counter(
            PREFIX + "preemptions",
            "Streams paused and offloaded for a more urgent request, by their priority",
            ["priority"],
            registry=r,
        )
        self.preempted_seconds = Counter(
            PREFIX + "preempted_seconds",
            "Seconds streams spent preempted, by their priority",
            ["priority"],
            registry=r,
        )
        self.requests_waiting_by_priority = Gauge(
            PREFIX + "requests_waiting_by_priority",
            "Requests waiting for a slot, by priority",
            ["priority"],
            registry=r,
        )
        self.kv_cache_evictions = Counter(
            PREFIX + "kv_cache_evictions", "Cached KV runs evicted to make room", registry=r
        )
        self.kv_offloads = Counter(
            PREFIX + "kv_offloads", "Paused streams whose KV was saved to host memory", registry=r
        )
        self.kv_restores = Counter(
            PREFIX + "kv_restores", "Offloaded streams restored into KV", registry=r
        )
        self.spec_draft_tokens = Counter(
            PREFIX + "spec_draft_tokens", "Prompt-lookup draft tokens verified", registry=r
        )
        self.spec_accepted_tokens = Counter(
            PREFIX + "spec_accepted_tokens", "Draft tokens the model agreed with", registry=r
        )
        self.event_log_dropped = Counter(
            PREFIX + "event_log_dropped",
            "Event log lines lost: queue full, the file refused them (disk full), or "
            "emitted after the log closed",
            ["reason"],
            registry=r,
        )
        self._priorities_seen: set[str] = set()
        self._init_labels()
        self.kv_usage: Callable[[], float] = lambda: 0.0
        r.register(VllmNames(self))

    def set_waiting_by_priority(self, counts: Mapping[str, int]) -> None:
        """Requests waiting per priority; a priority seen before goes back to zero."""
        self._priorities_seen.update(counts)
        for priority in self._priorities_seen:
            self.requests_waiting_by_priority.labels(priority).set(counts.get(priority, 0))

    def count_event_log_drop(self, reason: str, lines: int) -> None:
        self.event_log_dropped.labels(reason).inc(lines)

    def _init_labels(self) -> None:
        """Expose every documented label value at zero from the start."""
        for cause in ("client", "socket_full", "preempted", "disconnected"):
            self.pauses.labels(cause)
            self.paused_seconds.labels(cause)
        reasons = (
            "client",
            "disconnect",
            "ttft_timeout",
            "superseded",
            "pause_timeout",
            "shutdown",
            "unloaded",
            "resume_timeout",
        )
        for reason in reasons:
            self.cancellations.labels(reason)
        for reason in ("queue_full", "kv_budget_exceeded", "prompt_too_long", "shutting_down"):
            self.rejections.labels(reason)
        for reason in ("queue_full", "write_failed", "closed"):
            self.event_log_dropped.labels(reason)
        for tier in ("device", "host", "disk"):
            self.prompt_cache_hits.labels(tier)
        for action in ("host_cache_dropped", "stream_cancelled"):
            self.memory_actions.labels(action)
        self.rejections.labels("memory_pressure")
        self.cancellations.labels("memory_pressure")

    def bind_gauges(
        self,
        running: Callable[[], float],
        waiting: Callable[[], float],
        paused: Callable[[], float],
        kv_used: Callable[[], float],
        backpressure_peak: Callable[[], float],
        *,
        kv_usage: Callable[[], float] = lambda: 0.0,
    ) -> None:
        """Gauges read the engine's state when scraped; ``kv_usage``: the fraction
        of the KV budget running sequences hold (0 to 1)."""
        self.kv_usage = kv_usage
        self.requests_running.set_function(running)
        self.requests_waiting.set_function(waiting)
        self.streams_paused.set_function(paused)
        self.kv_cache_used_bytes.set_function(kv_used)
        self.backpressure_peak.set_function(backpressure_peak)

    def bind_tiers(self, tiers: Callable[[], dict[str, int]]) -> None:
        """``tiers()``: bytes per tier, read when scraped; the tiers it names now are the
        series (a later binding that names none, an unloaded model's, reads 0 for them)."""
        self._tiers = tuple(tiers()) or self._tiers
        for tier in self._tiers:
            self.kv_tier_bytes.labels(tier).set_function(_reader(tiers, tier))

    def bind_ledger(self, lines: Callable[[], dict[str, int | None]]) -> None:
        """``lines()``: bytes per ledger line (None: no cap), read when scraped; its
        lines are named as :meth:`bind_tiers` names the tiers."""
        self._lines = tuple(lines()) or self._lines
        for line in self._lines:
            self.memory_ledger_bytes.labels(line).set_function(_ledger_reader(lines, line))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class VllmNames(Collector):
    """The series gateways score workers by (llm-d, vLLM production-stack), under
    vLLM's names, with vLLM's meaning and unit, read from this engine's own metrics
    when scraped (``vllm:prefix_cache_queries`` is a counter of its own): a fleet's
    router reads an edge-llm node as it reads a vLLM one (docs/observability.md)."""

    def __init__(self, metrics: EngineMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._metrics
        for metric in (m.requests_running, m.requests_waiting, m.ttft, m.itl):
            for family in metric.collect():
                yield _renamed(family, _VLLM_RENAMED[family.name])
        yield GaugeMetricFamily(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            value=m.kv_usage(),
        )
        yield CounterMetricFamily(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            value=_total(m.prompt_tokens_cached),
        )

    def describe(self) -> list[Metric]:
        return []  # no fixed description: the registry must not collect at register


def _renamed(family: Metric, name: str) -> Metric:
    out = Metric(name, family.documentation, family.type, family.unit)
    for sample in family.samples:
        suffix = sample.name.removeprefix(family.name)
        out.add_sample(name + suffix, sample.labels, sample.value, sample.timestamp)
    return out


def _total(counter: Counter) -> float:
    """A counter's value (without labels)."""
    return sum(s.value for f in counter.collect() for s in f.samples if s.name.endswith("_total"))


def _reader(tiers: Callable[[], dict[str, int]], tier: str) -> Callable[[], float]:
    return lambda: tiers().get(tier, 0)


def _ledger_reader(lines: Callable[[], dict[str, int | None]], line: str) -> Callable[[], float]:
    def read() -> float:
        value = lines().get(line, 0)
        return float("nan") if value is None else float(value)

    return read
