"""Shared fixtures: real engine processes on 127.0.0.1, stopped by the tests, and the
engine thread over the fake backend."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import settings

from edge_llm.config.tree import EngineConfig, load_config
from edge_llm.engine import Engine, EngineSettings, build_engine
from edge_llm.engine.runtime.threads import CoreReadings
from edge_llm.engine.scheduling.prefill_budget import StepCosts
from edge_llm.observability.events import EventSink, null_sink
from edge_llm.server.app import create_app
from edge_llm.server.context import CONTEXT
from edge_llm.server.runtime import build_context, engine_settings

from fakes import FakeBackend, fake_loader
from helpers import metric

_START_TIMEOUT_S = 120.0
# No test reaches the Hugging Face Hub: a pull not pointed at tests/hub_standin.py meets a
# closed port on this machine (the engines started here inherit it).
os.environ.setdefault("HF_ENDPOINT", "http://127.0.0.1:9")
# Hypothesis's per-example deadline (200 ms) measures the machine, not the code: on a
# loaded 2-core machine a one-value percentile took 285 ms (test_bench_stats, 2026-12-07).
settings.register_profile("edge-llm", deadline=None)
settings.load_profile("edge-llm")


@dataclass
class EngineProcess:
    """A real ``edge-llm serve`` child process with the embedded model."""

    url: str
    proc: subprocess.Popen[str]
    event_log: Path
    reader: threading.Thread
    output: list[str] = field(default_factory=list)
    printed: queue.Queue[str] = field(default_factory=queue.Queue)  # lines not yet in output

    def wait_for_output(self, wanted: Callable[[str], bool], timeout: float = 120.0) -> str:
        """The next printed line that ``wanted`` accepts (lines read on the way join
        ``output``); raises AssertionError if none comes within ``timeout``."""
        while True:
            try:
                line = self.printed.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(
                    "expected output did not come:\n" + "".join(self.output)
                ) from None
            self.output.append(line)
            if wanted(line):
                return line

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def get_json(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=30) as response:
            return json.loads(response.read())

    def debug_streams(self) -> dict[str, Any]:
        result: dict[str, Any] = self.get_json("/debug/streams")
        return result

    def stream(self, stream_id: str) -> dict[str, Any]:
        for stream in self.debug_streams()["streams"]:
            if stream["id"] == stream_id:
                return dict(stream)
        raise KeyError(stream_id)

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as response:
            return str(response.read().decode())

    def metric(self, name: str, *, absent: float | None = None, **labels: str) -> float:
        """A sample of /metrics now (summed over the samples with ``labels``)."""
        return metric(self.metrics_text(), name, absent=absent, **labels)

    def events(self) -> list[dict[str, Any]]:
        """The event log's complete lines: one the engine is still writing (a read can
        see part of a write) is read whole the next time."""
        if not self.event_log.exists():
            return []
        written = self.event_log.read_bytes()
        complete = written[: written.rfind(b"\n") + 1].decode("utf-8")
        return [json.loads(line) for line in complete.splitlines() if line.strip()]

    def events_of(self, event: str, request_id: str | None = None) -> list[dict[str, Any]]:
        """The lines of the event log so far named ``event`` (of ``request_id``)."""
        return [
            line for line in self.events()
            if line["event"] == event and request_id in (None, line.get("request_id"))
        ]  # fmt: skip

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        _close_pipe(self.proc, self.reader)
        return self.proc.returncode


def _read_lines(proc: subprocess.Popen[str], sink: queue.Queue[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        sink.put(line)


def start_engine(tmp_path: Path, *flags: str, env: dict[str, str] | None = None) -> EngineProcess:
    """Start ``edge-llm serve --port 0`` and wait for its "serving ... on URL" line."""
    event_log = tmp_path / f"engine-{len(list(tmp_path.glob('engine-*.jsonl')))}.jsonl"
    event_log.touch()
    cmd = [
        sys.executable, "-m", "edge_llm", "serve",
        "--host", "127.0.0.1", "--port", "0", "--event-log", str(event_log), *flags,
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Pulled models: a store of the test's own, never the user's.
        env={**os.environ, "EDGE_LLM_MODELS_DIR": str(tmp_path / "pulled"), **(env or {})},
    )
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(proc, lines), daemon=True)
    reader.start()
    output: list[str] = []
    while True:
        try:
            line = lines.get(timeout=_START_TIMEOUT_S)
        except queue.Empty:
            _discard(proc, reader)
            raise RuntimeError("engine did not start:\n" + "".join(output)) from None
        output.append(line)
        if " on http://" in line:
            url = line.split(" on ", 1)[1].split()[0]
            return EngineProcess(url, proc, event_log, reader, output, lines)
        if proc.poll() is not None and lines.empty():
            _discard(proc, reader)
            raise RuntimeError("engine exited:\n" + "".join(output))


def _discard(proc: subprocess.Popen[str], reader: threading.Thread) -> None:
    """An engine that did not start: killed and its pipe closed (left to the garbage
    collector, the pipe's "unclosed file" warning failed an unrelated later test)."""
    proc.kill()
    proc.wait()
    _close_pipe(proc, reader)


def _close_pipe(proc: subprocess.Popen[str], reader: threading.Thread) -> None:
    """An exited engine's output pipe: its reader thread finished, then closed."""
    reader.join(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()


EngineFactory = Callable[..., EngineProcess]


@pytest.fixture(scope="session")
def engine_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """One engine with the seed's configuration, shared by the session. Paused
    streams are kept long enough for tests on a loaded machine (max_pause_ms is
    not a seed key)."""
    engine = start_engine(tmp_path_factory.mktemp("engine"), "--max-pause-ms", "600000")
    yield engine
    engine.stop()


@pytest.fixture
def engine_factory(tmp_path: Path) -> Iterator[EngineFactory]:
    """Start engines with custom flags; each is stopped after the test."""
    started: list[EngineProcess] = []

    def factory(*flags: str, env: dict[str, str] | None = None) -> EngineProcess:
        engine = start_engine(tmp_path, *flags, env=env)
        started.append(engine)
        return engine

    yield factory
    for engine in started:
        engine.stop()


@pytest.fixture
async def engine_of() -> AsyncIterator[object]:
    """``make(backend=None, costs=None, cores=None, **settings)``: a started engine
    over the fake backend, stopped (its gate opened) after the test. ``costs`` replaces
    the measured step costs before the engine starts; ``cores`` stands for what the
    thread governor reads of the cores."""
    engines: list[Engine] = []

    def make(
        backend: FakeBackend | None = None,
        costs: StepCosts | None = None,
        cores: CoreReadings | None = None,
        **settings: object,
    ) -> Engine:
        engine = build_engine(
            backend or FakeBackend(),  # type: ignore[arg-type]
            EngineSettings(**settings),  # type: ignore[arg-type]
            cores=cores,
        )
        if costs is not None:
            engine.scheduler.prefill_budget.costs = costs
        engine.start(asyncio.get_running_loop())
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        if engine.backend.gate is not None:  # type: ignore[attr-defined]
            engine.backend.gate.release(10_000)  # type: ignore[attr-defined]
        await asyncio.to_thread(engine.stop)


def app_over(
    backend: FakeBackend, config: EngineConfig, events: EventSink = null_sink
) -> web.Application:
    """The whole application over ``backend``, its engine started on the running loop
    (:func:`app_engine`; stop it with :func:`stop_app_engine`)."""
    engine = build_engine(backend, engine_settings(config), events=events)
    engine.start(asyncio.get_running_loop())
    ctx = build_context(config, engine, backend, events, loader=fake_loader(config))
    return create_app(ctx)


def app_engine(app: web.Application) -> Engine:
    """The engine of :func:`app_over`'s default model."""
    model = app[CONTEXT].default_model()
    assert model is not None, "the default model was unloaded"
    return model.engine


async def stop_app_engine(app: web.Application) -> None:
    """Stop the engines of :func:`app_over`: the default model's and any a request
    loaded (their fake backends' gates opened first)."""
    ctx = app[CONTEXT]
    await ctx.router.registry.close()
    for name in ctx.pool.names:
        loaded = ctx.pool.loaded(name)
        gate = loaded.engine.backend.gate if loaded else None  # type: ignore[attr-defined]
        if gate is not None:
            gate.release(10_000)
    await ctx.pool.unload_all()


@pytest.fixture
async def client_of() -> AsyncIterator[Callable[..., Any]]:
    """``make(backend=None, *, config_path=None, events=None, **config_keys)``: the
    whole HTTP server in-process on 127.0.0.1 over the fake backend (a test client;
    ``app_engine(client.app)`` is its engine), closed after the test. ``events``
    receives the engine's event-log lines."""
    made: list[TestClient] = []

    async def make(
        backend: FakeBackend | None = None,
        *,
        config_path: Path | None = None,
        events: EventSink = null_sink,
        **overrides: object,
    ) -> TestClient:
        config = load_config(config_path, env={}, overrides=overrides)
        app = app_over(backend or FakeBackend(), config, events)
        await app[CONTEXT].router.registry.start()
        client = TestClient(TestServer(app))
        await client.start_server()
        made.append(client)
        return client

    yield make
    for client in made:
        await client.close()
        await stop_app_engine(client.app)
