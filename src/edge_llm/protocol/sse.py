"""Server-sent events encoding (the server side; the client parser is in edge_llm.client)."""

from __future__ import annotations

import json
from typing import Any

PING = b": ping\n\n"
DONE = b"data: [DONE]\n\n"


def encode_data(payload: dict[str, Any]) -> bytes:
    """One ``data:`` event; JSON never contains a raw newline, so one line suffices."""
    return (
        b"data: "
        + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
        + b"\n\n"
    )


def encode_event(event: str, payload: dict[str, Any]) -> bytes:
    """A named event, as Anthropic's Messages API uses them."""
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event}\ndata: {data}\n\n".encode()
