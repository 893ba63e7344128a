"""What a transport sends, and where: one per stream, shared by its attempts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp

from edge_llm.client.render_queue import RenderQueue


@dataclass(frozen=True)
class StreamRequest:
    session: aiohttp.ClientSession
    url: str
    body: dict[str, Any]
    headers: dict[str, str]
    queue: RenderQueue[str]
