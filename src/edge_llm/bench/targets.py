"""Benchmark targets: ``NAME=URL[,key=..,model=..]`` parsed into a :class:`Target`.

The URL is any OpenAI-compatible base URL, with or without ``/v1``, with or without
a trailing slash. ``key=env:VAR`` reads the key from the environment so it stays out
of shell history and of the JSON export (which never contains keys).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

_OPTIONS = ("key", "model")


class TargetError(ValueError):
    """A ``--target`` specification is malformed; the message says how."""


@dataclass(frozen=True, slots=True)
class Target:
    """One endpoint under test.

    ``root`` is the server root (no ``/v1``): ``/debug/streams`` and ``/metrics`` live
    there; ``base_url`` is ``root + "/v1"``. ``model`` is None until discovered.
    """

    name: str
    root: str
    key: str | None = None
    model: str | None = None

    @property
    def base_url(self) -> str:
        return self.root + "/v1"

    @property
    def chat_url(self) -> str:
        return self.base_url + "/chat/completions"

    def headers(self) -> dict[str, str]:
        """Request headers that authenticate against this target."""
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def describe(self) -> dict[str, object]:
        """JSON-safe description: never the key itself, only whether one is set."""
        return {
            "name": self.name,
            "base_url": self.base_url,
            "model": self.model,
            "key_set": self.key is not None,
        }


def normalize_root(url: str) -> str:
    """``http://h:p/v1/`` and ``http://h:p`` both give ``http://h:p``.

    Raises :class:`TargetError` for a URL that is not http(s) with a host.
    """
    text = url.strip().rstrip("/")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetError(f"target URL must be http(s)://host[:port][/path]: {url!r}")
    if parts.query or parts.fragment:
        raise TargetError(f"target URL must not have a query or fragment: {url!r}")
    return text.removesuffix("/v1").rstrip("/")


def parse_target(spec: str, env: Mapping[str, str] | None = None) -> Target:
    """Parse ``NAME=URL[,key=K,model=M]``; ``key=env:VAR`` reads ``VAR`` from ``env``."""
    name, sep, rest = spec.partition("=")
    name = name.strip()
    if not sep or not name or not rest.strip():
        raise TargetError(f"--target must be NAME=URL[,key=..,model=..]: {spec!r}")
    url, *options = rest.split(",")
    values = _parse_options(options, spec)
    key = _resolve_key(values.get("key"), os.environ if env is None else env)
    return Target(name=name, root=normalize_root(url), key=key, model=values.get("model"))


def _parse_options(options: list[str], spec: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for option in options:
        field, sep, value = option.partition("=")
        field = field.strip()
        if not sep or field not in _OPTIONS:
            raise TargetError(f"unknown target option {option!r} in {spec!r} (use key=, model=)")
        if field in values:
            raise TargetError(f"target option {field!r} given twice in {spec!r}")
        values[field] = value.strip()
    return values


def _resolve_key(value: str | None, env: Mapping[str, str]) -> str | None:
    if not value:
        return None
    if value.startswith("env:"):
        variable = value[4:]
        if variable not in env:
            raise TargetError(f"environment variable {variable} (for key=env:{variable}) is unset")
        return env[variable].strip() or None
    return value


def check_unique(targets: list[Target]) -> None:
    """Raise :class:`TargetError` when two targets share a name."""
    seen: set[str] = set()
    for target in targets:
        if target.name in seen:
            raise TargetError(f"two targets are named {target.name!r}")
        seen.add(target.name)
