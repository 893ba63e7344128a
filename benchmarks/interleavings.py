"""The stream contract under random interleavings, on the real model (issue 59, SPEC 25).

Starts ``edge-llm serve`` as ``make run`` does (its defaults, the embedded model) on
127.0.0.1 with an event log, beside ``--busy`` busy loops (``contention.py``'s), and
runs ``--clients`` clients for ``--duration`` seconds. Each client picks, from its own
seeded random generator, one action after another:

- ``identical``: 2-3 streamed chats with one fresh prompt, sent together;
- ``prefix``: 2-3 streamed completions whose prompts prefix one another, sent together;
- ``chat``: one streamed chat, its prompt distinct or one of a few shared ones;
- ``pause``: a WebSocket stream paused and resumed 1-3 times;
- ``cancel``: a WebSocket stream cancelled before or after its first token;
- ``disconnect``: an SSE stream whose connection is closed before or after its first token;
- ``regenerate``: 2-3 requests in one session (``X-Session-Id``), each superseding the last;
- ``relay``: one of the above through the relay: its requests name the model of a second
  ``edge-llm serve`` (the upstream, started the same way with ``--model-id up-model``)
  that the first one relays to (``--upstream``); ``--no-relay``: no upstream, no action;

every request with a random priority (-1, 0 or 1); the clients' first actions cover
all eight. A refusal (a 503 with ``Retry-After``: nothing was spent on it) is retried
as the client SDK retries it when its ``retry_on`` lists ``overloaded``
(``RetryPolicy``: backoff, at least ``Retry-After``, up to ``--attempts`` in all); the
run counts the refusals, and the final answers in the invariants. A 504 is not retried
(the SDK's default would): a TTFT time-out is what deadline admission is there to
prevent, so each one counts. Before the clients, the issue's goal for identical prompts
is measured (a figure, not an invariant): for each ``--identical`` size, a lone
streamed chat's TTFT, then that many identical ones sent at once, and the worst one's
TTFT over the lone one's (goal: 2x; past ``max_sequences``, 4 by default, the rest
wait for a slot).
Then it checks the contract's invariants and prints them with the figures and the
seed (``--seed`` replays the choices; the timing is the machine's):

- ``stalls``: ``/debug/streams`` shows no wait without a reason that can end for
  ``--stall-s`` seconds (``Watch`` says which);
- ``5xx``: no final answer (status, error frame or error event) with a 5xx code (a
  ``ttft_timeout`` is a 504: on a machine too busy for the load, the run says so here;
  a refusal retried until it was served is not one);
- ``lost streams``: every request a client sent ends (a response, a ``done`` or error
  frame) within ``--request-timeout``, and every request the event log admits has one
  ``end`` line; a WebSocket stream's deltas carry as many tokens as its ``usage`` says;
- ``drained``: KV in use, running and waiting requests at 0 within 1 s of the load's end
  (on both servers);
- ``pause bound``: after a ``paused`` frame a client receives at most one token before
  ``resumed``, and the event log has at most one ``token_while_paused`` per pause.

The upstream's ``/debug/streams`` and event log are read the same way (the relayed
requests' engine is there); the front's relayed streams count by their ``routed`` and
``end`` lines. A failure names the invariant and exits 1.

    .venv/bin/python benchmarks/interleavings.py --duration 60 --clients 5 --busy 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from contention import busy_loops
from machine import noise, own_pids, snapshot
from output import add_output_flags, header, write_outputs

from edge_llm.bench.publish import table_data
from edge_llm.client.config import RetryConfig
from edge_llm.client.errors import OverloadedError
from edge_llm.client.retry import RetryPolicy
from edge_llm.errors import EdgeLLMError, Overloaded

START_TIMEOUT_S = 180.0
DRAIN_BOUND_S = 1.0
POLL_S = 0.05
SAMPLE_S = 0.5
IDLE_CPU_SHARE = 0.05  # of one core: the server's own polling and heartbeats, no step
PRIORITIES = (-1, 0, 1)
SHARED = (
    "Write a very long story about a dragon and a knight.",
    "Explain how a lighthouse keeper spends one night, step by step.",
    "List ten things a cook does before a restaurant opens.",
)
PREFIX_BASE = "The lighthouse stood on a narrow spit of rock at the mouth of the bay. Every evening"
PREFIX_TAILS = (
    " the keeper climbed the steps to the lamp room",
    " the keeper climbed the steps to the lamp room, trimmed the wick and wound the clock",
)
ACTIONS = ("identical", "prefix", "chat", "pause", "cancel", "disconnect", "regenerate", "relay")
INVARIANTS = ("stalls", "5xx", "lost streams", "drained", "pause bound")
UP_MODEL = "up-model"


def error_codes(base: type[EdgeLLMError], least_status: int) -> frozenset[str]:
    """The codes of ``base`` and its subclasses answered with ``least_status`` or
    more (errors.py)."""
    codes, todo = set(), [base]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if isinstance(cls.status, int) and cls.status >= least_status:
            codes.add(cls.code)
    return frozenset(codes)


SERVER_ERRORS = error_codes(EdgeLLMError, 500)
REFUSALS = error_codes(Overloaded, 503)  # 503 + Retry-After: retried, nothing was spent


# -- what the clients saw ------------------------------------------------------------------


@dataclass
class Tally:
    """What every client saw; each list holds one line per problem, for the report."""

    requests: int = 0
    actions: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    ids: set[str] = field(default_factory=set)
    server_errors: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    pauses: int = 0
    pause_violations: list[str] = field(default_factory=list)
    first_tokens: int = 0
    refused: Counter[str] = field(default_factory=Counter)  # refusals retried, by code
    waits_s: list[float] = field(default_factory=list)  # first attempt to first token

    def ended(self, outcome: str, request_id: str | None, code: str | None = None) -> None:
        self.outcomes[outcome if code is None else f"{outcome} {code}"] += 1
        if code in SERVER_ERRORS:
            self.server_errors.append(f"{request_id}: {outcome} {code}")


@dataclass
class Run:
    url: str
    tally: Tally
    request_timeout: float
    deadline: float
    retry: RetryPolicy
    relay: bool  # an upstream serves UP_MODEL
    model: str | None = None  # the upstream's, for a relayed action


class Refused(Exception):
    """A 503 refusal (``REFUSALS``) before any content: the request may be sent again."""

    def __init__(self, code: str, retry_after_s: float | None) -> None:
        super().__init__(code)
        self.code, self.retry_after_s = code, retry_after_s

    def as_client_error(self) -> OverloadedError:
        """What the SDK raises for it, for its ``RetryPolicy``."""
        return OverloadedError(self.code, server_code=self.code, retry_after_s=self.retry_after_s)


async def with_retries(
    run: Run, request_id: Callable[[], str | None], attempt: Callable[[], Awaitable[None]]
) -> None:
    """``attempt`` until it is not refused, as the SDK retries a refusal; a refusal
    left when the policy gives up is the request's answer (a 5xx)."""
    for number in range(1, 1000):
        try:
            return await attempt()
        except Refused as refused:
            decision = run.retry.decide(refused.as_client_error(), number, delivered=False)
            if decision is None:
                run.tally.ended("status 503", request_id(), refused.code)
                return
            run.tally.refused[refused.code] += 1
            await asyncio.sleep(decision.delay_ms / 1000.0)


def chat_body(content: str, rng: random.Random, **extra: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": rng.randint(8, 40),
        "temperature": 0,
        "stream": True,
        "priority": rng.choice(PRIORITIES),
        **extra,
    }


def fresh(rng: random.Random, text: str) -> str:
    return f"[{rng.getrandbits(40):010x}] {text}"


async def sse_request(
    run: Run,
    session: aiohttp.ClientSession,
    path: str,
    body: dict[str, Any],
    *,
    headers: dict[str, str] | None = None,
    drop_after: int | None = None,
) -> None:
    """One streamed request read to its end (or closed after ``drop_after`` data events:
    a disconnect), sent again while refused. Its outcome goes to the tally."""
    tally = run.tally
    tally.requests += 1
    body = body if run.model is None else {**body, "model": run.model}
    reply = SseReply(time.monotonic())

    async def attempt() -> None:
        async with session.post(run.url + path, json=body, headers=headers) as response:
            reply.id = response.headers.get("X-Request-Id") or reply.id
            if response.status != 200:
                return await _refusal(tally, response, reply.id)
            if reply.id:
                tally.ids.add(reply.id)  # admitted or relayed: the event log has it
            await _read_sse(tally, response, reply, drop_after)

    try:
        async with asyncio.timeout(run.request_timeout):
            await with_retries(run, lambda: reply.id, attempt)
    except TimeoutError:
        tally.lost.append(f"{reply.id or path}: no end within {run.request_timeout:.0f} s")
    except aiohttp.ClientError as error:
        tally.lost.append(f"{reply.id or path}: {error!r}")


@dataclass
class SseReply:
    started: float  # the first attempt's
    id: str | None = None


async def _refusal(tally: Tally, response: aiohttp.ClientResponse, request_id: str | None) -> None:
    """A status other than 200: a refusal to retry (raised), else the request's end."""
    code = (await _error_of(response)) or str(response.status)
    if response.status == 503 and code in REFUSALS:
        header = response.headers.get("Retry-After")
        raise Refused(code, float(header) if header and header.isdigit() else None)
    tally.ended(f"status {response.status}", request_id, code)
    if response.status >= 500 and code not in SERVER_ERRORS:
        tally.server_errors.append(f"{request_id}: status {response.status}")


async def _error_of(response: aiohttp.ClientResponse) -> str | None:
    try:
        document = await response.json(content_type=None)
    except (ValueError, aiohttp.ClientError):
        return None
    error = document.get("error") if isinstance(document, dict) else None
    return str(error.get("code")) if isinstance(error, dict) else None


async def _read_sse(
    tally: Tally, response: aiohttp.ClientResponse, reply: SseReply, drop_after: int | None
) -> None:
    events, delivered = 0, False
    if drop_after == 0:
        tally.ended("disconnected", reply.id)
        response.close()
        return
    async for raw in response.content:
        line = raw.decode().strip()
        if line == "data: [DONE]":
            tally.ended("completed", reply.id)
            return
        if not line.startswith("data: "):
            continue
        data = json.loads(line.removeprefix("data: "))
        if "error" in data:
            code = str(data["error"].get("code"))
            if not delivered and code in REFUSALS:
                raise Refused(code, None)  # refused while queued: no text yet
            tally.ended("error", reply.id, code)
            return
        events += 1
        if not delivered and _carries_text(data):
            delivered = True
            tally.first_tokens += 1
            tally.waits_s.append(time.monotonic() - reply.started)
        if drop_after is not None and events >= drop_after:
            tally.ended("disconnected", reply.id)
            response.close()
            return
    tally.lost.append(f"{reply.id}: the SSE stream ended without [DONE] or an error")


def _carries_text(data: dict[str, Any]) -> bool:
    """A chat or completion chunk with text (not the opening role chunk)."""
    choices = data.get("choices") or [{}]
    return bool(choices[0].get("text") or (choices[0].get("delta") or {}).get("content"))


async def ws_request(
    run: Run,
    session: aiohttp.ClientSession,
    body: dict[str, Any],
    rng: random.Random,
    *,
    pauses: int = 0,
    cancel_after: int | None = None,
) -> None:
    """A WebSocket stream: paused and resumed ``pauses`` times after some deltas, or
    cancelled after ``cancel_after`` deltas; read to its ``done`` or ``error`` frame,
    started again while refused."""
    tally = run.tally
    tally.requests += 1
    body = body if run.model is None else {**body, "model": run.model}
    stream = WsStream(tally, rng, pauses, cancel_after, time.monotonic())
    url = run.url.replace("http", "ws") + "/v1/stream"

    async def attempt() -> None:
        async with session.ws_connect(url) as ws:
            await ws.send_json({"type": "start", "request": body})
            await stream.run(ws)

    try:
        async with asyncio.timeout(run.request_timeout):
            await with_retries(run, lambda: stream.id, attempt)
    except TimeoutError:
        tally.lost.append(f"{stream.id or 'ws'}: no end within {run.request_timeout:.0f} s")
    except aiohttp.ClientError as error:
        tally.lost.append(f"{stream.id or 'ws'}: {error!r}")


@dataclass
class WsStream:
    """One WebSocket stream's frames, as a client that pauses or cancels reads them."""

    tally: Tally
    rng: random.Random
    pauses: int
    cancel_after: int | None
    started: float  # the first attempt's
    id: str | None = None
    tokens: int = 0
    paused_at: int | None = None  # tokens received when the client's paused frame came
    resume_sent: bool = False

    async def run(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        next_pause = self.rng.randint(1, 6)
        if self.cancel_after == 0:
            await ws.send_json({"type": "cancel"})
        async for message in ws:
            frame = json.loads(message.data)
            kind = frame["type"]
            if kind == "started":
                self.id = frame["id"]
                self.tally.ids.add(frame["id"])
            elif kind == "delta":
                if self.tokens == 0:
                    self.tally.first_tokens += 1
                    self.tally.waits_s.append(time.monotonic() - self.started)
                self.tokens += int(frame["n_tokens"])
                if self.cancel_after and self.tokens >= self.cancel_after:
                    self.cancel_after = None
                    await ws.send_json({"type": "cancel"})
                elif self.pauses and self.paused_at is None and self.tokens >= next_pause:
                    self.pauses -= 1
                    self.paused_at = -1  # sent, not yet confirmed
                    next_pause = self.tokens + self.rng.randint(1, 6)
                    await ws.send_json({"type": "pause"})
            elif kind == "paused" and frame["cause"] == "client":
                await self._paused(ws)
            elif kind == "resumed" and self.resume_sent:
                self._resumed()
            elif kind == "done":
                self._done(frame)
                return
            elif kind == "error":
                code = str(frame["code"])
                if self.tokens == 0 and code in REFUSALS:
                    raise Refused(code, None)
                self.tally.ended("error", self.id, code)
                return
        self.tally.lost.append(f"{self.id}: the socket closed without done or error")

    async def _paused(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """Hold the pause a while (the action itself, not a wait for anything), then resume."""
        self.paused_at = self.tokens
        self.tally.pauses += 1
        await asyncio.sleep(self.rng.uniform(0.05, 0.8))
        self.resume_sent = True
        await ws.send_json({"type": "resume"})

    def _resumed(self) -> None:
        assert self.paused_at is not None and self.paused_at >= 0
        after = self.tokens - self.paused_at
        if after > 1:
            self.tally.pause_violations.append(
                f"{self.id}: {after} tokens after the paused frame (client side)"
            )
        self.paused_at, self.resume_sent = None, False

    def _done(self, frame: dict[str, Any]) -> None:
        usage = int(frame["usage"]["completion_tokens"])
        if usage != self.tokens:
            self.tally.lost.append(f"{self.id}: deltas carried {self.tokens} tokens, usage {usage}")
        self.tally.ended("completed", self.id)


# -- the clients' actions --------------------------------------------------------------------


Action = Callable[[Run, aiohttp.ClientSession, random.Random], Awaitable[None]]


async def identical(run: Run, session: aiohttp.ClientSession, rng: random.Random) -> None:
    body = chat_body(fresh(rng, rng.choice(SHARED)), rng)
    await asyncio.gather(
        *(sse_request(run, session, "/v1/chat/completions", body) for _ in range(rng.randint(2, 3)))
    )


async def prefix(run: Run, session: aiohttp.ClientSession, rng: random.Random) -> None:
    start = fresh(rng, PREFIX_BASE)
    prompts = [start, *(start + tail for tail in PREFIX_TAILS)][: rng.randint(2, 3)]
    rng.shuffle(prompts)
    bodies = [
        {"prompt": p, "max_tokens": rng.randint(8, 32), "temperature": 0, "stream": True,
         "priority": rng.choice(PRIORITIES)}
        for p in prompts
    ]  # fmt: skip
    await asyncio.gather(*(sse_request(run, session, "/v1/completions", b) for b in bodies))


async def chat(run: Run, session: aiohttp.ClientSession, rng: random.Random) -> None:
    text = rng.choice(SHARED) if rng.random() < 0.5 else fresh(rng, rng.choice(SHARED))
    await sse_request(run, session, "/v1/chat/completions", chat_body(text, rng))


async def pause(run: Run, session: aiohttp.ClientSession, rng: random.Random) -> None:
    body = chat_body(fresh(rng, rng.choice(SHARED)), rng, max_tokens=rng.randint(24, 64))
    await ws_request(run, session, body, rng, pauses=rng.randint(1, 3))


async def cancel(run: Run, session: aiohttp.ClientSession, rng: random.Random) -> None:
    body = chat_body(fresh(rng, rng.choice(SHARED)), rng, max_tokens=64)
    await ws_request(run, session, body, rng, cancel_after=rng.choice((0, 1, 3, 8)))


async def disconnect(run: Run, session: aiohttp.ClientSession, rng: random.Random) -> None:
    body = chat_body(fresh(rng, rng.choice(SHARED)), rng, max_tokens=64)
    drop = rng.choice((0, 1, 4))
    await sse_request(run, session, "/v1/chat/completions", body, drop_after=drop)


async def regenerate(run: Run, session: aiohttp.ClientSession, rng: random.Random) -> None:
    """Clicks in one session, each after the last one's first event or at once."""
    headers = {"X-Session-Id": f"session-{rng.getrandbits(32):08x}"}
    text = fresh(rng, rng.choice(SHARED))
    clicks = []
    for _ in range(rng.randint(2, 3)):
        body = chat_body(text, rng)
        clicks.append(
            asyncio.create_task(
                sse_request(run, session, "/v1/chat/completions", body, headers=headers)
            )
        )
        await asyncio.sleep(rng.uniform(0.0, 0.5))  # a user's hesitation, part of the load
    await asyncio.gather(*clicks)


async def relay(run: Run, session: aiohttp.ClientSession, rng: random.Random) -> None:
    """Another action's requests, to the model the upstream serves (``--no-relay``:
    without an upstream, to the local model)."""
    name = rng.choice([a for a in ACTIONS if a != "relay"])
    relayed = replace(run, model=UP_MODEL) if run.relay else run
    await ACTION_OF[name](relayed, session, rng)


ACTION_OF: dict[str, Action] = {
    "identical": identical, "prefix": prefix, "chat": chat, "pause": pause,
    "cancel": cancel, "disconnect": disconnect, "regenerate": regenerate, "relay": relay,
}  # fmt: skip


async def client(run: Run, rng: random.Random, first: Sequence[str]) -> None:
    """``first``: this client's share of the actions, so that a short run has each."""
    async with aiohttp.ClientSession() as session:
        for name in first:
            await _act(run, session, rng, name)
        while time.monotonic() < run.deadline:
            await _act(run, session, rng, rng.choice(ACTIONS))


async def _act(run: Run, session: aiohttp.ClientSession, rng: random.Random, name: str) -> None:
    run.tally.actions[name] += 1
    await ACTION_OF[name](run, session, rng)


# -- what the server saw ---------------------------------------------------------------------


@dataclass
class Watch:
    """``/debug/streams`` read every ``SAMPLE_S`` during the load. A stall is a wait
    without a reason that can end, lasting ``stall_s`` (a busy machine makes steps
    slow, not absent): a stream prefilled, unpaused and without a token while the
    engine takes 3 steps or more (the issue's stall), or streams waiting unpaused for
    their first token while the engine takes no step and the server process uses
    under ``IDLE_CPU_SHARE`` of a core (idle: not in one long step of a starved
    machine, which a 2-core machine at load 14 showed at 5.7 s)."""

    stall_s: float
    samples: int = 0
    peak_running: int = 0
    peak_waiting: int = 0
    peak_kv_bytes: int = 0
    stalled: dict[str, str] = field(default_factory=dict)
    prefilled: dict[str, tuple[float, int]] = field(default_factory=dict)  # since, steps
    idle_since: tuple[float, int, float] | None = None  # since, steps, server CPU s

    def read(self, document: dict[str, Any], now: float, cpu_s: float) -> None:
        """One reading; ``cpu_s``: the server process's CPU seconds so far."""
        self.samples += 1
        self.peak_running = max(self.peak_running, document["requests_running"])
        self.peak_waiting = max(self.peak_waiting, document["requests_waiting"])
        self.peak_kv_bytes = max(self.peak_kv_bytes, document["kv_used_bytes"])
        steps = int(document["steps"])
        waiting = [s for s in _local(document) if _waits_for_first_token(s)]
        for stream in waiting:
            self._prefilled(stream, now, steps)
        for key in set(self.prefilled) - {s["id"] for s in waiting}:
            del self.prefilled[key]
        self._idle(waiting, now, steps, cpu_s)

    def _prefilled(self, stream: dict[str, Any], now: float, steps: int) -> None:
        key = stream["id"]
        if stream["state"] != "prefill" or stream["prefill_done"] < stream["n_prompt_tokens"]:
            self.prefilled.pop(key, None)
            return
        since, at_step = self.prefilled.setdefault(key, (now, steps))
        if now - since >= self.stall_s and steps - at_step >= 3:
            self.stalled[key] = (
                f"{key}: prefilled {stream['prefill_done']}/{stream['n_prompt_tokens']}, no "
                f"token for {now - since:.1f} s and {steps - at_step} engine steps"
            )

    def _idle(self, waiting: list[dict[str, Any]], now: float, steps: int, cpu_s: float) -> None:
        if not waiting or (self.idle_since is not None and self.idle_since[1] != steps):
            self.idle_since = None
        if not waiting:
            return
        since, _, cpu_since = self.idle_since = self.idle_since or (now, steps, cpu_s)
        used = cpu_s - cpu_since
        if now - since >= self.stall_s and used < IDLE_CPU_SHARE * (now - since):
            for stream in waiting:
                self.stalled[stream["id"]] = (
                    f"{stream['id']}: {stream['state']} while the engine took no step "
                    f"for {now - since:.1f} s (the server used {used:.2f} CPU-s)"
                )


def _local(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The streams of this server's engine (a front lists the ones it relays too: the
    upstream's watch sees those)."""
    return [s for s in document["streams"] if s.get("backend", "local") == "local"]


def _waits_for_first_token(stream: dict[str, Any]) -> bool:
    return stream["state"] in ("queued", "prefill") and stream["n_generated"] == 0


async def watch(url: str, pid: int, into: Watch, stop: asyncio.Event) -> None:
    process = psutil.Process(pid)
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            async with session.get(url + "/debug/streams") as response:
                document = await response.json()
            cpu = process.cpu_times()
            into.read(document, time.monotonic(), cpu.user + cpu.system)
            try:
                await asyncio.wait_for(stop.wait(), SAMPLE_S)
            except TimeoutError:
                continue


async def drain_time(
    urls: Sequence[str], bound_s: float
) -> tuple[float | None, list[dict[str, Any]]]:
    """Seconds until KV in use, running and waiting requests read 0 on every server
    (None: not within ``bound_s`` plus a margin to say by how much), and the last
    readings."""
    start = time.monotonic()
    async with aiohttp.ClientSession() as session:
        while True:
            documents = []
            for url in urls:
                async with session.get(url + "/debug/streams") as response:
                    documents.append(await response.json())
            took = time.monotonic() - start
            if all(_drained(d) for d in documents):
                return took, documents
            if took > bound_s * 5:
                return None, documents
            await asyncio.sleep(POLL_S)  # a reading of the servers' state, polled


def _drained(document: dict[str, Any]) -> bool:
    return (
        document["kv_used_bytes"] == 0
        and document["requests_running"] == 0
        and document["requests_waiting"] == 0
    )


def engine_checks(events: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The invariants a server's event log shows: one end per admitted (or relayed:
    ``routed``) request, no 5xx error (a ttft_timeout is a 504; a refusal is the
    client's to retry, its final answer counted there), at most one token per pause."""
    started = {e["request_id"] for e in events if e["event"] in ("admitted", "routed")}
    ends = Counter(e["request_id"] for e in events if e["event"] == "end")
    problems: dict[str, list[str]] = {name: [] for name in INVARIANTS}
    for request_id in sorted(started):
        if ends[request_id] != 1:
            problems["lost streams"].append(f"{request_id}: {ends[request_id]} end lines")
    for e in events:
        error = e.get("error")
        if e["event"] == "end" and error in SERVER_ERRORS and error not in REFUSALS:
            problems["5xx"].append(f"{e['request_id']}: ended {error} (event log)")
    problems["pause bound"] = tokens_while_paused(events)
    return problems


def tokens_while_paused(events: list[dict[str, Any]]) -> list[str]:
    """Pauses (one per request and cause, from ``paused`` to ``resumed`` or the end)
    in which the engine generated more than one token."""
    open_: dict[tuple[str, str], int] = {}
    over: list[str] = []
    for e in events:
        key = (str(e.get("request_id")), str(e.get("cause")))
        if e["event"] == "paused":
            open_[key] = 0
        elif e["event"] == "token_while_paused" and key in open_:
            open_[key] += 1
            if open_[key] == 2:
                over.append(f"{key[0]}: 2+ tokens while paused ({key[1]})")
        elif e["event"] == "resumed":
            open_.pop(key, None)
    return over


def count_pauses(events: list[dict[str, Any]]) -> Counter[str]:
    return Counter(str(e.get("cause")) for e in events if e["event"] == "paused")


# -- the server ------------------------------------------------------------------------------


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[str]
    event_log: Path
    output: list[str]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def events(self) -> list[dict[str, Any]]:
        lines = self.event_log.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]


@contextmanager
def server(directory: Path, extra: Sequence[str]) -> Iterator[Server]:
    """``edge-llm serve`` with ``make run``'s configuration on 127.0.0.1, an event log."""
    event_log = directory / "events.jsonl"
    cmd = [sys.executable, "-m", "edge_llm", "serve", "--host", "127.0.0.1", "--port", "0",
           "--event-log", str(event_log), *extra]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str] = queue.Queue()
    output: list[str] = []
    threading.Thread(target=_read_lines, args=(proc, lines), daemon=True).start()
    started = Server(_wait_for_url(proc, lines, output), proc, event_log, output)
    threading.Thread(target=_keep_lines, args=(lines, output), daemon=True).start()
    try:
        yield started
    finally:
        started.stop()


@contextmanager
def servers(directory: Path, extra: Sequence[str], relay: bool) -> Iterator[Servers]:
    """The front (as ``make run`` starts it) and, with ``relay``, the upstream it
    relays ``UP_MODEL`` to: a second server started the same way."""
    with ExitStack() as stack:
        upstream = None
        front_extra = list(extra)
        if relay:
            (directory / "upstream").mkdir()
            up_args = [*extra, "--model-id", UP_MODEL]
            upstream = stack.enter_context(server(directory / "upstream", up_args))
            front_extra += ["--upstream", f"up={upstream.url}"]
        (directory / "front").mkdir()
        front = stack.enter_context(server(directory / "front", front_extra))
        if upstream is not None:
            asyncio.run(_wait_for_model(front.url, UP_MODEL))
        yield Servers(front, upstream)


@dataclass
class Servers:
    front: Server
    upstream: Server | None

    @property
    def all(self) -> list[Server]:
        return [self.front] if self.upstream is None else [self.front, self.upstream]


async def _wait_for_model(url: str, model: str) -> None:
    """Until the front has learnt the upstream's model (its first health check)."""
    async with aiohttp.ClientSession() as session:
        async with asyncio.timeout(START_TIMEOUT_S):
            while True:
                async with session.get(url + "/v1/models") as response:
                    listed = (await response.json()).get("data", [])
                if any(m.get("id") == model for m in listed):
                    return
                await asyncio.sleep(POLL_S)  # the front's health check, polled


def _read_lines(proc: subprocess.Popen[str], lines: queue.Queue[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put(line)


def _keep_lines(lines: queue.Queue[str], output: list[str]) -> None:
    while True:
        output.append(lines.get())
        del output[:-200]


def _wait_for_url(proc: subprocess.Popen[str], lines: queue.Queue[str], output: list[str]) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        output.append(line)
        if " on http://" in line:
            return line.split(" on ", 1)[1].split()[0]
    proc.kill()
    raise SystemExit("edge-llm did not start:\n" + "".join(output[-20:]))


# -- identical prompts together (the goal: within 2x a lone request's TTFT) ----------


@dataclass
class Group:
    """``n`` identical streamed chats sent at once, after a lone one (fresh prompts)."""

    n: int
    lone_s: float | None
    worst_s: float | None  # None: one of them got no first token

    @property
    def ratio(self) -> float | None:
        if self.lone_s is None or self.worst_s is None or self.lone_s <= 0:
            return None
        return self.worst_s / self.lone_s

    def describe(self) -> str:
        if self.ratio is None:
            return f"x{self.n}: no first token for one of them (lone {self.lone_s})"
        assert self.worst_s is not None and self.lone_s is not None
        return (f"x{self.n}: worst TTFT {self.worst_s:.2f} s = {self.ratio:.1f}x lone "
                f"{self.lone_s:.2f} s")  # fmt: skip


async def first_token_s(session: aiohttp.ClientSession, url: str, content: str) -> float | None:
    """Seconds to the first content of a streamed chat, read to its end; None: none came."""
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 8,
            "temperature": 0, "stream": True}  # fmt: skip
    started, first = time.monotonic(), None
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        if response.status != 200:
            return None
        async for raw in response.content:
            line = raw.decode().strip()
            if first is None and line.startswith("data: {") and '"content":' in line:
                data = json.loads(line.removeprefix("data: "))
                if data.get("choices") and data["choices"][0]["delta"].get("content"):
                    first = time.monotonic() - started
    return first


async def identical_groups(url: str, sizes: Sequence[int], rng: random.Random) -> list[Group]:
    """For each size: a lone request, then that many identical ones at once."""
    groups = []
    async with aiohttp.ClientSession() as session:
        for n in sizes:
            lone = await first_token_s(session, url, fresh(rng, SHARED[0]))
            prompt = fresh(rng, SHARED[0])
            ttfts = await asyncio.gather(*(first_token_s(session, url, prompt) for _ in range(n)))
            worst = None if None in ttfts else max(t for t in ttfts if t is not None)
            groups.append(Group(n, lone, worst))
    return groups


# -- the run ---------------------------------------------------------------------------------


@dataclass
class Result:
    tally: Tally
    watches: list[Watch]  # the front's, then the upstream's
    drain_s: float | None
    last_readings: list[dict[str, Any]]
    events: list[list[dict[str, Any]]]  # each server's event log, in the same order
    load_s: float
    groups: list[Group] = field(default_factory=list)
    problems: dict[str, list[str]] = field(default_factory=dict)


async def load(started: Servers, args: argparse.Namespace) -> tuple[Tally, list[Watch], float]:
    tally = Tally()
    policy = RetryPolicy(RetryConfig(retry_on=("overloaded",), max_attempts=args.attempts))
    deadline = time.monotonic() + args.duration
    run = Run(started.front.url, tally, args.request_timeout, deadline, policy,
              relay=started.upstream is not None)  # fmt: skip
    watches, stop = [Watch(args.stall_s) for _ in started.all], asyncio.Event()
    watchers = [
        asyncio.create_task(watch(s.url, s.proc.pid, w, stop))
        for s, w in zip(started.all, watches, strict=True)
    ]
    begun = time.monotonic()
    rngs = [random.Random(f"{args.seed}-{n}") for n in range(args.clients)]
    n = args.clients
    await asyncio.gather(*(client(run, rng, ACTIONS[i::n]) for i, rng in enumerate(rngs)))
    load_s = time.monotonic() - begun
    stop.set()
    await asyncio.gather(*watchers)
    return tally, watches, load_s


def run_once(args: argparse.Namespace) -> Result:
    with (
        tempfile.TemporaryDirectory(prefix="interleavings-") as tmp,
        busy_loops(args.busy),
        servers(Path(tmp), args.serve_args, args.relay) as started,
    ):
        rng = random.Random(f"{args.seed}-groups")
        groups = asyncio.run(identical_groups(started.front.url, args.identical, rng))
        tally, watches, load_s = asyncio.run(load(started, args))
        urls = [s.url for s in started.all]
        drain_s, readings = asyncio.run(drain_time(urls, DRAIN_BOUND_S))
        for each in started.all:
            each.stop()
        events = [each.events() for each in started.all]
        if args.event_log:
            for each, suffix in zip(started.all, ("", ".upstream"), strict=False):
                shutil.copyfile(each.event_log, args.event_log + suffix)
    result = Result(tally, watches, drain_s, readings, events, load_s, groups)
    result.problems = check(result)
    return result


def check(result: Result) -> dict[str, list[str]]:
    tally = result.tally
    problems: dict[str, list[str]] = {name: [] for name in INVARIANTS}
    for where, events, watched in zip(("", "upstream "), result.events, result.watches,
                                      strict=False):  # fmt: skip
        for name, found in engine_checks(events).items():
            problems[name] += [where + line for line in found]
        problems["stalls"] += [where + line for line in sorted(watched.stalled.values())]
    logged = {line.split(":")[0] for line in problems["5xx"]}
    problems["5xx"] += [e for e in tally.server_errors if e.split(":")[0] not in logged]
    problems["lost streams"] += tally.lost
    problems["pause bound"] += tally.pause_violations
    front = result.events[0]
    started = {e["request_id"] for e in front if e["event"] in ("admitted", "routed")}
    problems["lost streams"] += [f"{i}: not in the event log" for i in sorted(tally.ids - started)]
    if result.drain_s is None or result.drain_s > DRAIN_BOUND_S:
        keys = ("kv_used_bytes", "requests_running", "requests_waiting")
        readings = [{k: r.get(k) for k in keys} for r in result.last_readings]
        problems["drained"].append(f"not within {DRAIN_BOUND_S:g} s of the load's end: {readings}")
    return problems


def figures(result: Result, args: argparse.Namespace) -> list[list[str]]:
    tally = result.tally
    events = [e for log in result.events for e in log]  # both servers'
    front = result.events[0]
    client_pauses = tally.pauses
    held = client_pauses - len(tally.pause_violations)
    rows = [
        ["seed", str(args.seed)],
        ["identical", "; ".join(g.describe() for g in result.groups) or "—"],
        ["load", f"{result.load_s:.1f} s, {args.clients} clients, {args.busy} busy loops"],
        ["actions", _counts(tally.actions)],
        ["requests", f"{tally.requests} sent, {len(tally.ids)} ids seen, "
                     f"{tally.first_tokens} with a first token, "
                     f"{sum(e['event'] == 'routed' for e in front)} relayed"],
        ["outcomes", _counts(tally.outcomes)],
        ["refusals", f"{_counts(tally.refused)} (503, retried)" if tally.refused else "—"],
        ["client wait", _spread(tally.waits_s) + " (first attempt to first token)"],
        ["engine pauses", _counts(Counter(str(e.get("cause")) for e in events
                                          if e["event"] == "paused"))],
        ["cache hits", str(sum(e["event"] == "cache_hit" for e in events))],
        ["TTFT", _ttft(events)],
        ["504s", _timeouts(events)],
        *(_peaks(name, w) for name, w in zip(("peaks", "upstream peaks"), result.watches,
                                             strict=False)),
        ["drained in", "—" if result.drain_s is None else f"{result.drain_s * 1000:.0f} ms"],
        ["client pauses", f"{held} of {client_pauses} within one token"
                        + (f" ({held / client_pauses:.0%})" if client_pauses else "")],
    ]  # fmt: skip
    for name in INVARIANTS:
        found = result.problems[name]
        rows.append([name, "ok" if not found else f"FAILED ({len(found)})"])
    return rows


def _peaks(name: str, watched: Watch) -> list[str]:
    kv_mib = watched.peak_kv_bytes / 2**20
    return [
        name,
        f"running {watched.peak_running}, waiting {watched.peak_waiting}, "
        f"KV {kv_mib:.1f} MiB ({watched.samples} readings)",
    ]


def _ttft(events: list[dict[str, Any]]) -> str:
    """Median and largest time to first token the engines logged (a relayed request's
    twice: the front's and the upstream's)."""
    return _spread([e["ttft_ms"] / 1000 for e in events if e["event"] == "first_token"])


def _spread(values: list[float]) -> str:
    if not values:
        return "—"
    values = sorted(values)
    return f"median {values[len(values) // 2]:.2f} s, max {values[-1]:.2f} s"


def _timeouts(events: list[dict[str, Any]]) -> str:
    """The requests that ended ``ttft_timeout``, with what admission predicted for them
    (the ``admitted`` line's ``predicted_ttft_ms``) and where they waited: a prediction
    under the time-out is a miss of the model, one over it a request deadline admission
    (when on) would have refused."""
    admitted = {e["request_id"]: e for e in events if e["event"] == "admitted"}
    timed_out = [e for e in events if e["event"] == "end" and e.get("error") == "ttft_timeout"]
    if not timed_out:
        return "none"
    lines = []
    for end in timed_out:
        start = admitted.get(end["request_id"], {})
        predicted = start.get("predicted_ttft_ms")
        lines.append(
            f"{end['request_id']} predicted "
            + ("—" if predicted is None else f"{predicted / 1000:.1f} s")
            + f" (queue position {start.get('queue_position')}, "
            f"prompt {start.get('n_prompt_tokens')})"
        )
    return f"{len(lines)}: " + "; ".join(lines)


def _sizes(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in text.split(",") if n.strip())


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{name} {n}" for name, n in sorted(counter.items())) or "—"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--busy", type=int, default=2, help="busy loops beside the server")
    parser.add_argument("--seed", type=int, help="the clients' choices (default: random)")
    parser.add_argument("--request-timeout", type=float, default=180.0,
                        help="seconds a request may take before it counts as lost")  # fmt: skip
    parser.add_argument("--stall-s", type=float, default=5.0,
                        help="a wait without a reason this long is a stall")  # fmt: skip
    parser.add_argument("--event-log", help="keep the front's event log here (the "
                        "upstream's: the same name + .upstream)")  # fmt: skip
    parser.add_argument("--no-relay", dest="relay", action="store_false",
                        help="no upstream: the relay action uses the local model")  # fmt: skip
    parser.add_argument("--attempts", type=int, default=3,
                        help="attempts per request while refused (503), the first "
                             "included")  # fmt: skip
    parser.add_argument("--identical", type=_sizes, default=(2, 4, 8),
                        help="sizes of the identical groups measured first (e.g. 2,4,8; "
                             "'' for none)")  # fmt: skip
    parser.add_argument("--serve-arg", dest="serve_args", action="append", default=[],
                        help="one more argument for edge-llm serve (repeatable)")  # fmt: skip
    add_output_flags(parser)
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(2**31)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"seed {args.seed} (replay the choices with --seed {args.seed})", flush=True)
    started, start = datetime.now(UTC), snapshot()
    result = run_once(args)
    machine = noise(start, snapshot(), own_pids())
    rows = figures(result, args)
    for name, value in rows:
        print(f"{name:>14}  {value}")
    for line in machine.lines():
        print(line)
    failed = [name for name in INVARIANTS if result.problems[name]]
    for name in failed:
        print(f"invariant {name!r} failed (seed {args.seed}):")
        for line in result.problems[name][:20]:
            print(f"  {line}")
    table = table_data("Random interleavings on the real model", ("figure", "value"), rows)
    run = header("interleavings", "Random interleavings", started, machine,
                 [f"seed {args.seed}; {args.clients} clients; {args.busy} busy loops; "
                  f"relay {'on' if args.relay else 'off'}; {args.attempts} attempts; "
                  f"serve {' '.join(args.serve_args) or 'as make run'}"])  # fmt: skip
    raw = {"seed": args.seed, "problems": result.problems, "failed": failed,
           "requests": result.tally.requests, "pauses": result.tally.pauses,
           "actions": dict(result.tally.actions), "outcomes": dict(result.tally.outcomes),
           "drain_s": result.drain_s, "refused": dict(result.tally.refused),
           "identical": [{"n": g.n, "lone_s": g.lone_s, "worst_s": g.worst_s, "ratio": g.ratio}
                         for g in result.groups]}  # fmt: skip
    write_outputs(args, run, [table], raw)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
