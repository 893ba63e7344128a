"""What a target says about itself: edge-llm's ``/debug/streams`` and ``/metrics``, and
llama.cpp's ``/slots`` (per-slot ``is_processing`` and ``next_token[0].n_decoded``).

Servers without them: every method returns None, and the caller reports the figure as
not measurable (or infers it) rather than guessing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from edge_llm.bench.connection import HttpError, fetch
from edge_llm.bench.targets import Target

KV_USED_METRIC = "edge_llm_kv_cache_used_bytes"
MAX_INTROSPECTION_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class StreamSample:
    """One ``/debug/streams`` entry for one stream, at ``t`` seconds since its start."""

    t: float
    state: str
    pause_cause: str | None
    n_generated: int
    pauses: int
    paused_ms: float
    ring_write: int
    ring_read: int
    backpressure_peak: int
    tokens_while_paused: int | None

    @classmethod
    def of(cls, t: float, entry: dict[str, Any]) -> StreamSample:
        return cls(
            t=t,
            state=str(entry.get("state")),
            pause_cause=_opt_str(entry.get("pause_cause")),
            n_generated=int(entry.get("n_generated") or 0),
            pauses=int(entry.get("pauses") or 0),
            paused_ms=float(entry.get("paused_ms") or 0.0),
            ring_write=int(entry.get("ring_write") or 0),
            ring_read=int(entry.get("ring_read") or 0),
            backpressure_peak=int(entry.get("backpressure_peak") or 0),
            tokens_while_paused=_opt_int(entry.get("tokens_while_paused")),
        )


def _opt_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _opt_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class ServerInspector:
    """Reads a target's introspection endpoints, each on its own short connection."""

    def __init__(self, target: Target) -> None:
        self.target = target

    async def _get(self, path: str) -> bytes | None:
        try:
            status, _, body = await fetch(
                self.target.root + path,
                headers=self.target.headers(),
                max_bytes=MAX_INTROSPECTION_BYTES,
            )
        except HttpError:
            return None
        return body if status == 200 else None

    async def debug_streams(self) -> dict[str, Any] | None:
        """The ``/debug/streams`` document, or None when the target has none."""
        body = await self._get("/debug/streams")
        if body is None:
            return None
        try:
            document = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None
        if not isinstance(document, dict) or not isinstance(document.get("streams"), list):
            return None
        return document

    async def stream_entry(self, stream_id: str) -> dict[str, Any] | None:
        """The ``/debug/streams`` entry whose ``id`` is ``stream_id``, if listed."""
        document = await self.debug_streams()
        for entry in (document or {}).get("streams", []):
            if isinstance(entry, dict) and entry.get("id") == stream_id:
                return entry
        return None

    async def kv_used_bytes(self) -> float | None:
        """``edge_llm_kv_cache_used_bytes`` from ``/metrics``, None if not exposed."""
        body = await self._get("/metrics")
        if body is None:
            return None
        return metric_value(body.decode("utf-8", errors="replace"), KV_USED_METRIC)

    async def slots(self) -> list[dict[str, Any]] | None:
        """llama.cpp's ``/slots`` list, or None when the target has none."""
        body = await self._get("/slots")
        try:
            slots = json.loads(body) if body is not None else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None
        if not isinstance(slots, list) or not all(isinstance(s, dict) for s in slots):
            return None
        return slots


def slot_progress(slots: list[dict[str, Any]]) -> int | None:
    """Tokens decoded by the one busy slot; None when no slot or several are busy.

    The probe runs alone, so the one busy slot is its request's.
    """
    busy = [s for s in slots if s.get("is_processing")]
    if len(busy) != 1:
        return None
    tokens = busy[0].get("next_token")
    first = tokens[0] if isinstance(tokens, list) and tokens else tokens
    decoded = first.get("n_decoded") if isinstance(first, dict) else None
    return decoded if isinstance(decoded, int) and not isinstance(decoded, bool) else None


def metric_value(text: str, name: str) -> float | None:
    """The value of an unlabelled sample ``name`` in Prometheus text format; without
    one, the sum of its labelled samples (an engine serving several models labels
    each series with its ``model``)."""
    labelled: list[float] = []
    for line in text.split("\n"):
        if line.startswith(name + " "):
            return _sample_value(line[len(name) :])
        if line.startswith(name + "{"):
            value = _sample_value(line.rpartition("}")[2])
            if value is not None:
                labelled.append(value)
    return sum(labelled) if labelled else None


def _sample_value(text: str) -> float | None:
    """The value of a sample line's part after its name and labels."""
    try:
        return float(text.split(maxsplit=1)[0])
    except (IndexError, ValueError):
        return None
