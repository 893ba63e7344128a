"""The part of the configuration the engine thread enforces, and the scheduler limits
derived from it."""

from __future__ import annotations

from dataclasses import dataclass

from edge_llm.engine.scheduling.scheduler import SchedulerLimits

# A prompt still prefilling after this fraction of its TTFT time-out gets whole batches,
# so several long prompts arriving beside decoding streams are not timed out.
URGENT_TTFT_FRACTION = 0.5


@dataclass(frozen=True)
class EngineSettings:
    max_queue: int = 16
    prefill_chunk_tokens: int = 512
    itl_target_s: float | None = 0.1  # None: every step prefills up to prefill_chunk_tokens
    speculative: bool = False
    max_draft_tokens: int = 8
    outbound_buffer_tokens: int = 32
    pause_on_socket_full: bool = True
    resume_threshold: float = 0.3
    cancel_release_kv: bool = True
    ttft_timeout_s: float | None = 10.0
    max_pause_s: float | None = 60.0
    prefix_cache: bool = True
    host_offload_bytes: int = 512 << 20  # 0: no offload
    host_cache_bytes: int = 256 << 20  # the prefix cache's host tier (per-slot layout); 0: none
    # The memory ledger's cap on every KV tier together (ledger.py; a CPU device:
    # max_kv_cache_mb). None: no common cap, each tier bound by its own setting.
    memory_cap_bytes: int | None = None
    cache_dir: str | None = None  # the disk tier's directory (None: no disk tier)
    cache_dir_bytes: int = 1 << 30
    offload_paused_after_s: float = 1.0
    deadline_admission: bool = False
    min_available_bytes: int = 0  # device memory floor (0: not watched)
    max_preemptions: int = 3  # times one stream may be preempted (0: never)
    adaptive_threads: bool = True  # fewer decode threads under CPU contention (threads.py)


def scheduler_limits(max_sequences: int, settings: EngineSettings) -> SchedulerLimits:
    """The scheduler's limits; their ``max_batch_tokens`` sizes the backend's batch."""
    urgent_after_s = None
    if settings.itl_target_s is not None and settings.ttft_timeout_s:
        urgent_after_s = URGENT_TTFT_FRACTION * settings.ttft_timeout_s
    return SchedulerLimits(
        max_sequences,
        settings.max_queue,
        settings.prefill_chunk_tokens,
        settings.itl_target_s,
        settings.max_draft_tokens if settings.speculative else 0,
        urgent_after_s,
        settings.max_preemptions,
    )
