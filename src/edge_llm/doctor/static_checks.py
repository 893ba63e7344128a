"""Checks that need no network: the base URL's shape and the API key's characters."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from edge_llm.doctor.result import CheckResult, failed, passed, warned

_QUOTES = "\"'`\u2018\u2019\u201c\u201d"
_WHITESPACE = re.compile(r"\s")


@dataclass(frozen=True)
class UrlVerdict:
    result: CheckResult
    url: str | None  # the canonical base URL (ends in /v1) the next checks use; None: unusable


def check_base_url(raw: str) -> UrlVerdict:
    """Well-formed http(s) URL without whitespace, a trailing slash or a doubled ``/v1``."""
    parts = urlsplit(raw.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        fix = "use the form http://HOST:PORT/v1, e.g. http://127.0.0.1:8000/v1"
        return UrlVerdict(failed("base_url", f"{raw!r} is not an http(s) URL", fix), None)
    if parts.query or parts.fragment:
        fix = "remove everything after the path ('?...' or '#...')"
        return UrlVerdict(failed("base_url", f"{raw!r} has a query or fragment", fix), None)
    canonical = _canonical(parts.scheme, parts.netloc, parts.path)
    problems = _url_problems(raw, parts.path)
    if problems:
        summary = f"{raw!r}: " + "; ".join(problems)
        fix = f"set the base URL to {canonical}"
        return UrlVerdict(failed("base_url", summary, fix, canonical=canonical), canonical)
    if not parts.path.strip("/"):
        summary = f"{raw} has no /v1: this engine's client adds it, OpenAI-style tools do not"
        fix = f"use {canonical} for tools that take an OpenAI base URL"
        return UrlVerdict(warned("base_url", summary, fix, canonical=canonical), canonical)
    return UrlVerdict(
        passed("base_url", f"{canonical} is well-formed", canonical=canonical), canonical
    )


def _url_problems(raw: str, path: str) -> list[str]:
    problems = []
    if raw != raw.strip():
        problems.append("surrounding whitespace")
    if path.endswith("/") and path.strip("/"):
        problems.append("a trailing slash (requests go to //chat/completions)")
    elif path == "/":
        problems.append("a trailing slash")
    if path.rstrip("/").endswith("/v1/v1"):
        problems.append("a doubled /v1 (requests go to /v1/v1/chat/completions: 404)")
    return problems


def _canonical(scheme: str, netloc: str, path: str) -> str:
    path = path.rstrip("/")
    while path.endswith("/v1/v1"):
        path = path[: -len("/v1")]
    return urlunsplit((scheme, netloc, path or "/v1", "", ""))


def clean_key(raw: str) -> str:
    """The key without whitespace, quotes or a pasted ``Bearer`` prefix."""
    key = raw.strip().strip(_QUOTES).strip()
    if key.lower().startswith("bearer "):
        key = key[len("bearer ") :]
    return _WHITESPACE.sub("", key).strip(_QUOTES)


def mask_key(key: str) -> str:
    if not key:
        return "(empty)"
    if len(key) <= 8:
        return f"{key[:2]}… ({len(key)} chars)"
    return f"{key[:3]}…{key[-2:]} ({len(key)} chars)"


def check_api_key(raw: str) -> CheckResult:
    """No whitespace, quotes, ``Bearer`` prefix or non-ASCII characters."""
    if not raw:
        summary = "no API key set: fine only if the server was started without --api-key"
        fix = "pass --api-key KEY (or EDGE_LLM_API_KEY) with the key the server requires"
        return warned("api_key", summary, fix)
    problems = _key_problems(raw)
    if problems:
        summary = f"API key {mask_key(raw)} has " + ", ".join(problems)
        fix = (
            f"use the key without them: {mask_key(clean_key(raw))}; re-copy it from where "
            "it was created and check the shell quoting of your export"
        )
        return failed("api_key", summary, fix)
    return passed("api_key", f"API key {mask_key(raw)} has no whitespace or quotes")


def _key_problems(raw: str) -> list[str]:
    problems = []
    body = raw.strip()
    if body != raw:
        problems.append("leading/trailing whitespace")
    if body.lower().startswith("bearer "):
        problems.append("a 'Bearer ' prefix (the client adds it)")
        body = body[len("bearer ") :].strip()
    if _WHITESPACE.search(body):
        problems.append("whitespace inside (a line break or a space)")
    if any(q in raw for q in _QUOTES):
        problems.append("quote characters")
    if not raw.isascii():
        problems.append("non-ASCII characters (HTTP headers cannot carry them)")
    return problems
