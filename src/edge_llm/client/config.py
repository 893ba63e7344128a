"""Client configuration: the seed's ``edge_llm_client`` JSON, environment and flags.

Precedence, lowest first: field defaults (the seed's values), the JSON file,
``EDGE_LLM_BASE_URL`` / ``EDGE_LLM_API_KEY`` / ``EDGE_LLM_MODEL``, explicit
overrides (CLI flags). ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` are a fallback:
used only when neither the file nor an ``EDGE_LLM_*`` variable gives the value.

A config file must hold ``{"edge_llm_client": {...}}`` with at least ``base_url``
and ``model_id``; other keys default to the seed's values; unknown keys and bad
values raise :class:`~edge_llm.client.errors.ConfigError` naming the key.

``base_url`` is normalised (whitespace, trailing slash, a missing or doubled
``/v1``) and the API key is trimmed of stray whitespace (and a pasted ``Bearer``
prefix); each such repair is logged as a warning by :func:`load_client_config`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from edge_llm.client.errors import ConfigError

TOP_LEVEL_KEY = "edge_llm_client"
REQUIRED_FILE_KEYS = ("base_url", "model_id")
ENV_OVERRIDES = {
    "base_url": "EDGE_LLM_BASE_URL",
    "api_key": "EDGE_LLM_API_KEY",
    "model_id": "EDGE_LLM_MODEL",
}
ENV_FALLBACKS = {"base_url": "OPENAI_BASE_URL", "api_key": "OPENAI_API_KEY"}
RETRYABLE_CAUSES = frozenset(
    {
        "ttft_timeout",
        "socket_eagain",
        "connect_error",
        "overloaded",
        "dead_connection",
        "read_error",
        "server_error",
        "http_status",
        # Server codes, matched against the error's server_code.
        "queue_full",
        "kv_budget_exceeded",
        "engine_unavailable",
        "backend_error",
    }
)
LOGGER_NAME = "edge_llm.client.config"


def normalise_base_url(url: str) -> tuple[str, list[str]]:
    """Return the canonical base URL (ending in ``/v1`` unless it has another path)
    and one note per repair made. Raises :class:`ConfigError` if it is not http(s)."""
    notes: list[str] = []
    stripped = url.strip()
    if stripped != url:
        notes.append("base_url had surrounding whitespace; trimmed")
    parts = urlsplit(stripped)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(
            f"base_url must be an http:// or https:// URL, got {url!r}", field="base_url"
        )
    if parts.query or parts.fragment:
        raise ConfigError(f"base_url must not have a query or fragment: {url!r}", field="base_url")
    path = parts.path
    if path.endswith("/") and path.strip("/"):
        notes.append("base_url had a trailing slash; removed")
    path = path.rstrip("/")
    if path.endswith("/v1/v1"):
        notes.append("base_url had a doubled /v1; collapsed to one")
        while path.endswith("/v1/v1"):
            path = path[: -len("/v1")]
    if not path:
        notes.append("base_url had no path; using /v1")
        path = "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, "", "")), notes


def normalise_api_key(key: str) -> tuple[str, list[str]]:
    """Return the key without stray whitespace or a ``Bearer `` prefix, and notes."""
    notes: list[str] = []
    trimmed = key.strip()
    if trimmed != key:
        notes.append("api_key had leading/trailing whitespace; trimmed")
    if trimmed.lower().startswith("bearer "):
        notes.append("api_key started with 'Bearer '; removed (the client adds it)")
        trimmed = trimmed[len("bearer ") :].strip()
    return trimmed, notes


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, validate_default=True)


class RetryConfig(_Strict):
    """The ``retry`` object."""

    max_attempts: int = Field(2, ge=1, le=20, description="Attempts in total, first included")
    backoff_ms: int = Field(500, ge=0, description="Delay before the 2nd attempt; doubles after")
    retry_on: tuple[str, ...] = Field(
        ("ttft_timeout", "socket_eagain"), description="Error codes that allow another attempt"
    )
    jitter: float = Field(0.2, ge=0.0, le=1.0, description="Random +/- fraction of each backoff")
    max_backoff_ms: int = Field(30000, ge=0, description="Upper bound of one backoff")

    @field_validator("retry_on", mode="before")
    @classmethod
    def _known_causes(cls, value: object) -> object:
        if isinstance(value, list):
            value = tuple(value)
        if isinstance(value, tuple):
            unknown = [v for v in value if v not in RETRYABLE_CAUSES]
            if unknown:
                known = ", ".join(sorted(RETRYABLE_CAUSES))
                raise ValueError(f"unknown retry cause(s) {unknown}; known: {known}")
        return value


class ClientConfig(_Strict):
    """Everything the client needs; the seed's keys plus a few named additions."""

    base_url: str = Field("http://127.0.0.1:8000/v1", description="OpenAI-compatible base URL")
    api_key: str = Field("sk-local", description="Bearer key ('' sends no Authorization)")
    model_id: str = Field("SmolLM2-135M-Instruct", min_length=1, description="Model to ask for")
    stream: bool = Field(True, description="false: `edge-llm chat` prints the answer at the end")
    ttft_warn_ms: int = Field(3000, ge=0, description="Log a WARN past this TTFT (0: never)")
    ttft_hard_timeout_ms: int = Field(
        10000, ge=0, description="Cancel and apply retry past this TTFT (0: never)"
    )
    chunk_interval_ms: int = Field(50, ge=0, description="Render cadence of `edge-llm chat`")
    render_queue_high_watermark: float = Field(
        0.8, gt=0.0, le=1.0, description="Queue fill that sends PAUSE / stops reading"
    )
    render_queue_low_watermark: float = Field(
        0.3, ge=0.0, lt=1.0, description="Queue fill that sends RESUME / reads again"
    )
    max_prompt_tokens: int = Field(512, ge=1, description="Conversation budget (estimated)")
    socket_send_buffer_bytes: int = Field(
        4096, ge=0, description="SO_RCVBUF and SO_SNDBUF of client sockets (0: kernel default)"
    )
    retry: RetryConfig = RetryConfig()
    render_queue_capacity: int = Field(32, ge=2, le=65536, description="Render queue, in chunks")
    heartbeat_interval_ms: int = Field(1000, ge=1, description="Server heartbeat period")
    dead_after_heartbeats: int = Field(
        3, ge=1, description="Missed heartbeats that make a connection dead"
    )
    require_heartbeat: bool = Field(
        False, description="SSE: expect heartbeats from the start (else from the first ping)"
    )
    connect_timeout_ms: int = Field(10000, ge=1, description="Time allowed to connect")
    max_tokens: int | None = Field(None, ge=1, description="max_tokens sent (None: server's)")
    temperature: float | None = Field(None, ge=0.0, description="temperature sent")
    trust_env: bool = Field(False, description="Honour HTTP(S)_PROXY environment variables")

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        return normalise_base_url(value)[0]

    @field_validator("api_key")
    @classmethod
    def _api_key(cls, value: str) -> str:
        return normalise_api_key(value)[0]

    @model_validator(mode="after")
    def _watermarks_ordered(self) -> ClientConfig:
        if self.render_queue_low_watermark >= self.render_queue_high_watermark:
            raise ValueError("render_queue_low_watermark must be below render_queue_high_watermark")
        return self

    @property
    def chat_url(self) -> str:
        """``POST`` target of streaming chat completions."""
        return f"{self.base_url}/chat/completions"

    @property
    def ws_url(self) -> str:
        """The WebSocket stream endpoint (``ws(s)://.../v1/stream``)."""
        scheme, rest = self.base_url.split("://", 1)
        return f"{'wss' if scheme == 'https' else 'ws'}://{rest}/stream"

    @property
    def high_mark(self) -> int:
        """Queue length at which the high watermark is reached."""
        return max(1, math.ceil(self.render_queue_high_watermark * self.render_queue_capacity))

    @property
    def low_mark(self) -> int:
        """Queue length at or below which the low watermark is reached."""
        return math.floor(self.render_queue_low_watermark * self.render_queue_capacity)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The ``edge_llm_client`` object of a JSON file; raises :class:`ConfigError`."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read client config {path}: {exc.strerror}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"client config {path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get(TOP_LEVEL_KEY), dict):
        raise ConfigError(
            f"client config {path} must be an object with key {TOP_LEVEL_KEY!r}",
            field=TOP_LEVEL_KEY,
        )
    section: dict[str, Any] = data[TOP_LEVEL_KEY]
    for key in REQUIRED_FILE_KEYS:
        if key not in section:
            raise ConfigError(
                f"client config {path}: missing required key {TOP_LEVEL_KEY}.{key}", field=key
            )
    return dict(section)


def load_client_config(
    path: str | Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> ClientConfig:
    """Build the client configuration (see the module docstring for precedence).

    ``overrides`` maps field names to values (``None`` values are ignored), as the
    CLI produces them. Repairs to ``base_url`` / ``api_key`` are logged as
    warnings on the ``edge_llm.client.config`` logger. Raises :class:`ConfigError`.
    """
    values = read_config_file(path) if path is not None else {}
    _apply_env(values, os.environ if env is None else env)
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    _warn_repairs(values)
    try:
        return ClientConfig(**values)
    except ValidationError as exc:
        raise _describe(exc, path) from exc


def _apply_env(values: dict[str, Any], env: Mapping[str, str]) -> None:
    for key, name in ENV_FALLBACKS.items():
        if key not in values and ENV_OVERRIDES[key] not in env and env.get(name):
            values[key] = env[name]
    for key, name in ENV_OVERRIDES.items():
        if env.get(name):
            values[key] = env[name]


def _warn_repairs(values: Mapping[str, Any]) -> None:
    notes: list[str] = []
    if isinstance(values.get("base_url"), str):
        # A URL that cannot be normalised is reported by validation, with the rest.
        with contextlib.suppress(ConfigError):
            notes += normalise_base_url(values["base_url"])[1]
    if isinstance(values.get("api_key"), str):
        notes += normalise_api_key(values["api_key"])[1]
    for note in notes:
        logging.getLogger(LOGGER_NAME).warning("%s", note)


def _describe(exc: ValidationError, path: str | Path | None) -> ConfigError:
    where = f"client config {path}: " if path is not None else "client config: "
    parts = []
    fields = []
    for error in exc.errors():
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown key"
        if not error["loc"]:
            parts.append(f"{TOP_LEVEL_KEY}: {message}")
            continue
        field = ".".join(str(p) for p in error["loc"])
        fields.append(field)
        parts.append(f"{TOP_LEVEL_KEY}.{field}: {message} (got {error.get('input')!r})")
    return ConfigError(where + "; ".join(parts), field=fields[0] if fields else None)
