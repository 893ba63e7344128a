"""The event log never stops the engine: lines it cannot write are counted."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from edge_llm.observability.events import EventLog, read_events
from edge_llm.observability.metrics import EngineMetrics

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
