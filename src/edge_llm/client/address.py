"""Where the server is and which key it wants: one resolution for every command.

Each value comes from, highest first: the flag (``--base-url``, ``--api-key``,
``--model``), ``EDGE_LLM_BASE_URL`` / ``EDGE_LLM_API_KEY`` / ``EDGE_LLM_MODEL``,
the client JSON (``edge_llm_client``, for the commands that read one),
``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` / ``OPENAI_MODEL``, then the default
(``http://127.0.0.1:8000/v1``, key ``sk-local``). :func:`pick_setting` gives a value
as the user wrote it with its source (``edge-llm doctor`` reports both);
:func:`resolve_address` normalises the base URL (whitespace, trailing slash, a
missing or doubled ``/v1``) and the key (whitespace, a pasted ``Bearer``).

:func:`unreachable_message` is the one line every command prints when nothing
answers at the address: which URL, why, and which setting points there.
"""

from __future__ import annotations

import argparse
import errno
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from edge_llm.client.errors import ConfigError

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
DEFAULT_API_KEY = "sk-local"  # any key works with an engine started without --api-key
ENV_OVERRIDES = {
    "base_url": "EDGE_LLM_BASE_URL",
    "api_key": "EDGE_LLM_API_KEY",
    "model_id": "EDGE_LLM_MODEL",
}
ENV_FALLBACKS = {
    "base_url": "OPENAI_BASE_URL",
    "api_key": "OPENAI_API_KEY",
    "model_id": "OPENAI_MODEL",
}
FLAGS = {"base_url": "--base-url", "api_key": "--api-key", "model_id": "--model"}


@dataclass(frozen=True)
class Setting:
    value: str
    source: str  # "--base-url", "EDGE_LLM_API_KEY", a client JSON's path, "default"


def pick_setting(
    name: str,
    flag: str | None,
    env: Mapping[str, str],
    section: Mapping[str, Any] | None = None,
    file_label: str = "client config",
) -> Setting | None:
    """``name`` (``base_url``, ``api_key`` or ``model_id``) as the user wrote it, and
    where from; None when nothing sets it. Raises :class:`ConfigError` when the
    client JSON holds something other than a string."""
    if flag is not None:
        return Setting(flag, FLAGS[name])
    if env.get(ENV_OVERRIDES[name]):
        return Setting(env[ENV_OVERRIDES[name]], ENV_OVERRIDES[name])
    if section is not None and name in section:
        value = section[name]
        if not isinstance(value, str):
            raise ConfigError(f"{file_label}: edge_llm_client.{name} must be a string", field=name)
        return Setting(value, file_label)
    if env.get(ENV_FALLBACKS[name]):
        return Setting(env[ENV_FALLBACKS[name]], ENV_FALLBACKS[name])
    return None


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
    if not path:  # the documented form without /v1: no repair to report
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


@dataclass(frozen=True)
class ServerAddress:
    """A server's base URL and key, normalised, with where each came from."""

    base_url: str  # e.g. http://127.0.0.1:8000/v1
    api_key: str  # '' sends no Authorization header
    base_url_source: str = "default"
    api_key_source: str = "default"
    notes: tuple[str, ...] = ()  # repairs made to what the user wrote

    @property
    def root(self) -> str:
        """The server root (``/health``, ``/metrics``, ``/debug/streams`` live there)."""
        return self.base_url.removesuffix("/v1")

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def unreachable(self, exc: BaseException) -> str:
        """The one line to print when nothing answers at this address."""
        return unreachable_message(self.base_url, setting_to_change(self.base_url_source), exc)


def resolve_address(
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    env: Mapping[str, str],
    section: Mapping[str, Any] | None = None,
    file_label: str = "client config",
) -> ServerAddress:
    """The address from the flags (``None``: not given), the environment and the
    client JSON ``section``. Raises :class:`ConfigError` naming where a bad URL came from."""
    url = pick_setting("base_url", base_url, env, section, file_label)
    key = pick_setting("api_key", api_key, env, section, file_label)
    url = url or Setting(DEFAULT_BASE_URL, "default")
    key = key or Setting(DEFAULT_API_KEY, "default")
    try:
        normalised_url, url_notes = normalise_base_url(url.value)
    except ConfigError as exc:
        raise ConfigError(f"{exc.message} (from {url.source})", field="base_url") from exc
    normalised_key, key_notes = normalise_api_key(key.value)
    notes = [f"{note} (from {url.source})" for note in url_notes]
    notes += [f"{note} (from {key.source})" for note in key_notes]
    return ServerAddress(normalised_url, normalised_key, url.source, key.source, tuple(notes))


def setting_to_change(source: str) -> str:
    """What to change so the command reaches another server (the flag always wins)."""
    if source == ENV_OVERRIDES["base_url"]:
        return f"{source} (or --base-url)"
    if source not in ("default", FLAGS["base_url"], ENV_FALLBACKS["base_url"]):
        return f"base_url in {source} (or --base-url)"  # the client JSON
    return f"--base-url or {ENV_OVERRIDES['base_url']}"


def unreachable_message(url: str, setting: str, exc: BaseException) -> str:
    """``cannot reach the server at URL (why): start ... or change SETTING``."""
    return (
        f"cannot reach the server at {url} ({connect_failure(exc)}): start it with "
        f"`edge-llm serve` or point {setting} at a running server"
    )


def connect_failure(exc: BaseException) -> str:
    """Why a connection failed, in words, whichever library raised it (urllib's
    URLError, aiohttp's connector errors and their causes are unwrapped)."""
    cause = _root_cause(exc)
    if isinstance(cause, socket.gaierror):
        return "host name not found"
    if isinstance(cause, TimeoutError):
        return "no answer in time"
    if isinstance(cause, OSError) and cause.errno == errno.ECONNREFUSED:
        return "connection refused: nothing listens there"
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror.lower()
    return str(cause) or type(cause).__name__


def _root_cause(exc: BaseException) -> BaseException:
    seen: set[int] = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = getattr(exc, "os_error", None) or getattr(exc, "reason", None) or exc.__cause__
        if not isinstance(inner, BaseException):
            return exc
        exc = inner
    return exc


def add_address_flags(parser: argparse.ArgumentParser) -> None:
    """``--base-url`` and ``--api-key``, the same help for every command."""
    parser.add_argument(
        FLAGS["base_url"],
        metavar="URL",
        help=f"server base URL, with or without /v1 (default: ${ENV_OVERRIDES['base_url']}, "
        f"else {DEFAULT_BASE_URL})",
    )
    parser.add_argument(
        FLAGS["api_key"],
        metavar="KEY",
        help=f"key sent as 'Authorization: Bearer KEY' (default: ${ENV_OVERRIDES['api_key']}, "
        f"else {DEFAULT_API_KEY})",
    )
