"""A request's priority class as the APIs name it (no I/O).

Lower runs first, from ``MIN_PRIORITY`` to ``MAX_PRIORITY``; 0 is the default.
A request gives it as the body field ``priority`` (vLLM's name, every route), as a
service tier (mapped below), or as the ``X-Priority`` header. Whoever resolves the
final value (:mod:`edge_llm.server.priority`) takes, in order: the body (``priority``
before a service tier), the header, the API key's default, the route's default, 0.

Service tiers, mapped onto classes:

- OpenAI (``service_tier`` on chat, completions and Responses): ``priority`` and
  ``scale`` (reserved, faster capacity) -1; ``auto`` and ``default`` 0; ``flex``
  (cheaper, slower) 1.
- Anthropic (``service_tier`` on Messages): ``auto`` 0 (the default); ``standard_only``
  1 (it declines priority capacity: the class after the default's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import Field

from edge_llm.config.priority import MAX_PRIORITY, MIN_PRIORITY, parse_priority
from edge_llm.errors import InvalidRequest

__all__ = [
    "ANTHROPIC_TIERS",
    "HEADER",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "OPENAI_TIERS",
    "AnthropicTier",
    "OpenAITier",
    "Priority",
    "body_priority",
    "header_priority",
]

HEADER = "X-Priority"
Priority = Annotated[int, Field(ge=MIN_PRIORITY, le=MAX_PRIORITY)]
OpenAITier = Literal["auto", "default", "flex", "scale", "priority"]
AnthropicTier = Literal["auto", "standard_only"]
OPENAI_TIERS: dict[str, int] = {"priority": -1, "scale": -1, "auto": 0, "default": 0, "flex": 1}
ANTHROPIC_TIERS: dict[str, int] = {"auto": 0, "standard_only": 1}


def body_priority(priority: int | None, tier: str | None, tiers: Mapping[str, int]) -> int | None:
    """The class a body asks for: its ``priority``, else its service ``tier``'s
    (mapped by ``tiers``), else None."""
    if priority is not None:
        return priority
    return tiers[tier] if tier is not None else None


def header_priority(text: str | None) -> int | None:
    """The ``X-Priority`` header's class, None when absent; InvalidRequest naming the
    header when it is not an integer in range."""
    if text is None:
        return None
    value = parse_priority(text)
    if value is None:
        raise InvalidRequest(
            f"{HEADER}: must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY} "
            f"(lower runs first), got {text[:32]!r}",
            param=HEADER,
        )
    return value
