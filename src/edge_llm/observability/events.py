"""JSONL event logs, written by both the engine and the client.

Every line is one JSON object with at least ``ts`` (wall clock, Unix seconds),
``mono`` (monotonic seconds, for intervals), ``event`` and ``request_id``.
Writing happens on a background thread behind a bounded queue, so the engine's
inference thread never waits on the disk; lines that do not fit are counted in
``dropped`` and reported in the final ``log_closed`` line.

Engine events: ``admitted``, ``rejected``, ``prefill_progress``, ``first_token``,
``pause_received``, ``paused``, ``resume_received``, ``resumed``,
``token_while_paused``, ``cancel``, ``kv_freed``, ``cache_hit``, ``cache_evicted``,
``offloaded``, ``restored``, ``end``.
Client events: ``request_sent``, ``first_byte``, ``first_token``, ``ttft_warn``,
``watermark_high``, ``watermark_low``, ``pause_sent``, ``resume_sent``,
``read_paused``, ``read_resumed``, ``cancel_sent``, ``retry``, ``error``, ``end``.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

EventSink = Callable[..., None]

_CLOSE = object()


class EventLog:
    """Append JSON lines to a file from any thread without blocking the caller."""

    def __init__(self, path: str | Path, *, source: str, max_pending: int = 10000) -> None:
        self.path = Path(path)
        self.source = source
        self.dropped = 0
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max_pending)
        self._file: IO[str] = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._thread = threading.Thread(target=self._drain, name=f"{source}-event-log", daemon=True)
        self._thread.start()

    def emit(self, event: str, request_id: str | None = None, **fields: Any) -> None:
        record = {
            "ts": round(time.time(), 6),
            "mono": round(time.monotonic(), 6),
            "source": self.source,
            "event": event,
            "request_id": request_id,
            **fields,
        }
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        self.emit("log_closed", dropped=self.dropped)
        self._queue.put(_CLOSE)
        self._thread.join(timeout=5)
        self._file.close()

    def _drain(self) -> None:
        while True:
            record = self._queue.get()
            if record is _CLOSE:
                self._file.flush()
                return
            self._file.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
            if self._queue.empty():
                self._file.flush()


def null_sink(event: str, request_id: str | None = None, **fields: Any) -> None:
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
