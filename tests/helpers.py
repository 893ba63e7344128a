"""Helpers shared by the unit and the end-to-end tests: ports, WebSocket frames,
Prometheus text and a client event sink."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from edge_llm.protocol.sse import SSEParser

FRAME_TIMEOUT_S = 120.0


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def next_frame(
    ws: aiohttp.ClientWebSocketResponse | Any,
    *kinds: str,
    seen: list[dict[str, Any]] | None = None,
    timeout: float = FRAME_TIMEOUT_S,
) -> dict[str, Any]:
    """The next JSON frame whose ``type`` is one of ``kinds``. Frames of other kinds
    are skipped (appended to ``seen`` when given); an ``error`` frame fails the test
    unless ``error`` is one of ``kinds``."""
    while True:
        frame: dict[str, Any] = await asyncio.wait_for(ws.receive_json(), timeout)
        if frame["type"] in kinds:
            return frame
        assert frame["type"] != "error", frame
        if seen is not None:
            seen.append(frame)


def delta_text(frames: list[dict[str, Any]]) -> str:
    """The text of the ``delta`` frames among ``frames``."""
    return "".join(frame["text"] for frame in frames if frame["type"] == "delta")


def sse_events(body: bytes | str) -> list[tuple[str | None, Any]]:
    """The events of a whole SSE body, in order: (its ``event:`` name or None, its
    JSON data, or None for ``[DONE]``)."""
    parser = SSEParser()
    raw = body.encode() if isinstance(body, str) else body
    events = parser.feed(raw) + parser.close()
    return [(e.event, None if e.data == "[DONE]" else json.loads(e.data)) for e in events]


def metric(text: str, name: str, *, absent: float | None = None, **labels: str) -> float:
    """The value of sample ``name`` in Prometheus exposition ``text``, summed over
    the samples whose labels include ``labels``; fails when there is none, unless
    ``absent`` is given (a labelled counter has no sample before its first count)."""
    values = [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    ]
    if not values and absent is not None:
        return absent
    assert values, f"{name}{labels or ''} missing from the metrics"
    return float(sum(values))


class Recorder:
    """An event sink keeping the event-log lines it is given; awaitable per event name."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self._waiters: dict[str, asyncio.Event] = {}

    def __call__(self, event: str, request_id: str | None = None, **fields: Any) -> None:
        self.lines.append({"event": event, "request_id": request_id, **fields})
        if event in self._waiters:
            self._waiters[event].set()

    async def wait_for(self, event: str, timeout: float = 30.0) -> None:
        """Return once ``event`` has been logged."""
        if event not in self.names():
            waiter = self._waiters.setdefault(event, asyncio.Event())
            await asyncio.wait_for(waiter.wait(), timeout)

    async def wait_for_count(self, event: str, count: int, timeout: float = 30.0) -> None:
        """Return once ``event`` has been logged ``count`` times."""

        async def counted() -> None:
            while len(self.of(event)) < count:
                waiter = self._waiters.get(event)
                if waiter is None or waiter.is_set():
                    waiter = self._waiters[event] = asyncio.Event()
                await waiter.wait()

        await asyncio.wait_for(counted(), timeout)

    def names(self) -> list[str]:
        return [line["event"] for line in self.lines]

    def of(self, event: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line["event"] == event]
