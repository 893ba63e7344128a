"""Running the JavaScript client (clients/js, `@edge-llm/client`) from the tests.

`make js-client` (part of `make test`) installs its dev tools with `npm ci`; without
Node or that install the tests skip saying why, except under CI=true, where they fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "clients" / "js"
INSTALLED = PACKAGE / "node_modules" / ".package-lock.json"


def _missing(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: the JavaScript client's tests must run)")
    pytest.skip(reason)


def node() -> str:
    """The node binary, once the package's dev tools are installed (else skip or fail)."""
    found = shutil.which("node")
    if found is None or shutil.which("npm") is None:
        _missing("node and npm are not on PATH")
    if not INSTALLED.exists():
        _missing("clients/js has no node_modules: run `make js-client`")
    return str(found)


def node_flags() -> list[str]:
    """Node 20 has no global WebSocket unless asked (Node 22 has it by default)."""
    out = subprocess.run(
        [node(), "-p", "process.versions.node"], capture_output=True, text=True, check=True
    )
    return ["--experimental-websocket"] if int(out.stdout.split(".")[0]) < 22 else []


def run(
    *argv: str, cwd: Path = PACKAGE, timeout: float = 300, stdin_text: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a command (``node`` is the one :func:`node` found) and keep its output."""
    command = [node() if argv[0] == "node" else argv[0], *argv[1:]]
    env = {**os.environ, "NO_COLOR": "1", "npm_config_update_notifier": "false"}
    return subprocess.run(
        command,
        cwd=cwd,
        input=stdin_text,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def check(result: subprocess.CompletedProcess[str]) -> str:
    output = f"{result.stdout}\n{result.stderr}"
    assert result.returncode == 0, f"{result.args} exited {result.returncode}:\n{output}"
    return result.stdout
