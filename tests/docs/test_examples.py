"""The docs' runnable examples run as written, and print what the docs show beside them.

Each page's examples run in order in a working directory of their own, which holds
a link to the repository's ``src`` (examples read the shipped configs from there),
one to the virtualenv as ``.venv`` (as in a clone after ``make install``), one to
``clients/js`` as ``node_modules/@edge-llm/client`` (JavaScript examples run with node) and, when
the page uses an engine, its event log as ``engine.jsonl``. They run as in a shell
where the docs' PATH note was followed (``source .venv/bin/activate``): the
virtualenv's ``bin`` first on ``PATH`` and ``VIRTUAL_ENV`` set. Examples
marked ``run: server`` get a real ``edge-llm serve --port 0`` on 127.0.0.1 (shared by
the page's blocks with the same flags, stopped before the next page); the
``127.0.0.1:8000`` they name is rewritten to that engine's address, and back in
their output. Ports 8100-8199 that a block's own servers listen on get free ports
the same way. A shell block's background jobs are stopped when it ends. Every engine
an example starts, or is given, waits 60 s for a first token instead of 10 s: on a
loaded test machine a fresh engine's first answer can take longer than the seed's
time-out, which is not what the examples show. Markers: see ``doc_examples``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from js_client import PACKAGE, node, node_flags

from conftest import EngineProcess, start_engine
from doc_examples import ROOT, Example, examples, matches, pages
from helpers import free_port

pytestmark = pytest.mark.e2e

DOCS_ADDRESS = "127.0.0.1:8000"
EXAMPLE_TIMEOUT_S = 300.0
VENV_BIN = Path(sys.executable).parent
# Ports an example's own servers use: 127.0.0.1:81NN, localhost:81NN, --port 81NN.
_PRIVATE_PORT = re.compile(r"(?:(?<=127\.0\.0\.1:)|(?<=localhost:)|(?<=--port ))81\d\d\b")
# Ends a shell block's background jobs; keeps the block's own exit status.
_STOP_JOBS = "trap 'kill $(jobs -p) 2>/dev/null || true; wait || true' EXIT\n"
PATIENT_ENGINE = {"EDGE_LLM_TTFT_TIMEOUT_MS": "60000"}
# Variables of the caller's environment that would point an example elsewhere.
_FOREIGN_ENV = ("EDGE_LLM_", "OPENAI_", "ANTHROPIC_")


@dataclass
class PageRun:
    """The working directory and engines of the page whose examples are running."""

    page: str
    workdir: Path
    engines: dict[tuple[str, ...], EngineProcess] = field(default_factory=dict)

    def engine(self, flags: tuple[str, ...]) -> EngineProcess:
        if flags not in self.engines:
            engine = start_engine(self.workdir / "engines", *flags, env=PATIENT_ENGINE)
            log = self.workdir / "engine.jsonl"
            if not log.exists():
                log.symlink_to(engine.event_log)
            self.engines[flags] = engine
        return self.engines[flags]

    def stop(self) -> None:
        for engine in self.engines.values():
            engine.stop()


class Pages:
    """One PageRun at a time: moving to another page stops the previous page's engines."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.current: PageRun | None = None

    def run_for(self, page: str) -> PageRun:
        if self.current is None or self.current.page != page:
            self.close()
            workdir = self.base / page.replace("/", "_")
            (workdir / "engines").mkdir(parents=True)
            (workdir / "home").mkdir()
            (workdir / "src").symlink_to(ROOT / "src")
            (workdir / ".venv").symlink_to(VENV_BIN.parent)
            # A JavaScript example imports the client as a project that installed it.
            (workdir / "node_modules" / "@edge-llm").mkdir(parents=True)
            (workdir / "node_modules" / "@edge-llm" / "client").symlink_to(PACKAGE)
            self.current = PageRun(page, workdir)
        return self.current

    def close(self) -> None:
        if self.current is not None:
            self.current.stop()


@pytest.fixture(scope="module")
def page_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pages]:
    runs = Pages(tmp_path_factory.mktemp("docs-examples"))
    yield runs
    runs.close()


def environment(workdir: Path, engine: EngineProcess | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_ENV)}
    env.update(
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        VIRTUAL_ENV=str(VENV_BIN.parent),
        HOME=str(workdir / "home"),
        PYTHONUNBUFFERED="1",
        **PATIENT_ENGINE,
    )
    if engine is not None:
        env["EDGE_LLM_BASE_URL"] = engine.base_url
    return env


def addresses(example: Example, engine: EngineProcess | None) -> dict[str, str]:
    """host:port the docs name -> where it really is for this run."""
    found = {f"127.0.0.1:{port}" for port in _PRIVATE_PORT.findall(example.code)}
    real = {docs: f"127.0.0.1:{free_port()}" for docs in sorted(found)}
    if engine is not None:
        real[DOCS_ADDRESS] = engine.url.removeprefix("http://")
    return real


def localised(code: str, real: dict[str, str]) -> str:
    for docs, address in real.items():
        port, real_port = docs.rsplit(":", 1)[1], address.rsplit(":", 1)[1]
        code = code.replace(docs, address).replace(f"localhost:{port}", address)
        code = code.replace(f"--port {port}", f"--port {real_port}")
    return code


def command(example: Example, code: str, workdir: Path) -> list[str]:
    if example.language == "python":
        script = workdir / f"example_{example.line}.py"
        script.write_text(code, encoding="utf-8")
        return [sys.executable, str(script)]
    if example.language == "js":
        script = workdir / f"example_{example.line}.mjs"
        script.write_text(code, encoding="utf-8")
        return [node(), *node_flags(), str(script)]
    return ["bash", "-e", "-o", "pipefail", "-c", _STOP_JOBS + code]


def run_example(example: Example, run: PageRun) -> str:
    engine = None if example.server_flags is None else run.engine(example.server_flags)
    real = addresses(example, engine)
    result = subprocess.run(
        command(example, localised(example.code, real), run.workdir),
        cwd=run.workdir,
        env=environment(run.workdir, engine),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=EXAMPLE_TIMEOUT_S,
        check=False,
    )
    output = result.stdout
    for docs, address in real.items():
        output = output.replace(address, docs)
    assert result.returncode == 0, f"{example.id} exited {result.returncode}:\n{output}"
    return output


ALL = [example for page in pages() for example in examples(page)]


@pytest.mark.parametrize("example", ALL, ids=[example.id for example in ALL])
def test_example(example: Example, page_runs: Pages) -> None:
    output = run_example(example, page_runs.run_for(example.page))
    if example.expected is not None:
        assert matches(example.expected, output), (
            f"{example.id} printed:\n{output}\nthe docs show:\n{example.expected}"
        )
