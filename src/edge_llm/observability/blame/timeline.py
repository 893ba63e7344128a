"""Joining the engine's and the client's logs into one timeline per request.

Keyed by the server's stream id. Client lines written before that id was known are
matched through ``client_request_id`` (one key per attempt); ``kv_freed`` lines
(request_id null) go to the request whose ``scheduled`` line last named their slot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from edge_llm.observability.blame.lines import LogLine, first_of, int_of, name_of, ts_of
from edge_llm.observability.blame.model import CLIENT, ENGINE, Timeline
from edge_llm.observability.events import Event


def split_sources(
    events: Iterable[dict[str, Any]], default: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(engine lines, client lines) by each line's ``source``; ``default`` if it has none."""
    engine: list[dict[str, Any]] = []
    client: list[dict[str, Any]] = []
    for event in events:
        source = event.get("source") or default
        if source == ENGINE:
            engine.append(event)
        elif source == CLIENT:
            client.append(event)
    return engine, client


def engine_by_request(events: Iterable[LogLine]) -> dict[str, list[LogLine]]:
    """Engine lines per request id; ``kv_freed`` goes to the slot's last holder."""
    grouped: dict[str, list[LogLine]] = {}
    slot_owner: dict[int, str] = {}
    for event in events:
        request_id = event.get("request_id")
        if name_of(event) == Event.SCHEDULED and isinstance(request_id, str):
            slot = int_of(event, "slot")
            if slot is not None:
                slot_owner[slot] = request_id
        if request_id is None and name_of(event) == Event.KV_FREED:
            request_id = _slot_holder(event, slot_owner)
        if isinstance(request_id, str) and request_id:
            grouped.setdefault(request_id, []).append(event)
    return grouped


def _slot_holder(event: LogLine, slot_owner: Mapping[int, str]) -> str | None:
    slot = int_of(event, "slot")
    return None if slot is None else slot_owner.get(slot)


def client_attempts(events: Iterable[LogLine]) -> list[tuple[str, str, list[LogLine]]]:
    """(request key, client_request_id, lines) per attempt. An attempt starts at a
    ``request_sent``; its key is the first server id any of its lines carries, else
    the client_request_id (the request never got a server id)."""
    attempts: dict[str, list[list[LogLine]]] = {}
    for event in events:
        client_id = event.get("client_request_id") or event.get("request_id")
        if not client_id:
            continue  # not about a request (log_closed)
        segments = attempts.setdefault(str(client_id), [[]])
        if name_of(event) == Event.REQUEST_SENT and first_of(segments[-1], Event.REQUEST_SENT):
            segments.append([])
        segments[-1].append(event)
    result = []
    for client_id, segments in attempts.items():
        for lines in segments:
            server_id = next((e["request_id"] for e in lines if e.get("request_id")), None)
            result.append((str(server_id or client_id), client_id, lines))
    return result


def build_timelines(
    engine_events: Sequence[LogLine],
    client_events: Sequence[LogLine],
    *,
    have_engine_log: bool,
    have_client_log: bool,
) -> list[Timeline]:
    """One timeline per request seen in either log, oldest first."""
    timelines: dict[str, Timeline] = {}
    log_end = max((ts_of(e) for e in engine_events), default=None)

    def timeline(key: str) -> Timeline:
        if key not in timelines:
            timelines[key] = Timeline(
                key,
                have_engine_log=have_engine_log,
                have_client_log=have_client_log,
                engine_log_end_ts=log_end,
            )
        return timelines[key]

    for request_id, lines in engine_by_request(engine_events).items():
        timeline(request_id).engine.extend(lines)
    for key, client_id, lines in client_attempts(client_events):
        found = timeline(key)
        found.client.extend(lines)
        if client_id not in found.client_request_ids:
            found.client_request_ids.append(client_id)
    return sorted(timelines.values(), key=lambda t: t.first_ts)
