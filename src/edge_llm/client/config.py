"""Client configuration: the seed's ``edge_llm_client`` JSON, environment and flags.

Precedence, lowest first: field defaults (the seed's values), the JSON file,
``EDGE_LLM_BASE_URL`` / ``EDGE_LLM_API_KEY`` / ``EDGE_LLM_MODEL``, explicit
overrides (CLI flags). ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` / ``OPENAI_MODEL``
are a fallback: used only when neither the file nor an ``EDGE_LLM_*`` variable
gives the value. These three keys are resolved by
:func:`edge_llm.client.address.pick_setting`, as in every command.

A config file must hold ``{"edge_llm_client": {...}}`` with at least ``base_url``
and ``model_id``; other keys default to the seed's values; unknown keys and bad
values raise :class:`~edge_llm.client.errors.ConfigError` naming the key.

``base_url`` is normalised (whitespace, trailing slash, a missing or doubled
``/v1``) and the API key is trimmed of stray whitespace (and a pasted ``Bearer``
prefix); each such repair is logged as a warning by :func:`load_client_config`.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from edge_llm.client.address import (
    DEFAULT_API_KEY,
    DEFAULT_BASE_URL,
    ServerAddress,
    normalise_api_key,
    normalise_base_url,
    pick_setting,
    resolve_address,
)
from edge_llm.client.errors import ConfigError

TOP_LEVEL_KEY = "edge_llm_client"
REQUIRED_FILE_KEYS = ("base_url", "model_id")
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
FLAGGED = ("base_url", "api_key", "model_id")  # resolved as in every command


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

    base_url: str = Field(DEFAULT_BASE_URL, description="OpenAI-compatible base URL")
    api_key: str = Field(DEFAULT_API_KEY, description="Bearer key ('' sends no Authorization)")
    model_id: str | None = Field(
        None, min_length=1, description="Model to ask for (None: the server's default model)"
    )
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
    resumable: bool = Field(
        True,
        description="Ask for a resumable stream and resume it after a dropped connection, "
        "over SSE and the WebSocket (a server that refuses the SSE option is asked again "
        "without it)",
    )
    resume_attempts: int = Field(
        5, ge=0, le=100, description="Resumes in a row without an event before giving up"
    )

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
    return load_client(path, env=env, overrides=overrides)[0]


def load_client(
    path: str | Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> tuple[ClientConfig, ServerAddress]:
    """:func:`load_client_config`, and the address it points at with the source of
    its base URL and key (for messages that say which setting to change)."""
    values = read_config_file(path) if path is not None else {}
    label = f"client config {path}"
    environment = os.environ if env is None else env
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    flags = {name: None if given.get(name) is None else str(given.pop(name)) for name in FLAGGED}
    address = resolve_address(
        base_url=flags["base_url"],
        api_key=flags["api_key"],
        env=environment,
        section=values,
        file_label=label,
    )
    for note in address.notes:
        logging.getLogger(LOGGER_NAME).warning("%s", note)
    values.update(base_url=address.base_url, api_key=address.api_key)
    model = pick_setting("model_id", flags["model_id"], environment, values, label)
    if model is not None:
        values["model_id"] = model.value
    values.update(given)
    try:
        return ClientConfig(**values), address
    except ValidationError as exc:
        raise _describe(exc, path) from exc


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
