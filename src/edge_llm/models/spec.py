"""What each served model is: its file, limits, defaults and memory estimate."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from edge_llm.config.tree import EngineConfig
from edge_llm.errors import BackendError

MIB = 1024 * 1024
# Beyond weights and KV a model holds its vocabulary, llama.cpp's compute and output
# buffers and, once asked for embeddings, an embeddings context. Measured here: SmolLM2
# 135M about 10 MiB plus 40 for embeddings, Gemma 3 270M (a 262k-word vocabulary) about
# 50 plus 50. The reserve covers both; a load that measures more counts what it measured.
_MIN_RESERVE_BYTES = 64 * MIB


@dataclass(frozen=True)
class ModelSpec:
    name: str
    path: str | None  # None: the embedded default model
    size_bytes: int  # the GGUF file's size (its weights)
    kv_budget_bytes: int
    modified_at: float = 0.0  # the file's mtime (Unix seconds)
    context_tokens: int | None = None  # None: the model's trained context
    sampling: dict[str, float] = field(default_factory=dict)  # temperature, top_p, top_k
    keep_alive_s: float | None = None  # None: stays loaded while idle

    @property
    def estimate_bytes(self) -> int:
        """Memory the model takes once loaded: weights, KV budget and a reserve."""
        reserve = max(_MIN_RESERVE_BYTES, self.size_bytes // 2)
        return self.size_bytes + self.kv_budget_bytes + reserve


def keep_alive_s(ms: int) -> float | None:
    """``keep_alive_ms`` as seconds; -1 (any negative value): never."""
    return None if ms < 0 else ms / 1000.0


def default_spec(config: EngineConfig, name: str, path: str, size_bytes: int) -> ModelSpec:
    """The default model (``model_path`` or the embedded one), with the engine's keys."""
    return ModelSpec(
        name=name,
        path=path,
        size_bytes=size_bytes,
        modified_at=_file_stat(path)[1],
        kv_budget_bytes=kv_share_bytes(config, None),
        keep_alive_s=keep_alive_s(config.model.keep_alive_ms),
    )


def named_specs(config: EngineConfig) -> list[ModelSpec]:
    """The ``[models.NAME]`` models, in the order given."""
    specs = []
    for name, entry in config.models.items():
        sampling = {
            key: float(value)
            for key in ("temperature", "top_p", "top_k")
            if (value := getattr(entry, key)) is not None
        }
        keep_ms = entry.keep_alive_ms
        size, mtime = _file_stat(entry.path)
        specs.append(
            ModelSpec(
                name=name,
                path=entry.path,
                size_bytes=size,
                modified_at=mtime,
                kv_budget_bytes=kv_share_bytes(config, entry.max_kv_cache_mb),
                context_tokens=entry.context_tokens,
                sampling=sampling,
                keep_alive_s=keep_alive_s(
                    config.model.keep_alive_ms if keep_ms is None else keep_ms
                ),
            )
        )
    return specs


def pulled_spec(config: EngineConfig, name: str, path: str) -> ModelSpec:
    """A pulled model served under ``name`` (one the configuration does not name),
    with the engine's keys: its share of the KV cap is a named model's."""
    size, mtime = _file_stat(path)
    return ModelSpec(
        name=name,
        path=path,
        size_bytes=size,
        modified_at=mtime,
        kv_budget_bytes=kv_share_bytes(config, None),
        keep_alive_s=keep_alive_s(config.model.keep_alive_ms),
    )


def kv_share_bytes(config: EngineConfig, own_mb: int | None) -> int:
    """A model's share of the memory ledger, whose cap (``max_kv_cache_mb``) bounds
    every loaded model's KV together: its own ``[models.NAME] max_kv_cache_mb``, else
    an equal part of what those leave (with one model, the whole cap). The model's KV
    context and tiers are sized to it, so that models within the cap can all be loaded
    at once; when their own budgets leave nothing, the cap over the models served (they
    cannot all be loaded at once then: the pool unloads idle ones for a load)."""
    if own_mb is not None:
        return own_mb * MIB
    cap = config.backpressure.max_kv_cache_mb * MIB
    own = [e.max_kv_cache_mb for e in config.models.values() if e.max_kv_cache_mb is not None]
    served = 1 + len(config.models)
    rest = cap - sum(own) * MIB
    return rest // (served - len(own)) if rest > 0 else cap // served


def check_kv_shares(config: EngineConfig) -> None:
    """A model whose share is above the cap could never load: a start error."""
    cap_mb = config.backpressure.max_kv_cache_mb
    for name, entry in config.models.items():
        if entry.max_kv_cache_mb is not None and entry.max_kv_cache_mb > cap_mb:
            raise BackendError(
                f"[models.{name}] max_kv_cache_mb = {entry.max_kv_cache_mb} is more than "
                f"max_kv_cache_mb = {cap_mb}, the cap on every loaded model's KV together"
            )


def serves_several(config: EngineConfig) -> bool:
    """Named models are served beside the default one (``model_path``, else the
    embedded SmolLM2)."""
    return bool(config.models)


def _file_stat(path: str) -> tuple[int, float]:
    """(size, mtime); zeros for a missing file (its load says "model file not found")."""
    try:
        stat = os.stat(path)
    except OSError:
        return 0, 0.0
    return stat.st_size, stat.st_mtime
