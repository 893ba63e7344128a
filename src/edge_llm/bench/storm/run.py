"""Runs a storm against several targets, interleaved, and gathers the figures.

Targets take turns, never overlapping (two servers on one small machine would steal
each other's CPU): round 1 runs the whole storm against A, then B; round 2 against B,
then A; and so on. Every run uses the same seeded users and prompts, so each target sees
the same load. Before each run the target is given time to become idle (nothing running
or waiting), so leftovers of the previous run do not count against it. With
``fit_prompts`` the prompt range is first lowered to the smallest ``max_prompt_tokens``
a target reports; the result's config holds the range that ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from edge_llm.bench.chat_stream import Clock
from edge_llm.bench.runner import discover_model, host_info
from edge_llm.bench.storm.load import StormSettings, fitted
from edge_llm.bench.storm.stats import StormSummary, TargetRunData, summarize_storm
from edge_llm.bench.storm.user import Counters, StormRecord, TargetRun
from edge_llm.bench.storm.watch import ServerSample, ServerWatch
from edge_llm.bench.targets import Target

IDLE_POLL_S = 0.25


@dataclass(frozen=True, slots=True)
class StormConfig:
    targets: tuple[Target, ...]
    settings: StormSettings = field(default_factory=StormSettings)
    rounds: int = 1
    pids: dict[str, int] = field(default_factory=dict)
    sample_interval_s: float = 0.5
    idle_timeout_s: float = 60.0

    def to_json(self) -> dict[str, Any]:
        return {
            "targets": [t.describe() for t in self.targets],
            "settings": self.settings.to_json(),
            "rounds": self.rounds,
            "pids": self.pids,
            "sample_interval_s": self.sample_interval_s,
        }


@dataclass
class LiveState:
    """What the live view shows: the run under way and every target's counters."""

    target: str = ""
    round: int = 0
    elapsed_s: float = 0.0
    counters: dict[str, Counters] = field(default_factory=dict)
    last_sample: dict[str, ServerSample] = field(default_factory=dict)


@dataclass
class TargetRunResult:
    target: str
    round: int
    data: TargetRunData

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "round": self.round,
            "duration_s": self.data.duration_s,
            "counters_before": vars_of(self.data.before),
            "counters_after": vars_of(self.data.after),
            "samples": [s.to_json() for s in self.data.samples],
        }


def vars_of(obj: object) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in getattr(obj, "__slots__", ())}


@dataclass
class StormResult:
    config: StormConfig
    started_at: str
    host: dict[str, Any]
    run_tag: str
    records: list[StormRecord] = field(default_factory=list)
    runs: list[TargetRunResult] = field(default_factory=list)
    summaries: list[StormSummary] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "config": self.config.to_json(),
            "started_at": self.started_at,
            "host": self.host,
            "run_tag": self.run_tag,
            "summaries": [s.to_json() for s in self.summaries],
            "runs": [r.to_json() for r in self.runs],
            "records": [r.to_json() for r in self.records],
        }

    def write_json(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(self.to_json(), fh, indent=1)
            fh.write("\n")


def round_order(targets: tuple[Target, ...], round_index: int) -> list[Target]:
    """Targets in the order they run in a round: rotated by one each round."""
    if not targets:
        return []
    shift = round_index % len(targets)
    return [*targets[shift:], *targets[:shift]]


async def run_storm(
    config: StormConfig,
    on_update: Callable[[LiveState], None] | None = None,
    clock: Clock = time.perf_counter,
) -> StormResult:
    """Run every round against every target; failures are recorded, never raised."""
    config.settings.check()
    targets = tuple(await asyncio.gather(*(discover_model(t) for t in config.targets)))
    watches = {t.name: ServerWatch(t, config.pids.get(t.name)) for t in targets}
    for watch in watches.values():
        await watch.detect()
    limits = [w.max_prompt_tokens for w in watches.values() if w.max_prompt_tokens is not None]
    settings = fitted(config.settings, min(limits, default=None))
    config = replace(config, targets=targets, settings=settings)
    storm = _Storm(config, watches, on_update or (lambda _: None), clock)
    for round_index in range(config.rounds):
        for target in round_order(targets, round_index):
            storm.result.runs.append(await storm.run_target(target, round_index))
    result = storm.result
    for target in targets:
        records = [r for r in result.records if r.target == target.name]
        runs = [r.data for r in result.runs if r.target == target.name]
        slo = config.settings.ttft_slo_ms
        result.summaries.append(summarize_storm(target.name, records, runs, slo))
    return result


class _Storm:
    """A storm in progress: the config, the growing result and the live state."""

    def __init__(
        self,
        config: StormConfig,
        watches: dict[str, ServerWatch],
        notify: Callable[[LiveState], None],
        clock: Clock,
    ) -> None:
        self.config = config
        self.notify = notify
        self.clock = clock
        started = datetime.now(UTC).isoformat(timespec="seconds")
        self.result = StormResult(config, started, host_info(), secrets.token_hex(3))
        self.live = LiveState(counters={t.name: Counters() for t in config.targets})
        self.watches = watches

    async def run_target(self, target: Target, round_index: int) -> TargetRunResult:
        """One target's run of one round, with the server sampled while it lasts."""
        watch = self.watches[target.name]
        await wait_idle(watch, self.config.idle_timeout_s)
        before = await watch.counters()
        run = TargetRun(
            target,
            self.config.settings,
            round_index,
            self.result.run_tag,
            clock=self.clock,
            on_change=lambda: self._changed(run.now()),
        )
        run.counters = self.live.counters[target.name]
        self.live.target, self.live.round = target.name, round_index
        stop = asyncio.Event()
        watcher = asyncio.create_task(self._watch(watch, run, stop))
        started = self.clock()
        records = await run.run()
        duration = self.clock() - started
        stop.set()
        samples = await watcher
        after = await watch.counters()
        self.result.records.extend(records)
        data = TargetRunData(duration, samples, before, after, dict(watch.streams))
        watch.streams.clear()
        return TargetRunResult(target.name, round_index, data)

    def _changed(self, elapsed_s: float) -> None:
        self.live.elapsed_s = elapsed_s
        self.notify(self.live)

    async def _watch(
        self, watch: ServerWatch, run: TargetRun, stop: asyncio.Event
    ) -> list[ServerSample]:
        samples: list[ServerSample] = []
        while True:
            sample = await watch.sample(run.now())
            samples.append(sample)
            self.live.last_sample[watch.target.name] = sample
            self._changed(run.now())
            if stop.is_set():
                return samples
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.config.sample_interval_s)


async def wait_idle(watch: ServerWatch, timeout_s: float) -> bool:
    """Poll until nothing runs or waits on the target (True), or ``timeout_s`` passed."""
    if watch.kind is None:
        return True
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sample = await watch.sample(0.0)
        if sample.alive and not sample.running and not sample.waiting:
            watch.streams.clear()
            return True
        await asyncio.sleep(IDLE_POLL_S)
    return False
