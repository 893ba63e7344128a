"""A storm user against one target: ask, lose patience, regenerate, read slowly, abandon.

Each request ends in exactly one outcome, decided by the user:

- ``completed``: read to ``[DONE]``;
- ``abandoned``: the user closed it after reading some tokens (a planned abandonment);
- ``superseded``: no first token within the user's patience, so the user pressed
  regenerate (the same prompt, the same ``X-Session-Id``). The old connection stays open
  and unread until the turn ends, as a UI that opened a new request would leave it;
  whatever the server does with it (cancel it, pause it, keep generating) is its own;
- ``failed``: an error (status and code, an error inside the stream, no answer within
  ``timeout_s``). A 503 with ``Retry-After`` is retried once that time has passed (as the
  SDK's retry policy does), as a new attempt of the same turn.

A batch user (see :mod:`~edge_llm.bench.storm.load`) never regenerates: its one attempt
waits up to ``timeout_s``; its requests carry the batch's ``priority`` when asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edge_llm.bench.chat_stream import ChatStream, Clock, RequestOptions
from edge_llm.bench.connection import SMALL_LIMIT
from edge_llm.bench.prompts import Prompt
from edge_llm.bench.record import RequestRecord
from edge_llm.bench.storm.load import (
    INTERACTIVE,
    StormSettings,
    Turn,
    UserProfile,
    profiles,
    start_offset,
    user_turn,
)
from edge_llm.bench.targets import Target

OUTCOMES = ("completed", "abandoned", "superseded", "failed")
MAX_RETRY_AFTER_S = 10.0


@dataclass
class StormRecord:
    """One request of the storm. Times in seconds since the start of its target's run."""

    target: str
    round: int
    user: int
    turn: int
    attempt: int
    slow: bool
    prompt_tokens_requested: int
    turn_started_at: float
    request: RequestRecord
    outcome: str | None = None
    tokens_read: int = 0
    user_done_at: float | None = None  # when the user was done with it (rendered, closed)
    kind: str = INTERACTIVE  # or batch
    priority: int | None = None  # the priority field sent (None: none)
    text: str | None = None  # the answer's text, once completed

    @property
    def started_at(self) -> float:
        return self.request.started_at

    @property
    def ttft(self) -> float | None:
        return self.request.ttft

    @property
    def ended_at(self) -> float | None:
        """Run-relative end, once ended."""
        end = self.request.ended_at
        return None if end is None else self.started_at + end

    def to_json(self) -> dict[str, Any]:
        request = self.request.to_json()
        for name in ("target", "concurrency", "index"):
            request.pop(name, None)
        return {
            "target": self.target,
            "round": self.round,
            "user": self.user,
            "turn": self.turn,
            "attempt": self.attempt,
            "slow": self.slow,
            "kind": self.kind,
            "priority": self.priority,
            "prompt_tokens_requested": self.prompt_tokens_requested,
            "turn_started_at": self.turn_started_at,
            "outcome": self.outcome,
            "tokens_read": self.tokens_read,
            "user_done_at": self.user_done_at,
            "text": self.text,
            **request,
        }


@dataclass
class Counters:
    """Requests per outcome so far, for the live view."""

    started: int = 0
    outcomes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))

    @property
    def live(self) -> int:
        return self.started - sum(self.outcomes.values())


class TargetRun:
    """One target's share of one round: the users, their records and counters."""

    def __init__(
        self,
        target: Target,
        settings: StormSettings,
        round_index: int,
        tag: str,
        *,
        clock: Clock = time.perf_counter,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.target = target
        self.settings = settings
        self.round = round_index
        self.tag = tag
        self.clock = clock
        self.on_change = on_change
        self.epoch = clock()
        self.records: list[StormRecord] = []
        self.counters = Counters()
        self.options = RequestOptions(
            max_tokens=settings.max_tokens, temperature=0.0, timeout_s=settings.timeout_s
        )

    def now(self) -> float:
        return self.clock() - self.epoch

    async def run(self) -> list[StormRecord]:
        """All users until ``duration_s``; turns under way then are finished, not cut."""
        self.epoch = self.clock()
        await asyncio.gather(*(self.user(profile) for profile in profiles(self.settings)))
        return self.records

    async def user(self, profile: UserProfile) -> None:
        settings = self.settings
        await asyncio.sleep(start_offset(settings, profile.user))
        index = 0
        while self.now() < settings.duration_s:
            turn = user_turn(settings, profile.user, index, batch=profile.batch)
            await self.turn(profile, turn)
            index += 1
            await asyncio.sleep(min(turn.think_s, max(0.0, settings.duration_s - self.now())))

    async def turn(self, profile: UserProfile, turn: Turn) -> None:
        prompt = turn.prompt(self.settings, turn_tag(self.tag, self.round, turn))
        held: list[tuple[ChatStream, asyncio.Task[None]]] = []
        turn_start = self.now()
        regenerates = 0 if profile.batch else self.settings.max_regenerates
        try:
            for attempt in range(regenerates + 1):
                last = attempt == regenerates
                record = self._new_record(profile, turn, attempt, turn_start)
                stream = self._stream(profile, prompt, record)
                waiter = asyncio.create_task(_until_first_token(stream, self.epoch))
                patience = self.settings.timeout_s if last else profile.patience_s
                done, _ = await asyncio.wait({waiter}, timeout=patience)
                if not done:
                    if last:
                        await _cancel(waiter)
                        stream.fail_timeout(patience)
                        self._end(record, "failed")
                        return
                    self._end(record, "superseded")  # the user presses regenerate
                    held.append((stream, waiter))
                    continue
                retry_after = await self._read(profile, turn, stream, record)
                if retry_after is None or last:
                    return
                await asyncio.sleep(retry_after)
        finally:
            for stream, waiter in held:
                await _cancel(waiter)
                stream.close()

    def _new_record(
        self, profile: UserProfile, turn: Turn, attempt: int, turn_start: float
    ) -> StormRecord:
        request = RequestRecord(self.target.name, self.settings.users, len(self.records), "")
        record = StormRecord(
            target=self.target.name,
            round=self.round,
            user=profile.user,
            turn=turn.index,
            attempt=attempt,
            slow=profile.slow,
            kind=profile.kind,
            priority=self.settings.priority_of(profile),
            prompt_tokens_requested=turn.prompt_tokens,
            turn_started_at=turn_start,
            request=request,
        )
        request.prompt_id = f"u{profile.user}-t{turn.index}-a{attempt}"
        self.records.append(record)
        self.counters.started += 1
        self.on_change()
        return record

    def _stream(self, profile: UserProfile, prompt: Prompt, record: StormRecord) -> ChatStream:
        slow = profile.slow
        priority = {} if record.priority is None else {"priority": record.priority}
        return ChatStream(
            self.target,
            prompt,
            self.options,
            record.request,
            clock=self.clock,
            rcvbuf=self.settings.slow_rcvbuf if slow else None,
            limit=SMALL_LIMIT if slow else 64 * 1024,
            headers={"X-Session-Id": f"{self.tag}-r{self.round}-{profile.session}"},
            body=priority,
        )

    async def _read(
        self, profile: UserProfile, turn: Turn, stream: ChatStream, record: StormRecord
    ) -> float | None:
        """Read the answer as this user does; the Retry-After of a 503, if any."""
        rec = record.request
        remaining = max(0.1, self.settings.timeout_s - (self.now() - record.started_at))
        try:
            async with asyncio.timeout(remaining):
                if await self._render(profile, turn, stream, record):
                    return None
        except TimeoutError:
            stream.fail_timeout(self.settings.timeout_s)
        finally:
            stream.close()
        if rec.ok and rec.done:
            record.tokens_read = rec.n_output_tokens
            record.text = stream.text
            self._end(record, "completed")
            return None
        record.tokens_read = rec.n_chunks
        self._end(record, "failed")
        return _retry_after(stream)

    async def _render(
        self, profile: UserProfile, turn: Turn, stream: ChatStream, record: StormRecord
    ) -> bool:
        """Read to the end (False) or until the user abandons the stream (True)."""
        rec = record.request
        read = 0
        while True:
            new, read = rec.n_chunks - read, rec.n_chunks
            limit = turn.abandon_after_tokens
            if limit is not None and read >= limit and not stream.finished:
                record.tokens_read = limit  # chunks that came with the last read go unread
                self._end(record, "abandoned")
                return True
            if profile.slow and new:
                await asyncio.sleep(new / self.settings.slow_tokens_per_s)
            if stream.finished:
                return False
            await stream.read_some()  # the last batch is rendered by the next iteration

    def _end(self, record: StormRecord, outcome: str) -> None:
        if record.outcome is None:
            record.outcome = outcome
            record.user_done_at = self.now()
            self.counters.outcomes[outcome] += 1
            self.on_change()


def turn_tag(run_tag: str, round_index: int, turn: Turn) -> str:
    """The tag a turn's prompt starts with: unique to the run, the round and the turn, so
    that a prompt cache can reuse nothing between them; a replay with the same tag sends
    exactly the same text."""
    return f"{run_tag}-r{round_index}-u{turn.user}-t{turn.index}"


async def _until_first_token(stream: ChatStream, epoch: float) -> None:
    """Open the request and read until its first content chunk (or its end)."""
    if await stream.open(epoch):
        while not stream.record.chunk_times and await stream.read_some():
            pass


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


def _retry_after(stream: ChatStream) -> float | None:
    response = stream.response
    if response is None or response.status != 503:
        return None
    try:
        seconds = float(response.headers.get("retry-after", ""))
    except ValueError:
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)
