"""Upstream engines: ``--upstream NAME=URL`` and ``[upstream.NAME]`` tables.

An upstream is an OpenAI-compatible server (vLLM, llama-server, a hosted API)
that takes requests naming one of its ``models``, and, with ``fallback = true``,
requests for the local model that the device cannot take.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class UpstreamConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(description="Base URL of the OpenAI-compatible server (with or without /v1)")
    api_key: str | None = Field(None, description="Sent as 'Authorization: Bearer KEY'")
    models: list[str] = Field(
        default_factory=list,
        description="Model ids routed here (empty: those its GET /v1/models lists)",
    )
    max_concurrency: int = Field(
        16, ge=1, le=4096, description="Streams open to this upstream at once"
    )
    fallback: bool = Field(
        False,
        description="Take requests for the local model that the device refuses "
        "(prompt_too_long, queue_full, kv_budget_exceeded)",
    )

    @field_validator("url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        return base_url(value)

    @field_validator("models", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value


def base_url(url: str) -> str:
    """``http://host:port[/prefix]`` without a trailing slash or ``/v1``."""
    text = url.strip().rstrip("/")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"upstream url must be http(s)://host[:port][/path], got {url!r}")
    return text.removesuffix("/v1")


def check_name(name: str) -> str:
    if not _NAME.match(name) or name == "local":
        raise ValueError(
            f"upstream name {name!r}: use letters, digits, '_', '.', '-' (and not 'local')"
        )
    return name


def parse_upstream_flag(text: str) -> tuple[str, str]:
    """``NAME=URL`` from ``--upstream`` or ``EDGE_LLM_UPSTREAM``."""
    name, sep, url = text.partition("=")
    if not sep or not url.strip():
        raise ValueError(f"--upstream expects NAME=URL, got {text!r}")
    return check_name(name.strip()), url.strip()
