"""Per-request view of the client event log (docs/design.md §7).

Every line carries ``client_request_id`` (made up by the client) and
``request_id``: the server's id once known (``X-Request-Id``, the chunk ``id``,
or the WebSocket ``started`` frame), null before. The event names and their
fields are the contract ``edge-llm blame`` reads; see
:mod:`edge_llm.observability.events`.
"""

from __future__ import annotations

import uuid
from typing import Any

from edge_llm.observability.events import Event, EventSink, null_sink


class RequestLog:
    """Emits client events for one request; the caller sets :attr:`request_id`
    when the server's id is learnt (and resets it for each new attempt)."""

    def __init__(self, sink: EventSink | None = None, client_request_id: str | None = None) -> None:
        self._sink = sink or null_sink
        self.client_request_id = client_request_id or f"c-{uuid.uuid4().hex[:16]}"
        self.request_id: str | None = None

    def emit(self, event: Event, **fields: Any) -> None:
        self._sink(event, self.request_id, client_request_id=self.client_request_id, **fields)
