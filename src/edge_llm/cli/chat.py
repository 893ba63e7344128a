"""``edge-llm chat``: stream an answer to the terminal with the client config's policies.

With a prompt argument, one answer is streamed and the command exits (0 on
success, 1 with a one-line cause when the stream fails, 2 for a bad
configuration). Without one, it reads one user turn per line from stdin until
EOF, keeping the conversation (oldest turns are dropped to stay within
``max_prompt_tokens``, estimated at four characters a token).

Output is rendered at the config's ``chunk_interval_ms`` cadence (everything
queued is written each tick). ``--render-delay-ms N`` instead renders one chunk
every N ms, a slow renderer that fills the render queue so the watermarks,
PAUSE/RESUME (``--ws``) or socket read pauses (SSE) really happen;
``--no-pause`` keeps the renderer slow but never pauses the server. ``--priority``
sets the request's class (lower runs first). Before the first token a spinner on
stderr, when it is a terminal, shows where the request stands: "queued 3rd, ~2 s",
a prefill bar, "preempted" (it asks edge-llm for progress events then; over SSE
another server just shows "waiting"). Nothing of it reaches stdout.

With OpenTelemetry configured by the standard variables (``OTEL_EXPORTER_OTLP_ENDPOINT``,
...; see docs/observability.md) the command traces: each answer is a CLIENT span
(service ``edge-llm-chat`` unless ``OTEL_SERVICE_NAME`` says otherwise) with the
client's watermark and pause lines as events, and its ``traceparent`` makes the
engine's span its child.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import IO, TYPE_CHECKING, Any

from rich.console import Console
from rich.status import Status

from edge_llm.client import (
    ChatStream,
    ClientConfig,
    ClientError,
    ConfigError,
    ConnectError,
    Heartbeat,
    StreamClient,
    StreamResult,
)
from edge_llm.client.address import ServerAddress, add_address_flags
from edge_llm.client.config import load_client
from edge_llm.observability.events import EventLog
from edge_llm.observability.otel.settings import OtelConfigError, otel_settings

if TYPE_CHECKING:
    from edge_llm.observability.otel.sdk import Telemetry

PROG = "edge-llm chat"
CHAT_SERVICE_NAME = "edge-llm-chat"
BAR_WIDTH = 20
MIB = 1 << 20
CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "chat",
        help="stream an answer to the terminal (interactive without a prompt)",
        description="Stream a chat completion with the client config's TTFT, watermark and "
        "retry policies. Without a prompt, read one turn per line from stdin until EOF.",
    )
    parser.add_argument("prompt", nargs="?", help="the question (omit for interactive mode)")
    parser.add_argument("--config", help='client JSON file ({"edge_llm_client": {...}})')
    add_address_flags(parser)
    parser.add_argument(
        "--model",
        help="model id (default: $EDGE_LLM_MODEL, else the config's; none: the server's "
        "default model answers)",
    )
    parser.add_argument("--ws", action="store_true", help="use the engine's WebSocket protocol")
    parser.add_argument(
        "--render-delay-ms", type=int, default=0, help="slow renderer: N ms per chunk"
    )
    parser.add_argument("--event-log", help="append client events (JSONL) to this file")
    parser.add_argument(
        "--no-pause", action="store_true", help="never send PAUSE / stop reading when slow"
    )
    parser.add_argument("--max-tokens", type=int, help="max_tokens of each answer")
    parser.add_argument("--temperature", type=float, help="sampling temperature")
    parser.add_argument(
        "--priority", type=int, help="the request's class, -10..10 (lower runs first)"
    )
    parser.add_argument("--system", help="system prompt")
    parser.add_argument("--stats", action="store_true", help="print timings to stderr")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``edge-llm chat``; returns the exit code."""
    logging.basicConfig(level=logging.WARNING, format=f"{PROG}: %(levelname)s: %(message)s")
    try:
        config, address = load_client(args.config, overrides=_overrides(args))
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    if args.render_delay_ms < 0:
        print(f"{PROG}: --render-delay-ms must be >= 0", file=sys.stderr)
        return 2
    try:
        telemetry = _start_tracing()
    except OtelConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    event_log = EventLog(args.event_log, source="client") if args.event_log else None
    try:
        return asyncio.run(_main(args, config, address, event_log))
    finally:
        if event_log is not None:
            event_log.close()
        if telemetry is not None:
            telemetry.shutdown()  # exports the spans still held


def _start_tracing() -> Telemetry | None:
    """The process's tracer when the OTEL_* variables export traces (the client SDK then
    sends ``traceparent``); None otherwise, with nothing of OpenTelemetry imported."""
    settings = otel_settings(os.environ)
    if settings is None or settings.traces is None:
        return None
    from opentelemetry import trace  # noqa: PLC0415 (only when tracing is configured)

    from edge_llm.observability.otel.sdk import start_telemetry  # noqa: PLC0415

    name = settings.default_service_name and CHAT_SERVICE_NAME
    telemetry = start_telemetry(replace(settings, metrics=None, default_service_name=name))
    if telemetry.tracer_provider is not None:
        trace.set_tracer_provider(telemetry.tracer_provider)
    return telemetry


def _overrides(args: argparse.Namespace) -> dict[str, object]:
    return {
        "base_url": args.base_url,
        "api_key": args.api_key,
        "model_id": args.model,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
    }


async def _main(
    args: argparse.Namespace,
    config: ClientConfig,
    address: ServerAddress,
    event_log: EventLog | None,
) -> int:
    chat = Chat(
        config=config,
        address=address,
        transport="ws" if args.ws else "sse",
        render_delay_s=args.render_delay_ms / 1000,
        show_stats=args.stats,
        out=sys.stdout,
        err=sys.stderr,
        priority=args.priority,
    )
    conversation = Conversation(budget_tokens=config.max_prompt_tokens, system=args.system)
    sink = event_log.emit if event_log is not None else None
    async with StreamClient(config, event_log=sink, send_pause=not args.no_pause) as client:
        if args.prompt is not None:
            conversation.add("user", args.prompt)
            return 0 if await chat.turn(client, conversation) else 1
        return await _interactive(chat, client, conversation)


async def _interactive(chat: Chat, client: StreamClient, conversation: Conversation) -> int:
    failures = 0
    while True:
        if sys.stdin.isatty():
            print("> ", end="", file=sys.stderr, flush=True)
        line = await asyncio.to_thread(sys.stdin.readline)
        if not line:
            return 1 if failures else 0
        if not line.strip():
            continue
        conversation.add("user", line.strip())
        if not await chat.turn(client, conversation):
            failures += 1
            conversation.drop_last()


@dataclass
class Conversation:
    """The messages sent each turn, trimmed to an estimated token budget."""

    budget_tokens: int
    system: str | None = None
    turns: list[dict[str, str]] = field(default_factory=list)

    def add(self, role: str, content: str) -> None:
        self.turns.append({"role": role, "content": content})

    def drop_last(self) -> None:
        if self.turns:
            self.turns.pop()

    def messages(self) -> list[dict[str, str]]:
        """System prompt plus the newest turns that fit (the last one always)."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        kept: list[dict[str, str]] = []
        used = sum(_estimate(m) for m in head)
        for message in reversed(self.turns):
            used += _estimate(message)
            if kept and used > self.budget_tokens:
                break
            kept.append(message)
        return head + kept[::-1]


def _estimate(message: dict[str, str]) -> int:
    return len(message["content"]) // CHARS_PER_TOKEN + TOKENS_PER_MESSAGE


class Spinner:
    """A transient spinner on stderr before the first token (only on a terminal)."""

    def __init__(self, err: IO[str]) -> None:
        self._status: Status | None = None
        if err.isatty():
            self._status = Console(file=err).status("waiting for the first token")

    def __enter__(self) -> Spinner:
        if self._status is not None:
            self._status.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def shown(self) -> bool:
        return self._status is not None

    def heartbeat(self, beat: Heartbeat) -> None:
        if self._status is not None:
            self._status.update(_progress_text(beat))

    def stop(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None


def _progress_text(beat: Heartbeat) -> str:
    """The spinner's line for one progress event."""
    wait = "" if beat.predicted_wait_ms is None else f", ~{_seconds(beat.predicted_wait_ms)}"
    if beat.state == "queued":
        place = "" if beat.queue_position is None else f" {_ordinal(beat.queue_position)}"
        return f"queued{place}{wait}"
    if beat.state == "preempted":
        return "preempted by a more urgent request (it resumes by itself)"
    if beat.state == "prefill" and beat.prefill_total:
        fraction = (beat.prefill_done or 0) / beat.prefill_total
        return (
            f"prefill {_bar(fraction)} {fraction:.0%} of {beat.prefill_total} prompt tokens{wait}"
        )
    if beat.state == "downloading":
        return _downloading(beat.download_done or 0, beat.download_total)
    if beat.state == "loading":
        return "loading the model"
    if beat.state:
        return f"waiting for the first token (engine: {beat.state}{wait})"
    return "waiting for the first token (server alive)"


def _bar(fraction: float) -> str:
    filled = round(fraction * BAR_WIDTH)
    return "█" * filled + "░" * (BAR_WIDTH - filled)


def _downloading(done: int, total: int | None) -> str:
    """A model pulled on first use: its file's bytes so far (of its size once known)."""
    if not total:
        return f"downloading the model, {done / MIB:.0f} MiB"
    fraction = done / total
    return f"downloading the model {_bar(fraction)} {fraction:.0%} of {total / MIB:.0f} MiB"


def _seconds(ms: int) -> str:
    """``0.4 s``, ``2 s``, ``12 s``: a tenth of a second only while it matters."""
    text = f"{ms / 1000:.1f}" if ms < 10_000 else f"{ms / 1000:.0f}"
    return text.removesuffix(".0") + " s"


def _ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, ..., 21st."""
    teen = 10 <= n % 100 <= 20
    suffix = "th" if teen else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


@dataclass
class Chat:
    """Streams turns to ``out``; reports failures on ``err`` in one line."""

    config: ClientConfig
    address: ServerAddress  # where the base URL came from, for the unreachable message
    transport: str
    render_delay_s: float
    show_stats: bool
    out: IO[str]
    err: IO[str]
    priority: int | None = None

    async def turn(self, client: StreamClient, conversation: Conversation) -> bool:
        """Stream one answer; True on success (the answer joins the conversation)."""
        try:
            result = await self._stream(client, conversation)
        except ClientError as exc:
            self.out.write("\n")
            self.out.flush()
            message = self.address.unreachable(exc) if isinstance(exc, ConnectError) else None
            print(f"{PROG}: {message or f'{exc.code}: {exc.message}'}", file=self.err, flush=True)
            return False
        conversation.add("assistant", result.text)
        if self.show_stats:
            print(_stats_line(result), file=self.err, flush=True)
        return True

    async def _stream(self, client: StreamClient, conversation: Conversation) -> StreamResult:
        with Spinner(self.err) as spinner:
            async with client.stream(
                conversation.messages(),
                transport="ws" if self.transport == "ws" else "sse",
                on_heartbeat=spinner.heartbeat,
                priority=self.priority,
                progress=spinner.shown,  # asked for only where someone sees it
            ) as stream:
                await self._render(stream, spinner.stop)
        return stream.result

    async def _render(self, stream: ChatStream, first_token: Callable[[], None]) -> None:
        loop = asyncio.get_running_loop()
        cadence = self.config.chunk_interval_ms / 1000
        async for text in stream:
            first_token()
            batch = [text] if self.render_delay_s else [text, *await stream.drain()]
            tick = loop.time()
            if self.config.stream:
                self.out.write("".join(batch))
                self.out.flush()
            delay = self.render_delay_s or cadence
            await asyncio.sleep(max(0.0, tick + delay - loop.time()))
        if not self.config.stream:
            self.out.write(stream.result.text)
        self.out.write("\n")
        self.out.flush()


def _stats_line(result: StreamResult) -> str:
    parts: list[Any] = [f"{result.n_tokens} tokens", f"{result.transport}"]
    if result.ttft_ms is not None:
        parts.append(f"ttft {result.ttft_ms:.0f} ms")
    if len(result.itl_ms) > 0 and result.e2e_ms is not None and result.ttft_ms is not None:
        span = (result.e2e_ms - result.ttft_ms) / 1000
        if span > 0:
            parts.append(f"{len(result.itl_ms) / span:.1f} chunks/s")
    parts.append(f"{result.pauses} pauses")
    if result.attempts > 1:
        parts.append(f"{result.attempts} attempts")
    return f"{PROG}: " + ", ".join(str(p) for p in parts) + f" [{result.request_id}]"
