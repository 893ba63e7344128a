"""JSONL event logs, written by both the engine and the client.

Every line is one JSON object with at least ``ts`` (wall clock, Unix seconds),
``mono`` (monotonic seconds, for intervals), ``event`` and ``request_id``.
Writing happens on a background thread behind a bounded queue, so the engine's
inference thread never waits on the disk; lines that do not fit in the queue or
on the disk, or come after ``close``, are counted in ``dropped`` (and by ``on_drop``:
the engine's ``edge_llm_event_log_dropped_total``); the final ``log_closed`` line
reports those before it. Every line emitted before ``close`` is written.

Every event name is a member of :class:`Event`; its comments say who writes each.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterable
from enum import StrEnum
from pathlib import Path
from typing import IO, Any, Protocol


class Event(StrEnum):
    """The name of every event line, as written (``event``) and read (``blame``).

    Every emitter passes a member (``tests/unit/test_event_names.py``); a member is a
    ``str``, so it is written as its value.
    """

    # Engine, per request: admission to end.
    ADMITTED = "admitted"
    REJECTED = "rejected"
    SCHEDULED = "scheduled"  # given a slot (the slot kv_freed later names)
    PREFILL_PROGRESS = "prefill_progress"
    FIRST_TOKEN = "first_token"  # also the client's and the upstream relay's
    PAUSE_RECEIVED = "pause_received"  # also the upstream relay's
    PAUSED = "paused"  # also the upstream relay's
    RESUME_RECEIVED = "resume_received"  # also the upstream relay's
    RESUMED = "resumed"  # also the upstream relay's
    TOKEN_WHILE_PAUSED = "token_while_paused"
    TTFT_TIMEOUT = "ttft_timeout"
    PAUSE_TIMEOUT = "pause_timeout"
    CANCEL = "cancel"  # also the upstream relay's
    # Server: a resumable stream's connection dropped, and it was not resumed in time.
    DETACHED = "detached"
    RESUME_TIMEOUT = "resume_timeout"
    KV_FREED = "kv_freed"
    END = "end"  # also the client's and the upstream relay's
    # Engine: the prefix cache and offload.
    CACHE_HIT = "cache_hit"
    CACHE_EVICTED = "cache_evicted"
    OFFLOADED = "offloaded"
    RESTORED = "restored"
    # Engine: device memory under min_available_mb, and back above it.
    MEMORY_PRESSURE = "memory_pressure"
    MEMORY_RECOVERED = "memory_recovered"
    # Engine: the thread governor changed the decode threads (with its reading and why).
    DECODE_THREADS = "decode_threads"
    # Server: admission details and upstreams.
    MAX_TOKENS_CLAMPED = "max_tokens_clamped"
    PROMPT = "prompt"  # the prompt text, with log_prompts on
    ROUTED = "routed"  # relayed to an upstream (its backend and route)
    UPSTREAM_FAILOVER = "upstream_failover"
    UPSTREAM_HEALTH = "upstream_health"
    # Server: models loaded and unloaded (models/pool.py).
    MODEL_LOADING = "model_loading"
    MODEL_LOADED = "model_loaded"
    MODEL_LOAD_FAILED = "model_load_failed"
    MODEL_UNLOADED = "model_unloaded"
    # Client.
    REQUEST_SENT = "request_sent"
    FIRST_BYTE = "first_byte"
    TTFT_WARN = "ttft_warn"
    WATERMARK_HIGH = "watermark_high"
    WATERMARK_LOW = "watermark_low"
    PAUSE_SENT = "pause_sent"
    RESUME_SENT = "resume_sent"
    READ_PAUSED = "read_paused"
    READ_RESUMED = "read_resumed"
    CANCEL_SENT = "cancel_sent"
    RETRY = "retry"
    ERROR = "error"
    # Every log's last line.
    LOG_CLOSED = "log_closed"


class EventSink(Protocol):
    def __call__(self, event: Event, request_id: str | None = None, /, **fields: Any) -> None:
        """Write one event line (never blocks the caller)."""


# (reason, lines): "queue_full", "write_failed" or "closed" (emitted after close)
DropCounter = Callable[[str, int], None]

_CLOSE = object()
_MAX_BATCH = 256


class EventLog:
    """Append JSON lines to a file from any thread without blocking the caller.

    A line that cannot be written (the queue is full, or the disk: ENOSPC, EFBIG,
    EIO) is counted in ``dropped`` and reported to ``on_drop``; the writer keeps
    going and later lines are written again as soon as the file takes them. The
    writer closes the file after the last line: ``close`` waits ``close_timeout_s``
    for it, and a slower disk still gets every line.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        source: str,
        max_pending: int = 10000,
        on_drop: DropCounter | None = None,
        close_timeout_s: float = 5.0,
    ) -> None:
        self.path = Path(path)
        self.source = source
        self.dropped = 0
        self.close_timeout_s = close_timeout_s
        self._on_drop = on_drop
        # Held for one put_nowait: no line enters the queue after the closing one.
        self._lock = threading.Lock()
        self._closed = False
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max_pending)
        # Unbuffered: each batch is one write() whose outcome is known at once.
        self._file: IO[bytes] = open(self.path, "ab", buffering=0)  # noqa: SIM115
        self._partial_line = False
        self._thread = threading.Thread(target=self._drain, name=f"{source}-event-log", daemon=True)
        self._thread.start()

    def emit(self, event: Event, request_id: str | None = None, /, **fields: Any) -> None:
        record = self._record(event, request_id, fields)
        with self._lock:
            if self._closed:
                self._drop("closed", 1)
                return
            try:
                self._queue.put_nowait(record)
            except queue.Full:
                self._drop("queue_full", 1)

    def _record(self, event: str, request_id: str | None, fields: dict[str, Any]) -> object:
        return {
            "ts": round(time.time(), 6),
            "mono": round(time.monotonic(), 6),
            "source": self.source,
            "event": event,
            "request_id": request_id,
            **fields,
        }

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            closing = self._record(Event.LOG_CLOSED, None, {"dropped": self.dropped})
        if not self._thread.is_alive():
            return  # its file is closed
        # Waits for room (nothing else enters now): the closing line says how many
        # lines were lost.
        self._queue.put(closing)
        self._queue.put(_CLOSE)
        self._thread.join(timeout=self.close_timeout_s)

    def _drop(self, reason: str, lines: int) -> None:
        self.dropped += lines
        if self._on_drop is not None:
            self._on_drop(reason, lines)

    def _drain(self) -> None:
        try:
            while True:
                batch = self._next_batch()
                records = [record for record in batch if record is not _CLOSE]
                if records:
                    self._write(records)
                if len(records) < len(batch):
                    return
        finally:
            self._file.close()

    def _next_batch(self) -> list[object]:
        batch = [self._queue.get()]
        while len(batch) < _MAX_BATCH:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _write(self, records: list[object]) -> None:
        data = b"".join(_encode_line(record) for record in records)
        if self._partial_line and not self._write_all(b"\n"):
            self._drop("write_failed", len(records))
            return
        written = self._write_some(data)
        self._partial_line = written > 0 and data[written - 1 : written] != b"\n"
        lost = len(records) - data[:written].count(b"\n")
        if lost:
            self._drop("write_failed", lost)

    def _write_all(self, data: bytes) -> bool:
        return self._write_some(data) == len(data)

    def _write_some(self, data: bytes) -> int:
        """Bytes the file took; a full disk takes part of a batch or nothing."""
        try:
            return self._file.write(data) or 0
        except OSError:
            return 0


def _encode_line(record: object) -> bytes:
    # backslashreplace: a field that is not valid Unicode must not stop the writer.
    try:
        text = json.dumps(record, ensure_ascii=False, default=str)
    except (TypeError, ValueError):  # a dict keyed by non-strings, a cycle: those as str
        plain = {k: _plain(v) for k, v in record.items()} if isinstance(record, dict) else None
        text = json.dumps(plain or str(record), ensure_ascii=False, default=str)
    return (text + "\n").encode("utf-8", "backslashreplace")


def _plain(value: object) -> object:
    """``value`` if json takes it, else its str."""
    try:
        json.dumps(value, default=str)
    except (TypeError, ValueError):
        return str(value)
    return value


def null_sink(event: Event, request_id: str | None = None, /, **fields: Any) -> None:
    """Event sink used when no log file is configured."""


def parse_event_lines(lines: Iterable[str]) -> tuple[list[dict[str, Any]], int]:
    """JSON objects with an ``event`` key, and how many non-blank lines were not."""
    events: list[dict[str, Any]] = []
    skipped = 0
    for raw in lines:
        text = raw.strip()
        if not text:
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict) and "event" in record:
            events.append(record)
        else:
            skipped += 1
    return events, skipped


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """Parse a JSONL event log, skipping blank or broken lines."""
    with open(path, encoding="utf-8") as fh:
        return parse_event_lines(fh)[0]
