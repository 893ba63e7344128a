"""What the doctor checks, and where each value came from.

Values are taken **as the user wrote them** (the client normalises a trailing
slash or a stray space silently; the doctor must see them to report them), by
:func:`edge_llm.client.address.pick_setting`, as every command resolves them:
the flags, ``EDGE_LLM_BASE_URL`` / ``EDGE_LLM_API_KEY`` / ``EDGE_LLM_MODEL``, the
client JSON (``edge_llm_client``), then ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` /
``OPENAI_MODEL`` as a fallback, then the client's defaults. A model nobody set is
the empty string, as the client sends none (edge-llm's default model answers).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edge_llm.client.address import Setting, pick_setting
from edge_llm.client.config import FLAGGED, ClientConfig, read_config_file
from edge_llm.client.errors import ConfigError

DEFAULT_TTFT_WARN_MS = 3000
DEFAULT_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class DoctorSettings:
    base_url: Setting
    api_key: Setting
    model: Setting
    ttft_warn_ms: int = DEFAULT_TTFT_WARN_MS
    timeout_s: float = DEFAULT_TIMEOUT_S
    long_prompt_words: int = 300


def resolve(
    flags: Mapping[str, str | None],
    config_path: str | None,
    env: Mapping[str, str],
    *,
    ttft_warn_ms: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> DoctorSettings:
    """Raises :class:`ConfigError` when the client JSON cannot be read."""
    section = read_config_file(config_path) if config_path else {}
    file_label = config_path or ""
    values = {
        name: pick_setting(name, flags.get(name), env, section, file_label) or _default(name)
        for name in FLAGGED
    }
    warn_ms = ttft_warn_ms if ttft_warn_ms is not None else _file_int(section, "ttft_warn_ms")
    return DoctorSettings(
        base_url=values["base_url"],
        api_key=values["api_key"],
        model=values["model_id"],
        ttft_warn_ms=DEFAULT_TTFT_WARN_MS if warn_ms is None else warn_ms,
        timeout_s=timeout_s,
    )


def _default(name: str) -> Setting:
    default = ClientConfig.model_fields[name].default
    return Setting("" if default is None else str(default), "default")


def _file_int(section: Mapping[str, Any], key: str) -> int | None:
    value = section.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"edge_llm_client.{key} must be a non-negative integer", field=key)
    return value
