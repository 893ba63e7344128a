"""What the server does during a storm, sampled while the users run.

edge-llm: ``/debug/streams`` (KV bytes in use, running, waiting, paused streams, and each
stream's prefill and generated counts, kept by id so that work done for requests nobody
read can be joined with the users' records) and ``/metrics`` counters. llama-server:
``/slots`` (busy slots) and, with ``--metrics``, ``llamacpp:*`` counters and gauges.
With ``pid``, the resident memory of that process and its children (psutil). Anything a
server does not expose stays None: reported as not measured, never guessed.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
from typing import Any

import psutil

from edge_llm.bench.connection import HttpError, fetch
from edge_llm.bench.inspector import MAX_INTROSPECTION_BYTES, ServerInspector, metric_value
from edge_llm.bench.targets import Target

# (generated tokens, prompt tokens processed) counters, per server kind.
COUNTERS = {
    "edge-llm": ("edge_llm_generated_tokens_total", "edge_llm_prompt_tokens_total"),
    "llama.cpp": ("llamacpp:tokens_predicted_total", "llamacpp:prompt_tokens_total"),
}
MAX_STREAMS_KEPT = 100_000


@dataclass(frozen=True, slots=True)
class ServerSample:
    """One look at the server, ``t`` seconds after its run started."""

    t: float
    kv_used_bytes: float | None = None
    running: int | None = None
    waiting: int | None = None
    paused: int | None = None
    rss_bytes: int | None = None
    alive: bool = True

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class CounterReading:
    generated_tokens: float | None = None
    prompt_tokens: float | None = None


def rss_of(pid: int | None) -> int | None:
    """Resident bytes of ``pid`` and its children; None without a pid or once it is gone."""
    if pid is None:
        return None
    try:
        process = psutil.Process(pid)
        members = [process, *process.children(recursive=True)]
        return sum(int(p.memory_info().rss) for p in members)
    except psutil.Error:
        return None


class ServerWatch:
    """Samples one target. Call :meth:`detect` once, then :meth:`sample` repeatedly."""

    def __init__(self, target: Target, pid: int | None = None) -> None:
        self.target = target
        self.pid = pid
        self.inspector = ServerInspector(target)
        self.kind: str | None = None
        self.streams: dict[str, dict[str, Any]] = {}
        self.max_prompt_tokens: int | None = None  # the longest prompt it admits, if it says

    async def detect(self) -> str | None:
        """``edge-llm``, ``llama.cpp`` or None (an endpoint with neither)."""
        document = await self.inspector.debug_streams()
        if document is not None:
            self.kind = "edge-llm"
            self.max_prompt_tokens = _int(document.get("max_prompt_tokens"))
        elif await self.inspector.slots() is not None or await self._metrics() is not None:
            self.kind = "llama.cpp"
        return self.kind

    async def _metrics(self) -> str | None:
        try:
            status, _, body = await fetch(
                self.target.root + "/metrics",
                headers=self.target.headers(),
                max_bytes=MAX_INTROSPECTION_BYTES,
            )
        except HttpError:
            return None
        return body.decode("utf-8", errors="replace") if status == 200 else None

    async def counters(self) -> CounterReading:
        names = COUNTERS.get(self.kind or "")
        text = await self._metrics() if names else None
        if names is None or text is None:
            return CounterReading()
        return CounterReading(metric_value(text, names[0]), metric_value(text, names[1]))

    async def sample(self, t: float) -> ServerSample:
        rss = rss_of(self.pid)
        if self.kind == "edge-llm":
            return await self._edge_sample(t, rss)
        if self.kind == "llama.cpp":
            return await self._llama_sample(t, rss)
        return ServerSample(t, rss_bytes=rss)

    async def _edge_sample(self, t: float, rss: int | None) -> ServerSample:
        document = await self.inspector.debug_streams()
        if document is None:
            return ServerSample(t, rss_bytes=rss, alive=False)
        streams = [s for s in document["streams"] if isinstance(s, dict)]
        for entry in streams:
            if isinstance(entry.get("id"), str) and len(self.streams) < MAX_STREAMS_KEPT:
                self.streams[entry["id"]] = entry
        return ServerSample(
            t,
            kv_used_bytes=_number(document.get("kv_used_bytes")),
            running=_int(document.get("requests_running")),
            waiting=_int(document.get("requests_waiting")),
            paused=sum(1 for s in streams if s.get("state") == "paused"),
            rss_bytes=rss,
        )

    async def _llama_sample(self, t: float, rss: int | None) -> ServerSample:
        slots, text = await asyncio.gather(self.inspector.slots(), self._metrics())
        if slots is None and text is None:
            return ServerSample(t, rss_bytes=rss, alive=False)
        running = sum(1 for s in slots if s.get("is_processing")) if slots else None
        if text is not None:
            running = _int(metric_value(text, "llamacpp:requests_processing")) or running
        waiting = _int(metric_value(text, "llamacpp:requests_deferred")) if text else None
        return ServerSample(t, kv_used_bytes=None, running=running, waiting=waiting, rss_bytes=rss)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _int(value: object) -> int | None:
    number = _number(value)
    return None if number is None else int(number)
