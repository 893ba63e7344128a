"""Pulls on first use (``pull = "missing"``): one pull per file however many requests
ask, and how far it is, for every request that waits for it.

A request's ``model`` may spell one Hub source several ways (``o/r:q4_k_m``,
``hf.co/o/r:Q4_K_M``); a pull is keyed by the source's own name, so the spellings
asked at once wait for one download. Each waiter sees the pull's bytes (done, total)
and is woken at each step it reports (the request's ``downloading`` progress).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from edge_llm.models.pull import PullStatus, Report
from edge_llm.models.spec import ModelSpec

# Pull the model a name names now, reporting each step; None: it may not be pulled.
PullOnUse = Callable[[str, Report], Coroutine[Any, Any, ModelSpec | None]]


class PullFlight:
    """One pull under way: its task, the bytes it has (of ``total``, None until the
    Hub said) and who is woken at each step."""

    def __init__(self, name: str) -> None:
        self.name = name  # the source's own name: what the pulled model is stored as
        self.done = 0
        self.total: int | None = None
        self.task: asyncio.Task[ModelSpec | None] | None = None
        self._watchers: list[Callable[[], None]] = []

    def report(self, status: PullStatus) -> None:
        if status.completed is not None:
            self.done, self.total = status.completed, status.total
        for watcher in self._watchers:
            watcher()

    def watch(self, changed: Callable[[], None]) -> None:
        """Call ``changed`` at each step the pull reports and when it ends."""
        self._watchers.append(changed)
        if self.task is not None:
            self.task.add_done_callback(lambda _: changed())

    async def result(self) -> ModelSpec | None:
        """The pulled model (None: it may not be pulled); raises why the pull failed.
        A waiter cancelled does not cancel the pull: others may wait for it."""
        assert self.task is not None
        return await asyncio.shield(self.task)


class PullFlights:
    """The pulls under way, by the source's own name."""

    def __init__(self, pull: PullOnUse, key: Callable[[str], str | None]) -> None:
        """``key``: the source ``name`` names (one for all its spellings), None when
        it may not be pulled; ``pull``: pull it now."""
        self._pull = pull
        self._key = key
        self._flights: dict[str, PullFlight] = {}

    def may_pull(self, name: str) -> bool:
        return self._key(name) is not None

    def start(self, name: str) -> PullFlight | None:
        """The pull of ``name``'s source, started now unless under way (None: it may
        not be pulled)."""
        key = self._key(name)
        if key is None:
            return None
        flight = self._flights.get(key)
        if flight is None:
            flight = self._flights[key] = PullFlight(key)
            flight.task = asyncio.create_task(self._pull(key, flight.report))
            flight.task.add_done_callback(lambda _: self._flights.pop(key, None))
        return flight
