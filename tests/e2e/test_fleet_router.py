"""A fleet on an existing router (SPEC section 21, docs/fleet.md): two edge-llm workers
behind SGLang Model Gateway (PyPI ``sglang-router``, a dev dependency), policy
``cache_aware``, backend ``sglang`` (its default: the workers' ``/model_info`` and
``/server_info`` are 404 and it carries on; ``--backend openai`` in 0.3.2 sends every
request to one worker), everything on 127.0.0.1.

The router adds SGLang's fields to every request (``no_stop_trim``,
``separate_reasoning``, ...): that the workers answer at all is the dialect work of
issue 43 seen from the router's side."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest

from conftest import EngineProcess, start_engine
from helpers import free_port, metric

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-135M-Instruct"
QUESTION = [{"role": "user", "content": "Name the capital of France."}]
_READY_TIMEOUT_S = 60.0


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def _wait_for(what: str, ready: Callable[[], bool], timeout: float = _READY_TIMEOUT_S) -> None:
    """Poll ``ready`` (a cheap HTTP read) until it holds; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.1)


@dataclass
class Router:
    url: str
    metrics_url: str  # the router's own Prometheus endpoint
    proc: subprocess.Popen[bytes]
    log: Path
    clients: list[openai.OpenAI] = field(default_factory=list)  # closed by stop()

    def workers(self) -> dict[str, bool]:
        """Each worker's URL and whether the router holds it healthy."""
        listed = _get_json(self.url + "/workers")["workers"]
        return {w["url"]: bool(w["is_healthy"]) for w in listed}

    def health_checks(self, result: str) -> float:
        """Health checks of workers the router made so far with this result."""
        with urllib.request.urlopen(self.metrics_url, timeout=30) as response:
            text = response.read().decode()
        return metric(text, "smg_worker_health_checks_total", absent=0.0, result=result)

    def client(self) -> openai.OpenAI:
        client = openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0)
        self.clients.append(client)
        return client

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_router(tmp_path: Path, workers: list[EngineProcess], policy: str) -> Router:
    """``python -m sglang_router.launch_router`` in front of ``workers``, health-checked
    every second; returns once it lists them all healthy."""
    port, metrics_port = free_port(), free_port()
    log = tmp_path / f"router-{port}.log"
    cmd = [
        sys.executable, "-m", "sglang_router.launch_router",
        "--host", "127.0.0.1", "--port", str(port),
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
        "--backend", "sglang", "--policy", policy,
        "--worker-urls", *[w.url for w in workers],
        "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
        "--worker-startup-check-interval", "1", "--log-level", "warn",
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    router = Router(
        f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics", proc, log
    )
    expected = {w.url: True for w in workers}

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError("router exited:\n" + log.read_text(errors="replace"))
        try:
            return router.workers() == expected
        except OSError:
            return False

    try:
        _wait_for("the router listing its workers healthy", ready)
    except BaseException:
        router.stop()
        raise
    return router


Fleet = tuple[Router, list[EngineProcess]]


def _fleet(tmp_path: Path) -> Iterator[Fleet]:
    """Two workers and a cache-aware router, stopped at the end."""
    workers: list[EngineProcess] = []
    router = None
    try:
        workers = [start_engine(tmp_path) for _ in range(2)]
        router = start_router(tmp_path, workers, "cache_aware")
        yield router, workers
    finally:
        if router is not None:
            router.stop()
        for worker in workers:
            worker.stop()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    yield from _fleet(tmp_path_factory.mktemp("fleet"))


@pytest.fixture
def doomed_fleet(tmp_path: Path) -> Iterator[Fleet]:
    """A fleet of its own for the test that kills a worker."""
    yield from _fleet(tmp_path)


def _serving(workers: list[EngineProcess], stream_id: str) -> EngineProcess:
    """The worker whose streams include ``stream_id``."""
    for worker in workers:
        if any(s["id"] == stream_id for s in worker.debug_streams()["streams"]):
            return worker
    raise AssertionError(f"{stream_id} is on no worker")


def test_chat_through_the_router_plain_and_streamed(fleet) -> None:
    router, workers = fleet
    client = router.client()
    reply = client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=20
    )
    text = reply.choices[0].message.content or ""
    assert "Paris" in text
    _serving(workers, reply.id)  # answered by a worker, under its own id
    stream = client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=20, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens  # type: ignore[union-attr]


def _document(name: str) -> list[dict[str, str]]:
    """A long system prompt of its own (the gateway matches request texts by prefix)."""
    words = " ".join(f"{name}-{n}" for n in range(40))
    return [{"role": "system", "content": f"Document {name}: {words}"}]


def test_cache_aware_spreads_new_prompts_and_keeps_a_prompt_on_its_worker(fleet) -> None:
    """The gateway's cache_aware: a prompt it has not seen goes to the worker with
    the fewest requests in flight, one that starts like an earlier one to that
    one's worker (its prefix is cached there)."""
    router, workers = fleet
    client = router.client()
    ask = [{"role": "user", "content": "Which word comes first?"}]
    busy = client.chat.completions.create(
        model=MODEL, messages=_document("alpha") + ask, temperature=0, max_tokens=1000,
        stream=True, extra_body={"ignore_eos": True},
    )  # fmt: skip
    first = next(iter(busy))  # in flight on one worker until the stream is closed
    try:
        held = _serving(workers, first.id)
        other = client.chat.completions.create(
            model=MODEL, messages=_document("beta") + ask, temperature=0, max_tokens=2
        )
        assert _serving(workers, other.id) is not held
        again = client.chat.completions.create(
            model=MODEL, messages=_document("alpha") + ask, temperature=0, max_tokens=2
        )
        assert _serving(workers, again.id) is held
        assert again.usage.prompt_tokens_details.cached_tokens > 100  # type: ignore[union-attr]
    finally:
        busy.close()


def test_a_client_that_leaves_through_the_router_frees_the_workers_kv(fleet) -> None:
    router, workers = fleet
    body = json.dumps({
        "model": MODEL, "messages": QUESTION, "temperature": 0, "stream": True,
        "max_tokens": 2000, "ignore_eos": True,
    }).encode()  # fmt: skip
    host, port = router.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=120) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        )
        received = b""
        while received.count(b"data: ") < 4:  # the stream is flowing through the router
            piece = sock.recv(65536)
            assert piece, received
            received += piece
        stream_id = json.loads(received.split(b"data: ", 2)[1].split(b"\n")[0])["id"]
        worker = _serving(workers, stream_id)
        assert worker.stream(stream_id)["state"] in ("decoding", "paused")
        assert worker.debug_streams()["kv_used_bytes"] > 0
    # The socket is closed: the router drops its request to the worker, which cancels.

    def freed() -> bool:
        stream = worker.stream(stream_id)
        return stream["cancel_reason"] == "disconnect" and worker.debug_streams()[
            "kv_used_bytes"] == 0  # fmt: skip

    _wait_for("the worker cancelling the stream and freeing its cells", freed)
    assert worker.stream(stream_id)["n_generated"] < 2000


def test_the_routers_health_checks_of_the_workers_succeed(fleet) -> None:
    router, workers = fleet
    # Every second each worker's GET /health: two rounds at least, none failed.
    _wait_for("two rounds of health checks", lambda: router.health_checks("success") >= 4)
    assert router.health_checks("failure") == 0
    assert router.workers() == {w.url: True for w in workers}


def test_a_killed_worker_is_routed_around_and_health_checks_see_it(doomed_fleet) -> None:
    router, workers = doomed_fleet
    client = router.client()
    first = client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=4
    )
    # The worker the gateway sent to is killed (one request at a time: cache_aware
    # sends each new prompt to the first of the equally idle workers).
    killed = _serving(workers, first.id)
    (alive,) = [w for w in workers if w is not killed]
    killed.proc.send_signal(signal.SIGKILL)
    killed.proc.wait(timeout=30)
    # The gateway's health checks (GET /health every second) mark the killed worker
    # down and keep the live one up; until then it answers 503 (0.3.2 does not retry
    # a request on another worker: docs/fleet.md).
    expected = {alive.url: True, killed.url: False}
    _wait_for("the router marking the killed worker down", lambda: router.workers() == expected)
    assert router.health_checks("failure") >= 1
    for n in range(6):  # then every request is answered, by the live worker
        ask = [{"role": "user", "content": f"Question {n}: name a colour."}]
        reply = client.chat.completions.create(
            model=MODEL, messages=ask, temperature=0, max_tokens=4
        )
        assert _serving([alive], reply.id) is alive
