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

every request with a random priority (-1, 0 or 1); the clients' first actions cover
all seven. Before the clients, the issue's goal for identical prompts is measured (a
figure, not an invariant): for each ``--identical`` size, a lone streamed chat's TTFT,
then that many identical ones sent at once, and the worst one's TTFT over the lone
one's (goal: 2x; past ``max_sequences``, 4 by default, the rest wait for a slot).
Then it checks the contract's invariants and prints them with the figures and the
seed (``--seed`` replays the choices; the timing is the machine's):

- ``stalls``: ``/debug/streams`` shows no wait without a reason that can end for
  ``--stall-s`` seconds (``Watch`` says which);
- ``5xx``: no response status, error frame or error event with a 5xx code (a
  ``ttft_timeout`` is a 504: on a machine too busy for the load, the run says so here);
- ``lost streams``: every request a client sent ends (a response, a ``done`` or error
  frame) within ``--request-timeout``, and every request the event log admits has one
  ``end`` line; a WebSocket stream's deltas carry as many tokens as its ``usage`` says;
- ``drained``: KV in use, running and waiting requests at 0 within 1 s of the load's end;
- ``pause bound``: after a ``paused`` frame a client receives at most one token before
  ``resumed``, and the event log has at most one ``token_while_paused`` per pause.

A failure names the invariant and exits 1.

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
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from contention import busy_loops
from machine import noise, own_pids, snapshot
from output import add_output_flags, header, write_outputs

from edge_llm.bench.publish import table_data
from edge_llm.errors import EdgeLLMError

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
ACTIONS = ("identical", "prefix", "chat", "pause", "cancel", "disconnect", "regenerate")
INVARIANTS = ("stalls", "5xx", "lost streams", "drained", "pause bound")


def server_error_codes() -> frozenset[str]:
    """Every error code the engine answers with a 5xx status (errors.py)."""
    codes, todo = set(), list(EdgeLLMError.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if isinstance(cls.status, int) and cls.status >= 500:
            codes.add(cls.code)
    return frozenset(codes)


SERVER_ERRORS = server_error_codes()


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
    a disconnect). Its outcome goes to the tally."""
    tally = run.tally
    tally.requests += 1
    request_id: str | None = None
    try:
        async with asyncio.timeout(run.request_timeout):
            async with session.post(run.url + path, json=body, headers=headers) as response:
                request_id = response.headers.get("X-Request-Id")
                if request_id:
                    tally.ids.add(request_id)
                if response.status != 200:
                    code = (await _error_of(response)) or str(response.status)
                    tally.ended(f"status {response.status}", request_id, code)
                    if response.status >= 500:
                        tally.server_errors.append(f"{request_id}: status {response.status}")
                    return
                await _read_sse(tally, response, request_id, drop_after)
    except TimeoutError:
        tally.lost.append(f"{request_id or path}: no end within {run.request_timeout:.0f} s")
    except aiohttp.ClientError as error:
        tally.lost.append(f"{request_id or path}: {error!r}")


async def _error_of(response: aiohttp.ClientResponse) -> str | None:
    try:
        document = await response.json(content_type=None)
    except (ValueError, aiohttp.ClientError):
        return None
    error = document.get("error") if isinstance(document, dict) else None
    return str(error.get("code")) if isinstance(error, dict) else None


async def _read_sse(
    tally: Tally, response: aiohttp.ClientResponse, request_id: str | None, drop_after: int | None
) -> None:
    events = 0
    if drop_after == 0:
        tally.ended("disconnected", request_id)
        response.close()
        return
    async for raw in response.content:
        line = raw.decode().strip()
        if line == "data: [DONE]":
            tally.ended("completed", request_id)
            return
        if not line.startswith("data: "):
            continue
        data = json.loads(line.removeprefix("data: "))
        if "error" in data:
            tally.ended("error", request_id, str(data["error"].get("code")))
            return
        events += 1
        tally.first_tokens += events == 1
        if drop_after is not None and events >= drop_after:
            tally.ended("disconnected", request_id)
            response.close()
            return
    tally.lost.append(f"{request_id}: the SSE stream ended without [DONE] or an error")


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
    cancelled after ``cancel_after`` deltas; read to its ``done`` or ``error`` frame."""
    tally = run.tally
    tally.requests += 1
    stream = WsStream(tally, rng, pauses, cancel_after)
    url = run.url.replace("http", "ws") + "/v1/stream"
    try:
        async with asyncio.timeout(run.request_timeout):
            async with session.ws_connect(url) as ws:
                await ws.send_json({"type": "start", "request": body})
                await stream.run(ws)
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
                self.tally.first_tokens += self.tokens == 0
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
                self.tally.ended("error", self.id, str(frame["code"]))
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


ACTION_OF: dict[str, Action] = {
    "identical": identical, "prefix": prefix, "chat": chat, "pause": pause,
    "cancel": cancel, "disconnect": disconnect, "regenerate": regenerate,
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
        waiting = [s for s in document["streams"] if _waits_for_first_token(s)]
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


async def drain_time(url: str, bound_s: float) -> tuple[float | None, dict[str, Any]]:
    """Seconds until KV in use, running and waiting requests read 0 (None: not within
    ``bound_s`` plus a margin to say by how much), and the last reading."""
    start = time.monotonic()
    async with aiohttp.ClientSession() as session:
        while True:
            async with session.get(url + "/debug/streams") as response:
                document = await response.json()
            took = time.monotonic() - start
            if (
                document["kv_used_bytes"] == 0
                and document["requests_running"] == 0
                and document["requests_waiting"] == 0
            ):
                return took, document
            if took > bound_s * 5:
                return None, document
            await asyncio.sleep(POLL_S)  # a reading of the server's state, polled


def engine_checks(events: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The invariants the event log shows: one end per admitted request, no 5xx
    error (a ttft_timeout is a 504), at most one token per pause."""
    admitted = {e["request_id"] for e in events if e["event"] == "admitted"}
    ends = Counter(e["request_id"] for e in events if e["event"] == "end")
    problems: dict[str, list[str]] = {name: [] for name in INVARIANTS}
    for request_id in sorted(admitted):
        if ends[request_id] != 1:
            problems["lost streams"].append(f"{request_id}: {ends[request_id]} end lines")
    for e in events:
        if e["event"] == "end" and e.get("error") in SERVER_ERRORS:
            problems["5xx"].append(f"{e['request_id']}: ended {e['error']} (event log)")
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
    watch: Watch
    drain_s: float | None
    last_reading: dict[str, Any]
    events: list[dict[str, Any]]
    load_s: float
    groups: list[Group] = field(default_factory=list)
    problems: dict[str, list[str]] = field(default_factory=dict)


async def load(server: Server, args: argparse.Namespace) -> tuple[Tally, Watch, float]:
    tally = Tally()
    run = Run(server.url, tally, args.request_timeout, time.monotonic() + args.duration)
    seen, stop = Watch(args.stall_s), asyncio.Event()
    watcher = asyncio.create_task(watch(server.url, server.proc.pid, seen, stop))
    started = time.monotonic()
    rngs = [random.Random(f"{args.seed}-{n}") for n in range(args.clients)]
    n = args.clients
    await asyncio.gather(*(client(run, rng, ACTIONS[i::n]) for i, rng in enumerate(rngs)))
    load_s = time.monotonic() - started
    stop.set()
    await watcher
    return tally, seen, load_s


def run_once(args: argparse.Namespace) -> Result:
    with (
        tempfile.TemporaryDirectory(prefix="interleavings-") as tmp,
        busy_loops(args.busy),
        server(Path(tmp), args.serve_args) as started,
    ):
        rng = random.Random(f"{args.seed}-groups")
        groups = asyncio.run(identical_groups(started.url, args.identical, rng))
        tally, seen, load_s = asyncio.run(load(started, args))
        drain_s, reading = asyncio.run(drain_time(started.url, DRAIN_BOUND_S))
        started.stop()
        events = started.events()
        if args.event_log:
            shutil.copyfile(started.event_log, args.event_log)
    result = Result(tally, seen, drain_s, reading, events, load_s, groups)
    result.problems = check(result)
    return result


def check(result: Result) -> dict[str, list[str]]:
    tally, seen = result.tally, result.watch
    problems = engine_checks(result.events)
    problems["stalls"] += sorted(seen.stalled.values())
    logged = {line.split(":")[0] for line in problems["5xx"]}
    problems["5xx"] += [e for e in tally.server_errors if e.split(":")[0] not in logged]
    problems["lost streams"] += tally.lost
    problems["pause bound"] += tally.pause_violations
    admitted = {e["request_id"] for e in result.events if e["event"] == "admitted"}
    problems["lost streams"] += [f"{i}: not in the event log" for i in sorted(tally.ids - admitted)]
    if result.drain_s is None or result.drain_s > DRAIN_BOUND_S:
        reading = {k: result.last_reading.get(k) for k in
                   ("kv_used_bytes", "requests_running", "requests_waiting")}  # fmt: skip
        problems["drained"].append(f"not within {DRAIN_BOUND_S:g} s of the load's end: {reading}")
    return problems


def figures(result: Result, args: argparse.Namespace) -> list[list[str]]:
    tally, events = result.tally, result.events
    pauses = count_pauses(events)
    client_pauses = tally.pauses
    held = client_pauses - len(tally.pause_violations)
    rows = [
        ["seed", str(args.seed)],
        ["identical", "; ".join(g.describe() for g in result.groups) or "—"],
        ["load", f"{result.load_s:.1f} s, {args.clients} clients, {args.busy} busy loops"],
        ["actions", _counts(tally.actions)],
        ["requests", f"{tally.requests} sent, {len(tally.ids)} ids seen, "
                     f"{tally.first_tokens} with a first token"],
        ["outcomes", _counts(tally.outcomes)],
        ["engine pauses", _counts(pauses)],
        ["cache hits", str(sum(e["event"] == "cache_hit" for e in events))],
        ["TTFT", _ttft(events)],
        ["peaks", f"running {result.watch.peak_running}, waiting {result.watch.peak_waiting}, "
                  f"KV {result.watch.peak_kv_bytes / 2**20:.1f} MiB "
                  f"({result.watch.samples} readings)"],
        ["drained in", "—" if result.drain_s is None else f"{result.drain_s * 1000:.0f} ms"],
        ["client pauses", f"{held} of {client_pauses} within one token"
                        + (f" ({held / client_pauses:.0%})" if client_pauses else "")],
    ]  # fmt: skip
    for name in INVARIANTS:
        found = result.problems[name]
        rows.append([name, "ok" if not found else f"FAILED ({len(found)})"])
    return rows


def _ttft(events: list[dict[str, Any]]) -> str:
    """Median and largest time to first token the engine logged."""
    values = sorted(e["ttft_ms"] for e in events if e["event"] == "first_token")
    if not values:
        return "—"
    return f"median {values[len(values) // 2] / 1000:.2f} s, max {values[-1] / 1000:.2f} s"


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
    parser.add_argument("--event-log", help="keep the server's event log here")
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
                 [f"seed {args.seed}; {args.clients} clients; {args.busy} busy loops"])  # fmt: skip
    raw = {"seed": args.seed, "problems": result.problems, "failed": failed,
           "requests": result.tally.requests, "pauses": result.tally.pauses,
           "actions": dict(result.tally.actions), "outcomes": dict(result.tally.outcomes),
           "drain_s": result.drain_s,
           "identical": [{"n": g.n, "lone_s": g.lone_s, "worst_s": g.worst_s, "ratio": g.ratio}
                         for g in result.groups]}  # fmt: skip
    write_outputs(args, run, [table], raw)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
