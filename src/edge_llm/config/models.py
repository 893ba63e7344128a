"""Named models: ``--model NAME=PATH`` and ``[models.NAME]`` tables.

Each named model is a GGUF with its own context, KV budget, default sampling and
keep-alive; the keys it leaves out take the engine's values. Named models are
served beside the default model: a bare ``--model PATH`` (or ``model_path``), else
the embedded SmolLM2, which a request naming no model gets.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


class ModelEntryConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(description="The GGUF file")
    context_tokens: int | None = Field(
        None,
        ge=16,
        description="Most tokens of one sequence, prompt and answer (default: the model's "
        "trained context, bounded by its KV share)",
    )
    max_kv_cache_mb: int | None = Field(
        None,
        ge=1,
        description="This model's share of max_kv_cache_mb, the cap on every "
        "loaded model's KV together (MiB; at most that cap; default: an equal part of what "
        "the models' own shares leave)",
    )
    temperature: float | None = Field(
        None, ge=0.0, le=2.0, description="Default temperature (default: default_temperature)"
    )
    top_p: float | None = Field(
        None, gt=0.0, le=1.0, description="Default top_p (default: default_top_p)"
    )
    top_k: int | None = Field(None, ge=0, description="Default top_k (default: none)")
    keep_alive_ms: int | None = Field(
        None,
        ge=-1,
        description="Unload this model after it has been idle so long (default: keep_alive_ms)",
    )


def check_model_name(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(f"model name {name!r}: use letters, digits, '_', '.', ':', '-'")
    return name


def parse_model_flag(text: str) -> tuple[str | None, str]:
    """``NAME=PATH`` as (name, path); a bare ``PATH`` as (None, path): the default
    model. A ``=`` after a ``/`` belongs to the path."""
    name, sep, path = text.partition("=")
    if not sep or "/" in name or not name.strip():
        return None, text.strip()
    if not path.strip():
        raise ValueError(f"--model expects NAME=PATH or PATH, got {text!r}")
    return check_model_name(name.strip()), path.strip()
