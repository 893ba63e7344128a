"""The event log never stops the engine: lines it cannot write are counted; closing
it loses no line without a trace."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from edge_llm.observability.events import EventLog, read_events
from edge_llm.observability.metrics import EngineMetrics
from edge_llm.protocol.stream_rules import PauseCause

DEV_FULL = Path("/dev/full")


class Drops:
    def __init__(self) -> None:
        self.lines: dict[str, int] = {}
        self.seen = threading.Event()

    def __call__(self, reason: str, lines: int) -> None:
        self.lines[reason] = self.lines.get(reason, 0) + lines
        self.seen.set()


@pytest.mark.skipif(not DEV_FULL.exists(), reason="needs /dev/full")
def test_a_full_disk_drops_and_counts_lines_and_the_writer_survives() -> None:
    drops = Drops()
    log = EventLog(DEV_FULL, source="engine", on_drop=drops)
    for i in range(50):
        log.emit("token", "r1", n=i)
    assert drops.seen.wait(30)
    log.emit("end", "r1", text="\ud800 not encodable")  # still no exception anywhere
    log.close()
    assert drops.lines == {"write_failed": 52}  # 50 + end + log_closed
    assert log.dropped == 52


def test_lines_are_written_and_a_bad_string_does_not_stop_the_writer(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog(path, source="engine")
    log.emit("admitted", "r1", session="\udc80")
    log.emit("end", "r1")
    log.close()
    events = read_events(path)
    assert [e["event"] for e in events] == ["admitted", "end", "log_closed"]
    assert events[0]["session"] == "\udc80"  # written as the escape \udc80
    assert events[-1]["dropped"] == 0


def test_a_full_queue_counts_in_the_engine_metric(tmp_path: Path) -> None:
    metrics = EngineMetrics()
    log = EventLog(
        tmp_path / "e.jsonl", source="engine", max_pending=1, on_drop=metrics.count_event_log_drop
    )
    for _ in range(2000):
        log.emit("token", "r1")
    log.close()
    text = metrics.render().decode()
    line = next(
        ln
        for ln in text.splitlines()
        if ln.startswith('edge_llm_event_log_dropped_total{reason="queue_full"}')
    )
    assert float(line.split()[-1]) == log.dropped > 0
    written = (tmp_path / "e.jsonl").read_text().splitlines()
    assert len(written) + log.dropped == 2001
    assert json.loads(written[-1])["dropped"] == log.dropped


# -- close() loses no line without a trace ----------------------------------------------


class _HeldFile:
    """The log's file, whose writes wait until the test lets them through."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.released = threading.Event()

    def write(self, data: bytes) -> int | None:
        assert self.released.wait(30)
        return self.inner.write(data)  # type: ignore[no-any-return]

    def close(self) -> None:
        self.inner.close()


def test_a_writer_slower_than_the_close_timeout_still_writes_every_line(tmp_path: Path) -> None:
    """close() gives up waiting after its time-out; the writer goes on and closes the
    file itself (the file closed under it lost the lines it still held)."""
    path = tmp_path / "events.jsonl"
    log = EventLog(path, source="engine", close_timeout_s=0.05)
    held = _HeldFile(log._file)
    log._file = held  # type: ignore[assignment]
    log.emit("admitted", "r1")
    log.emit("end", "r1", finish_reason="stop")
    log.close()  # returns after its time-out, the writer still held
    held.released.set()
    log._thread.join(30)
    assert [e["event"] for e in read_events(path)] == ["admitted", "end", "log_closed"]
    assert log.dropped == 0


def test_a_line_emitted_after_close_is_counted_as_dropped(tmp_path: Path) -> None:
    drops = Drops()
    log = EventLog(tmp_path / "events.jsonl", source="engine", on_drop=drops)
    log.emit("admitted", "r1")
    log.close()
    log.emit("end", "r1")  # too late for the file: counted, never silently gone
    assert drops.lines == {"closed": 1} and log.dropped == 1
    assert [e["event"] for e in read_events(tmp_path / "events.jsonl")] == [
        "admitted",
        "log_closed",
    ]


def test_lines_emitted_while_the_log_closes_are_written_or_counted(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog(path, source="engine")
    emitted = 0
    started, stop = threading.Event(), threading.Event()

    def emit_until_stopped() -> None:
        nonlocal emitted
        while not stop.is_set():
            log.emit("prefill_progress", "r1", n=emitted)
            emitted += 1
            if emitted == 200:
                started.set()

    emitter = threading.Thread(target=emit_until_stopped)
    emitter.start()
    assert started.wait(30)
    log.close()
    stop.set()
    emitter.join(30)
    written = [e for e in read_events(path) if e["event"] != "log_closed"]
    assert [e["n"] for e in written] == list(range(len(written)))  # in order, no gap
    assert len(written) + log.dropped == emitted


def test_a_field_json_cannot_take_does_not_stop_the_writer(tmp_path: Path) -> None:
    """A dict keyed by an enum (json takes string keys only): the field is written as
    its str, and the lines after it are written too."""
    path = tmp_path / "events.jsonl"
    log = EventLog(path, source="engine")
    log.emit("paused", "r1", causes={PauseCause.CLIENT: 1.0}, n=3)
    log.emit("end", "r1")
    log.close()
    events = read_events(path)
    assert [e["event"] for e in events] == ["paused", "end", "log_closed"]
    assert events[0]["n"] == 3 and "client" in events[0]["causes"]
