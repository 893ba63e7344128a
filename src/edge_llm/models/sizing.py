"""Defaults that fit the model being served: the prompt limit, the KV budget and the
TTFT time-out from its GGUF (context length, layers, heads, KV type), its weights,
the machine's memory and its measured prefill rate.

The seed's values (512 prompt tokens, 256 MiB of KV, 10 s to the first token) were
chosen for the embedded 135M model and stay its defaults. For any other default
model, each of the three keys the configuration does not set (TOML, environment or
flag: those always win) is sized here, and :class:`Fit` says what and why for the
startup lines:

- ``max_prompt_tokens``: the model's context less a ``default_max_tokens`` answer,
  at most 4096, lowered until the KV budget that holds it fits half the memory the
  weights leave free; never below the seed's 512;
- ``max_kv_cache_mb``: the smallest budget whose one-sequence share (a slot's, or
  the whole pool) holds such a prompt and its answer; never below the seed's 256;
- ``ttft_timeout_ms``: 1.5 times the time the prefill of ``max_prompt_tokens`` takes
  at the rate measured when the model loads (kept in a pulled model's manifest for
  the next start), whole seconds, never below the seed's 10 s.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from edge_llm.config.tree import EngineConfig
from edge_llm.engine import (
    Backend,
    BatchItem,
    context_cells,
    context_tokens,
    device_share_bytes,
    kv_bytes_per_token,
)
from edge_llm.errors import BackendError
from edge_llm.models.gguf import GgufError, read_metadata
from edge_llm.models.store import ModelStore
from edge_llm.protocol.sampling import SamplingParams

MIB = 1024 * 1024
MAX_DEFAULT_PROMPT = 4096
SEED_PROMPT, SEED_KV_MB, SEED_TTFT_MS = 512, 256, 10000
TTFT_MARGIN = 1.5
_PROBE_TOKENS = 64  # about 0.2 s at this machine's 300 tokens/s (SmolLM2, quiet)
_WARM_TOKENS = 16
_PROBE = "prefill-probe"  # the probe's sampler key (no token is sampled)
_PROBE_TEXT = (
    "A small model on a device answers while the user waits: every prompt token is read "
    "before the first word of the answer appears, so the prompt's length sets the wait. "
)


@dataclass(frozen=True)
class ModelShape:
    """What sizing needs from a model's GGUF and file."""

    trained_tokens: int  # its context length (0: unknown)
    kv_bytes_per_token: int
    weights_bytes: int


@dataclass
class Fit:
    """The keys sized for the model and a reason for each (explicit keys are absent)."""

    values: dict[str, int] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)

    def set(self, key: str, value: int, why: str) -> None:
        self.values[key] = value
        self.reasons.append(f"{key} {value} ({why})")


def sequence_tokens(config: EngineConfig, kv_mb: int, shape: ModelShape) -> int:
    """The most tokens (prompt and answer) one sequence may hold with a KV cap of
    ``kv_mb``, as the backend will size its context (one slot's share, or the pool)."""
    sched, cache = config.scheduler, config.cache
    embeddings = context_cells(config.model.max_embedding_tokens) * shape.kv_bytes_per_token
    device = device_share_bytes(
        kv_mb * MIB, cache.host_cache_mb * MIB, cache.host_offload_mb * MIB, embeddings
    )
    cells = context_tokens(device, shape.kv_bytes_per_token, shape.trained_tokens,
                           sched.max_sequences, sched.kv_unified)  # fmt: skip
    return cells if sched.kv_unified else cells // sched.max_sequences


def kv_mb_for(config: EngineConfig, tokens: int, shape: ModelShape) -> int | None:
    """The smallest ``max_kv_cache_mb`` whose one-sequence share holds ``tokens``;
    None when the model's context cannot (no budget is enough)."""
    high = 1 << 22  # 4 TiB: more than any device has
    if sequence_tokens(config, high, shape) < tokens:
        return None
    low = 1
    while low < high:
        mid = (low + high) // 2
        if sequence_tokens(config, mid, shape) >= tokens:
            high = mid
        else:
            low = mid + 1
    return low


def fit(config: EngineConfig, shape: ModelShape, available_bytes: int) -> Fit:
    """Size the prompt limit and the KV budget the configuration leaves unset."""
    bp = config.backpressure
    explicit = bp.model_fields_set
    answer = config.scheduler.default_max_tokens
    result = Fit()
    if not shape.kv_bytes_per_token:
        return result
    room_mb = max(SEED_KV_MB, (available_bytes - shape.weights_bytes) // 2 // MIB)
    kv_mb = bp.max_kv_cache_mb if "max_kv_cache_mb" in explicit else room_mb
    prompt = bp.max_prompt_tokens
    if "max_prompt_tokens" not in explicit:
        context = shape.trained_tokens or MAX_DEFAULT_PROMPT + answer
        wanted = min(MAX_DEFAULT_PROMPT, context - answer)
        prompt = max(SEED_PROMPT, _largest_prompt(config, shape, wanted, answer, kv_mb))
        why = f"the model's context {shape.trained_tokens} less a {answer}-token answer"
        if prompt < wanted:
            why = f"what {kv_mb} MiB of KV hold with a {answer}-token answer per sequence"
        elif wanted == MAX_DEFAULT_PROMPT:
            why = f"at most {MAX_DEFAULT_PROMPT}; the model's context is {shape.trained_tokens}"
        result.set("max_prompt_tokens", prompt, why)
    if "max_kv_cache_mb" not in explicit:
        need = kv_mb_for(config, prompt + answer, shape) or room_mb
        sched = config.scheduler
        layout = "the pool" if sched.kv_unified else f"each of {sched.max_sequences} slots"
        per_token = shape.kv_bytes_per_token / 1024
        why = f"{layout} holds {prompt + answer} tokens at {per_token:.0f} KiB a token"
        result.set("max_kv_cache_mb", max(SEED_KV_MB, need), why)
    return result


def _largest_prompt(
    config: EngineConfig, shape: ModelShape, wanted: int, answer: int, kv_mb: int
) -> int:
    """The largest prompt up to ``wanted`` that ``kv_mb`` holds with its answer."""
    room = sequence_tokens(config, kv_mb, shape) - answer
    return max(0, min(wanted, room))


def ttft_fit(config: EngineConfig, prompt_tokens: int, prefill_per_s: float, fit: Fit) -> None:
    """Size ``ttft_timeout_ms`` (unless set) for a prompt of ``prompt_tokens``."""
    if "ttft_timeout_ms" in config.backpressure.model_fields_set or prefill_per_s <= 0:
        return
    seconds = math.ceil(TTFT_MARGIN * prompt_tokens / prefill_per_s)
    value = max(SEED_TTFT_MS, seconds * 1000)
    fit.set("ttft_timeout_ms", value, f"{prompt_tokens} prompt tokens at {prefill_per_s:.0f} "
            f"tokens/s prefill, measured, x{TTFT_MARGIN}")  # fmt: skip


def measure_prefill(backend: Backend) -> float:
    """Prompt tokens per second of one sequence's prefill on this machine now: a
    warm-up batch (the weights' first touch), then a timed one of 64 tokens; the KV is
    cleared. What else runs on the machine slows it (and so lengthens the time-out)."""
    tokens = backend.tokenize(_PROBE_TEXT * 8, add_special=False)[:_PROBE_TOKENS]
    if len(tokens) < 16:
        return 0.0
    batch = [BatchItem(slot=0, tokens=tokens, start_pos=0, sample=False, sampler=_PROBE)]
    warm = [BatchItem(slot=0, tokens=tokens[:_WARM_TOKENS], start_pos=0, sample=False,
                      sampler=_PROBE)]  # fmt: skip
    backend.start_sequence(_PROBE, SamplingParams())
    try:
        backend.decode(warm)
        backend.truncate(0, 0)
        began = time.perf_counter()
        backend.decode(batch)
        elapsed = time.perf_counter() - began
    finally:
        backend.truncate(0, 0)
        backend.end_sequence(_PROBE)
    return len(tokens) / elapsed if elapsed > 0 else 0.0


def shape_of(path: str, kv_cache_type: str) -> ModelShape | None:
    """The model's shape from its GGUF; None when the file cannot tell."""
    try:
        metadata = read_metadata(path)
    except (OSError, GgufError):
        return None
    per_token = kv_bytes_per_token(metadata, kv_cache_type)
    trained = metadata.get(f"{metadata.get('general.architecture')}.context_length")
    if not per_token:
        return None
    return ModelShape(trained if isinstance(trained, int) else 0, per_token,
                      Path(path).stat().st_size)  # fmt: skip


def fit_config(config: EngineConfig, available_bytes: int) -> tuple[EngineConfig, Fit]:
    """``config`` with the prompt limit and KV budget sized for its default model
    (none for the embedded one, whose defaults are the seed's)."""
    path = config.model.model_path
    if path is None or _is_embedded(path):
        return config, Fit()
    shape = shape_of(path, config.cache.kv_cache_type)
    if shape is None:
        return config, Fit()
    sized = fit(config, shape, available_bytes)
    return with_values(config, sized.values), sized


def _is_embedded(path: str) -> bool:
    """The embedded SmolLM2, named by its path: its defaults are the seed's."""
    from edge_llm.engine.runtime.llama_backend import (  # noqa: PLC0415 (loads llama.cpp)
        default_model_path,
    )

    try:
        return Path(path).resolve() == default_model_path().resolve()
    except (OSError, BackendError):
        return False


def fit_ttft(config: EngineConfig, backend: Backend, sized: Fit) -> EngineConfig:
    """``config`` with the TTFT time-out sized from the prefill rate: kept in a
    pulled model's manifest for these threads, else measured now (and kept)."""
    path = config.model.model_path
    if not path or _is_embedded(path) or "ttft_timeout_ms" in config.backpressure.model_fields_set:
        return config
    store = ModelStore(config.model.models_dir)
    key = f"prefill_tokens_per_s_{backend.n_threads}_threads"
    stored = store.by_blob(path)
    rate = stored.measured.get(key, 0.0) if stored is not None else 0.0
    if not rate:
        rate = measure_prefill(backend)
        if stored is not None and rate:
            store.write_manifest(replace(stored, measured={**stored.measured, key: rate}))
    ttft_fit(config, config.backpressure.max_prompt_tokens, rate, sized)
    return with_values(config, sized.values)


def with_values(config: EngineConfig, values: dict[str, int]) -> EngineConfig:
    """``config`` with backpressure keys replaced (validated as if they were set)."""
    if not values:
        return config
    merged = {**config.backpressure.model_dump(exclude_unset=True), **values}
    backpressure = type(config.backpressure)(**merged)
    return config.model_copy(update={"backpressure": backpressure})
