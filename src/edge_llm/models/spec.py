"""What each served model is: its file, limits, defaults and memory estimate."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from edge_llm.config.tree import EngineConfig

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
        kv_budget_bytes=config.backpressure.max_kv_cache_mb * MIB,
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
        kv_mb = entry.max_kv_cache_mb or config.backpressure.max_kv_cache_mb
        keep_ms = entry.keep_alive_ms
        size, mtime = _file_stat(entry.path)
        specs.append(
            ModelSpec(
                name=name,
                path=entry.path,
                size_bytes=size,
                modified_at=mtime,
                kv_budget_bytes=kv_mb * MIB,
                context_tokens=entry.context_tokens,
                sampling=sampling,
                keep_alive_s=keep_alive_s(
                    config.model.keep_alive_ms if keep_ms is None else keep_ms
                ),
            )
        )
    return specs


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
