"""Benchmark targets: ``NAME=URL[,key=..,model=..]`` parsed into a :class:`Target`.

The URL is any OpenAI-compatible base URL, with or without ``/v1``, with or without
a trailing slash. ``key=env:VAR`` reads the key from the environment so it stays out
of shell history and of the JSON export (which never contains keys). Without any
``--target``, ``bench`` and ``storm`` run against the one server every command
finds (``--base-url`` / ``EDGE_LLM_BASE_URL``, ``--api-key`` / ``EDGE_LLM_API_KEY``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass

from edge_llm.client.address import (
    ServerAddress,
    add_address_flags,
    normalise_base_url,
    resolve_address,
    setting_to_change,
    unreachable_message,
)
from edge_llm.client.errors import ConfigError

_OPTIONS = ("key", "model")
DEFAULT_TARGET_NAME = "edge-llm"


class TargetError(ValueError):
    """A ``--target`` specification is malformed; the message says how."""


class TargetUnreachable(Exception):
    """Nothing answers at a target's URL; the message is the one line to print."""


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
    setting: str = "--target NAME=URL"  # what the user changes to point it elsewhere

    @property
    def base_url(self) -> str:
        return self.root + "/v1"

    @property
    def chat_url(self) -> str:
        return self.base_url + "/chat/completions"

    def headers(self) -> dict[str, str]:
        """Request headers that authenticate against this target."""
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def unreachable(self, exc: BaseException) -> str:
        """The one line to print when nothing answers at this target."""
        return unreachable_message(self.base_url, self.setting, exc)

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
    try:
        return normalise_base_url(url)[0].removesuffix("/v1")
    except ConfigError as exc:
        raise TargetError(f"target URL: {exc.message}") from exc


def parse_target(spec: str, env: Mapping[str, str] | None = None) -> Target:
    """Parse ``NAME=URL[,key=K,model=M]``; ``key=env:VAR`` reads ``VAR`` from ``env``."""
    name, sep, rest = spec.partition("=")
    name = name.strip()
    if not sep or not name or not rest.strip():
        raise TargetError(f"--target must be NAME=URL[,key=..,model=..]: {spec!r}")
    url, *options = rest.split(",")
    values = _parse_options(options, spec)
    key = _resolve_key(values.get("key"), os.environ if env is None else env)
    root = normalize_root(url)
    setting = f"--target {name}=URL"
    return Target(name, root, key, values.get("model"), setting)


def default_target(address: ServerAddress) -> Target:
    """The target of a run given no ``--target``: the server every command finds."""
    setting = setting_to_change(address.base_url_source)
    root = address.root
    return Target(DEFAULT_TARGET_NAME, root, address.api_key or None, None, setting)


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """``--target`` (repeatable), or ``--base-url`` / ``--api-key`` for one server."""
    parser.add_argument(
        "--target",
        action="append",
        metavar="NAME=URL[,key=K,model=M]",
        help="an OpenAI-compatible endpoint (repeatable); URL with or without /v1; "
        "key=env:VAR reads the key from the environment; without model= the first of "
        "GET /v1/models is used; without any --target, the --base-url server",
    )
    add_address_flags(parser)


def targets_from_args(args: argparse.Namespace, env: Mapping[str, str]) -> list[Target]:
    """The ``--target`` list, or the one server of ``--base-url`` and the environment.
    Raises :class:`TargetError`."""
    if not args.target:
        try:
            address = resolve_address(base_url=args.base_url, api_key=args.api_key, env=env)
        except ConfigError as exc:
            raise TargetError(str(exc)) from exc
        return [default_target(address)]
    if args.base_url is not None or args.api_key is not None:
        raise TargetError(
            "--base-url and --api-key name one server; with --target give each its "
            "URL and key=: --target NAME=URL,key=K"
        )
    targets = [parse_target(spec, env) for spec in args.target]
    check_unique(targets)
    return targets


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
