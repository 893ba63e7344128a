"""What the doctor checks, and where each value came from.

Values are taken **as the user wrote them** (the client normalises a trailing
slash or a stray space silently; the doctor must see them to report them).
Precedence, highest first, as in :mod:`edge_llm.client.config`: the flags,
``EDGE_LLM_BASE_URL`` / ``EDGE_LLM_API_KEY`` / ``EDGE_LLM_MODEL``, the client
JSON (``edge_llm_client``), then ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` /
``OPENAI_MODEL`` as a fallback, then the client's defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edge_llm.client.config import ENV_FALLBACKS, ENV_OVERRIDES, ClientConfig, read_config_file
from edge_llm.client.errors import ConfigError

FIELDS = ("base_url", "api_key", "model_id")
FALLBACKS = {**ENV_FALLBACKS, "model_id": "OPENAI_MODEL"}
DEFAULT_TTFT_WARN_MS = 3000
DEFAULT_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Setting:
    value: str
    source: str  # "--base-url", "EDGE_LLM_API_KEY", the JSON file's path, "default"


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
    values = {name: _pick(name, flags.get(name), section, file_label, env) for name in FIELDS}
    warn_ms = ttft_warn_ms if ttft_warn_ms is not None else _file_int(section, "ttft_warn_ms")
    return DoctorSettings(
        base_url=values["base_url"],
        api_key=values["api_key"],
        model=values["model_id"],
        ttft_warn_ms=DEFAULT_TTFT_WARN_MS if warn_ms is None else warn_ms,
        timeout_s=timeout_s,
    )


def _pick(
    name: str, flag: str | None, section: Mapping[str, Any], file_label: str, env: Mapping[str, str]
) -> Setting:
    flag_name = "--model" if name == "model_id" else "--" + name.replace("_", "-")
    if flag is not None:
        return Setting(flag, flag_name)
    if env.get(ENV_OVERRIDES[name]):
        return Setting(env[ENV_OVERRIDES[name]], ENV_OVERRIDES[name])
    if name in section:
        value = section[name]
        if not isinstance(value, str):
            raise ConfigError(f"{file_label}: edge_llm_client.{name} must be a string", field=name)
        return Setting(value, file_label)
    if env.get(FALLBACKS[name]):
        return Setting(env[FALLBACKS[name]], FALLBACKS[name])
    default = ClientConfig.model_fields[name].default
    return Setting(str(default), "default")


def _file_int(section: Mapping[str, Any], key: str) -> int | None:
    value = section.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"edge_llm_client.{key} must be a non-negative integer", field=key)
    return value
