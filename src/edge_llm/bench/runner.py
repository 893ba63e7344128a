"""Runs a benchmark: warm-up, each concurrency level, then the slow-consumer probe.

Targets take turns so that machine noise hits them alike: at concurrency C, target A
runs a batch of C simultaneous requests, then B runs its batch of C, then A again, and
so on until each target has run ``requests`` requests at that level. Targets never
overlap, so each one sees exactly C concurrent streams (fewer only at the end of a
batch, when some have finished) and two servers on one machine do not steal each
other's CPU. Every target gets the same prompts in the same order. Unless ``unique_prompts`` is off,
each request's prompt starts with a tag unique to the run, level and index (the same
for every target), so no server answers a repeated prompt from its prompt cache.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from edge_llm.bench.chat_stream import Clock, RequestOptions, run_request
from edge_llm.bench.connection import HttpError, fetch
from edge_llm.bench.prompts import Prompt
from edge_llm.bench.record import RequestRecord
from edge_llm.bench.slow_consumer import (
    SLOW_PROMPT,
    SlowConsumerResult,
    SlowConsumerSettings,
    probe,
)
from edge_llm.bench.stats import Summary, summarize
from edge_llm.bench.targets import Target, TargetUnreachable

ProgressCallback = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """Everything that defines a run (keys are never exported, see Target.describe)."""

    targets: tuple[Target, ...]
    prompts: tuple[Prompt, ...]
    prompt_source: str
    requests: int = 8
    concurrency: tuple[int, ...] = (1,)
    warmup: int = 1
    options: RequestOptions = field(default_factory=RequestOptions)
    slow_consumer: SlowConsumerSettings | None = None
    unique_prompts: bool = True

    def to_json(self) -> dict[str, Any]:
        slow = self.slow_consumer
        return {
            "targets": [t.describe() for t in self.targets],
            "prompt_source": self.prompt_source,
            "n_prompts": len(self.prompts),
            "requests": self.requests,
            "concurrency": list(self.concurrency),
            "warmup": self.warmup,
            "max_tokens": self.options.max_tokens,
            "temperature": self.options.temperature,
            "include_usage": self.options.include_usage,
            "timeout_s": self.options.timeout_s,
            "slow_consumer": None if slow is None else _settings_json(slow),
            "unique_prompts": self.unique_prompts,
        }


def _settings_json(settings: SlowConsumerSettings) -> dict[str, Any]:
    return {
        "rcvbuf": settings.rcvbuf,
        "stall_after_chunks": settings.stall_after_chunks,
        "stall_s": settings.stall_s,
        "max_tokens": settings.max_tokens,
        "poll_interval_s": settings.poll_interval_s,
        "until_paused": settings.until_paused,
        "max_stall_s": settings.max_stall_s,
    }


@dataclass
class BenchResult:
    """A run's records, summaries and slow-consumer findings."""

    config: BenchConfig
    started_at: str
    host: dict[str, Any]
    records: list[RequestRecord] = field(default_factory=list)
    summaries: list[Summary] = field(default_factory=list)
    slow_consumer: list[SlowConsumerResult] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "config": self.config.to_json(),
            "started_at": self.started_at,
            "host": self.host,
            "summaries": [s.to_json() for s in self.summaries],
            "records": [r.to_json() for r in self.records],
            "slow_consumer": [s.to_json() for s in self.slow_consumer],
        }

    def write_json(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(self.to_json(), fh, indent=1)
            fh.write("\n")


def run_levels(config: BenchConfig) -> tuple[int, ...]:
    """The concurrency levels that run (none with ``requests == 0``)."""
    return config.concurrency if config.requests else ()


def total_steps(config: BenchConfig) -> int:
    """Progress steps of a run: one per request, warm-up and slow-consumer probe."""
    per_target = config.warmup + config.requests * len(run_levels(config))
    per_target += 1 if config.slow_consumer else 0
    return per_target * len(config.targets)


def host_info() -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "loadavg_at_start": list(load) if load else None,
    }


async def discover_model(target: Target) -> Target:
    """Fill ``target.model`` from ``GET /v1/models`` (first id) when not given.

    Raises :class:`TargetUnreachable` when nothing answers at the target: a run
    of connection errors measures nothing."""
    try:
        status, _, body = await fetch(target.base_url + "/models", headers=target.headers())
        models = json.loads(body)["data"] if status == 200 else []
        model = models[0]["id"] if models else None
    except HttpError as exc:
        if exc.kind == "connect_error":
            raise TargetUnreachable(target.unreachable(exc)) from exc
        return target
    except (ValueError, KeyError, IndexError, TypeError):
        return target
    if target.model or not isinstance(model, str):
        return target
    return replace(target, model=model)


async def run_bench(
    config: BenchConfig,
    on_progress: ProgressCallback | None = None,
    clock: Clock = time.perf_counter,
) -> BenchResult:
    """Run everything ``config`` asks for and return the result (errors are recorded)."""
    targets = tuple(await asyncio.gather(*(discover_model(t) for t in config.targets)))
    run = _Run(replace(config, targets=targets), on_progress or (lambda _: None), clock)
    await run.warmup()
    for level in run_levels(config):
        await run.level(level)
    await run.slow_consumers()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    run.result.host["loadavg_at_end"] = list(load) if load else None
    return run.result


class _Run:
    """One run in progress: the config, the clock's epoch and the growing result."""

    def __init__(self, config: BenchConfig, notify: ProgressCallback, clock: Clock) -> None:
        self.config = config
        self.notify = notify
        self.clock = clock
        started = datetime.now(UTC).isoformat(timespec="seconds")
        self.result = BenchResult(config, started, host_info())
        self.result.host["run_tag"] = self.run_tag = secrets.token_hex(3)
        self.epoch = clock()

    def prompt(self, index: int, tag: str) -> Prompt:
        """The index-th prompt; with ``unique_prompts``, tagged with this run, level and
        index (the same for every target, so all targets get the same text)."""
        prompt = self.config.prompts[index % len(self.config.prompts)]
        return prompt.tagged(f"{self.run_tag}-{tag}") if self.config.unique_prompts else prompt

    async def request(self, target: Target, level: int, index: int) -> RequestRecord:
        prompt = self.prompt(index, f"{level}-{index}")
        record = RequestRecord(target.name, level, index, prompt.id)
        options = self.config.options
        return await run_request(
            target, prompt, options, record, epoch=self.epoch, clock=self.clock
        )

    async def warmup(self) -> None:
        """Warm-up requests, interleaved, not recorded (concurrency 0 in their records)."""
        for index in range(self.config.warmup):
            for target in self.config.targets:
                await self.request(target, 0, index)
                self.notify(f"warm-up {target.name}")

    async def level(self, level: int) -> None:
        """``requests`` requests per target in batches of ``level``, targets taking turns."""
        config = self.config
        records: dict[str, list[RequestRecord]] = {t.name: [] for t in config.targets}
        durations = dict.fromkeys(records, 0.0)
        for first in range(0, config.requests, level):
            indices = range(first, min(first + level, config.requests))
            for target in config.targets:
                started = self.clock()
                batch = await self.batch(target, level, indices)
                durations[target.name] += self.clock() - started
                records[target.name].extend(batch)
        for target in config.targets:
            self.result.records.extend(records[target.name])
            summary = summarize(target.name, level, records[target.name], durations[target.name])
            self.result.summaries.append(summary)

    async def batch(
        self, target: Target, level: int, indices: Sequence[int]
    ) -> list[RequestRecord]:
        async def one(index: int) -> RequestRecord:
            record = await self.request(target, level, index)
            self.notify(f"c={level} {target.name}")
            return record

        return list(await asyncio.gather(*(one(i) for i in indices)))

    async def slow_consumers(self) -> None:
        settings = self.config.slow_consumer
        if settings is None:
            return
        for target in self.config.targets:
            self.notify(f"slow consumer {target.name}")
            prompt = (
                SLOW_PROMPT.tagged(f"{self.run_tag}-slow")
                if self.config.unique_prompts
                else SLOW_PROMPT
            )
            found = await probe(
                target,
                settings,
                self.config.options,
                epoch=self.epoch,
                clock=self.clock,
                prompt=prompt,
            )
            self.result.slow_consumer.append(found)
