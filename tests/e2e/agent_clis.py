"""Running the real Claude Code and Codex CLIs in tests, sealed off from the internet.

``make test`` installs them from npm (``scripts/install-agent-clis.sh``) into a
cache linked from the venv as ``agent-clis``; when that was impossible the
install wrote why into ``agent-clis.skip`` and these tests skip with that reason,
except in CI (``CI=true``), where a missing CLI fails the run with it.

Each run gets a fresh HOME (so no user settings, credentials or history are read
or written), the only base URL it knows is a 127.0.0.1 one, telemetry and update
checks are switched off, and every proxy variable points at a closed local port,
so anything that still tried to reach the internet would fail at once. The CLIs'
own retries are off: each of their calls reaches the engine once.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest
from aiohttp import web

from helpers import free_port

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "agents"
REFRESH_ENV = "EDGE_LLM_REFRESH_AGENT_FIXTURES"
RUN_TIMEOUT_S = 600.0
MODEL = "SmolLM2-135M-Instruct"
SHORT_SYSTEM = "You are a helpful assistant. Answer in one short sentence."
# Codex settings that shrink its ~10,000-token default prompt to ~400 tokens:
# short instructions, and no shell, patch, web, skills, environment or permission
# sections (two small tools remain).
CODEX_SMALL_PROMPT = (
    "features.shell_tool=false",
    "web_search=disabled",
    "skills.include_instructions=false",
    "include_environment_context=false",
    "include_permissions_instructions=false",
    "features.multi_agent=false",
    "features.goals=false",
)


def _install_dir() -> Path:
    return Path(sys.prefix) / "agent-clis"


def cli_path(name: str) -> Path:
    """The installed CLI, or skip the test saying why it is not there (fail in CI)."""
    path = _install_dir() / "node_modules" / ".bin" / name
    if path.exists():
        return path
    reason_file = Path(sys.prefix) / "agent-clis.skip"
    reason = reason_file.read_text().strip() if reason_file.exists() else "not installed"
    missing(f"{name} CLI unavailable: {reason} (`make agent-clis` installs it from npm)")


def missing(reason: str) -> NoReturn:
    """A real part a test needs is not on this machine: skip, or in CI (``CI=true``,
    as ``bash .ci/run`` runs) fail, so that CI never passes without it."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: a missing part fails the run)")
    pytest.skip(reason)


def sealed_env(home: Path, **extra: str) -> dict[str, str]:
    """Only what the CLIs need: PATH (node), a temp HOME, no way out."""
    dead_proxy = f"http://127.0.0.1:{free_port()}"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "HTTP_PROXY": dead_proxy,
        "HTTPS_PROXY": dead_proxy,
        "ALL_PROXY": dead_proxy,
        "http_proxy": dead_proxy,
        "https_proxy": dead_proxy,
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    return {**env, **extra}


def claude_env(home: Path, base_url: str, **extra: str) -> dict[str, str]:
    return sealed_env(
        home,
        ANTHROPIC_BASE_URL=base_url,
        ANTHROPIC_API_KEY="sk-local",
        ANTHROPIC_MODEL=MODEL,
        ANTHROPIC_DEFAULT_HAIKU_MODEL=MODEL,
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        DISABLE_TELEMETRY="1",
        DISABLE_AUTOUPDATER="1",
        DISABLE_ERROR_REPORTING="1",
        CLAUDE_CODE_MAX_RETRIES="0",
        **extra,
    )


def codex_env(home: Path, base_url: str) -> dict[str, str]:
    """A CODEX_HOME whose config.toml is what ``edge-llm config codex`` writes, with
    Codex's request and stream retries off."""
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        f'model = "{MODEL}"\n'
        'model_provider = "edge-llm"\n'
        "check_for_update_on_startup = false\n\n"
        "[analytics]\nenabled = false\n\n"
        "[model_providers.edge-llm]\n"
        'name = "edge-llm"\n'
        f'base_url = "{base_url}/v1"\n'
        'env_key = "EDGE_LLM_API_KEY"\n'
        'wire_api = "responses"\n'
        "request_max_retries = 0\n"
        "stream_max_retries = 0\n",
        encoding="utf-8",
    )
    return sealed_env(home, CODEX_HOME=str(codex_home), EDGE_LLM_API_KEY="sk-local")


def codex_small_prompt_args(home: Path) -> list[str]:
    instructions = home / "instructions.md"
    instructions.write_text(SHORT_SYSTEM + "\n", encoding="utf-8")
    args = ["-c", f"model_instructions_file={instructions}"]
    for setting in CODEX_SMALL_PROMPT:
        args += ["-c", setting]
    return args


@dataclass
class CliRun:
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


async def run_cli(
    cli: Path, args: Sequence[str], env: dict[str, str], cwd: Path, timeout: float = RUN_TIMEOUT_S
) -> CliRun:
    """Run to completion (stdin closed); killed and reported if it overruns."""
    proc = await asyncio.create_subprocess_exec(
        str(cli),
        *args,
        env=env,
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        output = f"{out.decode(errors='replace')}\n{err.decode(errors='replace')}"
        raise AssertionError(f"{cli.name} ran over {timeout} s:\n{output}") from None
    assert proc.returncode is not None
    return CliRun(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


# -- capturing what the CLIs send ------------------------------------------------------


@dataclass
class Capture:
    """Requests a CLI sent to the capture server; each was refused with a 400 in
    the API's own error shape, so the CLI gives up at once."""

    url: str
    requests: list[dict[str, Any]] = field(default_factory=list)

    def first(self, path: str) -> dict[str, Any]:
        for request in self.requests:
            if request["path"] == path:
                return request
        raise AssertionError(f"no request to {path}; got {[r['path'] for r in self.requests]}")


_KEPT_HEADERS = ("user-agent", "anthropic-version", "anthropic-beta", "content-type", "accept")


@asynccontextmanager
async def capture_server() -> AsyncIterator[Capture]:
    capture = Capture("")

    async def record(request: web.Request) -> web.Response:
        body = await request.json()
        headers = {k.lower(): v for k, v in request.headers.items()}
        capture.requests.append(
            {
                "path": request.path,
                "headers": {k: headers[k] for k in _KEPT_HEADERS if k in headers},
                "body": body,
            }
        )
        message = "capture server: request recorded"
        if request.path.endswith("/messages"):
            error = {"type": "invalid_request_error", "message": message}
            return web.json_response({"type": "error", "error": error}, status=400)
        error = {"message": message, "type": "invalid_request_error", "code": "captured"}
        return web.json_response({"error": error}, status=400)

    app = web.Application(client_max_size=16 << 20)
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    capture.url = f"http://127.0.0.1:{port}"
    try:
        yield capture
    finally:
        await runner.cleanup()


def fixture_path(name: str) -> Path:
    return FIXTURES / f"{name}.json"


def load_fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(fixture_path(name).read_text(encoding="utf-8"))
    return data


def save_fixture(name: str, request: dict[str, Any]) -> None:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    text = json.dumps(request, indent=1, ensure_ascii=False) + "\n"
    fixture_path(name).write_text(text, encoding="utf-8")


def shape(body: dict[str, Any]) -> dict[str, Any]:
    """What stays put between captures of one CLI version on any machine: the
    fields sent and the roles used (ids, dates, paths and, with the sandbox the
    host offers, some tools change)."""
    turns = body.get("messages") or body.get("input") or []
    return {
        "fields": sorted(body),
        "roles": sorted({str(turn.get("role", turn.get("type"))) for turn in turns}),
    }


def cli_version(headers: dict[str, str]) -> str:
    """``2.1.197`` from ``claude-cli/2.1.197 (external, sdk-cli)``."""
    found = re.search(r"/(\d+\.\d+\.\d+)", headers.get("user-agent", ""))
    return found[1] if found else "unknown"
