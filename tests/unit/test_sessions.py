"""A session has one live stream, decided by ``generation/sessions.py`` for every
backend: the book alone, then through the server over the fake backend (the relayed
case is in test_upstream_relay.py)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from edge_llm.generation.sessions import Sessions
from edge_llm.observability.events import Event

from fakes import FakeBackend


class _Stream:
    def __init__(self) -> None:
        self.finished = False
        self.cancelled: list[str] = []

    def cancel(self, reason: str) -> None:
        self.cancelled.append(reason)
        self.finished = True


def test_a_new_stream_of_a_session_ends_the_live_one() -> None:
    sessions = Sessions(supersede=True)
    old, other = _Stream(), _Stream()
    sessions.started("s1", old)
    sessions.started("s2", other)
    sessions.starting("s1")
    assert old.cancelled == ["superseded"]
    assert other.cancelled == []
    assert len(sessions) == 1


def test_supersede_off_leaves_the_live_stream_running() -> None:
    sessions = Sessions(supersede=False)
    old = _Stream()
    sessions.started("s1", old)
    sessions.starting("s1")
    assert old.cancelled == []


def test_an_ended_or_finished_stream_is_not_cancelled() -> None:
    sessions = Sessions()
    ended, finished = _Stream(), _Stream()
    sessions.started("s1", ended)
    sessions.ended("s1", ended)
    sessions.starting("s1")
    finished.finished = True
    sessions.started("s2", finished)
    sessions.starting("s2")
    sessions.starting(None)
    assert (ended.cancelled, finished.cancelled, len(sessions)) == ([], [], 0)


def test_a_newer_streams_end_does_not_forget_the_newest() -> None:
    sessions = Sessions(supersede=False)
    first, second = _Stream(), _Stream()
    sessions.started("s1", first)
    sessions.started("s1", second)
    sessions.ended("s1", first)
    assert len(sessions) == 1


@pytest.mark.parametrize("supersede", [True, False])
async def test_a_sessions_new_request_supersedes_its_local_stream(
    client_of, supersede: bool
) -> None:
    backend = FakeBackend()
    backend.gate = threading.Semaphore(0)  # nothing decodes until both are admitted
    admitted: list[str | None] = []
    both = asyncio.Event()

    def events(event: Event, request_id: str | None = None, /, **fields: Any) -> None:
        if event is Event.ADMITTED:
            admitted.append(request_id)
            if len(admitted) == 2:
                both.set()

    client = await client_of(backend, events=events, supersede_sessions=supersede)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    headers = {"X-Session-Id": "s1"}
    older = asyncio.create_task(client.post("/v1/chat/completions", json=body, headers=headers))
    newer = asyncio.create_task(client.post("/v1/chat/completions", json=body, headers=headers))
    await asyncio.wait_for(both.wait(), 30)
    backend.gate.release(1000)
    first, second = await older, await newer
    statuses = sorted([first.status, second.status])
    if supersede:  # whichever was admitted first is the older one
        assert statuses == [200, 409]
        refused = first if first.status == 409 else second
        assert (await refused.json())["error"]["reason"] == "superseded"
    else:
        assert statuses == [200, 200]
