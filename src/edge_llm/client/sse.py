"""Decoding the events of an OpenAI-style stream into chat chunks.

The bytes are split into events by the one SSE parser,
:class:`edge_llm.protocol.sse.SSEParser` (re-exported here with
:class:`~edge_llm.protocol.sse.SSEEvent` for the SDK's users).
:func:`parse_chunk` turns an event into a :class:`ChatChunk` (OpenAI
``chat.completion.chunk`` or legacy ``text_completion``), returns ``None`` for
``[DONE]`` and raises :class:`~edge_llm.client.errors.ServerStreamError` for
``{"error": ...}``. :func:`read_events` feeds the parser and maps its
:class:`~edge_llm.protocol.sse.EventTooLarge` to the client's
:class:`~edge_llm.client.errors.EventTooLargeError`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from edge_llm.client.errors import EventTooLargeError, MalformedChunkError, ServerStreamError
from edge_llm.protocol.sse import DONE_SENTINEL, EventTooLarge, SSEEvent, SSEParser

__all__ = ["DONE_SENTINEL", "ChatChunk", "SSEEvent", "SSEParser", "parse_chunk", "read_events"]


def read_events(parser: SSEParser, data: bytes) -> list[SSEEvent]:
    """The events ``data`` completes (``b""``: end of stream, flush the last one);
    :class:`EventTooLargeError` when a line or event is over the parser's bound."""
    try:
        return parser.feed(data) if data else parser.close()
    except EventTooLarge as exc:
        raise EventTooLargeError(str(exc)) from exc


@dataclass(frozen=True, slots=True)
class ChatChunk:
    """One decoded streaming chunk.

    ``content`` is the text delta ("" for role-only, usage-only or empty chunks);
    ``usage`` is the ``usage`` object when present; ``finish_reason`` and ``role``
    come from the first choice; ``raw`` is the whole decoded JSON object.
    """

    id: str | None
    content: str
    role: str | None
    finish_reason: str | None
    usage: dict[str, Any] | None
    raw: dict[str, Any]


def parse_chunk(event: SSEEvent) -> ChatChunk | None:
    """Decode one event of an OpenAI-style stream.

    Returns ``None`` for ``[DONE]`` (the caller must stop reading). Raises
    :class:`ServerStreamError` for ``{"error": ...}`` (or an ``event: error``)
    and :class:`MalformedChunkError` when the data is not a JSON object.
    """
    if event.data.strip() == DONE_SENTINEL:
        return None
    obj = _decode_object(event.data)
    if obj.get("error") or event.event == "error":
        raise ServerStreamError.from_payload(obj.get("error") or obj)
    choice = _first_choice(obj)
    delta = choice.get("delta")
    delta = delta if isinstance(delta, dict) else {}
    usage = obj.get("usage")
    return ChatChunk(
        id=_str_or_none(obj.get("id")),
        content=_content_of(choice, delta),
        role=_str_or_none(delta.get("role")),
        finish_reason=_str_or_none(choice.get("finish_reason")),
        usage=usage if isinstance(usage, dict) else None,
        raw=obj,
    )


def _decode_object(data: str) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except json.JSONDecodeError as exc:
        raise MalformedChunkError(f"SSE data is not JSON: {data[:80]!r}") from exc
    if not isinstance(obj, dict):
        raise MalformedChunkError(f"SSE data is not a JSON object: {data[:80]!r}")
    return obj


def _first_choice(obj: dict[str, Any]) -> dict[str, Any]:
    choices = obj.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return {}


def _content_of(choice: dict[str, Any], delta: dict[str, Any]) -> str:
    content = delta.get("content")
    if content is None:
        content = choice.get("text")
    return content if isinstance(content, str) else ""


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None
